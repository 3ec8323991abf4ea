"""What every analysis job shares: the model-source options, the loaded-model record, progress.

The contract of a job module ``nope_interp/jobs/<job>.py`` (see the README, "Adding an analysis"):

* ``NAME`` (the CLI command), ``HELP`` (one line) and ``TAKES_MODELS`` (whether the shared
  ``--run`` / ``--pretrained`` / ``--init`` options apply); optionally ``SOURCES`` (the
  :class:`ModelSource` fields it accepts, when not all of them; only those become flags), ``TAKES_HF``
  (``--hf-path``), ``TAKES_TEXT`` (``train-text`` language models) and ``DEFAULT_ONLY`` (config fields that
  shape the default models only: refused with a given source);
* a frozen ``<Job>Config`` (a :class:`~nope_interp.config.FrozenConfig`): its fields are the CLI flags,
  their help texts the ``--help``; it validates itself;
* ``default_models(config) -> list[ModelEntry]``: the models used when no source option is given;
* ``run(config, models=None, *, log=None) -> <Job>Result``: a frozen, typed result with ``to_dict()``; ``models``
  checked by :func:`job_models` (None: the defaults);
  ``log`` receives one line per step, and a progress bar is shown when ``log`` is given and stderr is a
  terminal (:func:`stderr_is_terminal`);
* ``write(result, out_root) -> list[Path]``: files under ``results/<job>/`` and ``figures/<job>/``
  (:func:`nope_interp.io.job_dirs`); returns every file written (what the CLI prints under ``outputs:``), the
  ``plotly.min.js`` beside the figures too: pass the paths through :func:`nope_interp.plotting.with_plotlyjs`;
* plot functions that take the result, never a model.
"""

import hashlib
import importlib
import json
import os
import re
import sys
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import inputs_too_long_error, protocol_prompts
from nope_interp.checks import in_order, is_int, repeated
from nope_interp.config import (
    FrozenConfig,
    ModelConfig,
    check_int,
    check_name,
    check_tasks,
    describe_presets,
    opt,
    preset,
)
from nope_interp.errors import Fields, NopeInterpError, NopeInterpWarning, user_stacklevel
from nope_interp.model import LensModel, build_model
from nope_interp.pretrained import LoadedRun, available_pretrained, available_seed_runs, load_pretrained, load_run
from tasks import DEFAULT_WINDOW

Log = Callable[[str], None] | None
T = TypeVar("T")


@dataclass(frozen=True)
class ModelSource(FrozenConfig):
    """Which models a job analyses: run directories, shipped models, or one initialised model.

    At most one of ``run``, ``pretrained`` and ``init`` is given; none means the job's default set.

    Raises:
        NopeInterpError: an empty or blank path in ``run`` or ``hf_path``; two sources at once; ``init`` without
            ``task``; ``with_seeds`` or ``with_candidates`` with ``run``, ``init`` or ``hf_path``; an unknown
            task, preset or model field;
            ``model_overrides`` or a preset other than ``paper`` without ``init`` (they would be ignored);
            ``task`` or ``n_digits`` with ``hf_path``; ``n_digits`` outside the range of a task it applies to
            (``task``, or each of ``pretrained``; a run's own task checks it when loaded: :func:`load_models`).
    """

    run: tuple[str, ...] = opt((), "run directories (runs/<name>/)")
    pretrained: tuple[str, ...] = opt((), f"shipped trained models by task: {', '.join(tasks_pkg.TASK_NAMES)}")
    init: bool = opt(False, "a freshly initialised model (give --task; --preset and --model-* shape it)")
    task: str | None = opt(None, "task for --init, or to analyse a trained model on another task")
    n_digits: int | None = opt(None, "task size (default: the paper's; alone with --run / --pretrained: the "
                                     "trained model's own task at this size)")
    preset: str = opt("paper", f"model preset for --init: {describe_presets()}; the shipped task models are cpu "
                               "(indexing: cpu with --model-n-layers 6)")
    with_seeds: bool = opt(False, "also the extra shipped seeds of the --pretrained tasks")
    with_candidates: bool = opt(False, "also the candidate runs of the --pretrained tasks kept in the repository "
                                       "(other recipes, seeds that missed 99%; nope_interp/pretrained/candidates/)")
    hf_path: str | None = opt(None, "a Hugging Face causal LM saved with save_pretrained (the hf extra), "
                                    "wrapped in a TransformerBridge")
    model_overrides: dict[str, Any] = opt({}, "ModelConfig fields for --init (the --model-* flags)")

    def _check_field_types(self) -> None:
        # a pathlib.Path is a path as a str is (as_path's message says so): kept as its str, JSON-safe
        if isinstance(self.run, (list, tuple)):
            object.__setattr__(self, "run", tuple(os.fspath(p) if isinstance(p, os.PathLike) else p for p in self.run))
        if isinstance(self.hf_path, os.PathLike):
            object.__setattr__(self, "hf_path", os.fspath(self.hf_path))
        for path in self.run if isinstance(self.run, tuple) else ():  # before "a list of strings": the path words
            io.as_path(path, "run")
        if self.hf_path is not None:
            io.as_path(self.hf_path, "hf_path")
        super()._check_field_types()

    def __post_init__(self) -> None:
        for path in self.run:  # an empty path would read as the current folder
            io.as_path(path, "run")
        if self.hf_path is not None:  # "" would read as not given
            io.as_path(self.hf_path, "hf_path")
        given = [n for n, v in (("run", self.run), ("pretrained", self.pretrained), ("init", self.init),
                                ("hf_path", self.hf_path)) if v]
        if len(given) > 1:
            raise NopeInterpError.naming("give at most one of {sources}; got "
                                         + " and ".join(f"{{{n}}}" for n in given),
                                         sources=Fields("run", "pretrained", "init", "hf_path"))
        if self.pretrained:
            check_tasks(self.pretrained)
        if self.task is not None:
            check_tasks((self.task,))
        if self.n_digits is not None:  # each task's own range, before any model is loaded
            for name in (self.task,) if self.task is not None else self.pretrained:
                task_or_error(name, self.n_digits)
        if self.init:
            if self.task is None:
                raise NopeInterpError.naming("{init} needs {task} (one of: {tasks})",
                                             tasks=", ".join(tasks_pkg.TASK_NAMES))
            preset(self.preset, **self.model_overrides)  # validates preset and overrides
        else:  # they shape an initialised model only: with any other source they would be ignored
            # the --model-* flags; a key is the user's text, never a format template: a plain name is its field's
            # placeholder (the CLI spells it --model-<name>), any other key (``"a{b"``, ``"x.y"``) one of its own
            shaping = {(f"model_{k}" if isinstance(k, str) and k.isidentifier() else f"model override #{i}"):
                       f"model_overrides[{k!r}]" for i, k in enumerate(self.model_overrides)}
            shaping.update({"preset": "preset"} if self.preset != "paper" else {})
            if shaping:
                raise NopeInterpError.naming(
                    ", ".join(f"{{{n}}}" for n in shaping) + f" shape{'s' if len(shaping) == 1 else ''} an {{init}} "
                    f"model; a trained, shipped or Hugging Face model has its own shape: drop "
                    f"{'it' if len(shaping) == 1 else 'them'}", shaping)
        inputs = [n for n, v in (("task", self.task), ("n_digits", self.n_digits)) if v is not None]
        if self.hf_path and inputs:  # the fields given only, and text_file where the command has it (analyze)
            one = len(inputs) == 1
            raise NopeInterpError.naming(
                " and ".join(f"{{{n}}}" for n in inputs) + f" name{'s' if one else ''} task inputs; a Hugging Face "
                "model ({hf_path}) reads random ids of its own vocabulary{or_text}: drop " + ("it" if one else "them"),
                or_text=Fields("text_file", around=" (or {})"))
        for flag, on in (("with_seeds", self.with_seeds), ("with_candidates", self.with_candidates)):
            if not on:
                continue
            other = [n for n, v in (("run", self.run), ("init", self.init), ("hf_path", self.hf_path)) if v]
            if other:
                raise NopeInterpError.naming(f"{{{flag}}} adds repository models to {{pretrained}} (or the default); "
                                             f"with {{{other[0]}}}, list every model yourself")
            if not self.pretrained and (self.task is not None or self.n_digits is not None):
                raise NopeInterpError.naming(f"{{{flag}}} alone means every shipped task's models; with {{task}} or "
                                             f"{{n_digits}} name them: {{pretrained}} TASK [TASK ...] {{{flag}}}")

    @property
    def given(self) -> bool:
        """True when an explicit source was given (otherwise the job uses its default models).
        ``with_seeds`` or ``with_candidates`` alone counts: every shipped model plus those repository models."""
        return bool(self.run or self.pretrained or self.init or self.with_seeds or self.with_candidates
                    or self.hf_path)

    @property
    def task_params(self) -> dict[str, int]:
        """``{"n_digits": N}`` when ``n_digits`` was given, else ``{}``."""
        return {} if self.n_digits is None else {"n_digits": self.n_digits}


