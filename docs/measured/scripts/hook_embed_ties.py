"""The row-mean adjacency score at hook_embed of every shipped, seed and candidate model (256 held-out prompts,
prompt seed 1), with repeated tokens' embeddings tied exactly (similarity.tie_equal_vectors, since 2026-12-03)
and as the matrix product alone gave them (the code before): how much the tie fix moves the stored scores.

Usage: .venv/bin/python docs/measured/scripts/hook_embed_ties.py OUT.md   (about 2 min on one thread)
"""
import sys

import tasks
from nope_interp import similarity as S
from nope_interp.analysis import analyze_model
from nope_interp.pretrained import available_candidate_runs, available_seed_runs, load_pretrained, load_run

orig = S._first_equal_position
rows = []
paths = []
for t in tasks.TASK_NAMES:
    paths.append(("shipped-" + t, None, t))
    paths += [(p.name, p, t) for p in available_seed_runs(t)]
    paths += [(p.name, p, t) for p in available_candidate_runs(t)]
for label, p, t in paths:
    run = load_pretrained(t) if p is None else load_run(p)
    vals = []
    for patch in (False, True):
        S._first_equal_position = (lambda u: None) if patch else orig
        a = analyze_model(run.model, run.task, 256, seed=1, points=("embed",))
        vals.append(a.scores["row_mean"]["hook_embed"]["mean"])
    S._first_equal_position = orig
    rows.append((label, t, None, vals[0], vals[1]))
    print(f"{label:40s} {t:9s} tied {vals[0]:.4f} old {vals[1]:.4f} diff {vals[1]-vals[0]:+.4f}", flush=True)
lines = ["# `hook_embed` with repeated tokens tied", "",
         "Row-mean adjacency score at `hook_embed`, 256 held-out prompts (prompt seed 1), by "
         "`docs/measured/scripts/hook_embed_ties.py`: tied = equal embeddings get equal cosines (ties fail, as "
         "documented; the code since 2026-12-03); product = the cosines as the matrix product gave them (before).",
         "", "| model | task | tied | product | product - tied |", "|---|---|---|---|---|"]
lines += [f"| {r[0]} | {r[1]} | {r[3]:.4f} | {r[4]:.4f} | {r[4] - r[3]:+.4f} |" for r in rows]
d = [r[4] - r[3] for r in rows]
lines += ["", f"{len(rows)} models: product - tied from {min(d):+.4f} to {max(d):+.4f}; tied scores "
          f"{min(r[3] for r in rows):.3f}-{max(r[3] for r in rows):.3f} (product "
          f"{min(r[4] for r in rows):.3f}-{max(r[4] for r in rows):.3f})."]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
