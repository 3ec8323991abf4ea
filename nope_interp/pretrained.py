"""Load a trained run directory, or one of the models shipped with the package, in one call.

Shipped models live in ``nope_interp/pretrained/<task>/`` with the run-directory layout (config.json
with the exact ``nope-interp train`` command, model.safetensors, metrics.jsonl, summary.json).
"""

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.checks import is_int, is_real
from nope_interp.config import ModelConfig, TextTrainConfig, TrainConfig
from nope_interp.errors import NopeInterpError
from nope_interp.model import build_model, check_nope, load_state

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
#: Extra seeds of the shipped recipes (for seed statistics): ``seeds/<task>-s<seed>/``.
SEEDS_DIR = PRETRAINED_DIR / "seeds"
#: Every other finished trained model kept as the record (other recipes, seeds that missed the target):
#: ``candidates/<name>/``; ``candidates/in-progress/`` holds checkpoints of unfinished runs and is skipped.
CANDIDATES_DIR = PRETRAINED_DIR / "candidates"


@dataclass(frozen=True)
class LoadedRun:
    """A trained model with everything needed to use it.

    Attributes:
        model: the HookedTransformer (eval mode, CPU unless ``device`` was given).
        model_cfg, train_cfg: the configs it was trained with. task: the task object.
        summary: ``summary.json`` (test accuracy, steps, wall time) or {} for an unfinished run.
        command: the ``nope-interp train`` command that produced it. path: the directory.
        weights_dtype: how ``model.safetensors`` stores the weights (:func:`stored_dtype`): ``"float32"`` as
            trained, ``"float16"`` for a run stored at half precision by :func:`halve`, or another torch
            dtype name, ``"mixed"`` or ``"none"`` for files written elsewhere. The model itself always computes
            in its config's dtype: the stored values are cast on load.
    """

    model: HookedTransformer
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    task: tasks_pkg.Task
    summary: dict[str, Any]
    command: str
    path: Path
    weights_dtype: str = "float32"

    @cached_property
    def splits(self) -> tasks_pkg.Splits:
        """The run's train/test splits, rebuilt from its config (deterministic)."""
        tc = self.train_cfg
        return self.task.splits(tc.n_train, tc.n_test, tc.data_seed)

    @cached_property
    def train_prompts(self) -> frozenset[str]:
        """The prompts the model was trained on: analyses draw their prompts from outside this set."""
        return frozenset(ex.prompt for ex in self.splits.train)

    @property
    def name(self) -> str:
        """Short name: ``shipped`` for the shipped model of its task, else the directory name."""
        return "shipped" if self.path.resolve() == (PRETRAINED_DIR / self.task.name).resolve() else self.path.name


def parse_run_config(config: Any, where: str | Path,
                     sections: tuple[tuple[str, type], ...] = (("model", ModelConfig), ("train", TrainConfig))
                     ) -> tuple[Any, ...]:
    """The model and training configs of a run's ``config.json`` content (already parsed JSON).

    Args:
        config: the parsed file: a JSON object with a ``"model"`` and a ``"train"`` object.
        where: the file, for the error message.
        sections: ``(key, config class)`` of each entry to read, in the order returned (a text run of
            :mod:`nope_interp.text_train` has ``model`` and ``text_train``).

    Raises:
        NopeInterpError: the file is not a JSON object, ``model`` or ``train`` is missing or not a JSON
            object (null, a list, ...), or a field is unknown or invalid; the one-line message names the
            file and the entry. An inconsistent ``task`` entry: another task name than ``train`` trained on,
            or task parameters other than the ones its ``task_params`` give.
    """
    if not isinstance(config, dict):
        raise NopeInterpError(f"run config is corrupt: {where}: expected a JSON object with "
                              f"{' and '.join(repr(k) for k, _ in sections)}, got {_json_kind(config)}")
    out = []
    kinds = {"train": "a task run (nope-interp train)", "text_train": "a language model run (nope-interp train-text)"}
    for key, cls in sections:
        if key not in config:
            other = next((k for k in kinds if k != key and isinstance(config.get(k), dict)), None)
            if key in kinds and other is not None:  # a run of the other kind, not a corrupt one
                raise NopeInterpError(f"{where} is {kinds[other]}, not {kinds[key]}: give it to the command "
                                      f"that made it")
            raise NopeInterpError(f"run config is corrupt: {where}: the entry {key!r} is missing")
        if not isinstance(config[key], dict):
            raise NopeInterpError(f"run config is corrupt: {where}: {key!r} must be a JSON object of "
                                  f"{cls.__name__} fields, got {_json_kind(config[key])}")
        try:
            out.append(cls.from_dict(config[key]))
        except NopeInterpError as err:
            raise NopeInterpError(f"run config is invalid: {where}: {key!r}: {err}") from None
    task = config.get("task")
    trained = getattr(out[-1], "task", None) if len(out) > 1 else None
    if isinstance(task, dict) and trained is not None and task.get("name", trained) != trained:
        raise NopeInterpError(f"run config is inconsistent: {where}: 'task' names {task.get('name')!r} but 'train' "
                              f"trained on {trained!r}")
    if isinstance(task, dict) and isinstance(task.get("params"), dict) and hasattr(out[-1], "make_task"):
        effective = out[-1].make_task().params()
        if any(effective[k] != v for k, v in task["params"].items() if k in effective):  # keys both know
            raise NopeInterpError(f"run config is inconsistent: {where}: 'task' has params {task['params']!r} but "
                                  f"'train' trained on {effective!r} (task_params {out[-1].task_params!r})")
    return tuple(out)


