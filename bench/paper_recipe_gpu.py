"""Train the paper's model with the paper's recipe on the four tasks: the GPU run, one command.

Shape ``paper-recipe`` (6 layers, d_model 384, 6 heads, tied embeddings, dropout 0.2) and the authors'
recipe: the packed objective (windows of 256 characters of the newline-joined training lines, loss on
every position), batch 256, AdamW betas (0.9, 0.99), weight decay 0.1, lr 2.6441e-4, 400 warmup steps,
cosine to 5,000 steps, early stop at 99% test exact match. Each task writes a run directory under
``OUT`` (config, weights, kept log-spaced weights, metrics, summary) and checkpoints every 250 steps, so
running the same command again resumes. Sized for about 10 minutes on one modern GPU.

    python bench/paper_recipe_gpu.py --out $OUT               # on the GPU machine
    python bench/paper_recipe_gpu.py --out /tmp/x --tiny      # the same code at a tiny size on a CPU (a test)

Then, on any machine: ``nope-interp trajectory --run OUT/<task>`` and ``nope-interp demo`` on the runs.
"""

import argparse
import sys
import time
from pathlib import Path

from nope_interp import io
from nope_interp.config import TrainConfig, preset
from nope_interp.train import resolve_device, train
from tasks import TASK_NAMES


def configs(tiny: bool, task: str) -> tuple:
    """(model config, train config) of the paper's recipe for ``task``; ``tiny`` shrinks everything."""
    if tiny:
        model = preset("tiny", tied_embeddings=True, dropout=0.2, n_ctx=48)
        train_cfg = TrainConfig(task=task, objective="packed", window=48, n_train=200, n_test=40, steps=6,
                                batch_size=4, warmup_steps=2, eval_every=3, eval_n=10, checkpoint_every=3)
        return model, train_cfg
    train_cfg = TrainConfig(task=task, objective="packed", window=256, batch_size=256, lr=2.6441e-4, warmup_steps=400,
                            steps=5000, eval_every=250, eval_n=500, checkpoint_every=250)
    return preset("paper-recipe"), train_cfg


def main(argv: list[str] | None = None) -> int:
    """Train every task in ``--tasks`` (skipping finished runs, resuming started ones); returns 0.

    Raises:
        NopeInterpError: an unavailable ``--device``; a run directory with other settings.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the four run directories")
    parser.add_argument("--tasks", nargs="+", default=list(TASK_NAMES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and steps (a CPU test of this script)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    for task in args.tasks:
        model_cfg, train_cfg = configs(args.tiny, task)
        run_dir = Path(args.out) / task
        if (run_dir / io.SUMMARY_FILE).exists():
            print(f"{task}: finished earlier, {run_dir}")
            continue
        t0 = time.perf_counter()
        result = train(model_cfg, train_cfg, run_dir, resume=(run_dir / io.CHECKPOINT_FILE).exists(), device=device,
                       command=f"python bench/paper_recipe_gpu.py --out {args.out}" + (" --tiny" if args.tiny else ""),
                       progress=False)
        print(f"{task}: test exact match {result.test_acc:.4f} after {result.steps} steps "
              f"({time.perf_counter() - t0:.0f} s on {device}); {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
