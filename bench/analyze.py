"""Benchmark: ``analyze`` on 256 prompts at every layer and hook point, cpu preset (target: at most 5 s).

Times :func:`nope_interp.analysis.analyze_model` (prompt sampling, run_with_cache, cosine matrices,
both reductions of the adjacency score) for each task, and prints the share of the time spent in the
forward pass as a reference measured in the same process.
Usage: .venv/bin/python bench/analyze.py [--preset cpu] [--n-prompts 256] [--device cpu|cuda]
"""

import argparse
import time

import torch


def main() -> None:
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.model import build_model, preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--n-prompts", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    model = build_model(preset(args.preset), device=args.device)
    print(f"analyze benchmark: preset {args.preset}, {args.n_prompts} prompts, device {args.device}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'task':>9} {'analyze s':>10} {'forward s':>10} {'sites':>6}")
    for name in tasks.TASK_NAMES:
        task = tasks.get_task(name)
        analyze_model(model, task, 8)  # warm-up
        t0 = time.perf_counter()
        res = analyze_model(model, task, args.n_prompts)
        t_an = time.perf_counter() - t0
        toks = task.prompt_tokens(task.analysis_prompts(args.n_prompts)).to(args.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(toks, return_type=None)
        t_fwd = time.perf_counter() - t0
        print(f"{name:>9} {t_an:>10.2f} {t_fwd:>10.3f} {len(res.sites):>6}", flush=True)


if __name__ == "__main__":
    main()
