"""Benchmark: the adjacency score on long sequences.

Compares, at n in {256, 1024, 4096} positions and d_model 768 (one random sequence):
  ours   = cosine_similarity_matrix + adjacency_score, cosine matrix included (on the CPU the compiled
           merge-sort counter of nope_interp.ckernel);
  torch  = the same with NOPE_INTERP_C_KERNEL=0: the vectorised torch counter (the fallback, and the CUDA path);
  naive  = cosine matrix + the all-pairs vectorised reference (adjacency_counts_naive), where it finishes
           within --naive-max-n;
  scipy  = scipy.stats.kendalltau row by row on the same cosine matrix (cosine excluded; tau-b, so
           comparable only without ties, which random float data has none of).
Each measurement runs in a fresh subprocess so its peak resident memory (ru_maxrss) is its own.
Prints a table of seconds, ratios (reference / ours) and peak MB. Usage:
    .venv/bin/python bench/adjacency.py [--sizes 256 1024 4096] [--device cpu|cuda] [--repeats 3]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _one(method: str, n: int, device: str, repeats: int) -> dict:
    import numpy as np
    import torch
    from scipy.stats import kendalltau

    from nope_interp.similarity import adjacency_counts_naive, adjacency_score_of_activations, cosine_similarity_matrix

    x = torch.randn(n, 768, generator=torch.Generator().manual_seed(0)).to(device)
    times, score = [], None
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if method in ("ours", "torch"):
            score = float(adjacency_score_of_activations(x))
        elif method == "naive":
            c = cosine_similarity_matrix(x)
            counts = adjacency_counts_naive(c, max_elements=2**26).double()
            k = torch.arange(n, device=c.device, dtype=torch.float64)
            score = float((counts[2:] / (k * (k - 1) / 2)[2:]).mean())
        else:  # scipy: cosine excluded from the timing
            c = cosine_similarity_matrix(x).cpu().numpy()
            t0 = time.perf_counter()
            rows = [(1 + kendalltau(np.arange(k), c[k, :k]).statistic) / 2 for k in range(2, n)]
            score = float(np.mean(rows))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "n": n, "seconds": min(times), "score": score, "peak_mb": peak_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-max-n", type=int, default=1024, help="skip the naive reference above this n")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.device, args.repeats)))
        return
    import torch

    print(f"adjacency-score benchmark, d_model 768, device {args.device}, torch threads {torch.get_num_threads()}")
    print(f"{'n':>6} {'ours s':>8} {'torch s':>8} {'naive s':>9} {'scipy s':>9} {'torch/ours':>10} {'naive/ours':>11} "
          f"{'scipy/ours':>11} "
          f"{'ours MB':>8} {'naive MB':>9} {'same score':>10}")
    for n in args.sizes:
        res = {}
        for method in ("ours", "torch", "naive", "scipy"):
            if method == "naive" and n > args.naive_max_n:
                continue
            repeats = 1 if method != "ours" else args.repeats
            env = {**os.environ, "NOPE_INTERP_C_KERNEL": "0" if method == "torch" else "1"}
            out = subprocess.run([sys.executable, __file__, "--one", method, str(n), "--device", args.device,
                                  "--repeats", str(repeats)], capture_output=True, text=True, check=True, env=env)
            res[method] = json.loads(out.stdout.strip().splitlines()[-1])
        ours, naive, scipy_ = res["ours"], res.get("naive"), res["scipy"]
        same = all(abs(r["score"] - ours["score"]) < 1e-9 for r in res.values())
        naive_s = f"{naive['seconds']:.3f}" if naive else "-"
        naive_ratio = f"{naive['seconds'] / ours['seconds']:.1f}x" if naive else "-"
        naive_mb = f"{naive['peak_mb']:.0f}" if naive else "-"
        torch_ = res["torch"]
        print(f"{n:>6} {ours['seconds']:>8.3f} {torch_['seconds']:>8.3f} {naive_s:>9} {scipy_['seconds']:>9.3f} "
              f"{torch_['seconds'] / ours['seconds']:>9.1f}x {naive_ratio:>11} "
              f"{scipy_['seconds'] / ours['seconds']:>10.2f}x {ours['peak_mb']:>8.0f} {naive_mb:>9} {str(same):>10}",
              flush=True)


if __name__ == "__main__":
    main()
