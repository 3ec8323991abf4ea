"""The ``nope-interp`` command line: ``train``, ``analyze``, ``demo`` (and more as issues land).

Flags for model and training settings are derived from :class:`~nope_interp.model.ModelConfig` and
:class:`~nope_interp.train.TrainConfig` (``--n-layers``, ``--lr``, ...). Bad input prints one line,
``nope-interp: error: ...``, and exits with status 2.
"""

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks import TASK_NAMES, TaskError
from nope_interp.errors import NopeInterpError

_MODEL_FLAGS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "act_fn", "normalization",
                "positional", "attention", "init_mean", "init_std", "seed")
_TRAIN_SKIP = ("task", "task_params")


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, names: Sequence[str], prefix: str = "") -> None:
    for f in dataclasses.fields(cls):
        if f.name not in names:
            continue
        typ = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
        parser.add_argument(f"--{prefix}{f.name.replace('_', '-')}", dest=f"{prefix.replace('-', '_')}{f.name}",
                            type=typ, default=None, help=f"(default from the preset/config: {f.default!r})")


def _model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {n: getattr(args, f"model_{n}") for n in _MODEL_FLAGS if getattr(args, f"model_{n}", None) is not None}


def _build_parser() -> argparse.ArgumentParser:
    from nope_interp.model import PRESETS, ModelConfig
    from nope_interp.train import TrainConfig

    parser = argparse.ArgumentParser(prog="nope-interp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a NoPE model on a task; writes runs/<name>/")
    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASK_NAMES)}")
    p.add_argument("--n-digits", type=int, default=None, help="task size (default: the paper's)")
    p.add_argument("--preset", default="cpu", help=f"model preset: {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--name", default=None, help="run name (default: <task>-<preset>-s<seed>)")
    p.add_argument("--runs-dir", default="runs", help="parent of the run directory (default runs/)")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_dataclass_flags(p, ModelConfig, _MODEL_FLAGS, prefix="model-")
    _add_dataclass_flags(p, TrainConfig, [f.name for f in dataclasses.fields(TrainConfig) if f.name not in _TRAIN_SKIP])
    return parser


def _cmd_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import torch

    from nope_interp.model import preset
    from nope_interp.train import TrainConfig, train

    if args.threads is not None:
        if args.threads < 1:
            raise NopeInterpError(f"--threads must be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    model_cfg = preset(args.preset, **_model_overrides(args))
    train_kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                if f.name not in _TRAIN_SKIP and getattr(args, f.name, None) is not None}
    task_params = {} if args.n_digits is None else {"n_digits": args.n_digits}
    cfg = TrainConfig(task=args.task, task_params=task_params, **train_kw)
    name = args.name or f"{args.task}-{args.preset}-s{model_cfg.seed}"
    run_dir = Path(args.runs_dir) / name
    result = train(model_cfg, cfg, run_dir, resume=args.resume, device=args.device,
                   command=shlex.join(["nope-interp", *argv]), progress=not args.no_progress)
    print(f"test exact match {result.test_acc:.4f} after {result.steps} steps "
          f"({result.wall_time_s / 60:.1f} min); outputs in {run_dir}/")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nope-interp`` console script. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return {"train": _cmd_train}[args.command](args, argv)
    except (NopeInterpError, TaskError) as err:
        print(f"nope-interp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
