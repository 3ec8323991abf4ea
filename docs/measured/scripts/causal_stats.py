"""The README's summary numbers of the layer-0 causal test, from a compare result (no model needed).

Reads ``docs/measured/compare/all-tasks.json`` (or the file given) and prints, over the trained models of
addition, indexing and ordering (and over all of them): the range of ``both`` (uniform attention and the
delimiters' values resampled from the digits'), the same on their step-0 weights, the share of the gap
that ``both`` closes on the answer-only ones, (both - none) / (both on the step-0 weights - none), where
``none`` is the trained model as it is, the digit-value participation ratio, and Spearman's rank correlation between the
participation ratio and ``both`` (scipy).

    .venv/bin/python docs/measured/scripts/causal_stats.py [compare.json]
"""
import json
import sys
from pathlib import Path

from scipy.stats import spearmanr

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "compare" / "all-tasks.json"
groups = json.loads(path.read_text())["groups"]
models = [(g["task"], g["recipe"], s) for g in groups for s in g["seeds"]]
other = [m for m in models if m[0] != "reversal"]
answer_only = [m for m in other if m[1].startswith("answer_only")]


def trained(m, key):
    return m[2]["diagnostics"]["trained"][key]


def span(values):
    return f"{min(values):.3f}-{max(values):.3f}"


print(f"{path}: {len(models)} models, {len(other)} of addition, indexing and ordering "
      f"({len(answer_only)} answer-only)")
print("both, trained:", span([trained(m, "l0_z_score_both") for m in other]))
print("both, step 0: ", span([m[2]["diagnostics"]["initialised"]["l0_z_score_both"] for m in other]))
closed = [(trained(m, "l0_z_score_both") - trained(m, "l0_z_score_none"))
          / (m[2]["diagnostics"]["initialised"]["l0_z_score_both"] - trained(m, "l0_z_score_none"))
          for m in answer_only]
print(f"gap closed by both, answer-only: {min(closed):.0%}-{max(closed):.0%}")
for name, ms in (("addition, indexing and ordering", other), ("answer-only of those", answer_only)):
    print(f"participation ratio, {name}:", span([trained(m, "digit_value_participation_ratio") for m in ms]))
print("participation ratio, reversal:",
      span([trained(m, "digit_value_participation_ratio") for m in models if m[0] == "reversal"]))
print("participation ratio, step 0:",
      span([m[2]["diagnostics"]["initialised"]["digit_value_participation_ratio"] for m in models]))
for name, ms in (("all", models), ("addition, indexing and ordering", other)):
    rho = spearmanr([trained(m, "digit_value_participation_ratio") for m in ms],
                    [trained(m, "l0_z_score_both") for m in ms]).statistic
    print(f"Spearman(participation ratio, both), {name} ({len(ms)}): {rho:.2f}")