#: The kinds of :class:`ModelEntry`.
ENTRY_KINDS = ("init", "run", "pretrained", "hf", "text")


@dataclass(frozen=True)
class ModelEntry:
    """One model to analyse, with its task and the prompts it must not be analysed on.

    Attributes:
        label: a short name for tables and file names (``init-paper-reversal``, a run directory's name,
            ``pretrained-reversal``, ``hf-<folder>``).
        kind: ``"init"``, ``"run"``, ``"pretrained"``, ``"hf"`` or ``"text"`` (a ``train-text`` language model).
        model: the HookedTransformer (eval mode), or a TransformerBridge for ``hf``.
        model_cfg: its config (None for ``hf``: a Hugging Face model has no ModelConfig). task: the task it
            is analysed on.
        train_prompts: prompts it was trained on (empty for an initialised model).
        run: the loaded run for a trained model, else None.
        source: provenance for result files (``{"init": config}`` or ``{"model_source": path, "model": config}``).

    Raises:
        NopeInterpError: a label that is not one safe path component (:func:`~nope_interp.config.check_name`;
            e.g. a run directory named ``..`` or with a space); a ``kind`` not in :data:`ENTRY_KINDS`; a
            ``model`` that is not a HookedTransformer or TransformerBridge; a ``model_cfg`` that is not a
            ModelConfig (None is allowed for kind ``hf`` only); a ``task`` that is not a ``tasks.Task`` (a task
            name: use ``tasks.get_task``); ``train_prompts`` not a set of strings (a set is stored as a frozenset);
            ``run`` not a LoadedRun or None; ``source`` not a dict.
    """

    label: str
    kind: str
    model: LensModel
    model_cfg: ModelConfig | None
    task: tasks_pkg.Task
    train_prompts: frozenset[str] = frozenset()
    run: LoadedRun | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # jobs write files named after the label: it must be one safe path component
        check_name("model label", self.label)

        def bad(what: str, value: object) -> NopeInterpError:
            return NopeInterpError(f"ModelEntry {self.label}: {what}, got {type(value).__name__} {value!r}"[:400])

        if not isinstance(self.kind, str) or self.kind not in ENTRY_KINDS:
            raise bad(f"kind must be one of {', '.join(ENTRY_KINDS)}", self.kind)
        if not isinstance(self.model, LensModel):
            raise bad("model must be a HookedTransformer or a TransformerBridge", self.model)
        if not isinstance(self.model_cfg, ModelConfig) and not (self.model_cfg is None and self.kind == "hf"):
            raise bad("model_cfg must be a ModelConfig (None only for a Hugging Face model, kind 'hf')",
                      self.model_cfg)
        if not isinstance(self.task, tasks_pkg.Task):
            hint = f" (tasks.get_task({self.task!r}) for a task name)" if isinstance(self.task, str) else ""
            raise bad(f"task must be a tasks.Task{hint}", self.task)
        if not isinstance(self.train_prompts, (set, frozenset)) or \
                not all(isinstance(p, str) for p in self.train_prompts):
            raise bad("train_prompts must be a set of prompt strings", self.train_prompts)
        object.__setattr__(self, "train_prompts", frozenset(self.train_prompts))
        if self.run is not None and not isinstance(self.run, LoadedRun):
            raise bad("run must be a LoadedRun or None", self.run)
        if not isinstance(self.source, dict):
            raise bad("source must be a dict", self.source)


