"""How well the MLP position probe is fitted: the probe before 2026-12-03 (Adam, early stopping after 8 epochs
without gain, at most 150 epochs), the probe now (patience 30, at most 1,000 epochs), the same MLP fitted by
L-BFGS to convergence without a validation split, and ridge, on the shipped models and freshly initialised
`cpu`-preset models: held-out NRMSE (chance 1.0), mean ± std over split seeds 0, 1, 2, on the probe job's
inputs (held-out prompts, prompt seed 1, full protocol). Writes a Markdown table.

Usage: .venv/bin/python docs/measured/scripts/mlp_fit.py OUT.md   (about 10 min on one thread)
"""

import sys
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from nope_interp import probing
from nope_interp.activations import collect_activations
from nope_interp.jobs import probe as probe_job
from nope_interp.jobs.common import entry_tokens

warnings.simplefilter("ignore", ConvergenceWarning)
MLP = {"hidden_layer_sizes": (32,) * 4}
PROBES = {
    "old (patience 8, <= 150 epochs)": lambda s: make_pipeline(StandardScaler(), MLPRegressor(
        **MLP, max_iter=150, early_stopping=True, n_iter_no_change=8, tol=1e-4, random_state=s,
        learning_rate_init=2e-3)),
    "now (patience 30, <= 1,000 epochs)": lambda s: probing.make_probe("mlp", s),
    "L-BFGS, no validation split": lambda s: make_pipeline(StandardScaler(), MLPRegressor(
        **MLP, solver="lbfgs", max_iter=2000, alpha=1e-3, random_state=s)),
    "ridge": lambda s: probing.make_probe("ridge", s),
}
CASES = [  # (task, model label, site, n_prompts)
    ("addition", "trained", "blocks.0.attn.hook_z", 64), ("addition", "trained", "blocks.0.attn.hook_z", 256),
    ("addition", "initialised", "blocks.0.hook_resid_post", 64),
    ("reversal", "initialised", "blocks.0.hook_resid_post", 64),
    ("reversal", "trained", "blocks.2.hook_resid_post", 64),
    ("ordering", "trained", "blocks.0.attn.hook_z", 64), ("ordering", "initialised", "blocks.5.hook_resid_post", 64),
    ("indexing", "trained", "blocks.5.hook_resid_post", 64),
]


def nrmse(make, X, y, g, seed):
    rng = np.random.default_rng(seed)  # the split of probing.fit_position_probe
    seqs = np.unique(g)
    test = np.isin(g, rng.choice(seqs, size=max(1, round(0.25 * len(seqs))), replace=False))
    model = make(seed).fit(X[~test], y[~test])
    return probing.score_predictions(y[test], model.predict(X[test])).nrmse


def main(out: str) -> None:
    lines = ["| task | model | site | prompts (rows) | feature | " + " | ".join(PROBES) + " |",
             "|---" * (5 + len(PROBES)) + "|"]
    entries = {}
    for task, label, site, n in CASES:
        if task not in entries:
            entries[task] = probe_job.default_models(probe_job.ProbeConfig(tasks=(task,)))
        entry = next(e for e in entries[task] if e.label == label)
        _, _, tokens = entry_tokens(entry, n, 1, "full")
        acts = collect_activations(entry.model, tokens)
        a = acts.acts[acts.labels.index(site)]
        for feature in ("cos_profile", "variance"):
            X, y, g = probing.position_features(a, feature)
            cells = []
            for make in PROBES.values():
                v = [nrmse(make, X, y, g, s) for s in (0, 1, 2)]
                cells.append(f"{np.mean(v):.3f} ± {np.std(v):.3f}")
            lines.append(f"| {task} | {label} | `{site}` | {n} ({len(y)}) | {feature} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    head = (f"# MLP position probe: how well it is fitted\n\nMeasured {time.strftime('%Y-%m-%d')} by "
            "`docs/measured/scripts/mlp_fit.py`: held-out NRMSE (chance 1.0; mean ± std over split seeds 0, 1, 2) of "
            "each probe on the same features and split.\n\n")
    open(out, "w").write(head + "\n".join(lines) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1])