def run_settings(model_cfg: Any, cfg: Any) -> dict[str, Any]:
    """The settings of a run that ``--resume`` compares: the model's and the training config's fields, each
    under its own prefix (``model.window``, ``train.window``), so that a field of the same name in both (``seed``,
    ``window``) is compared in each rather than one hiding the other. Task parameters are compared as the task
    takes them, defaults filled in (``--n-digits 16`` on reversal is its default)."""
    train = cfg.to_dict()
    if "task_params" in train and hasattr(cfg, "make_task"):  # the task's effective sizes: {} == the defaults
        train["task_params"] = cfg.make_task().params()
    return {**{f"model.{k}": v for k, v in model_cfg.to_dict().items()},
            **{f"train.{k}": v for k, v in train.items()}}


def settings_stamp(model_cfg: Any, cfg: Any) -> dict[str, str]:
    """The metadata a run's weights files carry: its :func:`run_settings` as JSON under
    :data:`nope_interp.io.SETTINGS_KEY`, so that loading the run can tell whether ``config.json`` still
    describes the weights (:func:`check_settings_stamp`)."""
    return {io.SETTINGS_KEY: json.dumps(io.json_safe(run_settings(model_cfg, cfg)), sort_keys=True)}


def check_settings_stamp(path: Path, model_cfg: Any, cfg: Any, config_path: Path) -> None:
    """Refuse weights whose stamp (:func:`settings_stamp`) disagrees with the run's config: an edited
    ``config.json`` (another activation, attention, data seed, task size, ...) that still fits the weights'
    shapes would load a different model, or score training prompts as held out, without a word. Weights
    without a stamp (written before it existed: the shipped models) are not checked.

    Raises:
        NopeInterpError: the settings that differ, with both values (the first three, and a count); a stamp that
            is not JSON; the weights file missing or not safetensors.
    """
    raw = io.weights_metadata(path).get(io.SETTINGS_KEY)
    if raw is None:
        return
    try:
        stored = json.loads(raw)
    except json.JSONDecodeError:
        raise NopeInterpError(f"weights are corrupt: {path}: its settings stamp is not JSON") from None
    given = json.loads(settings_stamp(model_cfg, cfg)[io.SETTINGS_KEY])
    # only settings both sides know: a field added to the configs later (filled with its default when an older
    # config is read) or removed is not a disagreement
    diff = [f"{k} ({stored[k]!r} in the weights, {given[k]!r} in the config)"
            for k in sorted(set(stored) & set(given)) if stored[k] != given[k]]
    if diff:
        more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise NopeInterpError(f"{config_path} does not describe the weights {path.name}: {', '.join(diff[:3])}{more}"
                              f"; restore the config the run was trained with")


def _json_kind(value: Any) -> str:
    """How a parsed JSON value reads in an error message: ``null``, ``a list``, ``a string``, ..."""
    if value is None:
        return "null"
    kinds = {bool: "a boolean", list: "a list", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__) + f" {value!r}"[:60]