def task_or_error(name: str, n_digits: int | None, base: dict[str, Any] | None = None) -> tasks_pkg.Task:
    """``tasks.get_task(name, **base, n_digits=n_digits)`` (``n_digits`` None: left out) with its TaskError (an
    ``n_digits`` outside the task's own range) as a one-line NopeInterpError naming ``n_digits`` (``--n-digits`` on
    the command line).

    Raises:
        NopeInterpError: the task refuses the parameters (an unknown task name too).
    """
    params = {**(base or {}), **({} if n_digits is None else {"n_digits": n_digits})}
    try:
        return tasks_pkg.get_task(name, **params)
    except tasks_pkg.TaskError as err:
        if n_digits is None:
            raise NopeInterpError(str(err)) from None
        raise NopeInterpError.naming("{n_digits}={value!r} does not fit task {name}: {why}", value=n_digits,
                                     name=name, why=str(err)) from None


def job_models(job: str, models: object, defaults: Callable[[], list[ModelEntry]]) -> list[ModelEntry]:
    """The models a job's ``run(config, models)`` analyses: ``defaults()`` when ``models`` is None, else
    ``models`` checked as a non-empty list or tuple of :class:`ModelEntry` (the one check of every job's
    ``models`` argument).

    Raises:
        NopeInterpError: ``models`` an empty list (a mistake, not a request for the defaults), not a list or
            tuple (one entry alone), or holding something that is not a ``ModelEntry`` (a ``LoadedRun`` or a
            model: the message says how to wrap it); two entries with one label; one trained model twice
            (:func:`refuse_same_model_twice`).
    """
    if models is None:
        return defaults()
    if not isinstance(models, list | tuple):
        raise NopeInterpError(f"{job}: models must be a list of ModelEntry (or None for the default models), got "
                              f"{type(models).__name__}; for one model write [entry]")
    if not models:
        raise NopeInterpError(f"{job}: models is an empty list; give models, or None for the default models")
    for m in models:
        if not isinstance(m, ModelEntry):
            hint = (" (wrap a loaded run: nope_interp.jobs.common.entry_from_run(run, label))"
                    if isinstance(m, LoadedRun) else "")
            raise NopeInterpError(f"{job}: models must hold ModelEntry objects, got a {type(m).__name__}{hint}")
    labels = [m.label for m in models]
    twice = list(dict.fromkeys(lab for lab in labels if labels.count(lab) > 1))
    if twice:   # results, rows and files are keyed by label: the second model replaced the first one's
        raise NopeInterpError(f"{job}: models must have distinct labels (results and files are keyed by them), got "
                              f"{', '.join(map(repr, twice))} more than once; give each ModelEntry its own label")
    refuse_same_model_twice(job, models)
    return list(models)


def refuse_default_only(job: str, config: FrozenConfig, default_only: Iterable[str], default_models: str,
                        models: Iterable[ModelEntry]) -> None:
    """For a job's ``run(config, models)`` with ``models`` given: refuse the config fields that shape the job's
    default models only (its ``DEFAULT_ONLY``) when they are set to something other than their default
    (:meth:`~nope_interp.config.FrozenConfig.given_fields`; a field the config filled itself, such as
    ``quick``'s seeds, does not count): they would be ignored, yet recorded in the result. ``tasks`` naming
    exactly the given models' tasks and ``text_task`` naming the one task of every given model agree with
    them and are kept. The CLI refuses the same flags with ``--run`` / ``--pretrained`` / ``--init`` /
    ``--hf-path``.

    Raises:
        NopeInterpError: such a field set; the message names every one of them; ``default_only`` a single
            string (read letter by letter before: :func:`~nope_interp.checks.in_order`). A generator given as
            ``default_only`` is read once (before, the first field's test used it up).
    """
    default_only = tuple(in_order("default_only", default_only, "config field names", "refuse_default_only", key=str))
    names = tuple(dict.fromkeys(e.task.name for e in models))
    agrees = {"tasks": lambda v: set(v) == set(names), "text_task": lambda v: names == (v,)}
    given = [name for name in config.given_fields() if name in default_only
             and not (name in agrees and agrees[name](getattr(config, name)))]
    if given:
        one = len(given) == 1
        # the job's DEFAULT_MODELS is its --help text: its flags read as the config fields they set
        default_models = re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"),
                                default_models)
        raise NopeInterpError(f"{job}: {', '.join(given)} shape{'s' if one else ''} the default models "
                              f"({default_models}), not the models given to run(): {'it' if one else 'they'} "
                              f"would be ignored; leave {'it' if one else 'them'} at the default")


def check_inputs_fit(job: str, models: Iterable[ModelEntry], protocols: Iterable[str], window: int | None) -> None:
    """Before any work: refuse the task models whose ``n_ctx`` cannot hold the analysis inputs of any of
    ``protocols`` (``window`` characters, = tokens, for the ``window`` protocol), all of them named in one
    message, with the window that fits every task model given (the least ``n_ctx``); one task model alone gets
    the analysis's own message (:func:`~nope_interp.analysis.inputs_too_long`; the CLI names the flag).
    Train-text and Hugging Face models (no task inputs) are not checked, nor a protocol or window the analysis
    itself refuses.

    Raises:
        NopeInterpError: inputs longer than a model's ``n_ctx``, e.g. ``--protocol window --window 64`` with a
            model of ``n_ctx`` 48 beside one of 64 (a set of ``protocols`` is read sorted, so the protocol named is
            always the same: :func:`~nope_interp.checks.in_order`); ``protocols`` a single string (``"full"``, read
            letter by letter before: give ``["full"]``).
    """
    protocols = in_order("protocols", protocols, "protocol names", "check_inputs_fit", key=str)
    shapes = [(e.task, e.label, e.model.cfg.n_ctx) for e in models if e.kind not in ("text", "hf")]
    check_shapes_fit(job, shapes, protocols, window)


