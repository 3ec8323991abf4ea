"""The training loop: AdamW (decay on matrices only), warmup + cosine decay, grad clipping, early stop.

Defaults follow the authors' code (``docs/method.md``, "Models and training"): AdamW betas (0.9, 0.99), weight decay 0.1
on matrices only, grad clip 1.0, peak lr 2.6441e-4, 400 warmup steps, cosine decay to lr/10,
5,000 steps, batch 256, early stop once test exact match reaches 99%. All are configurable.

Data (see :mod:`tasks.base`): per-example sequences with an answer-only loss. The batch of step ``s``
is drawn (with replacement) by a generator seeded from ``(seed, s)``, so a resumed run sees exactly
the batches an uninterrupted one would, and the same seed on the same machine gives the same weights.
"""

import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.config import ModelConfig, TrainConfig
from nope_interp.errors import NopeInterpError
from nope_interp.evaluate import answer_loss, exact_match_accuracy
from nope_interp.model import build_model, check_nope

__all__ = ["TrainConfig", "TrainResult", "train", "finalize", "answer_loss", "lr_at", "make_optimizer",
           "resolve_device", "log_spaced_steps", "trajectory_path"]


@dataclass(frozen=True)
class TrainResult:
    """What a finished (or stopped) run reached.

    Attributes:
        run_dir: where everything was written.
        steps: optimizer steps taken in total.
        test_acc: exact match on the whole test split, in [0, 1].
        stopped_early: True if ``target_acc`` was reached before ``steps``.
        wall_time_s: seconds of training in this process and earlier resumed ones.
    """

    run_dir: Path
    steps: int
    test_acc: float
    stopped_early: bool
    wall_time_s: float


def log_spaced_steps(max_step: int) -> list[int]:
    """The steps whose weights a run keeps for the adjacency-through-training job: 0 (the init), 25 * 2**k
    for k = 0, 1, ... up to ``max_step`` (25, 50, 100, ..., 12800, 25600, ...), and ``max_step``.
    About log2(max_step / 25) + 2 files of weights (2.5 MB each for the ``cpu`` preset)."""
    steps = [0]
    while (nxt := 25 * 2 ** (len(steps) - 1)) < max_step:
        steps.append(nxt)
    return [*steps, max_step] if max_step > 0 else steps


def trajectory_path(run_dir: str | Path, step: int) -> Path:
    """Where the weights of ``step`` are kept: ``run_dir/checkpoints/step_NNNNNN.safetensors``."""
    return Path(run_dir) / io.TRAJECTORY_DIR / f"step_{step:06d}.safetensors"


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - floor)


