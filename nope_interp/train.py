"""The training loop: AdamW (decay on matrices only), warmup + cosine decay, grad clipping, early stop.

Defaults follow the authors' code (``docs/method.md``, "Models and training"): AdamW betas (0.9, 0.99), weight decay 0.1
on matrices only, grad clip 1.0, peak lr 2.6441e-4, 400 warmup steps, cosine decay to lr/10,
5,000 steps, batch 256, early stop once test exact match reaches 99%. All are configurable.

Data (see :mod:`tasks.base`): per-example sequences with an answer-only loss. The batch of step ``s``
is drawn (with replacement) by a generator seeded from ``(seed, s)``, so a resumed run sees exactly
the batches an uninterrupted one would, and the same seed on the same machine gives the same weights.
"""

import math
import re
import shlex
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.config import ModelConfig, TextTrainConfig, TrainConfig, check_float, check_train_fits
from nope_interp.errors import CommandLineOnly, NopeInterpError, ScheduleWarning, sigterm_as_exit, user_stacklevel
from nope_interp.evaluate import answer_loss, answer_token_loss, exact_match_accuracy
from nope_interp.model import build_model, check_device, check_nope, load_state
from nope_interp.pretrained import check_settings_stamp, parse_run_config, run_settings, settings_stamp

T = TypeVar("T")

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
        time_limited: True if the run stopped at ``train``'s ``time_limit_s``, at a checkpoint before the end of
            its schedule: nothing was scored (``test_acc`` is NaN) and no summary written; resume it, or write
            its summary with :func:`finalize`.
    """

    run_dir: Path
    steps: int
    test_acc: float
    stopped_early: bool
    wall_time_s: float
    time_limited: bool = False


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


_STEP_FILE = re.compile(r"step_([0-9]+)\.safetensors")  # ASCII digits only (\d also matches other scripts)


def kept_steps(run_dir: str | Path) -> dict[int, Path]:
    """``{step: weights file}`` of the weights a run kept, ascending ({} when it kept none).

    Raises:
        NopeInterpError: two files for one step (``step_25`` beside ``step_000025``): which one is the run's
            cannot be told, and one would be dropped without a word.
    """
    folder = Path(run_dir) / io.TRAJECTORY_DIR
    found: dict[int, Path] = {}
    for p in sorted(folder.glob("step_*.safetensors")):
        if (m := _STEP_FILE.fullmatch(p.name)) is None:
            continue
        step = int(m.group(1))
        if step in found:
            raise NopeInterpError(f"{folder} holds two weights files for step {step}: {found[step].name} and "
                                  f"{p.name}; remove the one the run did not write")
        found[step] = p
    return dict(sorted(found.items()))


def lr_at(step: int, cfg: TrainConfig | TextTrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup over ``warmup_steps`` (step 0 at lr / warmup_steps),
    then cosine decay that reaches ``lr * min_lr_ratio`` at ``step == steps``; the last update taken, step
    ``steps - 1``, runs just above that floor (nanoGPT's schedule, evaluated per 0-based step)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - floor)


def make_optimizer(model: HookedTransformer, cfg: TrainConfig | TextTrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on trainable matrices (ndim >= 2) only; vectors get none."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for the whole update (same arithmetic as the default, measured faster on CPU)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available else ``"cpu"``; any other device is checked by
    :func:`nope_interp.model.check_device` and returned as a string.

    Raises:
        NopeInterpError: an unknown device, a malformed ``cuda:N`` or a GPU that is not there.
    """
    return str(check_device(device))


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


def estimate_train_memory(model_cfg: ModelConfig, cfg: TrainConfig, task: tasks_pkg.Task) -> dict[str, int]:
    """Bytes a training run of these configs needs at its peak, by part: an estimate from the sizes alone,
    calibrated on CPU against the measured peak of one training step (activations within about 25% of it for
    the tiny and cpu presets at sequence lengths 40-256).

    Returns:
        ``{"model and optimizer": ..., "activations": ..., "data": ...}``: float32 weights, gradients, AdamW's
        two moments and a saving copy (5 x the weights); one training batch's activations kept for the
        backward pass (``batch_size`` x sequence length x per-token width of every layer: about
        ``8 d_model + 3 d_mlp`` floats with the trainer's hook-free forward, ``16 d_model + 4 d_mlp`` plus the
        attention scores with the hooked forward that sliding-window models use), or one evaluation batch if
        larger;
        the train and test examples as Python strings, their token tensors (answer-only: tokens, targets and
        mask; packed: the token stream) and, when the split takes more than a quarter of the task's prompts,
        the enumerated prompt space.
    """
    from nope_interp.model import model_memory_bytes

    d, m, h, n_layers, v = model_cfg.d_model, model_cfg.d_mlp, model_cfg.n_heads, model_cfg.n_layers, model_cfg.d_vocab
    line = len(cfg.eval_prefix) + task.max_prompt_len + task.max_answer_len + 1
    seq = cfg.window if cfg.objective == "packed" else line
    if model_cfg.attention == "sliding":  # the hooked forward (the fast forward of nope_interp.fast_forward
        # has no local attention in training)
        per_layer = 16 * d + 4 * m + 4 * h * seq
    else:
        per_layer = 8 * d + 3 * m + h * seq // 2
    train_acts = 4 * cfg.batch_size * seq * (n_layers * per_layer + 4 * v + 4 * d)
    eval_batch = min(1024, cfg.n_test)  # nope_interp.evaluate.predict's batch, no gradients
    eval_acts = 4 * eval_batch * line * (n_layers * (4 * d + m + h * line) + 2 * v)
    n_examples = cfg.n_train + cfg.n_test
    data = n_examples * (300 + 2 * line) + cfg.n_train * line * (10 if cfg.objective == "packed" else 17)
    if 4 * n_examples > task.n_distinct_prompts():
        data += task.n_distinct_prompts() * (100 + task.max_prompt_len)
    return {"model and optimizer": 5 * model_memory_bytes(model_cfg), "activations": max(train_acts, eval_acts),
            "data": data}