def check_shapes_fit(job: str, shapes: list[tuple[tasks_pkg.Task, str, int]], protocols: Iterable[str],
                     window: int | None) -> None:
    """:func:`check_inputs_fit` of task models known by their shapes alone: ``(task, label, n_ctx)`` each, so a
    job that builds its default models one at a time (``averaging``) checks them all before building the first.

    Raises:
        NopeInterpError: as :func:`check_inputs_fit`.
    """
    protocols = in_order("protocols", protocols, "protocol names", "check_shapes_fit", key=str)
    if len(shapes) == 1:  # the analysis's own message (the CLI names the flag), before the job's first line
        ((task, _, n_ctx),) = shapes
        for protocol in protocols:
            try:
                why = inputs_too_long_error(task, protocol, protocol_window(protocol, window), n_ctx)
            except tasks_pkg.TaskError:  # a window that is no length: the analysis names it
                continue
            if why is not None:  # no label: one model
                why.config = job_config(job)  # its window is the job's (--window), not the model's (--model-window)
                raise why
    if len(shapes) < 2:
        return
    for protocol in protocols:
        bad = []
        for task, label, n_ctx in shapes:
            try:
                length = tasks_pkg.protocol_length(task, protocol, protocol_window(protocol, window))
            except tasks_pkg.TaskError:  # a window that is no length: the analysis names it
                continue
            if length > n_ctx:
                bad.append(f"{label} (n_ctx={n_ctx} is too small for {task.name} inputs of {length} tokens)")
        if bad:
            fits = min(n_ctx for _, _, n_ctx in shapes)
            fix = "; {window} {fits} or less fits every model given" if protocol == "window" and fits >= 3 else ""
            err = NopeInterpError.naming("{job}: the {protocol_name} inputs do not fit {n_bad} of {n} models: {bad}"
                                         + fix, job=job, protocol_name=protocol, n_bad=len(bad), n=len(shapes),
                                         bad=", ".join(bad), fits=fits)
            err.config = job_config(job)
            raise err


def job_config(job: str) -> type | None:
    """The config class of the job named ``job`` (``"analyze"``: ``AnalyzeConfig``), None for another name: set
    as :attr:`NopeInterpError.config` of a job's error naming its ``window``, so the CLI spells it as the job's
    ``--window``, not the ``--model-window`` of an ``--init`` model, whether or not ``--window`` was given."""
    from nope_interp.jobs import JOB_HELP, job_module_name

    if job not in JOB_HELP:
        return None
    return getattr(importlib.import_module(job_module_name(job)), "CONFIG", None)


def refuse_same_model_twice(job: str, models: Iterable[ModelEntry]) -> None:
    """Refuse one trained model given twice on the same task under two labels: the same directory reached
    through a link or another spelling (compared after resolving), or a copy with byte-identical weights
    (``model.safetensors``, compared by SHA-256). Each entry would count as a seed of its recipe, so every
    mean over seeds would repeat one value and every std and confidence interval shrink. The same run on two
    tasks (labels ``-on-<task>``) and initialised or Hugging Face models (no directory) are not compared.

    Raises:
        NopeInterpError: two entries of the same task whose directories resolve to one, or whose weights files
            are identical.
    """
    seen: dict[tuple[str, str, str], str] = {}
    for entry in models:
        where = run_path(entry)  # absolute, links resolved; None without a directory
        if where is None:
            continue
        task = f"{entry.task.name}{sorted(entry.task.params().items())}"
        weights = Path(where) / io.WEIGHTS_FILE
        keys = [("directory", where, task)]
        if weights.is_file():
            with weights.open("rb") as fh:
                keys.append(("weights", hashlib.file_digest(fh, "sha256").hexdigest(), task))
        for key in keys:
            if key in seen and seen[key] != entry.label:
                why = ("one directory (after resolving links)" if key[0] == "directory"
                       else "byte-identical weights (a copy)")
                raise NopeInterpError(f"{job}: {seen[key]} and {entry.label} are the same model ({why}): it would "
                                      "count as two seeds in every mean, std and interval over seeds; give it once")
            seen[key] = entry.label


def draw_seed(label: str) -> int:
    """The seed of one model's random draws in a job (ablations' subspaces and swaps, averaging's random
    attention patterns, the diagnostics' resampled delimiters): the CRC-32 of ``label`` (UTF-8; lone surrogates
    from undecodable file names kept), an integer in [0, 2**32). Jobs key it by the model's label (``averaging``
    by ``"<task>/<label>"``), so every model of a call gets its own draws and a label the same ones in any
    company, and a statistic over seeds also varies over draws (until 2026-12-03 every job drew with one seed
    for all its models, so the spread over seeds was blind to the draw). Paired models share their seed's draw
    on purpose: in ``compare`` a seed's initialised and trained models, in ``demo`` a task's three. The draws
    follow the label, not the weights: the same weights under another label (a renamed run folder, a shipped
    model given with ``--run`` instead of ``--pretrained``) get other draws.

    Raises:
        NopeInterpError: ``label`` not a string.
    """
    if not isinstance(label, str):
        raise NopeInterpError(f"draw_seed: label must be a string, got {type(label).__name__}")
    return zlib.crc32(label.encode("utf-8", "surrogatepass"))


def run_path(entry: ModelEntry) -> str | None:
    """The directory of ``entry``'s model as written in every output (``run`` of ``ablate.json``, its seed
    summaries and CSVs, of each run in ``trajectory``'s and ``compare``'s results): an absolute path with
    symlinks resolved (a leading ``~`` expanded), the same convention for a task run (shipped or given with
    ``--run``, relative or not) and a ``train-text`` run; None for a model without a directory (an initialised
    or a Hugging Face model, or a ``text`` entry built by hand without ``source["model_source"]``)."""
    if entry.run is not None:
        path = entry.run.path
    elif entry.kind == "text" and isinstance(entry.source.get("model_source"), str | Path):
        path = entry.source["model_source"]
    else:
        return None
    return resolved_dir(path)


def resolved_dir(path: str | Path) -> str:
    """``path`` as every output writes a model's directory (``run``, ``model_source``): absolute, symlinks
    resolved, a leading ``~`` expanded.

    Raises:
        NopeInterpError: an empty path or one that is not a ``str`` or ``Path``.
    """
    return str(io.as_path(path, "run directory").resolve())


