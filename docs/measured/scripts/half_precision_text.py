"""What storing the language models' weights at half precision does to their measurements:
docs/measured/half_precision/text.{md,json}.

The ``train-text`` models (``nope_interp/pretrained/text/<name>/``) are only analysed, never trained on again, so
their weights may be stored at float16 if no measurement of them moves. This script copies each model folder
twice into a scratch folder, stores one copy at float16 (:func:`nope_interp.pretrained.halve`; both copies are
computed in float32), and measures both copies the same way:

- held-out bits per character at 1x and 2x the training window (as ``train-text`` writes into summary.json);
- everything ``docs/measured/scripts/text_models.sh`` measures (``long-context`` within and past the window,
  ``ablate``, ``probe``): every numeric column of every CSV it writes, row by row.

It writes the largest change per CSV column (float16 - float32), and also compares the fresh float32 run with
the CSVs kept in ``docs/measured/text/`` (a check that the measurements are repeatable at all). With ``--convert``
the shipped folders are then stored at float16, but only if no bits-per-character value moved by more than
``--max-bpc-change`` and no other measured column (the probes' reported, not gated) by more than
``--max-score-change``.

    .venv/bin/python docs/measured/scripts/half_precision_text.py [--convert] [--scratch DIR] [--reuse]
        [FOLDER ...]
"""

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from nope_interp import io
from nope_interp.model import with_context
from nope_interp.pretrained import halve, stored_dtype
from nope_interp.text_train import available_text_models, bits_per_char, eval_tokens, load_text_run

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "docs" / "measured" / "half_precision"
KEPT = ROOT / "docs" / "measured" / "text"
FILES = (io.CONFIG_FILE, io.WEIGHTS_FILE, io.METRICS_FILE, io.SUMMARY_FILE)
# CSV columns that are identifiers or settings, not measurements
IGNORED = {"seconds"}  # the clock, neither an identifier nor a measurement
NOT_MEASURED = {"sequences", "input_seed", "n", "seed", "draw_seed", "score_n_seeds", "gap_n_seeds", "probe_converged",
                "shuffled_baseline_converged"}


def bpc(folder: Path) -> dict[str, float | None]:
    model, model_cfg, cfg = load_text_run(folder)
    out: dict[str, float | None] = {"bpc_1x": bits_per_char(model, eval_tokens(cfg.eval_windows, cfg.window))}
    if model_cfg.positional != "learned" or model_cfg.n_ctx >= 2 * cfg.window:
        long_model, _ = with_context(model, model_cfg, 2 * cfg.window)
        out["bpc_2x"] = bits_per_char(long_model, eval_tokens(cfg.eval_windows, 2 * cfg.window))
    else:
        out["bpc_2x"] = None
    return out


