"""Seconds per optimizer step of bench/paper_recipe_gpu.py's model and batch on CUDA (TF32), and of one
evaluation (500 test prompts, greedy): to size the GPU session's time budget. Run from the repository root.
Usage: python3 gpu_step_time.py [DEVICE [BATCH]] (default cuda, the recipe's batch 256; cpu 2 tests it here)"""

import runpy
import sys
import time

import torch

import tasks as tasks_pkg
from nope_interp.evaluate import exact_match_accuracy
from nope_interp.model import build_model
from nope_interp.train import make_optimizer, optimizer_step

torch.backends.cuda.matmul.allow_tf32 = True
configs = runpy.run_path("bench/paper_recipe_gpu.py")["configs"]
model_cfg, cfg = configs(False, "reversal")
device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
cfg = cfg.replace(n_train=20_000, n_test=2_000, batch_size=int(sys.argv[2]) if len(sys.argv) > 2 else cfg.batch_size)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
task = cfg.make_task()
splits = task.splits(cfg.n_train, cfg.n_test, cfg.data_seed)
stream = tasks_pkg.packed_stream(splits.train, cfg.data_seed)
model = build_model(model_cfg, device=device)
opt = make_optimizer(model, cfg)
gen = torch.Generator().manual_seed(0)
for step in range(25):
    if step == 5:
        sync()
        t0 = time.perf_counter()
    optimizer_step(model, opt, tasks_pkg.packed_batch(stream, cfg.window, cfg.batch_size, gen), cfg, step)
sync()
per_step = (time.perf_counter() - t0) / 20
t0 = time.perf_counter()
acc = exact_match_accuracy(model, task, splits.test[:500], prefix=cfg.eval_prefix)
per_eval = time.perf_counter() - t0
print(f"step time: {per_step * 1000:.1f} ms per optimizer step (batch {cfg.batch_size} x {cfg.window}), "
      f"{per_eval:.2f} s per evaluation of 500 prompts (acc {acc:.3f}); "
      f"peak memory {torch.cuda.max_memory_allocated() / 2**30 if device.startswith('cuda') else 0:.1f} GiB; "
      f"5,000 steps alone: {5000 * per_step / 60:.1f} min + {20 * per_eval / 60:.1f} min of evaluations")