def make_optimizer(model: HookedTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on trainable matrices (ndim >= 2) only; vectors get none."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available else ``"cpu"``; otherwise checked and returned."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise NopeInterpError(f"device {device!r} requested but CUDA is not available; use --device cpu or auto")
    if not (device == "cpu" or device.startswith("cuda")):
        raise NopeInterpError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def _cpu_name() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux, else the platform's processor string)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _check_fits(model_cfg: ModelConfig, task: tasks_pkg.Task, cfg: TrainConfig) -> None:
    need = len(cfg.eval_prefix) + task.max_prompt_len + task.max_answer_len + 1
    if cfg.objective == "packed" and cfg.window > model_cfg.n_ctx:
        raise NopeInterpError(f"window={cfg.window} is longer than the model's n_ctx={model_cfg.n_ctx}; "
                              f"use --window <= {model_cfg.n_ctx} or a larger --model-n-ctx")
    if model_cfg.n_ctx < need:
        raise NopeInterpError(
            f"n_ctx={model_cfg.n_ctx} is too small for task {task.name!r}: its examples need n_ctx >= {need}"
        )
    if model_cfg.d_vocab != tasks_pkg.D_VOCAB:
        raise NopeInterpError(f"d_vocab must be {tasks_pkg.D_VOCAB} (the task vocabulary), got {model_cfg.d_vocab}")


def train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    device: str = "auto",
    command: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train a model from scratch (or resume it) and write the run directory.

    Args:
        model_cfg: the model to build (its ``seed`` sets the init).
        cfg: training settings.
        run_dir: output directory ``runs/<name>/`` (layout in :mod:`nope_interp.io`).
        resume: continue from ``run_dir/checkpoint.pt``; the stored configs must match.
        device: ``"auto"``, ``"cpu"`` or ``"cuda[:N]"``.
        command: the command line to record in ``config.json`` (default: this process's argv).
        progress: show a tqdm bar with loss and accuracy.

    Raises:
        NopeInterpError: n_ctx too small for the task, a non-empty run directory without ``resume``,
            a missing or mismatched checkpoint with ``resume``.
    """
    run_dir = Path(run_dir)
    task = cfg.make_task()
    _check_fits(model_cfg, task, cfg)
    device = resolve_device(device)
    config = {
        "model": model_cfg.to_dict(),
        "train": cfg.to_dict(),
        "task": {"name": task.name, "params": task.params()},
        "command": command if command is not None else shlex.join(["nope-interp", *sys.argv[1:]]),
        **io.provenance(),
    }
    ckpt_path = run_dir / io.CHECKPOINT_FILE
    if resume:
        if not ckpt_path.is_file():
            raise NopeInterpError(f"--resume given but no checkpoint in {run_dir} (expected {ckpt_path.name})")
        old = io.read_json(run_dir / io.CONFIG_FILE, "run config")
        # compare as configs, so a run written before a config gained a field (with its default) resumes
        stored = {**ModelConfig.from_dict(old.get("model", {})).to_dict(),
                  **TrainConfig.from_dict(old.get("train", {})).to_dict()}
        given = {**model_cfg.to_dict(), **cfg.to_dict()}
        differ = [f"{k} (stored {stored[k]!r}, given {given[k]!r})" for k in given if stored.get(k) != given[k]]
        if differ:
            raise NopeInterpError(f"--resume: settings differ from those stored in {run_dir}: {', '.join(differ)}")
        config["command"] = old.get("command", config["command"])
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise NopeInterpError(f"run directory {run_dir} is not empty; use --resume or choose another --name")

    splits = task.splits(cfg.n_train, cfg.n_test, cfg.data_seed)
    packed = cfg.objective == "packed"
    if packed:
        stream = tasks_pkg.packed_stream(splits.train, cfg.data_seed)
    else:
        data = task.training_batch(splits.train)
    eval_examples = splits.test[: cfg.eval_n]
    prefix = cfg.eval_prefix

    def accuracy(examples: Any) -> float:
        return exact_match_accuracy(model, task, examples, prefix=prefix)

    model = build_model(model_cfg, device=device)
    opt = make_optimizer(model, cfg)
    start_step, wall_before, best_acc = 0, 0.0, 0.0
    if resume:
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start_step, wall_before = ckpt["step"], ckpt["wall_time_s"]
        kept = [r for r in io.read_jsonl(run_dir / io.METRICS_FILE) if r["step"] <= start_step]
        io.atomic_write_text(run_dir / io.METRICS_FILE, "".join(io.json.dumps(r) + "\n" for r in kept))
    else:
        io.write_json(run_dir / io.CONFIG_FILE, config)

    def save_checkpoint(step: int, wall: float) -> None:
        io.save_torch(
            ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "wall_time_s": wall}
        )
        io.save_weights(run_dir / io.WEIGHTS_FILE, model.state_dict())

    keep = set(log_spaced_steps(cfg.steps))
    if start_step == 0:
        io.save_weights(trajectory_path(run_dir, 0), model.state_dict())
    t0 = time.perf_counter()
    stopped_early, step, full_acc = False, start_step, None
    bar = tqdm(total=cfg.steps, initial=start_step, disable=not progress, desc=f"train {task.name}", unit="step")
    running = None
    while step < cfg.steps:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        if packed:
            batch = tasks_pkg.packed_batch(stream, cfg.window, cfg.batch_size, gen)
        else:
            idx = torch.randint(0, data.tokens.shape[0], (cfg.batch_size,), generator=gen)
            width = int(data.loss_mask[idx].any(0).nonzero().max()) + 1
            batch = tasks_pkg.Batch(data.tokens[idx, :width], data.targets[idx, :width],
                                    data.loss_mask[idx, :width])
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        model.train()
        loss = answer_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        model.eval()
        step += 1
        loss_value = loss.item()
        running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
        bar.update(1)
        wall = wall_before + time.perf_counter() - t0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            acc = accuracy(eval_examples)
            best_acc = max(best_acc, acc)
            record = {"step": step, "loss": running, "lr": lr_at(step - 1, cfg), "eval_acc": acc,
                      "eval_n": len(eval_examples), "wall_time_s": round(wall, 2)}
            if acc >= cfg.target_acc:
                full_acc = accuracy(splits.test)
                record["test_acc"] = full_acc
                stopped_early = full_acc >= cfg.target_acc
            io.append_jsonl(run_dir / io.METRICS_FILE, record)
            bar.set_postfix(loss=f"{running:.4f}", acc=f"{acc:.3f}")
        if step in keep or stopped_early:
            io.save_weights(trajectory_path(run_dir, step), model.state_dict())
        if step % cfg.checkpoint_every == 0 or stopped_early or step == cfg.steps:
            save_checkpoint(step, wall_before + time.perf_counter() - t0)
        if stopped_early:
            break
    bar.close()
    check_nope(model, model_cfg)
    wall = wall_before + time.perf_counter() - t0
    save_checkpoint(step, wall)
    # the whole test set was just scored if training stopped early at the target
    test_acc = full_acc if stopped_early else accuracy(splits.test)
    summary = {
        "task": task.name, "steps": step, "test_acc": test_acc, "n_test": len(splits.test),
        "target_acc": cfg.target_acc, "reached_target": test_acc >= cfg.target_acc,
        "stopped_early": stopped_early, "train_wall_time_s": round(wall, 1), "device": device,
        "torch_threads": torch.get_num_threads(), "cpu": _cpu_name(), "objective": cfg.objective,
        "eval_prefix": prefix, **io.provenance(),
    }
    io.write_json(run_dir / io.SUMMARY_FILE, summary)
    return TrainResult(run_dir=run_dir, steps=step, test_acc=test_acc, stopped_early=stopped_early, wall_time_s=wall)


def finalize(run_dir: str | Path, device: str = "cpu") -> dict[str, Any]:
    """Write ``summary.json`` for a run stopped before its last step, from its latest checkpoint.

    Scores the whole test split (greedy exact match) without training further; the summary says at
    which step the run stopped and that it did not finish its schedule.

    Raises:
        NopeInterpError: no checkpoint or config in ``run_dir``.
    """
    run_dir = Path(run_dir)
    config = io.read_json(run_dir / io.CONFIG_FILE, "run config")
    ckpt_path = run_dir / io.CHECKPOINT_FILE
    if not ckpt_path.is_file():
        raise NopeInterpError(f"no checkpoint in {run_dir} (expected {ckpt_path.name})")
    model_cfg, cfg = ModelConfig.from_dict(config["model"]), TrainConfig.from_dict(config["train"])
    ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
    model = build_model(model_cfg, device=device)
    model.load_state_dict(ckpt["model"])
    check_nope(model, model_cfg)
    io.save_weights(run_dir / io.WEIGHTS_FILE, model.state_dict())
    task = cfg.make_task()
    splits = task.splits(cfg.n_train, cfg.n_test, cfg.data_seed)
    test_acc = exact_match_accuracy(model, task, splits.test, prefix=cfg.eval_prefix)
    summary = {
        "task": task.name, "steps": ckpt["step"], "test_acc": test_acc, "n_test": len(splits.test),
        "target_acc": cfg.target_acc, "reached_target": test_acc >= cfg.target_acc, "stopped_early": False,
        "finished_schedule": ckpt["step"] >= cfg.steps,
        "note": f"stopped by hand at step {ckpt['step']} of {cfg.steps}; summary written by finalize()",
        "train_wall_time_s": round(ckpt["wall_time_s"], 1), "device": device, **io.provenance(),
    }
    io.write_json(run_dir / io.SUMMARY_FILE, summary)
    return summary