def keyed_generator(seed: int, *keys: str) -> torch.Generator:
    """A ``torch.Generator`` for one draw of a job, seeded by ``seed`` (a model's :func:`draw_seed`) and the
    ``keys`` that name the draw (e.g. the site and the ablation kind): the CRC-32 of
    ``"<seed>/<key>/<key>..."`` (UTF-8), an integer in [0, 2**32). So a draw depends only on the model and on what
    is drawn, never on which other draws the same call makes or in what order (one generator shared by a loop
    over sites and kinds gives a kind other draws when another kind or site is requested beside it). Keys are
    joined with ``/``, so keys containing ``/`` can alias (``("a/b",)`` and ``("a", "b")``): use names without it.

    Raises:
        NopeInterpError: ``seed`` not an integer in [0, 2**63); a key that is not a string.
    """
    seed = check_int("seed", seed, 0, 2**63 - 1)
    for key in keys:
        if not isinstance(key, str):
            raise NopeInterpError(f"keyed_generator: keys must be strings, got {type(key).__name__} {key!r}")
    text = "/".join((str(seed), *keys))
    return torch.Generator().manual_seed(zlib.crc32(text.encode("utf-8", "surrogatepass")))


def entry_from_run(run: LoadedRun, label: str, kind: str = "run", task: tasks_pkg.Task | None = None) -> ModelEntry:
    """A :class:`ModelEntry` for a loaded run; on another ``task`` (name or size) no training prompts are
    excluded and the label says which task it is analysed on (``<label>-on-<task><n_digits>``), so results
    of one run on two tasks never share a file name."""
    task = task or run.task
    train = run.train_prompts if task.name == run.task.name else frozenset()
    if task != run.task:
        label = f"{label}-on-{task.name}{task.params().get('n_digits', '')}"
    return ModelEntry(label=label, kind=kind, model=run.model, model_cfg=run.model_cfg, task=task,
                      train_prompts=train, run=run,
                      source={"model_source": resolved_dir(run.path), "model": run.model_cfg.to_dict(),
                              "weights_dtype": run.weights_dtype})


def eval_prefix(entry: ModelEntry) -> str:
    """The text a model reads before every prompt when its answers are scored: its run's ``eval_prefix``
    (``"\\n"`` for a model trained on packed windows, where every example but the first follows a newline;
    ``""`` for an answer-only model), and ``""`` for a model without a run (initialised)."""
    return "" if entry.run is None else entry.run.train_cfg.eval_prefix


def eval_examples(entry: ModelEntry, n: int, seed: int = 0) -> list[tasks_pkg.Example]:
    """At most ``n`` test examples (prompts of every length, with answers) of ``entry.task``.

    On the run's own task (same name and parameters) these are the first ``n`` of the run's test split, as
    training measured them. On other task parameters (a trained model asked about shorter or longer
    operands) they are ``n`` distinct prompts of ``entry.task`` drawn with ``seed``, none of them a training
    prompt of the run; all of them when those parameters allow fewer.

    Raises:
        NopeInterpError: ``n`` < 1; no prompt of ``entry.task`` outside the run's training prompts.
    """
    if not is_int(n) or n < 1:
        raise NopeInterpError(f"n must be an integer >= 1, got {n!r}")
    n = int(n)
    task = entry.task
    if entry.run is not None and entry.run.task == task:
        return list(entry.run.splits.test[:n])
    exclude = entry.train_prompts
    prompts = [p for p in task.distinct_prompts(min(task.n_distinct_prompts(), n + len(exclude)), seed)
               if p not in exclude][:n]
    if not prompts:
        raise NopeInterpError(f"no {task.name} prompt with {task.params()} lies outside the run's training prompts")
    return [task.example(p) for p in prompts]


def entry_from_init(cfg: ModelConfig, task: tasks_pkg.Task, label: str) -> ModelEntry:
    """A :class:`ModelEntry` for a freshly initialised model of ``cfg``."""
    return ModelEntry(label=label, kind="init", model=build_model(cfg), model_cfg=cfg, task=task,
                      source={"init": cfg.to_dict()})


