"""Why do packed indexing models with dropout stay at chance? Do they know where a digit sits in its number?

Indexing asks for the index of the first occurrence of a digit in a 9-digit number. A model trained on packed
windows sees each line start anywhere in its window, so the index of a digit inside its number is a position
relative to the line's `(`, not to the window's start; a NoPE model has to build it from causal attention.
This script fits linear probes (ridge regression, scikit-learn) on the residual stream of held-out `window`
inputs (64 characters of newline-joined test lines) for two targets at the digits of every complete
9-digit number: the digit's index in its number (0-8; what the task needs) and its position in the window
(0-63; what causal averaging gives for free); and at the `=` that ends each complete line, two probes of the
lookup the task needs: which of the nine digits equal the target digit (ridge, mean held-out ROC AUC over the
nine indices; 0.5 = nothing) and the answer itself (logistic regression, held-out accuracy beside the majority
answer's share). Score of the first two (fit on the first half of the inputs, scored on the second half less every line that also occurs in the first, since windows cut from one text share lines): R^2 on windows held out from the fit (half of them), and
the share of digits whose rounded prediction is the true index. Models: the packed 6x128 indexing
candidates (with and without dropout / tied embeddings), each beside its initialised twin (same config,
untrained), and the answer-only dropout model at 99% under the `full` protocol (its number always starts at
position 7). Every model's exact match on the same inputs is printed beside it.

Run: .venv/bin/python docs/measured/scripts/indexing_digit_index_probe.py [--n 512] [--out FILE.md]
(about 10 minutes on one thread at --n 512)
"""
import argparse
import re
import sys

import numpy as np
import torch
from sklearn.linear_model import LogisticRegressionCV, RidgeCV
from sklearn.metrics import roc_auc_score

import tasks
from nope_interp.evaluate import exact_match_on_inputs
from nope_interp.model import build_model
from nope_interp.pretrained import CANDIDATES_DIR, load_run
from tasks.vocab import encode_tensor

MODELS = [
    ("indexing-packed-6l-nodrop-s0", "packed, untied, no dropout"),
    ("indexing-packed-6l-nodrop-s1", "packed, untied, no dropout"),
    ("indexing-packed-6l-tied-s0", "packed, tied, no dropout"),
    ("indexing-packed-6l-dropout-s0", "packed, untied, dropout 0.1"),
    ("indexing-packed-6l-s0", "packed, tied, dropout 0.1"),
    ("indexing-paperlr80k-dropout-s0", "answer-only, untied, dropout 0.1"),
]
NUMBER = re.compile(r"wherex\((\d{9}),")
LINE = re.compile(r"wherex\((\d{9}),(\d)\)=")


