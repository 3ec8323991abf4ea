"""Benchmark: greedy decoding of the test set, key-value-cached (what ``predict`` and the trainer's test run
now) vs rerunning the whole sequence for every new token (the reference, and what decoding does with hooks
attached). Same model, same prompts, same run; prints the time per 1,000 prompts, the ratio and whether the
answers agree. A full 20,000-prompt test of reversal took about 13 minutes on one thread before the cache.

Usage: .venv/bin/python bench/decode.py [--tasks reversal addition ordering indexing] [--n 1024] [--threads 1]
"""

import argparse
import time

import torch

import tasks
from nope_interp import pretrained
from nope_interp.evaluate import greedy_decode, kv_cache_unsupported


def recomputed(model: torch.nn.Module, toks: torch.Tensor, n_new: int) -> torch.Tensor:
    """The reference: the whole sequence through the model for each new token."""
    with torch.inference_mode():
        for _ in range(n_new):
            toks = torch.cat([toks, model(toks, return_type="logits")[:, -1].argmax(-1, keepdim=True)], dim=1)
    return toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(tasks.TASK_NAMES))
    ap.add_argument("--n", type=int, default=1024, help="prompts per task (one batch)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'task':10s} {'prompt':>6s} {'new':>4s} {'cached s/1k':>12s} {'recomputed s/1k':>16s} {'ratio':>6s} agree")
    for name in args.tasks:
        model = pretrained.load_pretrained(name).model
        assert kv_cache_unsupported(model) is None
        task = tasks.get_task(name)
        prompts = [ex.prompt for ex in task.splits(args.n, 1, seed=7).train]
        length = max(map(len, prompts))
        toks = task.prompt_tokens([p for p in prompts if len(p) == length])  # one length: one batch
        n_new = task.max_answer_len + 1
        t0 = time.perf_counter()
        cached = greedy_decode(model, toks, n_new)
        t1 = time.perf_counter()
        ref = recomputed(model, toks, n_new)[:, toks.shape[1]:]
        t2 = time.perf_counter()
        per_k = 1000 / toks.shape[0]
        print(f"{name:10s} {toks.shape[1]:6d} {n_new:4d} {(t1 - t0) * per_k:12.2f} {(t2 - t1) * per_k:16.2f} "
              f"{(t1 - t0) / (t2 - t1):6.3f} {bool(torch.equal(cached, ref))}")


if __name__ == "__main__":
    main()