def check_train_memory(model_cfg: ModelConfig, cfg: TrainConfig, task: tasks_pkg.Task, device: str) -> None:
    """Refuse, before anything is built or written, a run whose :func:`estimate_train_memory` exceeds the free
    memory: everything on the host for ``device="cpu"``; model, optimizer and activations on a CUDA device
    and the data (and the model, built on the host first) on the host.

    Raises:
        NopeInterpError: the estimate does not fit; the message gives it by part and what is free.
    """
    from nope_interp.model import check_fits_memory, model_memory_bytes

    need = estimate_train_memory(model_cfg, cfg, task)
    advice = "lower {batch_size}, {n_train}/{n_test}, {window} or the model size"  # fields: the CLI names the flags
    what = f"training ({model_cfg.n_layers}x{model_cfg.d_model} model, batch {cfg.batch_size})"
    if torch.device(device).type == "cpu":
        check_fits_memory(need, "cpu", what, advice, TrainConfig)
    else:
        check_fits_memory({"model": model_memory_bytes(model_cfg), "data": need["data"]}, "cpu", what, advice,
                          TrainConfig)
        check_fits_memory({k: need[k] for k in ("model and optimizer", "activations")}, device, what, advice,
                          TrainConfig)


def _check_finite_weights(model: HookedTransformer, step: int) -> None:
    """Raise NopeInterpError if a weight is NaN or infinite after ``step`` (so no such weights are saved)."""
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise NopeInterpError.naming("training diverged at step {step}: weights {bad} are not finite (NaN or inf); "
                                     "they were not saved. Lower {lr} or {grad_clip} and train a new run",
                                     step=step, bad=", ".join(bad[:3]))


def warn_short_schedule(cfg: TrainConfig | TextTrainConfig) -> None:
    """Warn (:class:`~nope_interp.errors.ScheduleWarning`) when the linear warmup is not shorter than the whole
    schedule: the learning rate then stops at ``lr * steps / warmup_steps`` and never decays; a short test
    run with the default warmup does that silently otherwise."""
    if cfg.warmup_steps >= cfg.steps:
        warnings.warn(ScheduleWarning.naming(
            "{warmup_steps}={w} >= {steps}={s}: the learning rate never reaches {lr}={v:g} (it ends at {end:.3g}); "
            "pass {warmup_steps} below {steps}", w=cfg.warmup_steps, s=cfg.steps, v=cfg.lr,
            end=cfg.lr * cfg.steps / max(1, cfg.warmup_steps)), stacklevel=user_stacklevel())


