"""Benchmark: one long sequence through the analysis at every site of the ``cpu`` preset (time and peak memory).

Targets (issue 12): one 8,192-token sequence analysed at all sites in <= 60 s and <= 2 GB on 2 cores; the lag
profile adds <= 10%; both reductions of the adjacency score cost one count, not two. Each forward runs in a
fresh Python process, which reports its wall times and peak resident memory (``ru_maxrss``):

* ``hooked``: activations from ``run_with_cache`` (TransformerLens keeps every head's pos x pos scores and
  pattern): the reference for the forward pass (time and memory; its scores would be the same computation).
* ``fast``: :func:`nope_interp.analysis.analyze_tokens` with the fused hook-free activations
  (:func:`nope_interp.fast_forward.fast_activations`), as ``nope-interp long-context`` runs it.

Each child also times, on its activations, the adjacency scores of both reductions from one count
(:func:`~nope_interp.similarity.adjacency_scores_of_activations`) against one call of
:func:`~nope_interp.similarity.adjacency_score_of_activations` per reduction (two counts), and the lag profile at
``max_lag`` 31 (the ``long-context`` default) and at every lag (pos - 1). The last lines print the ratios.

Usage: .venv/bin/python bench/long_context.py [--n 8192] [--threads 2] [--skip-hooked]
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(mode: str, n: int, threads: int) -> None:
    """Analyse one random ``n``-token sequence at every site; print the timings and peak memory as JSON."""
    import torch

    from nope_interp.activations import collect_activations
    from nope_interp.config import preset
    from nope_interp.fast_forward import fast_activations
    from nope_interp.hooks import ACTIVATION_POINTS, activation_hook_names
    from nope_interp.model import build_model
    from nope_interp.similarity import adjacency_score_of_activations, adjacency_scores_of_activations, lag_profile

    torch.set_num_threads(threads)
    model = build_model(preset("cpu", n_ctx=n))
    tokens = torch.randint(0, model.cfg.d_vocab, (1, n), generator=torch.Generator().manual_seed(0))
    names = activation_hook_names(model.cfg.n_layers, ACTIVATION_POINTS)
    before = _peak_mib()
    t0 = time.perf_counter()
    if mode == "hooked":
        acts = collect_activations(model, tokens, ACTIVATION_POINTS, batch_size=1).acts
    else:
        got = fast_activations(model, tokens, names)
        acts = torch.stack([got[k].float() for k in names])
        del got
    t_fwd = time.perf_counter() - t0
    if mode == "hooked":  # the scores are the same computation on the same activations: time the forward only
        print(json.dumps({"mode": mode, "n": n, "sites": len(names), "forward_s": t_fwd, "before_mib": before,
                          "peak_mib": _peak_mib()}))
        return
    t0 = time.perf_counter()
    for i in range(len(names)):
        adjacency_scores_of_activations(acts[i])
    t_one_count = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(names)):
        for reduction in ("row_mean", "pooled"):
            adjacency_score_of_activations(acts[i], reduction)
    t_two_counts = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(names)):
        lag_profile(acts[i], max_lag=31)
    t_lag31 = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(len(names)):
        lag_profile(acts[i])
    t_lag_all = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "n": n, "sites": len(names), "forward_s": t_fwd, "scores_one_count_s": t_one_count,
                      "scores_two_counts_s": t_two_counts, "lag31_s": t_lag31, "lag_all_s": t_lag_all,
                      "before_mib": before, "peak_mib": _peak_mib()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-hooked", action="store_true", help="only the fused path (the hooked one needs ~5 GB)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.threads)
        return
    print(f"long-sequence analysis benchmark: cpu preset, one random sequence of {args.n} tokens, "
          f"{args.threads} threads, every site")
    rows = {}
    for mode in (("fast",) if args.skip_hooked else ("fast", "hooked")):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--n", str(args.n), "--threads",
                              str(args.threads)], capture_output=True, text=True, check=True)
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'forward':>8} {'sites':>5} {'fwd s':>7} {'scores s':>9} {'lag31 s':>8} {'lag all s':>9} "
          f"{'total s':>8} {'peak MiB':>9}")
    for mode, r in rows.items():
        if mode == "hooked":
            print(f"{mode:>8} {r['sites']:>5} {r['forward_s']:>7.2f} {'-':>9} {'-':>8} {'-':>9} {'-':>8} "
                  f"{r['peak_mib']:>9.0f}")
            continue
        total = r["forward_s"] + r["scores_one_count_s"] + r["lag31_s"]
        print(f"{mode:>8} {r['sites']:>5} {r['forward_s']:>7.2f} {r['scores_one_count_s']:>9.2f} {r['lag31_s']:>8.2f} "
              f"{r['lag_all_s']:>9.2f} {total:>8.2f} {r['peak_mib']:>9.0f}")
    f = rows["fast"]
    base = f["forward_s"] + f["scores_one_count_s"]
    print(f"fast total (forward + scores + lag profile to 31): {base + f['lag31_s']:.1f} s "
          f"(target <= 60 s), peak {f['peak_mib']:.0f} MiB (target <= 2048)")
    print(f"lag profile / (forward + scores): to lag 31 {f['lag31_s'] / base:.3f}, "
          f"to every lag {f['lag_all_s'] / base:.3f} (target <= 0.10)")
    print(f"scores, two counts / one count: {f['scores_two_counts_s'] / f['scores_one_count_s']:.2f}x")
    if "hooked" in rows:
        h = rows["hooked"]
        print(f"hooked / fast: forward time {h['forward_s'] / f['forward_s']:.2f}x, "
              f"peak memory {h['peak_mib'] / f['peak_mib']:.2f}x")


if __name__ == "__main__":
    main()