def load_run(path: str | Path, device: str = "cpu") -> LoadedRun:
    """Load ``runs/<name>/`` (or a shipped model directory).

    Raises:
        NopeInterpError: ``path`` not a path (:func:`nope_interp.io.as_path`); the directory, its config or its
            weights are missing or corrupt (a NaN or infinite weight included), or stamped with other settings
            than ``config.json`` holds (:func:`check_settings_stamp`); a ``summary.json`` that
            is not an object, with a ``test_acc`` outside [0, 1] or non-integer ``steps``, or older than the run's
            ``metrics.jsonl`` (stale: stopped by hand, finalized, then trained further).
    """
    path = io.check_readable(io.as_path(path), "run directory", folder=True)
    if not path.is_dir():
        raise NopeInterpError(f"run directory not found: {path}")
    config = io.read_json(path / io.CONFIG_FILE, "run config")
    model_cfg, train_cfg = parse_run_config(config, path / io.CONFIG_FILE)
    check_settings_stamp(path / io.WEIGHTS_FILE, model_cfg, train_cfg, path / io.CONFIG_FILE)
    state = io.load_weights(path / io.WEIGHTS_FILE)
    model = build_model(model_cfg, device=device)
    load_state(model, state, f"the weights {path / io.WEIGHTS_FILE}")
    check_nope(model, model_cfg)
    summary = _checked_summary(path)
    return LoadedRun(model=model, model_cfg=model_cfg, train_cfg=train_cfg, task=train_cfg.make_task(),
                     summary=summary, command=config.get("command", ""), path=path,
                     weights_dtype=stored_dtype(state))


def _checked_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json`` ({} when it has none), checked: a JSON object whose ``test_acc`` (when present)
    is a fraction in [0, 1] and ``steps`` an integer >= 0, not older than the run's training history (a
    summary of step 30 beside metrics up to step 120 describes other weights than the run's)."""
    summary_path = path / io.SUMMARY_FILE
    if not summary_path.exists():
        return {}
    summary = io.read_json(summary_path, "run summary")
    if not isinstance(summary, dict):
        raise NopeInterpError(f"run summary is corrupt: {summary_path} holds {_json_kind(summary)}, not an object")
    acc, steps = summary.get("test_acc"), summary.get("steps")
    if "test_acc" in summary and (not is_real(acc) or not 0.0 <= acc <= 1.0):
        raise NopeInterpError(f"run summary is corrupt: {summary_path}: test_acc must be a fraction in [0, 1], "
                              f"got {_json_kind(acc)}")
    if "steps" in summary and (not is_int(steps) or steps < 0):
        raise NopeInterpError(f"run summary is corrupt: {summary_path}: steps must be an integer >= 0, got "
                              f"{_json_kind(steps)}")
    metrics = io.read_metrics(path / io.METRICS_FILE) if is_int(steps) else []
    if metrics and metrics[-1]["step"] > steps:
        raise NopeInterpError(f"run summary is stale: {summary_path} is for step {steps}, but the run trained to step "
                              f"{metrics[-1]['step']} ({io.METRICS_FILE}): its weights are not the ones scored; "
                              f"resume the run to its end, or finalize it again (nope_interp.train.finalize; "
                              "nope-interp train --finalize)")
    return summary