def text_measurements(models_dir: Path, out: Path, run: bool = True) -> dict[str, list[dict[str, str]]]:
    """Run text_models.sh on the folders in ``models_dir`` (unless ``run`` is False: what ``out`` holds already);
    {csv name: rows} of what it wrote."""
    if run:
        env = {**os.environ, "BIN": str(ROOT / ".venv" / "bin" / "nope-interp"), "OMP_NUM_THREADS": "1"}
        t0 = time.time()
        subprocess.run(["bash", str(ROOT / "docs/measured/scripts/text_models.sh"), str(models_dir), str(out)],
                       check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        print(f"  text_models.sh on {models_dir}: {time.time() - t0:.0f} s", flush=True)
    found = {}
    for path in sorted(out.rglob("*.csv")):
        with path.open() as f:
            found[path.relative_to(out).as_posix()] = list(csv.DictReader(f))
    return found


def _number(value: str) -> float | None:
    try:
        x = float(value)
    except ValueError:
        return None
    return None if math.isnan(x) else x


def _key(row: dict[str, str]) -> tuple:
    """What identifies a row: its non-numeric columns and its settings (a path reduced to its last part)."""
    return tuple((col, Path(v).name if "/" in v else v) for col, v in row.items() if col not in IGNORED
                 and (col in NOT_MEASURED or _number(v) is None and v.lower() != "nan"))


def compare(a: list[dict[str, str]], b: list[dict[str, str]], where: str) -> dict[str, float]:
    """Largest |b - a| per numeric column over the rows of ``a`` (matched to ``b``'s by :func:`_key`)."""
    index = {}
    for row in b:
        index.setdefault(_key(row), []).append(row)
    worst: dict[str, float] = {}
    for ra in a:
        matches = index.get(_key(ra), [])
        if len(matches) != 1:
            raise SystemExit(f"{where}: {len(matches)} rows match {dict(_key(ra))}: not the same measurement")
        for col, value in ra.items():
            if col in NOT_MEASURED or col in IGNORED:
                continue
            xa, xb = _number(value), _number(matches[0].get(col, ""))
            if xa is not None and xb is not None:
                worst[col] = max(worst.get(col, 0.0), abs(xb - xa))
    return worst


def probe_means(measured: dict[str, dict[str, list[dict[str, str]]]]) -> list[dict]:
    """Per (feature, probe, inputs): the largest |change| of the seed-mean probe NRMSE (float16 - float32) over
    models and sites, and the largest |seed 0 - seed 1| of the float32 runs."""
    name = "results/probe/probe.csv"
    groups: dict[tuple, dict[str, dict[str, float]]] = {}
    for precision in ("float32", "float16"):
        for r in measured[precision].get(name, []):
            key = (r["model"], r["site"], r["feature"], r["probe"], r["inputs"])
            groups.setdefault(key, {}).setdefault(precision, {})[r["seed"]] = float(r["probe_nrmse"])
    out: dict[tuple, dict] = {}
    for (_, _, feature, probe, inputs), by in groups.items():
        row = out.setdefault((feature, probe, inputs), {"feature": feature, "probe": probe, "inputs": inputs,
                                                        "change": 0.0, "seed_spread": 0.0})
        a, b = by["float32"], by["float16"]
        row["change"] = max(row["change"], abs(sum(b.values()) / len(b) - sum(a.values()) / len(a)))
        row["seed_spread"] = max(row["seed_spread"], max(a.values()) - min(a.values()))
    return [out[k] for k in sorted(out)]


def kept_csvs() -> dict[str, list[dict[str, str]]]:
    """The float32 CSVs kept in docs/measured/text/ (the three models' and, in ``hybrid/``, the hybrid's, measured
    apart), under the names text_models.sh writes."""
    names = {"long_context_within.csv": "within/results/long_context/summary.csv",
             "long_context_past.csv": "past/results/long_context/summary.csv",
             "ablate.csv": "results/ablate/ablate.csv", "probe.csv": "results/probe/probe.csv"}
    kept: dict[str, list[dict[str, str]]] = {}
    for prefix in ("", "hybrid/"):
        for stored, written in names.items():
            path = KEPT / (prefix + stored)
            if path.is_file():
                with path.open() as f:
                    kept.setdefault(written, []).extend(csv.DictReader(f))
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="text model folders (default: the shipped ones)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/half_precision_text"))
    parser.add_argument("--convert", action="store_true", help="then store the folders at float16")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the copies and measurements of a precision already complete in --scratch")
    parser.add_argument("--max-bpc-change", type=float, default=0.001)
    parser.add_argument("--max-score-change", type=float, default=0.001)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    folders = args.folders or available_text_models()
    for folder in folders:
        dtype = stored_dtype(io.load_weights(folder / io.WEIGHTS_FILE))
        if dtype != "float32":
            raise SystemExit(f"{folder}: stored as {dtype} already: no float32 reference to compare with")
    done = {p: args.reuse and (args.scratch / f"out-{p}" / "results" / "probe" / "probe.csv").is_file()
            for p in ("float32", "float16")}
    for precision in done:
        if not done[precision]:
            shutil.rmtree(args.scratch / precision, ignore_errors=True)
            shutil.rmtree(args.scratch / f"out-{precision}", ignore_errors=True)
    report: dict = {"models": [f.name for f in folders], "bpc": {}, "csv_float16_vs_float32": {},
                    "csv_float32_vs_kept": {}}
    measured = {}
    for precision in ("float32", "float16"):
        models_dir = args.scratch / precision
        for folder in folders:
            dest = models_dir / folder.name
            if not done[precision]:
                dest.mkdir(parents=True)
                for name in FILES:
                    shutil.copyfile(folder / name, dest / name)
                if precision == "float16":
                    halve(dest)
            report["bpc"].setdefault(folder.name, {})[precision] = bpc(dest)
            print(f"{folder.name} {precision}: {report['bpc'][folder.name][precision]}", flush=True)
        measured[precision] = text_measurements(models_dir, args.scratch / f"out-{precision}",
                                                run=not done[precision])
    bpc_change = max(abs(p["float16"][k] - p["float32"][k]) for p in report["bpc"].values()
                     for k in p["float32"] if p["float32"][k] is not None)
    for name, rows in measured["float32"].items():
        report["csv_float16_vs_float32"][name] = compare(rows, measured["float16"][name], name)
    for name, rows in kept_csvs().items():
        if name in measured["float32"]:
            try:
                report["csv_float32_vs_kept"][name] = compare(rows, measured["float32"][name], f"kept {name}")
            except SystemExit as err:  # kept from an older version of the command: said, not compared
                print(f"not compared with the kept CSV: {err}", flush=True)
    # the gate: every column but the probes' (a probe is a fitted model whose fit moves with any change of its
    # inputs, as between its seeds: reported per feature below, as the mean over seeds the README quotes)
    score_change = max((v for name, cols in report["csv_float16_vs_float32"].items() if "probe" not in name
                        for v in cols.values()), default=0.0)
    report["probe_seed_mean_nrmse_change"] = probe_means(measured)
    report.update(max_bpc_change=bpc_change, max_score_change=score_change,
                  bytes={f.name: (f / io.WEIGHTS_FILE).stat().st_size for f in folders})
    OUT.mkdir(parents=True, exist_ok=True)
    io.write_json(OUT / "text.json", report)
    lines = ["# The language models' weights at half precision: what moves", "",
             "Generated by `docs/measured/scripts/half_precision_text.py`: each `train-text` model's float32 weights "
             "and the same", "weights rounded to float16, both loaded into a float32 model and measured the same "
             "way.", "", "| model | bpc 1x float32 | float16 | bpc 2x float32 | float16 |", "|---|---|---|---|---|"]
    for name, p in report["bpc"].items():
        two = (f"{p['float32']['bpc_2x']:.5f} | {p['float16']['bpc_2x']:.5f}" if p["float32"]["bpc_2x"] is not None
               else "- | -")
        lines.append(f"| {name} | {p['float32']['bpc_1x']:.5f} | {p['float16']['bpc_1x']:.5f} | {two} |")
    lines += ["", "Largest change, float16 - float32, per measured column of each CSV `text_models.sh` writes "
              "(and, beside it, fresh float32 against the CSV kept in `docs/measured/text/`, when kept):", "",
              "| CSV | column | float16 vs float32 | float32 vs kept |", "|---|---|---|---|"]
    for name, cols in report["csv_float16_vs_float32"].items():
        kept = report["csv_float32_vs_kept"].get(name, {})
        for col, value in cols.items():
            lines.append(f"| `{name}` | {col} | {value:.2e} | {kept[col]:.2e} |" if col in kept
                         else f"| `{name}` | {col} | {value:.2e} | - |")
    lines += ["", f"Largest bits-per-character change {bpc_change:.2e}; largest change of any measured column but "
              f"the probes' {score_change:.2e}.", "",
              "The probes: largest change of the NRMSE averaged over the probe's seeds (as the README quotes it), per "
              "feature, probe and inputs, over models and sites. A probe is a model fitted to the activations, so its "
              "fit moves with any change of them; for comparison, the largest difference between two seeds of the "
              "same probe (float32) is given beside it.", "",
              "| feature | probe | inputs | float16 vs float32 (mean over seeds) | seed 0 vs seed 1 (float32) |",
              "|---|---|---|---|---|"]
    for row in report["probe_seed_mean_nrmse_change"]:
        lines.append(f"| {row['feature']} | {row['probe']} | {row['inputs']} | {row['change']:.4f} | "
                     f"{row['seed_spread']:.4f} |")
    (OUT / "text.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT / 'text.md'} and {OUT / 'text.json'}")
    if args.convert:
        if bpc_change > args.max_bpc_change or score_change > args.max_score_change:
            raise SystemExit(f"not converted: bpc moved by {bpc_change:.2e} (limit {args.max_bpc_change}), scores "
                             f"by {score_change:.2e} (limit {args.max_score_change})")
        for folder in folders:
            print(f"stored at float16: {halve(folder)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