def load_models(source: ModelSource, default_with_seeds: bool = False) -> list[ModelEntry]:
    """The models named by ``source`` ([] when it names none: the job then uses its defaults).

    ``default_with_seeds``: for a job whose default models include the extra seeds (``compare``), so that
    ``--with-candidates`` alone adds the candidates to that default instead of replacing the seeds.

    Raises:
        NopeInterpError: a missing or corrupt run directory (a missing one, a file, or a folder without
            ``config.json``), named as ``run=...`` (on the CLI ``--run=...``); an ``hf_path`` without
            ``config.json``; a task without a shipped model; a run directory
            whose name is not a safe label (:func:`~nope_interp.config.check_name`); two run directories of
            the same folder name (the same run given twice, too); ``n_digits`` outside the range of a run's own
            task.
    """
    task = None if source.task is None else task_or_error(source.task, source.n_digits)

    def own_task(run: LoadedRun) -> tasks_pkg.Task | None:  # --n-digits alone: the run's own task at that size
        if task is not None or source.n_digits is None:
            return task
        return task_or_error(run.task.name, source.n_digits, run.task.params())

    if source.hf_path:
        from nope_interp.hf import load_hf

        name = Path(os.path.abspath(source.hf_path)).name
        try:
            io.check_readable(io.as_path(source.hf_path, "hf_path"), "folder", folder=True)
        except NopeInterpError as err:  # before: a name too long or a folder it may not enter was a traceback
            raise NopeInterpError.naming("{hf_path}={path!r}: {why}", path=str(source.hf_path), why=str(err)) from None
        if not os.path.isfile(io.as_path(source.hf_path, "hf_path") / "config.json"):  # load_hf's check, named
            raise NopeInterpError.naming("{hf_path}={path!r} is not a folder saved by save_pretrained (no "
                                         "config.json)", path=str(source.hf_path))
        return [ModelEntry(label=f"hf-{name}", kind="hf", model=load_hf(source.hf_path, "hf_path"), model_cfg=None,
                           task=task or tasks_pkg.get_task("reversal"), source={"hf_path": str(source.hf_path)})]
    if source.init:
        assert task is not None  # checked by ModelSource
        cfg = preset(source.preset, **source.model_overrides)
        tweaks = "".join(f"-{k}{'_'.join(map(str, v)) if isinstance(v, tuple | list) else v}"
                         for k, v in sorted(source.model_overrides.items()))  # tuples: nope_layers1_3
        size = "".join(f"-{k}{v}" for k, v in sorted(source.task_params.items()))  # --n-digits: -n_digits5
        return [entry_from_init(cfg, task, f"init-{source.preset}-{task.name}{size}{tweaks}")]
    if (source.with_seeds or source.with_candidates) and not source.pretrained:
        return shipped_entries(tasks_pkg.TASK_NAMES, with_seeds=source.with_seeds or default_with_seeds,
                               with_candidates=source.with_candidates)
    for path in source.run:  # what is wrong with the folder itself first, naming the flag
        where = os.fspath(path)
        try:
            os.stat(where)
        except (FileNotFoundError, NotADirectoryError):
            raise NopeInterpError.naming("{run}={path!r}: no such folder", path=str(path)) from None
        except OSError as err:  # a loop of links, a name too long, a folder it may not enter: said as such
            raise NopeInterpError.naming("{run}={path!r} cannot be read: {why}", path=str(path),
                                         why=err.strerror or str(err)) from None
        if os.path.isdir(where) and not os.access(where, os.R_OK | os.X_OK):
            raise NopeInterpError.naming("{run}={path!r} cannot be read: permission denied", path=str(path))
        if not os.path.isdir(where):
            raise NopeInterpError.naming("{run}={path!r} is a file, not a run folder (one written by nope-interp "
                                         "train or train-text: config.json, model.safetensors, ...)", path=str(path))
        if not os.path.exists(os.path.join(where, io.CONFIG_FILE)):
            raise NopeInterpError.naming("{run}={path!r} is not a run folder: it has no {config} (a run folder is one "
                                         "written by nope-interp train or train-text)", path=str(path),
                                         config=io.CONFIG_FILE)
    seen: dict[str, str] = {}
    for path in source.run:  # labels name result rows, files and figure lines: two models must not share one
        label = run_label(path)
        if label in seen:
            raise NopeInterpError.naming("{run} holds {first!r} and {path!r}, which share the label {label!r} (their "
                                         "folder name), which labels results and figures: give each run its own "
                                         "folder name (copy or rename one)", first=seen[label], path=str(path),
                                         label=label)
        seen[label] = str(path)
    entries = []
    for path in source.run:
        label = run_label(path)
        if is_text_run(path):
            entries.append(text_entry(path, label, task))
            continue
        run = load_run(path)
        entries.append(entry_from_run(run, label, "run", own_task(run)))
    for name in source.pretrained:
        run = load_pretrained(name)
        entries.append(entry_from_run(run, f"pretrained-{name}", "pretrained", own_task(run)))
        if source.with_seeds:
            entries += seed_entries(name, own_task(run))
        if source.with_candidates:
            entries += candidate_entries(name, own_task(run))
    return entries


def run_label(path: str | Path) -> str:
    """The label of a run directory in results and figures: its folder name (also for ``runs/x/..`` or
    ``.``), except for a training sweep's point (``<out>/<sweep>/points/<key>/run``, where every folder is
    called ``run``): ``<sweep>-<key>``.

    Raises:
        NopeInterpError: the label is not a safe file name (spaces, non-ASCII letters, ...): the message says
            to rename or link the folder.
    """
    full = Path(os.path.abspath(path))
    if full.name == "run" and full.parent.parent.name == "points" and full.parent.parent.parent.name:
        label = f"{full.parent.parent.parent.name}-{full.parent.name}"
    else:
        label = full.name
    try:
        check_name("run label", label)
    except NopeInterpError:
        raise NopeInterpError(f"the run folder {str(path)!r} names the result files, so its name must be 1-200 "
                              f"characters from A-Z a-z 0-9 . _ + - (not starting with . or -), got {label!r}: "
                              "rename the folder, or link it under such a name (ln -s)") from None
    return label


def _repository_entries(paths: list[Path], task: tasks_pkg.Task | None, missing: str) -> list[ModelEntry]:
    """``paths`` (run folders kept in the repository) as :class:`ModelEntry` s labelled by folder name;
    the warning ``missing`` when there are none (they are not in the wheel)."""
    if not paths:
        warnings.warn(missing, stacklevel=user_stacklevel())
    return [entry_from_run(load_run(p), p.name, "run", task) for p in paths]


def seed_entries(name: str, task: tasks_pkg.Task | None = None) -> list[ModelEntry]:
    """The extra shipped seeds of task ``name`` as :class:`ModelEntry` s; a warning when there are none (they
    live in the repository, not in the wheel, and a task may have none yet).

    Raises:
        NopeInterpError: unknown task name; a corrupt seed run.
    """
    from nope_interp import pretrained  # at call time: tests move SEEDS_DIR

    return _repository_entries(available_seed_runs(name), task,
                               f"no extra seeds of {name} in {pretrained.SEEDS_DIR} (they ship in the repository, "
                               "not in the wheel; a task may have none yet): using the shipped model alone")


def candidate_entries(name: str, task: tasks_pkg.Task | None = None) -> list[ModelEntry]:
    """The candidate runs of task ``name`` kept in the repository
    (:func:`nope_interp.pretrained.available_candidate_runs`) as :class:`ModelEntry` s labelled by folder
    name; a warning when there are none (they are not in the wheel).

    Raises:
        NopeInterpError: unknown task name; a corrupt candidate run.
    """
    from nope_interp import pretrained  # at call time: tests move CANDIDATES_DIR

    return _repository_entries(pretrained.available_candidate_runs(name), task,
                               f"no candidate runs of {name} in {pretrained.CANDIDATES_DIR} (they are kept in the "
                               "repository, not in the wheel)")


def is_text_run(path: str | Path) -> bool:
    """Whether ``path`` is a run of ``nope-interp train-text`` (its ``config.json`` has ``text_train``)."""
    try:
        config = io.read_json(Path(path) / io.CONFIG_FILE, "run config")
    except NopeInterpError:
        return False  # load_run reports what is wrong with it
    return isinstance(config, dict) and "text_train" in config


