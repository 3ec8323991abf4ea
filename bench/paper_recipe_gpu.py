"""Train the paper's model with the paper's recipe on the four tasks: the GPU run, one command.

Shape ``paper-recipe`` (6 layers, d_model 384, 6 heads, tied embeddings, dropout 0.2) and the authors'
recipe: the packed objective (windows of 256 characters of the newline-joined training lines, loss on
every position), batch 256, AdamW betas (0.9, 0.99), weight decay 0.1, lr 2.6441e-4, 400 warmup steps,
cosine to 5,000 steps, early stop at 99% test exact match (500 test prompts every 250 steps, the whole
20,000-prompt test split once they pass). Each task writes a run directory under ``OUT`` (config, weights,
kept log-spaced weights, metrics, summary) and checkpoints every 125 steps, so running the same command
again resumes a run that has not finished. The tasks train one after the other.

    python bench/paper_recipe_gpu.py --out $OUT --budget-s 360     # on the GPU machine
    python bench/paper_recipe_gpu.py --out /tmp/x --tiny            # tiny, on a CPU (a test)

Measured on one H200 (2026-12-04, TF32): 61 ms per optimizer step alone (10 GiB), 72 ms with the
evaluations and checkpoints, so the whole 5,000-step schedule takes about 6 minutes per task and about
24 minutes for the four (less where a task stops early at 99%), not the 10 minutes first planned. Four tasks
trained at once, one process each on the one GPU, ran at 0.55 s per step each (138 ms per step in all
against 72: 1.9 times slower than one after the other), so that option was removed. ``--budget-s`` bounds
each task's training time: at the first checkpoint past it (every 125 steps) the run stops, is scored on the
whole test split (:func:`nope_interp.train.finalize`), its summary says so (``time_budget_s``, ``note``) and
the same command resumes it. On CUDA, float32 matrix products use TF32 unless ``--precision fp32``; ``--precision
bf16`` runs training and evaluation under bfloat16 autocast (weights and optimizer state stay float32; on a
CPU too, for its test; not yet timed on a GPU). The precision is recorded in each summary
(``matmul_precision``) and in the command its ``config.json`` records, and a run is resumed only at its own.
Bad input is one line on stderr and exit status 2.

Then, on any machine: ``nope-interp trajectory --run OUT/<task>`` and ``nope-interp compare --run OUT/*``.
"""

import contextlib
import dataclasses
import math
import shlex
import sys
import time
from pathlib import Path

import torch

from nope_interp import io
from nope_interp.cli import OneLineParser
from nope_interp.config import TrainConfig, preset
from nope_interp.errors import NopeInterpError
from nope_interp.train import finalize, finished_run_message, resolve_device, train
from tasks import TASK_NAMES


def configs(tiny: bool, task: str) -> tuple:
    """(model config, train config) of the paper's recipe for ``task``; ``tiny`` shrinks everything."""
    if tiny:
        model = preset("tiny", tied_embeddings=True, dropout=0.2, n_ctx=48)
        train_cfg = TrainConfig(task=task, objective="packed", window=48, n_train=200, n_test=40, steps=6,
                                batch_size=4, warmup_steps=2, eval_every=3, eval_n=10, checkpoint_every=2)
        return model, train_cfg
    train_cfg = TrainConfig(task=task, objective="packed", window=256, batch_size=256, lr=2.6441e-4, warmup_steps=400,
                            steps=5000, eval_every=250, eval_n=500, checkpoint_every=125)
    return preset("paper-recipe"), train_cfg


def stored_precision(run_dir: Path) -> str | None:
    """The ``--precision`` a started run was trained at, read from the command its ``config.json`` records
    (written under the run's lock when it started); None for a run not started, or one without the flag."""
    try:
        words = shlex.split(str(io.read_json(run_dir / io.CONFIG_FILE, "run config").get("command", "")))
    except (NopeInterpError, OSError, ValueError, AttributeError):
        return None
    return words[words.index("--precision") + 1] if "--precision" in words[:-1] else None