def digit_targets(inputs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(window, pos) of every digit of every complete 9-digit number, its index in the number, and the number
    (the key of :func:`split`)."""
    win, pos, idx, key = [], [], [], []
    for w, text in enumerate(inputs):
        for m in NUMBER.finditer(text):
            for k in range(9):
                win.append(w)
                pos.append(m.start(1) + k)
                idx.append(k)
                key.append(m.group(1))
    return np.array(win), np.array(pos), np.array(idx), np.array(key)


def split(win: np.ndarray, key: np.ndarray, n_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Fit rows (the first half of the windows) and held-out rows (the other half, less every row whose line
    also occurs in the fit half: windows cut at random offsets of one text share lines)."""
    fit = win < n_windows // 2
    return fit, ~fit & ~np.isin(key, key[fit])


def equals_targets(inputs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(window, pos) of the `=` of every complete line with a 9-digit number, its answer (0-8), and for each
    index k of the number whether digit k equals the target digit (the set the answer is the first of), and
    the line (the key of :func:`split`)."""
    win, pos, answer, match, key = [], [], [], [], []
    for w, text in enumerate(inputs):
        for m in LINE.finditer(text):
            x, t = m.group(1), m.group(2)
            key.append(m.group(0))
            win.append(w)
            pos.append(m.end() - 1)
            answer.append(x.index(t))
            match.append([c == t for c in x])
    return np.array(win), np.array(pos), np.array(answer), np.array(match, dtype=float), np.array(key)


def classify(x: np.ndarray, y: np.ndarray, train: np.ndarray, held: np.ndarray) -> float:
    """Held-out accuracy of a multinomial logistic-regression probe (C by 3-fold CV on the training half)."""
    fit = LogisticRegressionCV(Cs=7, cv=3, max_iter=2000).fit(x[train], y[train])
    return float((fit.predict(x[held]) == y[held]).mean())


def match_auc(x: np.ndarray, match: np.ndarray, train: np.ndarray, held: np.ndarray) -> float:
    """Mean over the nine indices of the held-out ROC AUC of a ridge probe for "digit k is the target digit"."""
    fit = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x[train], match[train])
    pred = fit.predict(x[held])
    return float(np.mean([roc_auc_score(match[held][:, k], pred[:, k]) for k in range(match.shape[1])]))


def probe(x: np.ndarray, y: np.ndarray, train: np.ndarray, held: np.ndarray) -> tuple[float, float]:
    """Held-out R^2 and rounded-exact share of a ridge probe (alpha by leave-one-out on the training half)."""
    fit = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x[train], y[train])
    pred = fit.predict(x[held])
    truth = y[held]
    r2 = 1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()
    exact = float((np.clip(np.rint(pred), truth.min(), truth.max()) == truth).mean())
    return float(r2), exact


def measure(model, inputs: list[str]) -> list[tuple[str, float, float, float, float]]:
    win, pos, idx, key = digit_targets(inputs)
    ewin, epos, answer, match, ekey = equals_targets(inputs)
    tokens = torch.stack([encode_tensor(t) for t in inputs])
    names = ["hook_embed"] + [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    n_windows = len(inputs)
    train, held = split(win, key, n_windows)
    etrain, eheld = split(ewin, ekey, n_windows)
    rows = []
    for name in names:
        x = cache[name][torch.as_tensor(win), torch.as_tensor(pos)].float().numpy()
        r2_idx, ex_idx = probe(x, idx.astype(float), train, held)
        r2_pos, _ = probe(x, pos.astype(float), train, held)
        xe = cache[name][torch.as_tensor(ewin), torch.as_tensor(epos)].float().numpy()
        rows.append((name, r2_idx, ex_idx, r2_pos, match_auc(xe, match, etrain, eheld),
                     classify(xe, answer, etrain, eheld)))
    majority = float((answer[eheld] == np.bincount(answer[etrain]).argmax()).mean())
    return rows, majority


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=512, help="window inputs (default 512)")
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    lines = ["| model | recipe | weights | protocol | exact match on these inputs | site | digit index R^2 | "
             "index exact | window position R^2 | at `=`: match-set AUC | at `=`: answer probe accuracy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, recipe in MODELS:
        run = load_run(CANDIDATES_DIR / name)
        answer_only = run.train_cfg.objective == "answer_only"
        protocol = "full" if answer_only else "window"
        inputs = (tasks.protocol_inputs(run.task, "full", args.n, 1, run.train_prompts) if answer_only
                  else tasks.protocol_inputs(run.task, "window", args.n, 1, run.train_prompts, 64))
        if answer_only:  # full prompts: keep those with 9-digit numbers (the probe's targets)
            inputs = [p for p in inputs if NUMBER.match(p)]
        acc = exact_match_on_inputs(run.model, run.task, inputs).exact_match
        for label, model in (("trained", run.model.eval()), ("initialised", build_model(run.model_cfg).eval())):
            rows, majority = measure(model, inputs)
            for site, r2_idx, ex_idx, r2_pos, auc, ans in rows:
                lines.append(f"| `{name}` | {recipe} | {label} | {protocol} | "
                             f"{acc if label == 'trained' else float('nan'):.3f} | `{site}` | {r2_idx:.3f} | "
                             f"{ex_idx:.3f} | {r2_pos:.3f} | {auc:.3f} | {ans:.3f} |")
        lines.append(f"| `{name}` | | | | | majority answer (held-out half) | | | | | {majority:.3f} |")
        print(f"{name}: done", file=sys.stderr, flush=True)
    header = ["# Digit-index and lookup probes of the packed indexing models", "",
              f"Made by `docs/measured/scripts/indexing_digit_index_probe.py --n {args.n}` ({args.n} window inputs of "
              "64 characters per packed model, up to as many full prompts for the answer-only one; probes fit "
              "on half of the inputs, scored on the other half less the lines that also occur in the first). "
              "Exact match: the model's greedy answer to the "
              "last complete prompt of each input.", ""]
    text = "\n".join(header + lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