def train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    device: str = "auto",
    command: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    time_limit_s: float | None = None,
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
        log: called with one line at every evaluation (step, loss, exact match, answer loss, time), for a run
            without the bar (``nope-interp train --no-progress`` prints them); None: silent.
        time_limit_s: seconds of training in this call (> 0) after which the run stops at its next checkpoint
            (every ``checkpoint_every`` steps), so no step is lost; the result then has ``time_limited`` set,
            no summary is written and the run resumes from there. None: no limit.

    Before anything is built or written: the sizes are checked against the task and the free memory
    (:func:`check_train_memory`) and the run directory must be creatable and writable. The run directory
    is then locked (:func:`nope_interp.io.exclusive`) so that a second writer is refused at once. Training
    stops at the first step whose loss or gradient norm is not finite (no weights of that step are kept;
    the last checkpoint is the last good one). A new run that stops before its first checkpoint (an
    error, a divergence, Ctrl-C) is removed again, so that it never blocks a rerun.

    Raises:
        NopeInterpError: a bidirectional model (:func:`check_trainable_attention`); ``run_dir`` not a path;
            ``time_limit_s`` not a finite number > 0;
            n_ctx too small for the task, more examples than the task has, a run that would not
            fit the free memory (the message gives the estimate), a run directory that is a file or not
            writable, one being written by another process, a non-empty run directory without ``resume``,
            a missing, mismatched, corrupt or unsafe checkpoint with ``resume`` (or a missing or corrupt
            ``metrics.jsonl`` beside a checkpoint past step 0: its history would be lost), a non-finite loss or
            gradient norm (the message names the step).

    Warns:
        ScheduleWarning: ``warmup_steps`` >= ``steps`` (the learning rate never reaches ``lr``).
    """
    run_dir = io.as_path(run_dir, "run_dir")
    if time_limit_s is not None:
        check_float("time_limit_s", time_limit_s, 0.0, low_open=True)
    check_configs(model_cfg, cfg, TrainConfig)
    check_trainable_attention(model_cfg)
    task = cfg.make_task()
    check_train_fits(model_cfg, task, cfg)
    device = resolve_device(device)
    check_train_memory(model_cfg, cfg, task, device)
    return locked_run(run_dir, resume, lambda: _train(model_cfg, cfg, run_dir, task, resume=resume, device=device,
                                                      command=command, progress=progress, log=log,
                                                      time_limit_s=time_limit_s))


def locked_run(run_dir: Path, resume: bool, body: Callable[[], T]) -> T:
    """Run ``body`` (a training into ``run_dir``) with the run directory checked and locked
    (:func:`nope_interp.io.exclusive`); if a new run stops before its first checkpoint (an error, Ctrl-C),
    its directory is removed again, so that it never blocks a rerun.

    Raises:
        NopeInterpError: a run directory that is a file, not writable, or being written by another process;
            whatever ``body`` raises.
    """
    io.check_writable_dir(run_dir, "run directory")
    with io.exclusive(run_dir, "run directory"), sigterm_as_exit():
        existed = run_dir.is_dir()
        new = not resume and not (existed and any(run_dir.iterdir()))
        try:
            return body()
        except BaseException:
            if new and not (run_dir / io.CHECKPOINT_FILE).exists():
                _remove_new_run(run_dir, keep_dir=existed)  # nothing to resume: never leave a half-made run
            raise


def optimizer_step(model: HookedTransformer, opt: torch.optim.Optimizer, batch: tasks_pkg.Batch,
                   cfg: TrainConfig | TextTrainConfig, step: int) -> tuple[float, float]:
    """One update at 0-based ``step``: the scheduled lr (:func:`lr_at`), the loss on ``batch``
    (:func:`~nope_interp.evaluate.answer_loss`, hook-free forward, train mode), clipped gradients, and the
    optimizer step, which is skipped when the loss or the gradient norm is not finite (the caller stops).
    The model is left in eval mode.

    Returns:
        ``(loss in nats, gradient norm before clipping)``.
    """
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    model.train()
    loss = answer_loss(model, batch, fast=True)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if bool(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)):
        opt.step()
    model.eval()
    return loss.item(), grad_norm.item()


def load_optimizer_state(opt: torch.optim.Optimizer, state: Any, ckpt_path: Path) -> None:
    """Load a checkpoint's optimizer ``state`` into ``opt``.

    Raises:
        NopeInterpError: the state does not fit the model (a corrupt or foreign checkpoint), one line.
    """
    try:
        opt.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as err:
        raise NopeInterpError(f"checkpoint is corrupt: {ckpt_path}: its optimizer state does not fit the "
                              f"model: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None


#: What a finished task run's summary must hold: its numbers are read from it (a sweep point's result).
TASK_SUMMARY_FIELDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("stopped_early", (bool,)), ("test_acc", (int, float)), ("train_wall_time_s", (int, float)))


def finished_summary(run_dir: Path, steps: int, step: int | None = None,
                     fields: tuple[tuple[str, tuple[type, ...]], ...] = TASK_SUMMARY_FIELDS) -> dict[str, Any] | None:
    """The run's ``summary.json`` if it says the run has finished, else None (no summary, or one written by
    :func:`finalize` for a run stopped by hand before its last step). Finished: it stopped early at its
    target, or trained its whole schedule of ``steps``; with ``step`` (the checkpoint's), only a summary of
    that step counts. ``fields``: ``(name, types)`` a finished summary must hold (a ``train-text`` run's
    summary has no test exact match: pass ``()``).

    Raises:
        NopeInterpError: ``summary.json`` is not valid JSON or not an object; a finished summary without one
            of ``fields`` of its type (by default a boolean ``stopped_early``, a numeric ``test_acc`` and
            ``train_wall_time_s``).
    """
    path = run_dir / io.SUMMARY_FILE
    if not path.is_file():
        return None
    summary = io.read_json(path, "run summary")
    if not isinstance(summary, dict):
        raise NopeInterpError(f"run summary is corrupt: {path} holds a JSON {type(summary).__name__}, not an "
                              f"object")
    done = summary.get("steps")
    if isinstance(done, bool) or not isinstance(done, int) or (step is not None and done != step):
        return None
    if not (summary.get("stopped_early") is True or done >= steps):
        return None
    for key, kinds in fields:
        value = summary.get(key)
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise NopeInterpError(f"run summary is corrupt: {path}: {key!r} is {value!r}")
    return summary


def _how_it_finished(summary: dict[str, Any], steps: int) -> str:
    """How a finished run (its :func:`finished_summary`, of a schedule of ``steps``) ended, for messages:
    ``stopped early at its target at step 840 (test exact match 0.99)``."""
    early = summary.get("stopped_early") is True
    why = "stopped early at its target" if early else f"trained its whole schedule ({steps})"
    acc = f" (test exact match {summary['test_acc']})" if "test_acc" in summary else ""
    return f"{why} at step {summary['steps']}{acc}"


def not_empty_message(run_dir: Path, ckpt_path: Path, section: str = "train",
                      fields: tuple[tuple[str, tuple[type, ...]], ...] = TASK_SUMMARY_FIELDS) -> NopeInterpError:
    """The error of a new run (no ``--resume``) into a non-empty ``run_dir``: for a run that has finished
    (:func:`finished_summary` of the schedule stored in its ``config.json`` under ``section``: ``"train"``, or
    ``"text_train"`` for a ``train-text`` run, with ``fields``), what works: ``--resume`` and ``--finalize``
    (``train`` only) refuse a finished run, so another ``--name``, or removing the folder to train it again.
    Otherwise :func:`nope_interp.io.not_empty_message` (``--resume`` for a run with a checkpoint, removal for
    one killed before it, another name for a folder that is not a run). Before 2026-12-03 a finished run was
    also told to use ``--resume``, which then refused it.

    The schedule is the stored one, not the one given now: ``--name`` of a finished 6-step run with the
    default ``--steps`` is still a finished run. A config or summary that cannot be read gives the general
    message (``--resume`` then names what is wrong). The error is made by
    :meth:`~nope_interp.errors.NopeInterpError.naming`: ``resume=True``, ``finalize()`` and ``run_dir`` in Python,
    ``--resume``, ``--finalize`` and ``--name`` on the command line.
    """
    return finished_run_message(run_dir, section, fields) or io.not_empty_message(run_dir, ckpt_path)


def no_checkpoint_message(run_dir: Path, ckpt_path: Path, section: str = "train",
                          fields: tuple[tuple[str, tuple[type, ...]], ...] = TASK_SUMMARY_FIELDS) -> NopeInterpError:
    """The error of ``--resume`` on a run directory without a checkpoint: for a finished run (a candidate or
    seed folder copied to ``runs/`` keeps its weights and summary, never a checkpoint) what
    :func:`not_empty_message` says of it; otherwise :func:`nope_interp.io.no_checkpoint_message` (before: "no
    checkpoint" for a finished run too, as if something were missing)."""
    return finished_run_message(run_dir, section, fields) or io.no_checkpoint_message(run_dir, ckpt_path)


def finished_run_message(run_dir: Path, section: str = "train",
                         fields: tuple[tuple[str, tuple[type, ...]], ...] = TASK_SUMMARY_FIELDS
                         ) -> NopeInterpError | None:
    """The error saying what to do with ``run_dir`` when it holds a finished run (:func:`finished_summary` of the
    schedule stored in its ``config.json`` under ``section``), else None; None too when its config or summary cannot
    be read. Made by :meth:`~nope_interp.errors.NopeInterpError.naming` (arguments in Python, flags on the CLI)."""
    try:
        stored = io.read_json(run_dir / io.CONFIG_FILE, "run config")
        steps = (stored.get(section) or {}).get("steps") if isinstance(stored, dict) else None
        ok = isinstance(steps, int) and not isinstance(steps, bool)
        summary = finished_summary(run_dir, steps, fields=fields) if ok else None
    except (NopeInterpError, OSError, AttributeError):  # unreadable, or a section that is not an object
        summary = None
    if summary is None:
        return None
    refused = "{resume} and {finalize} refuse it" if section == "train" else "{resume} refuses it"  # no text finalize
    return NopeInterpError.naming(
        "run directory {run_dir} holds a finished run: it {how}, so there is nothing to resume (" + refused + "); "
        "analyse it, or train a new run under another {name} (or remove the folder, rm -r {run_dir}, to train this "
        "one again)", io.RUN_ARG_NAMES, run_dir=run_dir, how=_how_it_finished(summary, steps))


def check_resume_stamp(run_dir: Path, model_cfg: Any, cfg: Any) -> None:
    """Before ``--resume``: refuse a ``config.json`` that does not describe the run's weights (the settings
    stamp of its ``model.safetensors``, :func:`nope_interp.pretrained.check_settings_stamp`): an edited config
    (another schedule, seed, learning rate) would continue the checkpoint under settings it was not trained
    with, and the summary would report them. A run without weights yet (stopped before its first checkpoint's
    weights were written) is not checked.

    Raises:
        NopeInterpError: the settings that differ, with both values.
    """
    weights = run_dir / io.WEIGHTS_FILE
    if weights.is_file():
        check_settings_stamp(weights, model_cfg, cfg, run_dir / io.CONFIG_FILE)


def resume_metrics(run_dir: Path, step: int, steps: int,
                   fields: tuple[tuple[str, tuple[type, ...]], ...] = TASK_SUMMARY_FIELDS) -> None:
    """Check that a run can resume from its checkpoint at ``step`` (of ``steps``), then cut its
    ``metrics.jsonl`` back to the records up to ``step`` (those after it are trained again). A run whose
    checkpoint is at its last step but which has no summary (stopped while scoring the test set) resumes:
    it only scores the test set and writes the summary.

    Raises:
        NopeInterpError: a checkpoint ``step`` past ``steps``; the run has finished (:func:`finished_summary`
            with ``fields``: its summary says it
            stopped early at its target or trained its whole schedule, at this step): resuming rewrote its
            summary, and after an early stop trained on past the target; a corrupt summary; ``metrics.jsonl``
            missing while the checkpoint is past step 0 (the history up to it would be lost) or corrupt (a
            record without ``loss`` or ``lr``). Nothing is written then. Otherwise a ``summary.json`` that
            :func:`finalize` wrote for the stopped run is removed: it would describe weights the run replaces
            (the finished run writes its own).
    """
    if step > steps:  # a schedule shorter than the checkpoint: config.json was edited, or is another run's
        raise NopeInterpError.naming(
            "{resume}: the checkpoint of {run_dir} is at step {step}, past the {steps}-step schedule of its "
            "config.json: the config does not describe this checkpoint; restore the config the run was trained with",
            io.RUN_ARG_NAMES, run_dir=run_dir, step=step, steps=steps)
    summary = finished_summary(run_dir, steps, step, fields)
    if summary is not None:
        raise NopeInterpError.naming(
            "{resume}: {run_dir} has finished: it {how}, so there is nothing to resume and its files are left as they "
            "are; analyse it, or train a new run under another {name}", io.RUN_ARG_NAMES, run_dir=run_dir,
            how=_how_it_finished(summary, steps))
    metrics_path = run_dir / io.METRICS_FILE
    if step > 0 and not metrics_path.exists():  # resuming would write a history that starts here
        raise NopeInterpError.naming(
            "{resume}: {metrics_path} is missing, but the checkpoint is at step {step}: resuming would lose the "
            "training history up to it; restore the file, or train a new run under another {name}", io.RUN_ARG_NAMES,
            metrics_path=metrics_path, step=step)
    kept = [r for r in io.read_metrics(metrics_path, ("loss", "lr")) if r["step"] <= step]
    io.atomic_write_text(metrics_path, "".join(io.jsonl_line(r) for r in kept))
    # a summary that did not stop the resume was written by finalize() for a run stopped by hand: the weights
    # are about to move past it, and a stale summary would be read as this run's accuracy (compare, demo)
    (run_dir / io.SUMMARY_FILE).unlink(missing_ok=True)


def seed_step_rng(seed: int, step: int) -> None:
    """Seed torch's global generator from ``(seed, step)`` before a training step: dropout (the model's
    permanent hooks and the hook-free forward draw their masks from it) then depends on the run's seed and the
    step only, so a run is reproducible and ``--resume`` continues it exactly. Before 2026-12-03 the global
    generator was never seeded (torch seeds it at random in each process) and not checkpointed: runs with
    dropout were neither reproducible nor resumed exactly. A different stream from the batch's (an offset of
    2**40)."""
    torch.manual_seed(2**40 + int(seed) * 1_000_003 + int(step))


def early_stop_record(run_dir: Path, step: int, target_acc: float) -> float | None:
    """The full-test exact match of the evaluation at ``step`` in ``metrics.jsonl`` if it reached
    ``target_acc`` (the run stopped early there: the trainer checkpoints before it writes the summary), else
    None. A run killed between the two resumes into its summary instead of training past its target."""
    path = run_dir / io.METRICS_FILE
    if not path.exists():
        return None
    for r in io.read_metrics(path):
        acc = r.get("test_acc")
        if r["step"] == step and isinstance(acc, (int, float)) and not isinstance(acc, bool) and acc >= target_acc:
            return float(acc)
    return None


def resumed_running_loss(ckpt: dict[str, Any]) -> float | None:
    """The smoothed training loss a checkpoint saved (``running_loss``), so that the loss logged after
    ``--resume`` equals an uninterrupted run's; None for checkpoints written before it was saved."""
    value = ckpt.get("running_loss")
    return float(value) if isinstance(value, float) and math.isfinite(value) else None


def check_configs(model_cfg: Any, cfg: Any, cls: type) -> None:
    """Refuse, in one line, configs of the wrong type (a dict of settings, None) before any attribute is read.

    Raises:
        NopeInterpError: ``model_cfg`` not a :class:`~nope_interp.config.ModelConfig` or ``cfg`` not a ``cls``.
    """
    for name, value, want in (("model_cfg", model_cfg, ModelConfig), ("cfg", cfg, cls)):
        if not isinstance(value, want):
            raise NopeInterpError(f"{name} must be a {want.__name__} (e.g. {want.__name__}(**settings)), got "
                                  f"{type(value).__name__}")


def check_trainable_attention(model_cfg: Any) -> None:
    """Refuse to train a model whose attention sees later positions: with a next-token loss (every objective
    here, task or text) its inputs hold its own targets, so its loss and bits per character would be wrong.

    Raises:
        NopeInterpError: ``attention='bidirectional'`` (the bidirectional control is for initialised models).
    """
    if getattr(model_cfg, "attention", "causal") == "bidirectional":
        err = NopeInterpError.naming(
            "{attention}={value!r} cannot be trained: its inputs hold the next tokens it is trained to predict; train "
            "a causal or sliding model (the bidirectional control is for initialised models: the analysis commands' "
            "--init, ModelSource(init=True) in Python)", value="bidirectional")
        err.config = ModelConfig  # --model-attention on the command line
        raise err


def check_same_settings(stored: dict[str, Any], given: dict[str, Any], run_dir: Path,
                        notes: dict[str, str | CommandLineOnly] | None = None, command: Any = None) -> None:
    """Refuse ``--resume`` when the given settings differ from those stored in the run (dicts of
    :func:`run_settings`). ``notes``: words to add to a field's entry (which flag sets it, what to give): a string,
    or a :class:`~nope_interp.errors.CommandLineOnly` shown on the command line only.
    ``command``: the run's recorded command (its ``config.json``), named in the message as the way to resume
    (a ``--preset`` of another shape differs in half a dozen fields the user never typed).

    Raises:
        NopeInterpError: the differing fields, with both values, then the recorded command.
    """
    notes = notes or {}
    keys = [k for k in given if stored.get(k) != given[k]]
    # one placeholder per entry and note: the values (and a note that is CommandLineOnly) are never a template
    entries = {f"entry{i}": f"{k} (stored {stored[k]!r}, given {given[k]!r}" for i, k in enumerate(keys)}
    entry_notes = {f"note{i}": notes.get(k, "") for i, k in enumerate(keys)}
    differ = ", ".join(f"{{entry{i}}}{{note{i}}})" for i in range(len(keys)))
    if keys:
        how = ""
        if isinstance(command, str) and command.strip():
            try:
                words = shlex.split(command)
            except ValueError:  # a hand-edited command with unbalanced quotes: still shown
                words = command.split()
            resume = command if "--resume" in words else f"{command} --resume"
            how = f"; to resume it, rerun its own command: {resume}"
        raise NopeInterpError.naming("{resume}: settings differ from those stored in {run_dir}: " + differ + "{how}",
                                     io.RUN_ARG_NAMES, run_dir=run_dir, how=how, **entries, **entry_notes)


def _remove_new_run(run_dir: Path, keep_dir: bool) -> None:
    """Delete what a new run wrote into ``run_dir`` (it was empty or absent when the run took its lock)."""
    import shutil

    if not keep_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for child in list(run_dir.iterdir()) if run_dir.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _train(model_cfg: ModelConfig, cfg: TrainConfig, run_dir: Path, task: tasks_pkg.Task, *, resume: bool,
           device: str, command: str | None, progress: bool,
           log: Callable[[str], None] | None = None, time_limit_s: float | None = None) -> TrainResult:
    """The body of :func:`train`, run under the run directory's lock once the arguments are checked."""
    warn_short_schedule(cfg)  # here: a run refused by the lock says nothing more
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
            raise no_checkpoint_message(run_dir, ckpt_path)
        old = io.read_json(run_dir / io.CONFIG_FILE, "run config")
        # compare as configs, so a run written before a config gained a field (with its default) resumes
        old_model, old_train = parse_run_config(old, run_dir / io.CONFIG_FILE)
        finished_summary(run_dir, old_train.steps)  # a corrupt summary is named here, not after "settings differ"
        finished = finished_run_message(run_dir)  # before the settings: a finished run is refused whatever is given
        if finished is not None:
            raise finished
        check_resume_stamp(run_dir, old_model, old_train)
        check_same_settings(run_settings(old_model, old_train), run_settings(model_cfg, cfg), run_dir,
                            command=old.get("command"))
        config["command"] = old.get("command", config["command"])
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise not_empty_message(run_dir, ckpt_path)

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
    start_step, wall_before, best_acc, resumed_loss = 0, 0.0, 0.0, None
    if resume:
        ckpt = io.load_checkpoint(ckpt_path, device)
        load_state(model, ckpt["model"], f"the weights of checkpoint {ckpt_path}")
        load_optimizer_state(opt, ckpt["optimizer"], ckpt_path)
        start_step, wall_before = ckpt["step"], ckpt["wall_time_s"]
        resumed_loss = resumed_running_loss(ckpt)
        resume_metrics(run_dir, start_step, cfg.steps)
    else:
        io.write_json(run_dir / io.CONFIG_FILE, config)
        # the history starts empty: a checkpoint before the first evaluation (a stop, a time limit) resumes, and a
        # missing file beside a checkpoint always means a lost history
        io.atomic_write_text(run_dir / io.METRICS_FILE, "")

    saved_step = [start_step] if resume else []  # the step of the checkpoint on disk, if any
    stamp = settings_stamp(model_cfg, cfg)

    def save_checkpoint(step: int, wall: float) -> None:
        _check_finite_weights(model, step)  # a checkpoint always holds the last good weights
        io.save_torch(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                  "wall_time_s": wall, "running_loss": running})
        saved_step[:] = [step]
        io.save_weights(run_dir / io.WEIGHTS_FILE, model.state_dict(), stamp)

    keep = set(log_spaced_steps(cfg.steps))
    if start_step == 0:
        io.save_weights(trajectory_path(run_dir, 0), model.state_dict(), stamp)
    t0 = time.perf_counter()
    stopped_early, step, full_acc = False, start_step, None
    bar = tqdm(total=cfg.steps, initial=start_step, disable=not progress, desc=f"train {task.name}", unit="step")
    running = resumed_loss  # the logged loss is smoothed over steps: a resumed run continues the same average
    if resume:  # stopped early at its checkpoint, killed before its summary: write the summary, train no more
        full_acc = early_stop_record(run_dir, start_step, cfg.target_acc)
        stopped_early = full_acc is not None
    while step < cfg.steps and not stopped_early:
        seed_step_rng(cfg.seed, step)  # dropout masks from (seed, step): reproducible and resumed exactly
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        if packed:
            batch = tasks_pkg.packed_batch(stream, cfg.window, cfg.batch_size, gen)
        else:
            idx = torch.randint(0, data.tokens.shape[0], (cfg.batch_size,), generator=gen)
            width = int(data.loss_mask[idx].any(0).nonzero().max()) + 1
            batch = tasks_pkg.Batch(data.tokens[idx, :width], data.targets[idx, :width],
                                    data.loss_mask[idx, :width])
        loss_value, grad_norm = optimizer_step(model, opt, batch, cfg, step)
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):  # the update was not applied
            kept = (f"{ckpt_path} keeps step {saved_step[0]}" if saved_step
                    else "no checkpoint had been written yet")
            raise NopeInterpError.naming(
                "training diverged at step {step}: loss {loss:.4g}, gradient norm {norm:.4g} (not finite); this step "
                "was not applied and {kept}. Lower {lr}, raise {warmup_steps} or lower {grad_clip} and train a new "
                "run", step=step + 1, loss=loss_value, norm=grad_norm, kept=kept)
        step += 1
        running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
        bar.update(1)
        wall = wall_before + time.perf_counter() - t0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            acc = accuracy(eval_examples)
            best_acc = max(best_acc, acc)
            record = {"step": step, "loss": running, "lr": lr_at(step - 1, cfg), "eval_acc": acc,
                      "eval_answer_loss": answer_token_loss(model, task, eval_examples, prefix=prefix),
                      "eval_n": len(eval_examples), "wall_time_s": round(wall, 2)}
            if acc >= cfg.target_acc:
                full_acc = accuracy(splits.test)
                record["test_acc"] = full_acc
                stopped_early = full_acc >= cfg.target_acc
            io.append_jsonl(run_dir / io.METRICS_FILE, record)
            bar.set_postfix(loss=f"{running:.4f}", acc=f"{acc:.3f}")
            if log is not None:
                log(f"step {step}/{cfg.steps}: loss {running:.4f}, eval exact match {acc:.3f}"
                    + (f" (full test {full_acc:.4f})" if "test_acc" in record else "")
                    + f", answer loss {record['eval_answer_loss']:.3f} nats, {wall / 60:.1f} min")
        if step in keep or stopped_early:
            _check_finite_weights(model, step)
            io.save_weights(trajectory_path(run_dir, step), model.state_dict(), stamp)
        if step % cfg.checkpoint_every == 0 or stopped_early or step == cfg.steps:
            save_checkpoint(step, wall_before + time.perf_counter() - t0)
        if stopped_early:
            break
        if (time_limit_s is not None and saved_step == [step] and step < cfg.steps
                and time.perf_counter() - t0 >= time_limit_s):  # at a checkpoint just written: nothing lost
            bar.close()
            return TrainResult(run_dir=run_dir, steps=step, test_acc=float("nan"), stopped_early=False,
                               wall_time_s=wall_before + time.perf_counter() - t0, time_limited=True)
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

    The checkpoint is read with ``weights_only=True`` (:func:`nope_interp.io.load_checkpoint`): nothing
    stored in it runs. The run directory is locked while the summary is written. The run's history is cut
    at the checkpoint's step: evaluations in ``metrics.jsonl`` and weights kept in ``checkpoints/`` after it
    (a stop between an evaluation and the next checkpoint) describe weights the run no longer has.

    Raises:
        NopeInterpError: an unknown or absent ``device`` (:func:`resolve_device`; ``"auto"`` is allowed); no
            checkpoint or config in ``run_dir``; a corrupt, truncated or unsafe checkpoint, or one whose weights
            do not fit the config; a run directory that is not writable or is being
            written by another process; a run that has finished (:func:`finished_summary`), whose summary
            is final; a corrupt summary or ``metrics.jsonl``.
    """
    device = resolve_device(device)  # a bad device is named as such, not read as a corrupt checkpoint
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NopeInterpError(f"run directory not found: {run_dir}")
    io.check_writable_dir(run_dir, "run directory")
    with io.exclusive(run_dir, "run directory"):
        return _finalize(run_dir, device)


def _finalize(run_dir: Path, device: str) -> dict[str, Any]:
    """The body of :func:`finalize`, under the run directory's lock."""
    config = io.read_json(run_dir / io.CONFIG_FILE, "run config")
    ckpt_path = run_dir / io.CHECKPOINT_FILE
    if not ckpt_path.is_file():
        raise NopeInterpError(f"no checkpoint in {run_dir} (expected {ckpt_path.name})")
    model_cfg, cfg = parse_run_config(config, run_dir / io.CONFIG_FILE)
    ckpt = io.load_checkpoint(ckpt_path, device)
    done = finished_summary(run_dir, cfg.steps, ckpt["step"])
    if done is not None:  # its summary is the final one (a "stopped by hand" one would let --resume train on)
        raise NopeInterpError.naming(
            "{finalize}: {run_dir} has finished (step {step}, test exact match {acc}, stopped early: {early}): its "
            "summary.json is final and is left as it is", io.RUN_ARG_NAMES, run_dir=run_dir, step=ckpt["step"],
            acc=done["test_acc"], early=done["stopped_early"])
    model = build_model(model_cfg, device=device)
    load_state(model, ckpt["model"], f"the weights of checkpoint {ckpt_path}")
    check_nope(model, model_cfg)
    io.save_weights(run_dir / io.WEIGHTS_FILE, model.state_dict(), settings_stamp(model_cfg, cfg))
    # evaluations logged, and weights kept, after the checkpoint (a stop between the two) describe weights the
    # run no longer has: the history ends at the finalized step (a resume writes them again)
    metrics_path = run_dir / io.METRICS_FILE
    if metrics_path.exists():
        kept = [r for r in io.read_metrics(metrics_path) if r["step"] <= ckpt["step"]]
        io.atomic_write_text(metrics_path, "".join(io.jsonl_line(r) for r in kept))
    for step, path in kept_steps(run_dir).items():
        if step > ckpt["step"]:
            path.unlink()
    task = cfg.make_task()
    splits = task.splits(cfg.n_train, cfg.n_test, cfg.data_seed)
    test_acc = exact_match_accuracy(model, task, splits.test, prefix=cfg.eval_prefix)
    early = early_stop_record(run_dir, ckpt["step"], cfg.target_acc) is not None  # it had stopped at its target
    summary = {
        "task": task.name, "steps": ckpt["step"], "test_acc": test_acc, "n_test": len(splits.test),
        "target_acc": cfg.target_acc, "reached_target": test_acc >= cfg.target_acc, "stopped_early": early,
        "finished_schedule": ckpt["step"] >= cfg.steps,
        "note": (f"stopped early at its target at step {ckpt['step']} of {cfg.steps}, killed before its summary; "
                 "summary written by finalize()") if early else
                f"stopped by hand at step {ckpt['step']} of {cfg.steps}; summary written by finalize()",
        "train_wall_time_s": round(ckpt["wall_time_s"], 1), "device": device, **io.provenance(),
    }
    io.write_json(run_dir / io.SUMMARY_FILE, summary)
    return summary