def run_task(task: str, out: Path, *, tiny: bool, device: str, budget_s: float | None, precision: str,
             command: str) -> str:
    """Train (or resume, or skip when finished) ``task`` into ``out/task`` at ``precision`` (``tf32``,
    ``fp32`` or ``bf16``, the one in effect on ``device``); returns one line on what happened.

    Raises:
        NopeInterpError: a run directory with other settings, or being written by another process; a run
            resumed at another precision than it was trained at.
    """
    model_cfg, train_cfg = configs(tiny, task)
    run_dir = out / task
    if finished_run_message(run_dir) is not None:
        return f"{task}: finished earlier, {run_dir}"
    resume = (run_dir / io.CHECKPOINT_FILE).exists()
    stored = stored_precision(run_dir) if resume else None
    if stored is not None and stored != precision:
        how = ("on a CUDA device (--device cuda)" if stored == "tf32" and not device.startswith("cuda")
               else f"with --precision {stored}")
        raise NopeInterpError(f"{run_dir} was trained at precision {stored}, not {precision}: resume it {how}")
    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    t0 = time.perf_counter()
    with autocast:
        result = train(model_cfg, train_cfg, run_dir, resume=resume, device=device, command=command,
                       progress=False, log=lambda line: print(f"{task}: {line}", flush=True), time_limit_s=budget_s)
        extra = {}
        if result.time_limited:  # stopped at a checkpoint it had just written: the summary scores that step
            summary = finalize(run_dir, device)
            result = dataclasses.replace(result, test_acc=summary["test_acc"])
            extra = {"time_budget_s": budget_s,
                     "note": f"stopped at the script's time budget ({budget_s:g} s of training in this call) at its "
                             f"checkpoint at step {result.steps} of {train_cfg.steps}; summary written by "
                             "finalize(); the same command resumes it"}
    summary = io.read_json(run_dir / io.SUMMARY_FILE, "run summary")
    recorded = "bf16-autocast" if precision == "bf16" else precision
    io.write_json(run_dir / io.SUMMARY_FILE, {**summary, **extra, "matmul_precision": recorded})
    return (f"{task}: test exact match {result.test_acc:.4f} after {result.steps} steps "
            f"({time.perf_counter() - t0:.0f} s on {device}{', time budget spent' if extra else ''}); {run_dir}")


def main(argv: list[str] | None = None) -> int:
    """Train every task in ``--tasks`` one after the other (skipping finished runs, resuming started ones);
    returns 0, or 2 after a one-line error (an unavailable ``--device``, an unusable ``--out``, a run directory
    with other settings or precision, one being written by another process)."""
    parser = OneLineParser(prog="paper_recipe_gpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the four run directories")
    parser.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), choices=list(TASK_NAMES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and steps (a CPU test of this script)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds of training per task in this call (default, or inf: no limit)")
    parser.add_argument("--precision", choices=["tf32", "fp32", "bf16"], default="tf32",
                        help="float32 matrix products on CUDA (tf32, the default, or fp32), or bfloat16 autocast")
    args = parser.parse_args(argv)
    if args.budget_s is not None and not args.budget_s > 0:  # NaN too
        parser.error(f"--budget-s must be > 0 (got {args.budget_s})")
    budget_s = None if args.budget_s in (None, math.inf) else args.budget_s
    try:
        device = resolve_device(args.device)
        # the precision in effect: TF32 exists on CUDA only
        precision = "fp32" if args.precision == "tf32" and not device.startswith("cuda") else args.precision
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
        command = (f"python bench/paper_recipe_gpu.py --out {args.out}" + (" --tiny" if args.tiny else "")
                   + f" --precision {precision}")
        for task in args.tasks:
            print(run_task(task, Path(args.out), tiny=args.tiny, device=device, budget_s=budget_s,
                           precision=precision, command=command), flush=True)
    except (NopeInterpError, OSError) as err:
        print(f"paper_recipe_gpu: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