def stored_dtype(state: Any) -> str:
    """The floating dtype a state dict (``{name: tensor}``) stores its weights in (``"float32"``,
    ``"float16"``, ...); ``"mixed"`` when its floating tensors disagree, ``"none"`` when it has none.
    Non-tensor values are ignored.

    Raises:
        NopeInterpError: ``state`` is not a dict.
    """
    if not isinstance(state, dict):
        raise NopeInterpError(f"state must be a dict of name -> tensor, got {type(state).__name__}")
    dtypes = {str(v.dtype).removeprefix("torch.") for v in state.values()
              if isinstance(v, torch.Tensor) and v.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else ("none" if not dtypes else "mixed")


def is_shipped_dir(path: str | Path) -> bool:
    """Whether ``path`` is the shipped model folder of a task, ``.../pretrained/<task>/``: of this package or
    of any other checkout (judged by the folder's place, symlinks resolved).

    Raises:
        NopeInterpError: ``path`` not a path (:func:`nope_interp.io.as_path`).
    """
    path = io.as_path(path).resolve()
    shipped = {(PRETRAINED_DIR / t).resolve() for t in tasks_pkg.TASK_NAMES}
    return path in shipped or (path.parent.name == "pretrained" and path.name in tasks_pkg.TASK_NAMES)


def half_precision(state: Any) -> dict[str, torch.Tensor]:
    """``state`` with every floating-point tensor rounded to float16 (IEEE half: 11 significant bits, so a
    relative rounding error of at most 2^-11 ~ 4.9e-4 on normal values; values below 6.1e-5 in magnitude
    become subnormal, absolute error at most 3e-8); other tensors unchanged, all detached.

    Args:
        state: ``{parameter name: tensor}`` as written by ``model.state_dict()``.

    Raises:
        NopeInterpError: ``state`` is not a dict of tensors; a tensor is on the meta device; a tensor holds NaN;
            an infinite entry anywhere but in TransformerLens's ``IGNORE`` attention-mask buffers (-inf by
            design, kept infinite); a finite value beyond float16's largest, 65504 in magnitude (larger values
            overflow or lose the range: the message names the tensor and its largest magnitude).
    """
    if not isinstance(state, dict):
        raise NopeInterpError(f"state must be a dict of name -> tensor, got {type(state).__name__}")
    out: dict[str, torch.Tensor] = {}
    limit = torch.finfo(torch.float16).max
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise NopeInterpError(f"state[{name!r}] is not a tensor: {type(value).__name__}")
        value = value.detach()
        if value.is_meta:
            raise NopeInterpError(f"state[{name!r}] is on the meta device: it has no values to store")
        if not value.is_floating_point():
            out[name] = value
            continue
        if bool(torch.isnan(value).any()):
            raise NopeInterpError(f"state[{name!r}] holds NaN: cannot store it at half precision")
        if not str(name).endswith("IGNORE") and bool(torch.isinf(value).any()):
            raise NopeInterpError(f"state[{name!r}] holds inf: only the IGNORE attention-mask buffers may")
        finite = value[torch.isfinite(value)]
        biggest = float(finite.abs().max()) if finite.numel() else 0.0
        if biggest > limit:
            raise NopeInterpError(f"state[{name!r}] has |x| up to {biggest:.4g}, beyond float16's {limit:.0f}: "
                                  "it cannot be stored at half precision")
        out[name] = value.to(torch.float16)
    return out


def halve(run_dir: str | Path) -> Path:
    """Store a run's ``model.safetensors`` at half precision, in place: half the bytes (a maintainer's tool
    to keep the repository's weights small).

    Only for models that are analysed, never for the shipped task models the demo measures (those stay
    float32): the measured effect of the rounding on every kept candidate and extra seed (test exact match
    and adjacency scores, float32 vs float16) is in ``docs/measured/half_precision/half_precision.md``, and
    a test checks it on shipped models; for the ``train-text`` language models (bits per character and every
    text measurement of the README) it is in ``docs/measured/half_precision/text.md``. A run already at half
    precision is left as it is. The run directory is locked while the file is rewritten, as training locks
    it, so a training in progress there is refused.

    Args:
        run_dir: a finished or stopped run directory (``config.json``, ``model.safetensors``) of a task model
            (``nope-interp train``) or a language model (``nope-interp train-text``). A stopped run resumed
            later (``--resume``) continues from its float32 ``checkpoint.pt`` and writes float32 weights again.

    Returns:
        The weights file.

    Raises:
        NopeInterpError: the run cannot be loaded; it is a shipped task model folder,
            ``.../pretrained/<task>/`` (:func:`is_shipped_dir`); its weights do not fit float16
            (:func:`half_precision`); another process (a training) holds the run directory.
    """
    if is_shipped_dir(run_dir):
        raise NopeInterpError(f"{run_dir} is a shipped task model: the demo measures it, so it stays float32")
    path = io.check_readable(io.as_path(run_dir, "run_dir"), "run directory", folder=True)
    if not path.is_dir():
        raise NopeInterpError(f"run directory not found: {path}")
    config = io.read_json(path / io.CONFIG_FILE, "run config")
    if isinstance(config, dict) and isinstance(config.get("text_train"), dict) and "train" not in config:
        # a text run whose weights load (nope_interp.text_train.load_text_run, which imports this module)
        model_cfg, cfg = parse_run_config(config, path / io.CONFIG_FILE,
                                          (("model", ModelConfig), ("text_train", TextTrainConfig)))
        check_settings_stamp(path / io.WEIGHTS_FILE, model_cfg, cfg, path / io.CONFIG_FILE)
        load_state(build_model(model_cfg), io.load_weights(path / io.WEIGHTS_FILE), f"the weights of {path}")
    else:
        path = load_run(path).path
    weights = path / io.WEIGHTS_FILE
    with io.exclusive(path, "run directory"):
        state = io.load_weights(weights)
        if stored_dtype(state) != "float16":
            io.save_weights(weights, half_precision(state), io.weights_metadata(weights) or None)
    return weights


def available_pretrained() -> list[str]:
    """Task names with a shipped trained model, in the paper's task order."""
    return [t for t in tasks_pkg.TASK_NAMES if (PRETRAINED_DIR / t / io.WEIGHTS_FILE).is_file()]


def load_pretrained(task: str, device: str = "cpu") -> LoadedRun:
    """The shipped trained model for ``task`` (no download: the weights are in the package).

    Raises:
        NopeInterpError: no shipped model for that name (the message lists the available ones).
    """
    if task not in available_pretrained():
        available = ", ".join(available_pretrained()) or "none"
        raise NopeInterpError(f"no shipped model for {task!r}; available: {available}")
    return load_run(PRETRAINED_DIR / task, device=device)


def available_seed_runs(task: str) -> list[Path]:
    """Directories of the extra shipped seeds of ``task`` (same recipe as the shipped model, other
    ``--seed``/``--model-seed``), sorted by seed; the shipped model itself is not included.

    Raises:
        NopeInterpError: unknown task name.
    """
    if task not in tasks_pkg.TASK_NAMES:
        raise NopeInterpError(f"unknown task {task!r}; allowed: {', '.join(tasks_pkg.TASK_NAMES)}")

    def seed_of(path: Path) -> str:
        return path.name[len(task) + 2 :]

    # ASCII digits only: str.isdigit() and int() also accept other scripts' digits and superscripts
    found = [p for p in SEEDS_DIR.glob(f"{task}-s*")
             if re.fullmatch(r"[0-9]+", seed_of(p)) and (p / io.WEIGHTS_FILE).is_file()]
    return sorted(found, key=lambda p: int(seed_of(p)))


def available_candidate_runs(task: str) -> list[Path]:
    """Directories of the candidate runs of ``task`` kept in the repository (``pretrained/candidates/``: the
    other recipes and the seeds that missed the target; not in the wheel), sorted by name. A candidate's task
    is read from its ``config.json``; folders without weights and ``in-progress/`` are skipped.

    Raises:
        NopeInterpError: unknown task name; a candidate whose config is missing or corrupt (the file is named).
    """
    if task not in tasks_pkg.TASK_NAMES:
        raise NopeInterpError(f"unknown task {task!r}; allowed: {', '.join(tasks_pkg.TASK_NAMES)}")
    if not CANDIDATES_DIR.is_dir():
        return []
    found = []
    for path in sorted(CANDIDATES_DIR.iterdir()):
        if path.name == "in-progress" or not (path / io.WEIGHTS_FILE).is_file():
            continue
        config = io.read_json(path / io.CONFIG_FILE, "run config")
        _, train_cfg = parse_run_config(config, path / io.CONFIG_FILE)
        if train_cfg.task == task:
            found.append(path)
    return found


def ship(run_dir: str | Path, task: str | None = None, as_seed: bool = False, overwrite: bool = False) -> Path:
    """Copy a finished run into the package as the shipped model of its task (a maintainer's tool).

    Copies config.json, model.safetensors, metrics.jsonl and summary.json (not the optimizer
    checkpoint) to ``nope_interp/pretrained/<task>/``, or with ``as_seed`` to
    ``nope_interp/pretrained/seeds/<task>-s<model seed>/`` (an extra seed for the seed statistics). The files
    are copied into a new folder that then replaces the destination, so a failure leaves the old one whole.

    Raises:
        NopeInterpError: ``task`` is not a task name (it becomes a folder name) or not the task the run was
            trained on; the run is not finished (no summary.json, or a summary that ``finalize`` wrote for a
            run stopped by hand before its schedule's end without reaching its target) or cannot be loaded; one
            of the four files missing; a destination that exists without ``overwrite``; shipping a run whose
            weights are not stored at float32 (a run stored at half precision by :func:`halve`) as a task's
            shipped model, which the demo measures at float32 (as an extra seed it is allowed: seeds are
            only analysed). Nothing is written then.
    """

    if task is not None and task not in tasks_pkg.TASK_NAMES:
        raise NopeInterpError(f"task must be one of {', '.join(tasks_pkg.TASK_NAMES)}, got {task!r}")
    run = load_run(run_dir)
    if task is not None and task != run.task.name:  # load_pretrained(task) would give a model of another task
        raise NopeInterpError(f"run {run_dir} was trained on {run.task.name}, not {task}: ship it as {run.task.name}")
    if not run.summary:
        raise NopeInterpError(f"run {run_dir} has no summary.json: it has not finished")
    by_hand = (run.summary.get("finished_schedule") is False and run.summary.get("stopped_early") is not True
               and run.summary.get("reached_target") is not True)
    if by_hand:
        raise NopeInterpError(f"run {run_dir} was stopped by hand at step {run.summary.get('steps')} before its "
                              "schedule's end and below its target (its summary was written by finalize): not a "
                              "finished run to ship")
    if not as_seed and run.weights_dtype != "float32":
        raise NopeInterpError(f"run {run_dir} stores its weights at {run.weights_dtype}; a shipped model must be "
                              f"float32 (recover the float32 file from git history, `git log -- "
                              f"{Path(run_dir) / io.WEIGHTS_FILE}`, or retrain)")
    check_shippable_files(run_dir)
    name = task or run.task.name
    dest = SEEDS_DIR / f"{name}-s{run.model_cfg.seed}" if as_seed else PRETRAINED_DIR / name
    if dest.exists() and not overwrite:
        raise NopeInterpError(f"{dest} exists: shipping {run_dir} would replace it; pass overwrite=True to do so")
    return install_run_files(run_dir, dest)


#: The files of a run that a shipped model keeps (not the optimizer checkpoint or the kept weights).
SHIPPED_FILES = (io.CONFIG_FILE, io.WEIGHTS_FILE, io.METRICS_FILE, io.SUMMARY_FILE)


def check_shippable_files(run_dir: str | Path) -> None:
    """Check that ``run_dir`` holds every file of :data:`SHIPPED_FILES`.

    Raises:
        NopeInterpError: some are missing (named), before anything is copied.
    """
    missing = [f for f in SHIPPED_FILES if not (Path(run_dir) / f).is_file()]
    if missing:
        raise NopeInterpError(f"run {run_dir} lacks {', '.join(missing)}: a shipped model needs all of "
                              f"{', '.join(SHIPPED_FILES)}")


def install_run_files(run_dir: str | Path, dest: Path) -> Path:
    """Copy ``run_dir``'s :data:`SHIPPED_FILES` to the folder ``dest``, replacing it whole: the files are copied
    into a new folder beside it that then takes its place, so a failure or a stop part-way leaves the old folder
    whole and a replaced folder keeps no file of the old one (no lock file: it would sit in the package).
    Used by :func:`ship` and :func:`nope_interp.text_train.ship_text`.

    Returns:
        ``dest``.

    Raises:
        NopeInterpError: a file missing (:func:`check_shippable_files`); a file cannot be copied (the OS's
            reason; ``dest`` unchanged).
    """
    import shutil
    import tempfile

    check_shippable_files(run_dir)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for fname in SHIPPED_FILES:
            try:
                shutil.copyfile(Path(run_dir) / fname, staging / fname)
            except OSError as err:
                raise NopeInterpError(f"cannot copy {Path(run_dir) / fname} to {dest}: {err.strerror or err}; "
                                      f"{dest} is unchanged") from None
        if dest.exists():
            old = dest.with_name(f".{dest.name}-replaced")
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
            staging.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