def text_entry(path: str | Path, label: str, task: tasks_pkg.Task | None = None) -> ModelEntry:
    """A :class:`ModelEntry` (kind ``text``) for a character-level language model of ``nope-interp train-text``:
    the tasks' vocabulary, no task of its own (``task`` only names the inputs of ``task`` kind; default
    reversal) and no training prompts; ``source["text_window"]`` is its training window (characters).

    Raises:
        NopeInterpError: a corrupt run (:func:`nope_interp.text_train.load_text_run`); a label that is not safe.
    """
    from nope_interp.text_train import load_text_run

    check_name("run label", label)
    model, model_cfg, train_cfg = load_text_run(path)
    return ModelEntry(label=label, kind="text", model=model, model_cfg=model_cfg,
                      task=task or tasks_pkg.get_task("reversal"),
                      source={"model_source": resolved_dir(path), "text_run": True, "text_window": train_cfg.window,
                              "model": model_cfg.to_dict()})


def locked_write(job_folder: str) -> Callable[[Callable[..., list[Path]]], Callable[..., list[Path]]]:
    """Decorate a job's ``write(result, out_root)`` so that it holds both of its output folders
    (``results/<job_folder>`` and ``figures/<job_folder>`` under ``out_root``: :func:`nope_interp.io.job_dirs`)
    for the whole write (:func:`nope_interp.io.exclusive_folders`), after checking both as the CLI does before
    any work (:func:`~nope_interp.io.check_writable_dir`: a file, a dangling link or a folder that may not be
    written where a folder goes is one line, and a dangling link's target is never created). The CLI already
    holds the locks around the job (re-entrant in one thread); this guards a Python caller, so two processes
    writing one out-root are refused in one line instead of leaving one's JSON beside the other's figures. The
    wrapper's ``__nope_locked__`` holds ``job_folder`` (tests that strip the type checker lock again with it).

    Raises (from the decorated write):
        NopeInterpError: ``out_root`` not a path (:func:`~nope_interp.io.job_dirs`); a folder cannot be
            written or created; a folder is being written by another process or thread; nothing is written
            then.
    """
    import functools

    def wrap(write: Callable[..., list[Path]]) -> Callable[..., list[Path]]:
        @functools.wraps(write)
        def locked(result: Any, out_root: Any = ".", *args: Any, **kwargs: Any) -> list[Path]:
            folders = io.job_dirs(out_root, job_folder)
            for folder in folders:
                io.check_writable_dir(folder, "output folder")
            with io.exclusive_folders(folders, "output folder"):
                return write(result, out_root, *args, **kwargs)

        locked.__nope_locked__ = job_folder  # type: ignore[attr-defined]
        return locked

    return wrap


def protocol_tag(protocol: str, window: int = DEFAULT_WINDOW) -> str:
    """The part of an output's name that tells its analysis inputs apart: ``""`` for ``full`` (the default
    keeps its plain names), ``"authors"``, ``"window<window>"`` (``window64``), so that neither two protocols
    nor two window lengths ever write to the same file. ``protocol`` is one of ``tasks.PROTOCOLS`` (checked by
    the caller's config); ``window`` (characters) only matters for ``window``."""
    return "" if protocol == "full" else f"window{window}" if protocol == "window" else protocol


def with_protocol(rows: list[dict[str, Any]], protocol: str, window: int = DEFAULT_WINDOW) -> list[dict[str, Any]]:
    """CSV ``rows`` with the analysis inputs as their first columns: ``protocol`` and, for the ``window``
    protocol, ``window`` (characters), so that a CSV read alone says what it measured, as its JSON does."""
    cols = {"protocol": protocol, **({"window": window} if protocol == "window" else {})}
    return [{**cols, **row} for row in rows]


def protocol_window(protocol: str, window: int) -> int:
    """The ``window`` argument to pass with ``protocol`` in a loop over several protocols: ``window``
    (characters) for the ``window`` protocol, the default 64 for the others, which refuse any other value
    (it would be ignored)."""
    return window if protocol == "window" else DEFAULT_WINDOW


def text_task_name(entry: ModelEntry) -> str:
    """The ``task`` of a ``train-text`` model's result rows: ``text-nope``, ``text-learned``, ``text-rotary`` or, for
    a hybrid, ``text-rotary-nope<layers>`` (:attr:`nope_interp.config.ModelConfig.positional_label`), so that
    seeds of one positional scheme are summarised together and the twins and hybrids apart.

    Raises:
        NopeInterpError: ``entry`` is not a ``train-text`` model.
    """
    if entry.kind != "text" or entry.model_cfg is None:
        raise NopeInterpError(f"{entry.label} is not a train-text language model (kind {entry.kind!r})")
    return f"text-{entry.model_cfg.positional_label}"


#: Length of the random-token inputs of a Hugging Face model (``kind="hf"``) in analyze and probe (capped
#: at the model's ``n_ctx``: :func:`hf_random_length`).
HF_RANDOM_LENGTH = 64


def hf_random_length(model: Any) -> int:
    """:data:`HF_RANDOM_LENGTH`, or the model's ``n_ctx`` when that is shorter (a model with a 32-token context
    was given 64-token inputs it could not read)."""
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    return min(HF_RANDOM_LENGTH, int(n_ctx)) if is_int(n_ctx) and n_ctx >= 2 else HF_RANDOM_LENGTH


