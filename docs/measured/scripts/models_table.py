"""Every trained task model in the repository in one table: docs/measured/models.md.

Reads only the files each run folder holds (config.json, summary.json; in-progress folders: metrics.jsonl),
so the table is regenerated after any model is added:

    .venv/bin/python docs/measured/scripts/models_table.py            # writes docs/measured/models.md
"""

import json
import re
import sys
from pathlib import Path

from nope_interp import io
from nope_interp.pretrained import stored_dtype
from nope_interp.stats import fmt_fraction

ROOT = Path(__file__).resolve().parents[3]
PRETRAINED = ROOT / "nope_interp" / "pretrained"
OUT = ROOT / "docs" / "measured" / "models.md"
GPU = ROOT / "docs" / "measured" / "gpu"  # the GPU runs' logs: their folders stayed on the device machine
GPU_LINE = re.compile(r"^(\w+): test exact match ([\d.]+) after (\d+) steps \((\d+) s on cuda")
WHERE = {".": "shipped (in the wheel)", "seeds": "extra seed", "candidates": "candidate",
         "candidates/in-progress": "in progress (resume with --resume)"}


def _row(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if not summary:  # in progress: the last complete metrics line
        last = {}
        for line in (folder / "metrics.jsonl").read_text().splitlines():
            try:
                last = json.loads(line)
            except json.JSONDecodeError:  # a half-written last line
                break
        summary = {"steps": last.get("step"), "train_wall_time_s": last.get("wall_time_s")}
    m, t = cfg["model"], cfg["train"]
    objective = t.get("objective", "answer_only")
    extras = [x for x, on in (("tied", m.get("tied_embeddings")), (f"dropout {m.get('dropout')}", m.get("dropout")))
              if on]
    acc = summary.get("test_acc")
    return {
        "run": folder.relative_to(PRETRAINED).as_posix(),
        "where": WHERE.get(folder.parent.relative_to(PRETRAINED).as_posix(), folder.parent.name),
        "task": cfg["task"]["name"], "objective": objective + (f", window {t.get('window')}" if objective == "packed"
                                                               else ""),
        "shape": f"{m['n_layers']}x{m['d_model']}" + (", " + ", ".join(extras) if extras else ""),
        "lr": t["lr"], "seed": m["seed"], "steps": summary.get("steps") or 0, "max_steps": t["steps"],
        "test_acc": acc, "at_99": None if acc is None else acc >= 0.99,
        "minutes": None if summary.get("train_wall_time_s") is None else summary["train_wall_time_s"] / 60,
        "threads": summary.get("torch_threads"), "cpu": summary.get("cpu"),
        "stored": _stored(folder),
    }


def gpu_lines() -> list[str]:
    """The GPU runs of the paper's shape and recipe, read from their logs (their run folders, configs and
    summaries stayed on the device machine): one row per task, a resumed run's segments added up."""
    runs: dict[str, dict] = {}
    for log in ("main.log", "resume.log"):
        for line in (GPU / log).read_text().splitlines():
            if m := GPU_LINE.match(line):
                run = runs.setdefault(m[1], {"seconds": 0, "logs": []})
                run.update(test_acc=float(m[2]), steps=int(m[3]))
                run["seconds"] += int(m[4])
                run["logs"].append(log)
    lines = ["## The GPU runs (not in the repository)", "",
             "The paper's shape and recipe (`bench/paper_recipe_gpu.py`: 6x384, 6 heads, tied embeddings, dropout "
             "0.2, packed 256-character windows, batch 256, lr 2.6441e-4, cosine to 5,000 steps) on one H200 "
             "(TF32), 2026-12-04, read from the run logs in `docs/measured/gpu/` (the four trained at once, then "
             "reversal resumed alone; time: the trainer's clock, segments added). Their weights are not in the repository.", "",
             "| task | steps (of 5,000) | test exact match | at 99% | GPU time (min) | logs |", "|---|---|---|---|---|---|"]
    for task in ("addition", "reversal", "indexing", "ordering"):
        if task in runs:
            r = runs[task]
            lines.append(f"| {task} | {r['steps']:,} | {fmt_fraction(r['test_acc'])} | "
                         f"{'yes' if r['test_acc'] >= 0.99 else '**no**'} | {r['seconds'] / 60:.1f} | "
                         f"{', '.join(r['logs'])} |")
    return lines


def _stored(folder: Path) -> str:
    """How ``model.safetensors`` stores the weights (:func:`nope_interp.pretrained.stored_dtype`)."""
    path = folder / "model.safetensors"
    return stored_dtype(io.load_weights(path)) if path.exists() else "-"


def main() -> int:
    folders = sorted({p.parent for p in PRETRAINED.rglob("config.json")
                      if "text" not in p.relative_to(PRETRAINED).parts
                      and ((p.parent / "summary.json").exists() or (p.parent / "metrics.jsonl").exists())})
    rows = [r for r in (_row(f) for f in folders) if r["task"] in ("addition", "reversal", "indexing", "ordering")]
    order = {"addition": 0, "reversal": 1, "indexing": 2, "ordering": 3}
    rows.sort(key=lambda r: (order[r["task"]], r["objective"], r["shape"], -r["lr"], r["max_steps"], r["seed"],
                             r["run"]))
    lines = ["# Every trained task model in the repository", "",
             "Generated by `docs/measured/scripts/models_table.py` from each folder's `config.json` and "
             "`summary.json`. Test exact match: greedy decoding on the 20,000 held-out test prompts. Wall time: "
             "the trainer's own clock, on this project's 2-core CPU machines (often with the cores shared by two "
             "trainings; `threads` = torch threads). `at 99%`: the paper's stop. "
             "Text models (`text/`) are language models without a test exact match and are not listed. `weights`: "
             "how the file stores them (candidates and extra seeds are stored at float16, the shipped models at "
             "float32; the test exact match is the float32 model's, and what float16 moves is in "
             "`half_precision/half_precision.md`).", "",
             "| run | where | task | objective | shape | lr | seed | steps (of max) | test exact match | at 99% "
             "| wall time (min) | threads | CPU | weights |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = "-" if r["test_acc"] is None else fmt_fraction(r["test_acc"])
        at = "-" if r["at_99"] is None else ("yes" if r["at_99"] else "**no**")
        mins = "-" if r["minutes"] is None else f"{r['minutes']:.0f}"
        lines.append(f"| `{r['run']}` | {r['where']} | {r['task']} | {r['objective']} | {r['shape']} | {r['lr']:g} "
                     f"| {r['seed']} | {r['steps']:,} of {r['max_steps']:,} | {acc} | {at} | {mins} "
                     f"| {r['threads'] or '-'} | {r['cpu'] or '-'} | {r['stored']} |")
    lines += ["", *gpu_lines()]
    OUT.write_text("\n".join(lines) + "\n")
    sys.stdout.write(f"wrote {OUT} ({len(rows)} models)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
