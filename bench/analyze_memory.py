"""Benchmark: peak memory of ``analyze`` at 256 and 4,096 prompts (it must not grow with ``--n-prompts``).

Each size runs in a fresh Python process: build the model of ``--preset`` (an initialised model, as
``nope-interp analyze --init --task T --preset P``), then :func:`nope_interp.jobs.analyze.run` on ``N``
prompts at every hook site. The child reports its peak resident memory (``ru_maxrss``) before the analysis
(imports + model) and after it; the table gives both and the growth (peak - before), and the last line the
ratio of the largest size's peak and growth to the smallest's. Streaming keeps the ratio of the peaks near
1; the old code held every site of every prompt plus two float64 copies (growth proportional to N).
No timing: the numbers are memory only.

Usage: .venv/bin/python bench/analyze_memory.py [--preset paper] [--task reversal] [--n-prompts 256 4096]
"""

import argparse
import json
import resource
import subprocess
import sys


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(preset: str, task: str, n_prompts: int) -> None:
    """Run the analysis once in this process and print ``{"n", "before_mib", "peak_mib"}`` as JSON."""
    import torch

    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import ModelSource, load_models

    torch.set_num_threads(1)
    entries = load_models(ModelSource(init=True, task=task, preset=preset))
    before = _peak_mib()
    res = analyze.run(analyze.AnalyzeConfig(n_prompts=n_prompts), entries)
    assert res.models[0].analysis.n_prompts == n_prompts
    print(json.dumps({"n": n_prompts, "before_mib": before, "peak_mib": _peak_mib()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--task", default="reversal")
    parser.add_argument("--n-prompts", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.preset, args.task, args.child)
        return
    print(f"analyze peak memory: --init --task {args.task} --preset {args.preset}, one process per size")
    print(f"{'prompts':>8} {'before MiB':>11} {'peak MiB':>9} {'growth MiB':>11}")
    rows = []
    for n in args.n_prompts:
        out = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--task", args.task, "--child",
                              str(n)], check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(f"{n:>8} {row['before_mib']:>11.0f} {row['peak_mib']:>9.0f} "
              f"{row['peak_mib'] - row['before_mib']:>11.0f}", flush=True)
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        growth = (hi["peak_mib"] - hi["before_mib"]) / max(1.0, lo["peak_mib"] - lo["before_mib"])
        print(f"ratio {hi['n']} / {lo['n']} prompts: peak {hi['peak_mib'] / lo['peak_mib']:.2f}x, "
              f"growth {growth:.2f}x (prompts {hi['n'] / lo['n']:.0f}x)")


if __name__ == "__main__":
    main()