def entry_tokens(entry: ModelEntry, n: int, seed: int, protocol: str = "full",
                 window: int = DEFAULT_WINDOW) -> tuple[str, str, Int[Tensor, "n pos"]]:
    """The inputs a token-level analysis reads for ``entry``, as ``(task name, protocol, tokens)``.

    - a task model: ``n`` held-out inputs of its task under ``protocol`` (``tasks.protocol_inputs``:
      ``full``-length prompts by default, the ``authors``' fixed-length padded lines, or ``window``-character
      windows of concatenated lines; ``seed``, training prompts excluded);
    - a ``train-text`` language model: ``n`` windows of its training length from the held-out plays
      (:func:`nope_interp.text.text_windows`, ``seed``), task :func:`text_task_name`, protocol ``text``;
    - a Hugging Face model (a ``TransformerBridge``, its own vocabulary): ``n`` sequences of
      :func:`hf_random_length` ids of :func:`random_tokens` (``seed``), task ``random``, protocol ``random``.

    Raises:
        NopeInterpError: too few distinct prompts; the text extra missing for a text model; a ``protocol``
            other than ``full`` for a text or Hugging Face model (they read no task inputs); an unknown
            protocol; inputs longer than the model's ``n_ctx``.
    """
    if protocol != "full" and entry.kind in ("text", "hf"):
        raise NopeInterpError(f"{entry.label}: protocol {protocol} applies to task models; a "
                              f"{'train-text' if entry.kind == 'text' else 'Hugging Face'} model reads "
                              f"{'held-out text windows' if entry.kind == 'text' else 'random tokens'}")
    if entry.kind == "text":
        from nope_interp.text import text_windows
        from nope_interp.text_train import encode_text

        windows = text_windows(n, int(entry.source["text_window"]), seed=seed)
        return text_task_name(entry), "text", torch.stack([encode_text(w) for w in windows])
    if entry.kind == "hf":
        return "random", "random", random_tokens(entry.model, n, hf_random_length(entry.model), seed)
    task = entry.task
    try:
        inputs = protocol_prompts(entry.model, task, n, seed, entry.train_prompts, protocol, window)
    except NopeInterpError as err:  # n or window out of range, too few held-out prompts, a bad seed, n_ctx
        raise err.prefixed(entry.label) from None
    return task.name, protocol, task.prompt_tokens(inputs)


def random_tokens(model: Any, n: int, length: int, seed: int) -> Int[Tensor, "n length"]:
    """``n`` sequences of ``length`` token ids drawn i.i.d. uniformly (generator seeded with ``seed``) from the
    ids of ``model``'s vocabulary whose token embedding (``model.W_E``) is not zero: a Hugging Face model's
    padding id has a zero embedding (``padding_idx``), and a zero vector has no cosine.

    Raises:
        NopeInterpError: every token embedding is zero; ``n`` or ``length`` not an integer >= 1; ``seed`` not an
            integer >= 0.
    """
    n, length = check_int("n", n, 1, 10**7), check_int("length", length, 1, 10**7)
    seed = check_int("seed", seed, 0, 2**63 - 1)  # an int: torch's manual_seed refuses a numpy integer
    with torch.no_grad():
        ids = torch.nonzero(model.W_E.detach().float().norm(dim=-1) > 0).flatten().cpu()
    if ids.numel() == 0:
        raise NopeInterpError("every token embedding of the model is zero: no random tokens to draw")
    gen = torch.Generator().manual_seed(seed)
    return ids[torch.randint(0, ids.numel(), (n, length), generator=gen)]


def shipped_entries(task_names: Iterable[str], with_seeds: bool = False,
                    with_candidates: bool = False) -> list[ModelEntry]:
    """The shipped trained model of each task that has one (and its extra seeds with ``with_seeds``, its
    candidate runs with ``with_candidates``).

    Raises:
        NopeInterpError: ``task_names`` is a single string (give a list of task names), a set or frozenset (the
            entries follow its order: :func:`~nope_interp.checks.in_order`); a name that is no task (before: left
            out without a word), the message listing the tasks; a task named twice (before: its models twice).
    """
    if isinstance(task_names, str):
        raise NopeInterpError(f"task_names must be a list of task names, got the single string {task_names!r} "
                              f"(write [{task_names!r}] for a list of one)")
    task_names = in_order("task_names", task_names, "task names", "shipped_entries")
    unknown = [n for n in task_names if n not in tasks_pkg.TASK_NAMES]
    if unknown:
        raise NopeInterpError(f"shipped_entries: unknown task {unknown[0]!r} in task_names; allowed: "
                              f"{', '.join(tasks_pkg.TASK_NAMES)}"[:300])
    twice = repeated(task_names)
    if twice:  # each model once: a repeated name would add its models (and their rows) twice
        raise NopeInterpError(f"shipped_entries: task_names names {', '.join(map(repr, twice))} more than once")
    entries = []
    for name in task_names:
        if name in available_pretrained():
            entries.append(entry_from_run(load_pretrained(name), f"pretrained-{name}", "pretrained"))
            if with_seeds:
                entries += seed_entries(name)
            if with_candidates:
                entries += candidate_entries(name)
    return entries


def progress(items: Iterable[T], desc: str, log: Log, total: int | None = None) -> Iterator[T]:
    """Iterate ``items`` with a tqdm bar on stderr when ``log`` is given (a CLI run), there is more than one item
    and stderr is a terminal; silently otherwise (a log file redirected from stderr gets the per-item lines of
    ``log``, not the bar's carriage-return redraws)."""
    items = list(items)
    total = len(items) if total is None else total
    yield from tqdm(items, desc=desc, total=total, disable=log is None or total <= 1 or not stderr_is_terminal(),
                    leave=False, dynamic_ncols=True)


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal or a Jupyter kernel's output (where ``tqdm.auto`` draws a
    widget); False for a file, a pipe, or a stream without ``isatty``. Progress bars are drawn only then: every
    job's :func:`progress`, and the CLI's training and sweep bars (``--no-progress`` turns those off anywhere)."""
    if "ipykernel" in sys.modules:
        return True
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def warn_overwriting_another_model(path: Path, key: str, new: object, job: str, takes_label: bool = False) -> None:
    """Warn (:class:`~nope_interp.errors.NopeInterpWarning`) when the result file ``path`` records under ``key``
    another model's directory than ``new`` (the one about to be written over it): two runs of one folder name in two
    parent folders share a label, and the second's results replace the first's. Nothing when ``path`` is absent,
    unreadable, or records the same directory or none. ``job`` names the command in the message; ``takes_label``:
    the job has a ``label`` setting, which the message offers first as the way to keep both."""
    try:
        old = json.loads(path.read_text()).get(key) if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(old, str) and isinstance(new, str) and old != new:
        fix = "another {label} or {out_root}" if takes_label else "another {out_root}"
        warnings.warn(NopeInterpWarning.naming(
            "{job}: overwriting {path}, the results of {old}, with those of {new} (the same folder name; give "
            + fix + " to keep both)", job=job, path=str(path), old=old, new=new), stacklevel=user_stacklevel())


def emit(log: Log, line: str) -> None:
    """Send ``line`` to ``log`` when it is given; ``print`` goes through ``tqdm.write`` so that a progress
    bar on stderr is not broken."""
    if log is print:
        tqdm.write(line)
    elif log is not None:
        log(line)
