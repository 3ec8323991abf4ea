"""Sweeps: many trainings or initialised-model analyses from one spec, resumable, on a local pool or on Ray.

A **spec** is a TOML file (format in the README, "Sweeps"; shipped examples in ``nope_interp/sweeps/``)::

    [sweep]
    name = "init-size-grid"      # output folder name
    kind = "init"                # init: analyse freshly initialised models; train: train (and score) models
    [base]                       # fields every point shares
    task = "reversal"
    preset = "paper"
    [axes]                       # the product of these values
    model_n_layers = [6, 12, 24]
    seed = [0, 1, 2, 3, 4]
    [[points]]                   # optional: explicit points (each is crossed with the axes; a point's
    task = "addition"            # fields override [base]; a field may not be both an axis and in [base]
                                 # or in a point)

Fields: ``task``, ``n_digits``, ``preset``, ``seed`` (seeds the init, and the prompts or the batches; an
explicit ``model_seed`` wins for the init), every :class:`~nope_interp.config.ModelConfig` field as
``model_<field>`` (as the ``--model-*`` flags), and per kind: ``init`` takes ``n_prompts`` and ``points``
(hook points scored); ``train`` takes every :class:`~nope_interp.config.TrainConfig` field (as the
``train`` flags) and ``analyze_n_prompts`` (prompts on which the trained model is scored; 0 for none).
A ``model_d_model`` without ``model_d_head`` / ``model_d_mlp`` sets d_head = d_model / n_heads and
d_mlp = 4 d_model, as the paper's size grid. Every value is normalised to its config field's type before the
key is computed (``model_init_std = 1`` and ``= 1.0`` are the same point), and each point is checked against
its task when the spec is loaded (the task's prompts, and for a training its examples, must fit ``n_ctx``).

Each point is one directory ``<out>/points/<key>/`` named by a stable hash of its full resolved config
(:func:`point_key`): ``point.json`` (the config), ``result.json`` (metrics, seconds, peak memory) once it
finished (``peak_mib``: the worker's peak resident memory while the point ran, see :func:`run_point`), or
``error.json`` (the error and its traceback) if it failed, and ``run/`` for a training. A
point is locked while it runs (:func:`nope_interp.io.exclusive`), so a restarted driver never runs a point
that an orphaned worker is still finishing; finished points are skipped, failed ones are retried.
Executors (:func:`run_sweep`): ``local`` (a process pool, one torch thread per worker by default; never
imports Ray) and ``ray`` (one Ray task per point with declared CPUs/GPUs; every node must see ``<out>``).
"""

import hashlib
import json
import math
import os
import resource
import shutil
import signal
import sys
import time
import tomllib
import traceback
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from nope_interp import io
from nope_interp.checks import is_int, is_real
from nope_interp.config import (
    ModelConfig,
    TrainConfig,
    check_field_value,
    check_name,
    check_threads,
    check_train_fits,
    preset,
)
from nope_interp.errors import (
    NopeInterpError,
    NopeInterpWarning,
    one_line,
    signals_held,
    sigterm_as_exit,
    user_stacklevel,
)

KINDS = ("init", "train")
EXECUTORS = ("local", "ray")
#: Folder of the shipped specs (package data).
SHIPPED_DIR = Path(__file__).parent / "sweeps"
_MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig))
#: ModelConfig fields added after sweep keys were first written: left out of the key at their default (None),
#: so that adding them does not rename (and so rerun) every finished point.
_ADDED_MODEL_FIELDS = ("nope_layers",)
_TRAIN_FIELDS = tuple(f.name for f in fields(TrainConfig) if f.name not in ("task", "task_params", "seed"))
_COMMON = ("task", "n_digits", "preset", "seed")
_KIND_FIELDS = {"init": ("n_prompts", "points"), "train": (*_TRAIN_FIELDS, "analyze_n_prompts")}
_INIT_DEFAULTS = {"preset": "paper", "n_prompts": 32, "points": ["z", "resid_post"], "seed": 0}
_TRAIN_DEFAULTS = {"preset": "cpu", "analyze_n_prompts": 64, "seed": 0}
_SECTIONS = {"sweep", "base", "axes", "points", "resources"}
#: The type of each spec field that maps to a config field (``model_<field>``, the TrainConfig fields); the
#: others (``task``, ``preset``, ``seed``, ``n_prompts``, ...) are checked by :func:`resolve` itself.
_FIELD_TYPES = {**{f"model_{k}": tp for k, tp in typing.get_type_hints(ModelConfig).items()},
                **{k: tp for k, tp in typing.get_type_hints(TrainConfig).items() if k in _TRAIN_FIELDS}}


def allowed_fields(kind: str) -> tuple[str, ...]:
    """Every field a point of ``kind`` (one of :data:`KINDS`) may set.

    Raises:
        KeyError: an unknown kind (callers check ``kind`` first).
    """
    return (*_COMMON, *(f"model_{f}" for f in _MODEL_FIELDS), *_KIND_FIELDS[kind])


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its fields (base, explicit point and axis values merged), the resolved configs
    and its key.

    Attributes:
        key: 16 hex digits of the SHA-256 of :meth:`resolved` (stable across runs and machines).
        fields: what the spec set for this point. model: the ModelConfig. task: task name; task_params.
        settings: the kind's other settings (``n_prompts``/``points``, or the TrainConfig as a dict and
            ``analyze_n_prompts``).
    """

    kind: str
    fields: dict[str, Any]
    model: ModelConfig
    task: str
    task_params: dict[str, int]
    settings: dict[str, Any]
    key: str = ""

    def resolved(self) -> dict[str, Any]:
        """The full config of the point (what its key hashes), JSON-ready."""
        model = {k: v for k, v in self.model.to_dict().items() if not (k in _ADDED_MODEL_FIELDS and v is None)}
        return {"kind": self.kind, "task": self.task, "task_params": self.task_params,
                "model": model, "settings": self.settings}


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep spec (:func:`load_spec`).

    Attributes:
        name: output folder name. kind: ``init`` or ``train``. base: shared fields. axes: field -> values
        (their product). explicit: explicit points (each crossed with the axes; none = one empty point).
        num_cpus, num_gpus: resources each point declares to Ray (``[resources]``; default 1 and 0).
        path: where the spec was read from.
    """

    name: str
    kind: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    explicit: tuple[dict[str, Any], ...] = ()
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    path: str = ""
    points: tuple[Point, ...] = field(default=(), repr=False)

    @property
    def varied(self) -> list[str]:
        """Fields that differ between points (the axes and the explicit points' keys), in spec order."""
        names = list(self.axes)
        for p in self.explicit:
            names += [k for k in p if k not in names]
        return names


def available_specs() -> list[str]:
    """Names of the shipped specs (``nope-interp sweep <name>``)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.toml"))


def spec_path(spec: str | Path) -> Path:
    """The file of ``spec``: a path to a TOML file, or the name of a shipped spec.

    Raises:
        NopeInterpError: neither a readable file nor a shipped spec (the message lists them).
    """
    p = Path(spec)
    if p.is_file():
        return p
    shipped = SHIPPED_DIR / f"{spec}.toml"
    if shipped.is_file():
        return shipped
    raise NopeInterpError(f"sweep spec {str(spec)!r} is neither a file nor a shipped spec "
                          f"({', '.join(available_specs())})")


def _where(i: int, values: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return f"point {i}" + (f" ({shown})" if shown else "")


def load_spec(spec: str | Path) -> SweepSpec:
    """Read, validate and expand a spec file (or shipped spec name).

    Raises:
        NopeInterpError: (one line naming the field, the point and the allowed values) a file that is not
            TOML; a missing ``[sweep]`` name or an unknown kind; an unknown section or field; an empty axis
            or an axis that is not a list; a field that is both an axis and set in ``[base]`` or in a
            ``[[points]]`` table; a value of the wrong type or out of range (from the configs' own checks);
            a point whose task does not fit its model (``n_ctx`` too small, :func:`resolve`); two points with
            the same resolved config (after normalising values to their field types); no point at all.
    """
    path = spec_path(spec)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise NopeInterpError(f"{path}: not a valid TOML file ({one_line(str(err))})") from None
    unknown = set(data) - _SECTIONS
    if unknown:
        raise NopeInterpError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; allowed: "
                              f"{', '.join(sorted(_SECTIONS))}")
    head = data.get("sweep", {})
    if not isinstance(head, dict) or set(head) - {"name", "kind"}:
        raise NopeInterpError(f"{path}: [sweep] takes name and kind only")
    name, kind = head.get("name"), head.get("kind")
    if not isinstance(name, str):
        raise NopeInterpError(f"{path}: [sweep] needs name = \"...\" (a folder name)")
    check_name("sweep name", name)
    if kind not in KINDS:
        raise NopeInterpError(f"{path}: [sweep] kind must be one of {', '.join(KINDS)}, got {kind!r}")
    allowed = allowed_fields(kind)
    base = data.get("base", {})
    axes = data.get("axes", {})
    explicit = data.get("points", [])
    res = data.get("resources", {})
    if not isinstance(base, dict) or not isinstance(axes, dict) or not isinstance(res, dict):
        raise NopeInterpError(f"{path}: [base], [axes] and [resources] must be tables")
    if not isinstance(explicit, list) or not all(isinstance(p, dict) for p in explicit):
        raise NopeInterpError(f"{path}: points must be an array of tables ([[points]])")
    for where, keys in (("[base]", base), ("[axes]", axes), *((f"[[points]] {i}", p) for i, p in enumerate(explicit))):
        bad = [k for k in keys if k not in allowed]
        if bad:
            raise NopeInterpError(f"{path}: unknown field(s) {', '.join(map(repr, bad))} in {where} of a {kind} "
                                  f"sweep; allowed: {', '.join(allowed)}")
    for k, values in axes.items():
        if not isinstance(values, list):
            raise NopeInterpError(f"{path}: axis {k!r} must be a list of values, got {values!r}")
        if not values:
            raise NopeInterpError(f"{path}: axis {k!r} is empty")
    # an axis value always wins over [base] and over an explicit point: the other value would be ignored
    for where, keys in (("[base]", base), *((f"[[points]] {i}", p) for i, p in enumerate(explicit))):
        both = [k for k in keys if k in axes]
        if both:
            raise NopeInterpError(f"{path}: field(s) {', '.join(map(repr, both))} set both in [axes] and in {where} "
                                  f"(the axis would override it); set each field in one place")
    if set(res) - {"num_cpus", "num_gpus"}:
        raise NopeInterpError(f"{path}: [resources] takes num_cpus and num_gpus only")
    num_cpus, num_gpus = res.get("num_cpus", 1), res.get("num_gpus", 0)
    for label, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if not is_real(v) or not 0 <= v <= 1024:
            raise NopeInterpError(f"{path}: [resources] {label} must be a number in [0, 1024], got {v!r}")
    spec = SweepSpec(name=name, kind=kind, base=dict(base), axes={k: list(v) for k, v in axes.items()},
                     explicit=tuple(dict(p) for p in explicit), num_cpus=float(num_cpus), num_gpus=float(num_gpus),
                     path=str(path))
    points = expand(spec)
    object.__setattr__(spec, "points", tuple(points))
    return spec


def _product(axes: dict[str, list[Any]]) -> Iterable[dict[str, Any]]:
    import itertools

    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        yield dict(zip(names, values, strict=True))


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of ``spec`` (explicit points x axes product, merged over ``base``), resolved and keyed.

    Raises:
        NopeInterpError: a value rejected by the configs (message names the point); duplicate points.
    """
    out: list[Point] = []
    seen: dict[str, int] = {}
    explicit = spec.explicit or ({},)
    i = 0
    for ex in explicit:
        for combo in _product(spec.axes):
            values = {**ex, **combo}
            try:
                point = resolve(spec.kind, {**spec.base, **values})
            except NopeInterpError as err:
                raise NopeInterpError(f"{spec.path}: {_where(i, values)}: {err}") from None
            if point.key in seen:
                raise NopeInterpError(f"{spec.path}: {_where(i, values)} duplicates point {seen[point.key]} "
                                      f"(the same resolved config)")
            seen[point.key] = i
            out.append(point)
            i += 1
    return out


def _as_type(tp: Any, value: Any, label: str) -> Any:
    """``value`` with every integer where ``tp`` wants a float as that float (``1`` -> ``1.0``, also in a union
    or a list), a numpy real where ``tp`` wants a float as a float, and any other numpy integer as an int
    (``np.int64(3)`` -> ``3``: the same point, with the same key, as the Python number); everything else
    unchanged (the configs' own checks refuse values of the wrong type)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _as_type(inner[0], value, label)
        return _as_type(float if float in inner and int not in inner else None, value, label)
    if origin is tuple and isinstance(value, list | tuple):
        return [_as_type(args[0], v, label) for v in value]
    if tp is float and is_real(value) and type(value) is not float:
        try:
            return float(value)
        except OverflowError:
            raise NopeInterpError(f"{label} must be a finite number, got {value}") from None
    if is_int(value) and type(value) is not int:  # a numpy integer, for an int field or one of no known type
        return int(value)
    return value


def normalise_fields(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (spec fields) with each value in its field's type, so that equal configs get equal keys:
    an integer given for a float field (``model_init_std = 1``, ``lr = 1``) becomes a float. Lists stay lists.

    Raises:
        NopeInterpError: an integer for a float field too large to be a float.
    """
    return {k: _as_type(_FIELD_TYPES.get(k), v, k) for k, v in values.items()}


def _check_init_fits(model: ModelConfig, task: Any) -> None:
    """Refuse (before any point runs) an init point whose analysis could not run: the full-length prompts
    must fit ``n_ctx`` (as :func:`nope_interp.analysis.analyze_model` checks, protocol ``full``) and their
    token ids the vocabulary."""
    import tasks as tasks_pkg

    if task.max_prompt_len > model.n_ctx:
        raise NopeInterpError(f"n_ctx={model.n_ctx} is too small for task {task.name!r} {task.params()}: its "
                              f"prompts need model_n_ctx >= {task.max_prompt_len}")
    if model.d_vocab < tasks_pkg.D_VOCAB:
        raise NopeInterpError(f"model_d_vocab must be at least {tasks_pkg.D_VOCAB} (the task vocabulary), got "
                              f"{model.d_vocab}")


def resolve(kind: str, values: dict[str, Any]) -> Point:
    """The :class:`Point` of ``values`` (spec fields) for ``kind``, with its key. Values are normalised to
    their fields' types first (:func:`normalise_fields`; the point's ``fields`` hold the normalised values).
    An ``n_digits`` equal to the task's default is the same point, with the same key, as leaving it out.

    Raises:
        NopeInterpError: an unknown field or a value the configs reject (``n_digits`` included); a task the
            point's model cannot hold: ``n_ctx`` shorter than the prompts (init) or than the examples (train,
            the same check as :func:`nope_interp.train.train`, which also checks ``d_vocab``, the packed
            ``window`` and ``n_train + n_test`` against the task's prompts).
    """
    import tasks as tasks_pkg

    if kind not in KINDS:
        raise NopeInterpError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    bad = [k for k in values if k not in allowed_fields(kind)]
    if bad:
        raise NopeInterpError(f"unknown field(s) {', '.join(map(repr, bad))}")
    values = normalise_fields(values)
    v = {**(_INIT_DEFAULTS if kind == "init" else _TRAIN_DEFAULTS), **values}
    task = v.get("task")
    if not isinstance(task, str) or task not in tasks_pkg.TASK_NAMES:
        raise NopeInterpError(f"task must be one of {', '.join(tasks_pkg.TASK_NAMES)}, got {task!r}")
    seed = v["seed"]
    if not is_int(seed) or not 0 <= seed < 2**31:
        raise NopeInterpError(f"seed must be an integer in [0, 2**31), got {seed!r}")
    seed = int(seed)
    task_params = {} if v.get("n_digits") is None else {"n_digits": v["n_digits"]}
    try:
        task_obj = tasks_pkg.get_task(task, **task_params)  # validates n_digits
    except tasks_pkg.TaskError as err:  # load_spec names the file and the point
        raise NopeInterpError(str(err)) from None
    if task_params and task_obj.params() == tasks_pkg.get_task(task).params():
        task_params = {}  # the task's default size, spelled out: the same point (and key) as leaving it out
    # TOML lists -> tuples (tuple-typed fields such as nope_layers)
    model_kw = {k.removeprefix("model_"): tuple(val) if isinstance(val, list) else val
                for k, val in v.items() if k.startswith("model_")}
    for k, val in model_kw.items():
        check_field_value(ModelConfig, k, val, f"model_{k}")
    if kind == "train":
        for k in _TRAIN_FIELDS:
            if k in v:
                check_field_value(TrainConfig, k, v[k])
    model_kw.setdefault("seed", seed)
    if not isinstance(v["preset"], str):
        raise NopeInterpError(f"preset must be a preset name, got {v['preset']!r}")
    if "d_model" in model_kw:
        n_heads = model_kw.get("n_heads", preset(v["preset"]).n_heads)
        if is_int(model_kw["d_model"]) and is_int(n_heads) and n_heads > 0:
            model_kw.setdefault("d_head", model_kw["d_model"] // n_heads)
            model_kw.setdefault("d_mlp", 4 * model_kw["d_model"])
    model = preset(v["preset"], **model_kw)
    if kind == "init":
        from nope_interp.hooks import ACTIVATION_POINTS, activation_hook_names

        n = v["n_prompts"]
        if not is_int(n) or not 1 <= n <= 100_000:
            raise NopeInterpError(f"n_prompts must be an integer in [1, 100000], got {n!r}")
        n = int(n)
        pts = v["points"]
        if not isinstance(pts, list) or not pts:
            raise NopeInterpError(f"points must be a non-empty list of hook points, got {pts!r}")
        activation_hook_names(model.n_layers, tuple(pts))  # validates the point names (each once)
        _check_init_fits(model, task_obj)
        # the analysis reads the sites in forward order whatever the list's order: one point, one key
        pts = [p for p in ACTIVATION_POINTS if p in pts]
        settings: dict[str, Any] = {"n_prompts": n, "points": pts, "prompt_seed": seed}
    else:
        train_kw = {k: val for k, val in v.items() if k in _TRAIN_FIELDS}
        tcfg = TrainConfig(task=task, task_params=task_params, seed=seed, **train_kw)
        n = v["analyze_n_prompts"]
        if not is_int(n) or not 0 <= n <= 100_000:
            raise NopeInterpError(f"analyze_n_prompts must be an integer in [0, 100000], got {n!r}")
        n = int(n)
        check_train_fits(model, task_obj, tcfg)  # what train() checks first: n_ctx, d_vocab, window, n_train + n_test
        settings = {"train": tcfg.to_dict(), "analyze_n_prompts": n}
    point = Point(kind=kind, fields=dict(values), model=model, task=task, task_params=task_params, settings=settings)
    return Point(**{**point.__dict__, "key": point_key(point)})


def point_key(point: Point) -> str:
    """16 hex digits of the SHA-256 of the point's resolved config as canonical JSON."""
    text = json.dumps(io.json_safe(point.resolved()), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _vm_hwm_mib() -> float | None:
    """This process's peak resident set size in MiB from ``VmHWM`` in ``/proc/self/status`` (Linux), or None
    where that cannot be read."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_memory() -> bool:
    """Restart this process's peak resident memory at its current resident memory, so that
    :func:`peak_memory_mib` then measures from now on: Linux only (writes ``5`` to ``/proc/self/clear_refs``,
    which resets ``VmHWM``). Returns whether it could (False elsewhere, or where /proc does not allow it)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return _vm_hwm_mib() is not None


def peak_memory_mib(since_reset: bool) -> float:
    """Peak resident memory of this process in MiB: since the last :func:`reset_peak_memory` when
    ``since_reset`` (it returned True; ``VmHWM``), else the process's peak since it started (``ru_maxrss``:
    KiB on Linux, bytes on macOS)."""
    if since_reset:
        hwm = _vm_hwm_mib()
        if hwm is not None:
            return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def run_point(kind: str, values: dict[str, Any], out_dir: str, threads: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Run one point in this process (what every executor calls; picklable by reference).

    ``device``: where the point's model runs, ``cpu`` or ``cuda`` (the executors pass ``cuda`` for a spec
    whose ``[resources] num_gpus`` is above 0, :func:`point_device`); a ``cuda`` point on a worker that sees
    no CUDA device fails with that message rather than running on the CPU.

    Skips a finished point (:func:`finished_result`); returns ``{"key", "status": "done" | "skipped" | "failed" |
    "busy", "seconds"}`` (``busy``: another process holds the point's lock), with ``"warnings"`` when the
    point's own work warned. A failure writes ``error.json`` and returns ``failed``: it never raises for the
    point's own errors.

    Warnings raised by the point's work (a short schedule, degenerate inputs) are not printed by the worker
    (where they came out in Python's two-line format, once per point, between the progress bar's lines): they
    are recorded, each distinct one once, as ``[{"category", "message"}]`` in ``result.json`` or ``error.json``
    and in the outcome, and :func:`run_sweep` reports them once per sweep.

    ``result.json`` holds ``metrics``, ``seconds`` (wall time of the point), ``device``, ``peak_mib`` and
    ``peak_scope``:
    ``"point"`` where the peak could be reset before the point (Linux, :func:`reset_peak_memory`): the
    highest resident memory of the worker process while this point ran, which includes the interpreter, the
    imported libraries and whatever the allocator kept from earlier points of the same worker; ``"process"``
    elsewhere: the worker's peak since it started, so a small point after a large one shows the large one's.

    Raises:
        NopeInterpError: ``device`` not ``cpu`` or ``cuda``; ``values`` that do not resolve to a point of
            ``kind`` (:func:`resolve`). A point folder that cannot be locked, created or written (a file in
            its place) is a ``failed`` outcome whose ``error`` says so, with no ``error.json``: it does not
            stop the other points. A point that ran but whose ``result.json`` cannot be written is ``failed``
            with an ``error.json`` saying so (where that can be written).
    """
    import torch

    if device not in DEVICES:
        raise NopeInterpError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")

    if threads:
        torch.set_num_threads(threads)
    point = resolve(kind, values)
    pdir = Path(out_dir) / "points" / point.key
    if finished_result(pdir) is not None:
        return {"key": point.key, "status": "skipped", "seconds": 0.0}
    t0 = time.perf_counter()
    try:
        with io.exclusive(pdir, "sweep point"):
            if finished_result(pdir) is not None:  # finished by another worker while this one waited
                return {"key": point.key, "status": "skipped", "seconds": 0.0}
            try:
                pdir.mkdir(parents=True, exist_ok=True)
                io.write_json(pdir / "point.json", {"key": point.key, "fields": point.fields, **point.resolved()})
                with open(pdir / "attempts.log", "a") as fh:
                    fh.write(f"start {time.time():.3f} pid {os.getpid()}\n")
                (pdir / "error.json").unlink(missing_ok=True)
            except (OSError, NopeInterpError) as err:  # no folder to record it in: the outcome says it
                why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
                return {"key": point.key, "status": "failed", "seconds": time.perf_counter() - t0,
                        "error": f"cannot write the point's folder {pdir}: {why}"}
            per_point = reset_peak_memory()
            caught: list[warnings.WarningMessage] = []
            try:
                # the caller's filters hold (an "error" filter fails the point, as before); entering the block
                # resets Python's once-per-location memory, so every point records its own
                with warnings.catch_warnings(record=True) as caught:
                    if device == "cuda" and not torch.cuda.is_available():
                        raise NopeInterpError("the point runs on cuda (a spec asks for it with [resources] "
                                              "num_gpus > 0), but this worker sees no CUDA device")
                    metrics = _run_init(point, device) if kind == "init" else _run_train(point, pdir, device)
            except Exception as err:  # recorded, never stops the sweep
                said = point_warnings(caught)
                io.write_json(pdir / "error.json", {"key": point.key, "error": f"{type(err).__name__}: {err}",
                                                    "traceback": traceback.format_exc(),
                                                    **({"warnings": said} if said else {})})
                return {"key": point.key, "status": "failed", "seconds": time.perf_counter() - t0,
                        "error": f"{type(err).__name__}: {err}", **({"warnings": said} if said else {})}
            said = point_warnings(caught)
            seconds = time.perf_counter() - t0
            try:
                io.write_json(pdir / "result.json", {"key": point.key, "fields": point.fields, "metrics": metrics,
                                                     "seconds": round(seconds, 3),
                                                     "peak_mib": round(peak_memory_mib(per_point), 1),
                                                     "peak_scope": "point" if per_point else "process",
                                                     "pid": os.getpid(), "host": os.uname().nodename,
                                                     "device": device, **({"warnings": said} if said else {})})
            except Exception as err:  # it ran, but its result could not be kept: recorded like any failure
                why = f"the point ran ({seconds:.1f} s) but its result.json could not be written: " \
                      f"{type(err).__name__}: {err}"
                try:
                    io.write_json(pdir / "error.json", {"key": point.key, "error": why,
                                                        "traceback": traceback.format_exc()})
                except Exception:  # noqa: BLE001 - the outcome still says why
                    pass
                return {"key": point.key, "status": "failed", "seconds": seconds, "error": why}
            with open(pdir / "attempts.log", "a") as fh:
                fh.write(f"done {time.time():.3f} pid {os.getpid()}\n")
            return {"key": point.key, "status": "done", "seconds": seconds, **({"warnings": said} if said else {})}
    except io.LockHeldError:
        return {"key": point.key, "status": "busy", "seconds": 0.0}
    except NopeInterpError as err:  # its lock file cannot be created: a failed point, the others go on
        return {"key": point.key, "status": "failed", "seconds": time.perf_counter() - t0, "error": str(err)}


def _summary_metrics(scores: dict[str, dict[str, float]], n_layers: int) -> dict[str, float]:
    """``L0_<point>``, ``last_<point>`` and ``mean_<point>`` (over layers) of the row-mean scores, per point."""
    out: dict[str, float] = {}
    by_point: dict[str, list[float]] = {}
    for site, s in scores.items():
        point = site.split(".")[-1].removeprefix("hook_")
        by_point.setdefault(point, []).append(s["mean"])
    for point, vals in by_point.items():
        out[f"L0_{point}"] = vals[0]
        out[f"last_{point}"] = vals[-1]
        out[f"mean_{point}"] = sum(vals) / len(vals)
    return out


#: Where a sweep point can run (:func:`point_device`).
DEVICES = ("cpu", "cuda")


def point_device(spec: SweepSpec) -> str:
    """Where the points of ``spec`` run: ``cuda`` when its ``[resources]`` declare GPUs (``num_gpus`` > 0),
    else ``cpu``."""
    return "cuda" if spec.num_gpus > 0 else "cpu"


def _run_init(point: Point, device: str = "cpu") -> dict[str, Any]:
    import tasks as tasks_pkg
    from nope_interp.analysis import analyze_model
    from nope_interp.model import build_model

    s = point.settings
    task = tasks_pkg.get_task(point.task, **point.task_params)
    res = analyze_model(build_model(point.model, device=device), task, s["n_prompts"], seed=s["prompt_seed"],
                        points=tuple(s["points"]))
    row = res.scores["row_mean"]
    return {**_summary_metrics(row, point.model.n_layers), "scores": {k: v["mean"] for k, v in row.items()}}


def _run_train(point: Point, pdir: Path, device: str = "cpu") -> dict[str, Any]:
    from nope_interp.analysis import analyze_model
    from nope_interp.pretrained import load_run
    from nope_interp.train import finished_summary, train

    tcfg = TrainConfig(**point.settings["train"])
    run_dir = pdir / "run"
    done = finished_summary(run_dir, tcfg.steps)
    if done is not None:  # trained before a driver stopped: not trained (or resumed) again
        out: dict[str, Any] = {"test_acc": done["test_acc"], "steps_taken": done["steps"],
                               "wall_time_s": done["train_wall_time_s"], "stopped_early": done["stopped_early"]}
    else:
        resume = (run_dir / "checkpoint.pt").exists()
        if not resume and run_dir.exists():  # cut short before its first checkpoint: nothing to resume from
            shutil.rmtree(run_dir)
            with open(pdir / "attempts.log", "a") as fh:
                fh.write(f"cleared {run_dir.name}/: stopped before its first checkpoint\n")
        result = train(point.model, tcfg, run_dir, resume=resume, device=device,
                       command=f"nope-interp sweep (point {point.key})", progress=False)
        out = {"test_acc": result.test_acc, "steps_taken": result.steps, "wall_time_s": result.wall_time_s,
               "stopped_early": result.stopped_early}
    n = point.settings["analyze_n_prompts"]
    if n:
        run = load_run(run_dir, device=device)
        res = analyze_model(run.model, run.task, n, seed=1, points=("z", "resid_post"), exclude=run.train_prompts)
        row = res.scores["row_mean"]
        out.update(_summary_metrics(row, point.model.n_layers))
        out["scores"] = {k: v["mean"] for k, v in row.items()}
    return out


@dataclass(frozen=True)
class SweepStatus:
    """What a sweep run ended with: counts, per-point outcomes and the wall time (seconds)."""

    done: int
    skipped: int
    failed: int
    outcomes: tuple[dict[str, Any], ...]
    wall_time_s: float


def point_warnings(caught: Sequence[warnings.WarningMessage]) -> list[dict[str, str]]:
    """The distinct warnings of one point, in the order first raised: ``[{"category": class name, "message":
    one line}]`` (:func:`~nope_interp.errors.one_line`)."""
    out: list[dict[str, str]] = []
    for w in caught:
        item = {"category": w.category.__name__, "message": one_line(str(w.message))}
        if item not in out:
            out.append(item)
    return out


def report_point_warnings(outcomes: Iterable[dict[str, Any]], stacklevel: int | None = None,
                          log: Callable[[str], None] | None = None) -> None:
    """Warn once per distinct warning of the points' outcomes (:func:`point_warnings`), naming how many points
    and which (the first three keys) raised it, with its own category: the toolkit's warnings
    (:mod:`nope_interp.errors`) and Python's built-in ones; any other library's as ``UserWarning``. Where the
    caller's filters turn a warning into an error, the points have already run: it goes to ``log`` as a
    ``warning:`` line instead (dropped without one), not a traceback after the work. ``stacklevel``: as
    :func:`warnings.warn`, counted from the caller of this function; None names the first frame outside the
    toolkit (:func:`~nope_interp.errors.user_stacklevel`)."""
    import builtins

    from nope_interp import errors

    seen: dict[tuple[str, str], list[str]] = {}
    for o in outcomes:
        for w in o.get("warnings", ()):
            seen.setdefault((w["category"], w["message"]), []).append(o["key"])
    for (name, message), keys in seen.items():
        category = getattr(errors, name, None) or getattr(builtins, name, None)
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        which = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
        text = f"{len(keys)} point(s) ({which}) warned: {message}"
        try:
            warnings.warn(category(text), stacklevel=user_stacklevel() if stacklevel is None else stacklevel + 1)
        except Warning:  # an "error" filter: the work is done and recorded
            if log:
                log(f"warning: {text}")


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, executor: str = "local", workers: int | None = None,
              threads: int = 1, ray_address: str | None = None, log: Callable[[str], None] | None = None,
              progress: bool = True) -> SweepStatus:
    """Run every unfinished point of ``spec`` into ``out_dir`` (``points/<key>/``), ``workers`` at a time.

    Args:
        executor: ``local`` (process pool) or ``ray`` (``ray.init(address=ray_address)``: an existing cluster,
            or a new local one when ``ray_address`` is None).
        workers: points run at a time: the local pool's processes (default 2); with Ray, at most this many
            tasks in flight (default None: as many as the cluster's resources fit, each point declaring the
            spec's ``[resources]``). A spec with ``num_gpus`` > 0 runs its points on ``cuda``
            (:func:`point_device`), with either executor.
        threads: torch threads per point (default 1, so ``workers`` points fit ``workers`` cores).
        progress: a tqdm bar with done / running / failed and the mean time per point.

    Warns:
        the points' own warnings, each distinct one once, after the points ran (:func:`report_point_warnings`;
        each point's are in its ``result.json`` or ``error.json``).

    Every check below runs before anything is written: a failed one leaves no folder or file behind.
    ``out_dir/spec.toml`` records the spec; a folder that holds the spec of another sweep (another
    ``[sweep]`` name or kind) is refused; the same sweep, edited (say, more seeds), updates it.

    Raises:
        NopeInterpError: an unknown executor; ``workers`` or ``threads`` < 1; a spec that runs on cuda with the
            local executor on a machine without CUDA (on Ray the workers' machines decide); ``ray_address``
            with the local executor, or not ``host:port``; Ray not installed (the message says
            ``pip install -e .[ray]``) or the cluster cannot be reached; ``out_dir`` not writable, or holding
            another sweep's spec; a file where ``out_dir/points`` goes.
    """
    if executor not in EXECUTORS:
        raise NopeInterpError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if workers is None and executor == "local":
        workers = 2
    for label, v in (("workers", workers), ("threads", threads)):
        if label == "workers" and v is None:
            continue
        if not is_int(v) or v < 1:
            raise NopeInterpError(f"{label} must be an integer >= 1, got {v!r}")
    workers, threads = None if workers is None else int(workers), int(threads)
    if executor == "local":   # on Ray the workers' machines decide (a point asks Ray for `threads` CPUs)
        check_threads("threads", threads)
    if ray_address is not None:
        if executor != "ray":
            raise NopeInterpError.naming("{ray_address} needs {executor}='ray' (got {executor}={value!r}, which "
                                         "would ignore it)", value=executor)
        _parse_address(ray_address)
    if executor == "local" and point_device(spec) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise NopeInterpError(f"the spec's [resources] num_gpus = {spec.num_gpus:g} runs its points on cuda, "
                                  f"but this machine sees no CUDA device (drop num_gpus to run on the CPU)")
    out = Path(out_dir).resolve()
    io.check_writable_dir(out, "sweep output folder")
    io.check_writable_dir(out / "points", "sweep points folder")  # a file there would fail every point
    spec_text = Path(spec.path).read_text()
    replaced = _check_out_dir_spec(spec, spec_text, out)
    todo = [p for p in spec.points if finished_result(out / "points" / p.key) is None]
    skipped = len(spec.points) - len(todo)
    ray = _ray_connect(ray_address, bool(todo)) if executor == "ray" else None
    try:
        out.mkdir(parents=True, exist_ok=True)
        io.atomic_write_text(out / "spec.toml", spec_text)
        if log:
            if replaced:
                log(f"{out / 'spec.toml'} updated: sweep {spec.name!r} changed since it was last run into this folder")
            log(f"sweep {spec.name}: {len(spec.points)} points, {skipped} already finished, {len(todo)} to run "
                f"({executor}, {workers or 'as many as the cluster fits'} at a time"
                f"{', on cuda' if point_device(spec) == 'cuda' else ''}) -> {out}")
        t0 = time.perf_counter()
        if executor == "local":
            outcomes = _run_local(spec, todo, out, workers, threads, progress)
        else:  # ray.init installs its own SIGTERM handler (a bare exit): ours again, so the CLI says what was kept
            with sigterm_as_exit():
                outcomes = _run_ray(ray, spec, todo, out, threads, progress, workers)
    finally:
        if ray is not None and ray.is_initialized():
            with signals_held():  # a second Ctrl-C or SIGTERM must not leave the cluster connection half shut
                ray.shutdown()
    report_point_warnings(outcomes, log=log)
    done = sum(o["status"] == "done" for o in outcomes)
    skipped += sum(o["status"] == "skipped" for o in outcomes)
    failed = [o for o in outcomes if o["status"] == "failed"]
    if log:
        for o in failed:
            where = out / "points" / o["key"] / "error.json"
            log(f"  failed {o['key']}: {o.get('error', '')}" + (f" (see {where})" if where.is_file() else ""))
        log(f"{done} ran, {skipped} skipped, {len(failed)} failed in {time.perf_counter() - t0:.0f} s")
    return SweepStatus(done=done, skipped=skipped, failed=len(failed), outcomes=tuple(outcomes),
                       wall_time_s=round(time.perf_counter() - t0, 2))


class _Bar:
    """tqdm over points with done / running / failed and the mean seconds per point."""

    def __init__(self, total: int, running: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="sweep", disable=not enabled or total == 0, dynamic_ncols=True)
        self.failed = 0
        self.seconds: list[float] = []
        self.update(running, advance=False)

    def update(self, running: int, outcome: dict[str, Any] | None = None, advance: bool = True) -> None:
        if outcome is not None:
            self.failed += outcome["status"] == "failed"
            if outcome["status"] == "done":
                self.seconds.append(outcome["seconds"])
        mean = f"{sum(self.seconds) / len(self.seconds):.1f}s" if self.seconds else "-"
        self.bar.set_postfix_str(f"running {running}, failed {self.failed}, {mean}/point")
        if advance:
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _warm_worker(threads: int, driver: int) -> None:
    """Pool initializer: set the torch threads and import the analysis stack once per worker, so a point's
    ``seconds`` measure the point and not the imports; and end the worker when its driver dies (a killed
    driver would otherwise leave idle workers blocked on its pipe forever; a point cut short this way has
    no ``result.json`` and is run again, or resumed from its checkpoint, by the next driver).

    The worker ignores SIGINT: a Ctrl-C at a terminal reaches every process of the foreground group, and the
    driver stops its workers itself (SIGTERM, :func:`_stop_workers`); a worker still importing printed a
    ``KeyboardInterrupt`` traceback under the driver's line. It was started with SIGINT blocked
    (:func:`_submit_shielded`), so a Ctrl-C before this point waits, and is dropped here."""
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def watch() -> None:  # the driver's PID comes from the driver: a worker born after its death ends too
        while os.getppid() == driver:
            time.sleep(0.5)
        os._exit(1)

    # first, so that a worker still importing (tens of seconds on a busy machine) also ends with its driver
    threading.Thread(target=watch, daemon=True, name="sweep-parent-watch").start()
    import torch

    import nope_interp.analysis  # noqa: F401
    import nope_interp.train  # noqa: F401

    torch.set_num_threads(threads)


def _submit_shielded(pool: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``pool.submit(fn, *args)`` with SIGINT blocked in this thread meanwhile: a spawn pool starts a worker
    inside ``submit``, and the worker inherits the signal mask through fork and exec, so a Ctrl-C while it is
    still importing (before :func:`_warm_worker` ignores SIGINT) cannot interrupt it. A Ctrl-C meant for the
    driver during the call is delivered when the mask is restored, right after."""
    if not hasattr(signal, "pthread_sigmask"):
        return pool.submit(fn, *args)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(fn, *args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _run_local(spec: SweepSpec, todo: list[Point], out: Path, workers: int, threads: int,
               progress: bool) -> list[dict[str, Any]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    outcomes: list[dict[str, Any]] = []
    if not todo:
        return outcomes
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools
    queue = list(todo)
    bar = _Bar(len(todo), 0, progress)
    others = set(multiprocessing.active_children())  # the caller's own children (a notebook's): never stopped here
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx, initializer=_warm_worker,
                             initargs=(threads, os.getpid())) as pool:
        running: dict[Any, Point] = {}
        try:
            while queue or running:
                while queue and len(running) < workers:
                    p = queue.pop(0)
                    running[_submit_shielded(pool, run_point, spec.kind, p.fields, str(out), threads,
                                             point_device(spec))] = p
                bar.update(len(running), advance=False)
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    p = running.pop(fut)
                    outcome = fut.result()
                    if outcome["status"] == "busy":  # an orphaned worker of a killed driver still runs it
                        time.sleep(1.0)
                        queue.append(p)
                        continue
                    outcomes.append(outcome)
                    bar.update(len(running), outcome)
        except BaseException:  # Ctrl-C, SIGTERM (the CLI's Terminated): stop the points, do not wait for them
            with signals_held():  # a second Ctrl-C or SIGTERM must not cut the stopping short
                pool.shutdown(wait=False, cancel_futures=True)
                _stop_workers(set(multiprocessing.active_children()) - others)  # the pool's workers only
                bar.close()
            raise
    bar.close()
    return outcomes


#: Seconds a stopped sweep's workers get to end after SIGTERM (a training among them writes its checkpoint)
#: before they are killed.
WORKER_STOP_GRACE_S = 20.0


def _stop_workers(workers: set[Any], grace_s: float = WORKER_STOP_GRACE_S) -> None:
    """Stop a local sweep's pool ``workers`` (``multiprocessing`` processes): SIGTERM to each (a training stops
    as from the CLI, its last checkpoint kept), then SIGKILL to any still alive after ``grace_s`` seconds in
    all. The kill is needed: SIGTERM can end an idle worker while it holds the pool's queue lock, and a worker
    that then returns to the queue blocks on that lock forever, and the pool's exit with it (seen once in
    about 12 stopped sweeps)."""
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(5.0)


def _check_out_dir_spec(spec: SweepSpec, spec_text: str, out: Path) -> bool:
    """Refuse to run ``spec`` into ``out`` when ``out/spec.toml`` is another sweep's (another ``[sweep]`` name
    or kind, or not a readable spec). Returns whether ``out/spec.toml`` exists and differs from ``spec_text``
    (comments and layout aside): the same sweep, edited, whose record the run updates."""
    old = _out_dir_spec(spec, out, "give another {out_dir}")
    return old is not None and old != tomllib.loads(spec_text)


def _out_dir_spec(spec: SweepSpec, out: Path, advice: str) -> dict[str, Any] | None:
    """The spec recorded in ``out/spec.toml`` (None when there is none), checked to be ``spec``'s sweep.

    Raises:
        NopeInterpError: the file is not a readable spec, or names another sweep (``[sweep]`` name or kind);
            the message ends with ``advice``, a :meth:`~nope_interp.errors.NopeInterpError.naming` template of
            the caller's own text (``{out_dir}``: the argument in Python, ``--out-dir`` on the command line;
            ``{name!r}``: ``spec.name``).
    """
    old_path = out / "spec.toml"
    if not old_path.exists():
        return None
    try:
        old = tomllib.loads(old_path.read_text())
        head = old.get("sweep", {})
        old_name, old_kind = head.get("name"), head.get("kind")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        raise NopeInterpError.naming("{out_dir}={path!r} holds a spec.toml that is not a readable sweep spec; "
                                     + advice, path=str(out), name=spec.name) from None
    if (old_name, old_kind) != (spec.name, spec.kind):
        raise NopeInterpError.naming("{out_dir}={path!r} holds another sweep's spec ({old_name!r}, kind "
                                     "{old_kind!r}; this is {name!r}, kind {kind!r}): " + advice, path=str(out),
                                     old_name=old_name, old_kind=old_kind, name=spec.name, kind=spec.kind)
    return old


def _ray_connect(address: str | None, connect: bool) -> Any:
    """Import Ray and, when ``connect``, join the cluster at ``address`` (None: start a private local one).
    Returns the ``ray`` module.

    Raises:
        NopeInterpError: Ray not installed; the address unreachable (checked first: ``ray.init`` itself
            retries an unreachable address for minutes) or refused by ``ray.init``.
    """
    try:
        import ray
    except ImportError:
        raise NopeInterpError("the ray executor needs Ray: pip install -e '.[ray]'") from None
    if not connect:
        return ray
    if address is not None:
        _check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False, ignore_reinit_error=True,
                 configure_logging=False)
    except Exception as err:
        if ray.is_initialized():
            ray.shutdown()
        raise NopeInterpError(f"cannot reach the Ray cluster at {address!r}: {one_line(str(err))[:300]}") \
            from None
    return ray


def _run_ray(ray: Any, spec: SweepSpec, todo: list[Point], out: Path, threads: int,
             progress: bool, workers: int | None = None) -> list[dict[str, Any]]:
    """Run ``todo`` as one Ray task each on the cluster ``ray`` is connected to (:func:`_ray_connect`): at most
    ``workers`` points at a time, or (None) as many as the cluster's resources fit."""
    outcomes: list[dict[str, Any]] = []
    if not todo:
        return outcomes
    remote = ray.remote(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_retries=0)(run_point)
    queue = list(todo)
    limit = len(todo) if workers is None else workers
    pending: dict[Any, Point] = {}

    def submit() -> None:
        while queue and len(pending) < limit:
            p = queue.pop(0)
            pending[remote.remote(spec.kind, p.fields, str(out), threads, point_device(spec))] = p

    submit()
    bar = _Bar(len(todo), len(pending), progress)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            p = pending.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as err:  # the worker process died (e.g. out of memory)
                outcome = {"key": p.key, "status": "failed", "seconds": 0.0,
                           "error": f"Ray task failed: {one_line(str(err))[:300]}"}
            if outcome["status"] == "busy":  # an orphaned worker of a killed driver still runs it
                time.sleep(1.0)
                queue.append(p)
            else:
                outcomes.append(outcome)
                bar.update(len(pending), outcome)
        submit()
    bar.close()
    return outcomes


def _parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Ray address ``[ray://]host:port``.

    Raises:
        NopeInterpError: not of that form, or a port outside 1-65535.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")  # an IPv6 address: [::1]:6379
    bare = host[1:-1] if bracketed else host
    ok = bool(bare) and not any(c.isspace() or c == "/" for c in bare) and (bracketed or ":" not in bare)
    if not ok or not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise NopeInterpError.naming("{ray_address} must be host:port (the head's GCS port, e.g. 127.0.0.1:6379), "
                                     "got {value!r}", value=address)
    return bare, int(port)


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Raise a one-line NopeInterpError unless ``host:port`` accepts a TCP connection (``ray.init`` itself
    retries an unreachable address for minutes)."""
    import socket

    host, port = _parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise NopeInterpError(f"cannot reach the Ray cluster at {address}: {err.strerror or err} (is `ray start "
                              f"--head` running there?)") from None


def _is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool) and finite: what the report can aggregate."""
    return is_real(value) and math.isfinite(value)


def load_result(point_dir: str | Path) -> dict[str, Any] | None:
    """The content of a point's ``result.json``, or None when there is none (the point has not finished).

    A result is a JSON object with ``key`` equal to the folder's name (the point's key), a ``metrics``
    object, and finite numbers ``seconds`` and ``peak_mib``.

    Raises:
        NopeInterpError: (one line naming the file) a ``result.json`` that is not such an object: truncated,
            not JSON, a folder, or another point's result (its ``key`` does not match).
    """
    pdir = Path(point_dir)
    path = pdir / "result.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        why = "a folder" if path.is_dir() else f"not readable JSON ({one_line(str(err))[:120]})"
        raise NopeInterpError(f"{path}: {why}") from None
    if not isinstance(data, dict):
        raise NopeInterpError(f"{path}: not a JSON object, got {type(data).__name__}")
    if data.get("key") != pdir.name:
        raise NopeInterpError(f"{path}: key {data.get('key')!r} does not match its point {pdir.name!r} "
                              f"(a foreign result file)")
    bad = [k for k in ("seconds", "peak_mib") if not _is_finite_number(data.get(k))]
    if not isinstance(data.get("metrics"), dict):
        bad.insert(0, "metrics")
    if bad:
        raise NopeInterpError(f"{path}: missing or malformed {', '.join(bad)} (a truncated or foreign file)")
    return data


def finished_result(point_dir: str | Path) -> dict[str, Any] | None:
    """The content of a point's ``result.json`` when the point finished, else None: no file, or one that
    :func:`load_result` refuses (a truncated or foreign file, or another point's result), so that the point
    is run again rather than read."""
    try:
        return load_result(point_dir)
    except NopeInterpError:
        return None


class SweepResults(NamedTuple):
    """What :func:`read_results` found, per point of the spec.

    Attributes:
        rows: one per finished point: ``key``, the varied fields, then every scalar metric as written
            (numbers, null as None, strings, bools; not objects such as ``scores``), ``seconds`` and
            ``peak_mib``.
        missing: keys of points with no result and no error (not run). failed: keys of points with an
            ``error.json`` and no result. unreadable: key -> one-line reason naming the ``result.json``
            that :func:`load_result` refused (the next sweep runs the point again).
    """

    rows: list[dict[str, Any]]
    missing: list[str]
    failed: list[str]
    unreadable: dict[str, str]


def _scalar(value: Any) -> bool:
    """Whether a metric value is a scalar (a number, None, a string or a bool): a column of the report;
    objects and lists (such as ``scores``, per hook point) are not."""
    return value is None or isinstance(value, (bool, str)) or is_real(value)


#: Columns of a report row that are not metrics (:func:`read_results`).
_ROW_COLUMNS = ("key", "seconds", "peak_mib")


def _metric_name(name: str, varied: Sequence[str]) -> str:
    """A metric's column in the report: its own name, unless that names a configured field or a row column
    (``steps``, the steps a train point took, in results written before it was called ``steps_taken``), which
    must never be overwritten by a measurement: then ``<name>_measured`` (``steps`` -> ``steps_taken``)."""
    if name == "steps":
        return "steps_taken"
    return f"{name}_measured" if name in varied or name in _ROW_COLUMNS else name


def read_results(spec: SweepSpec, out_dir: str | Path) -> SweepResults:
    """The results of ``spec``'s points in ``out_dir`` (:class:`SweepResults`: rows, missing, failed and
    unreadable). Metric values are kept as written (:func:`report` decides what it can aggregate); never
    raises for a bad result file (it is listed as unreadable)."""
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    failed: list[str] = []
    unreadable: dict[str, str] = {}
    for p in spec.points:
        pdir = Path(out_dir) / "points" / p.key
        try:
            data = load_result(pdir)
        except NopeInterpError as err:
            unreadable[p.key] = str(err)
            continue
        if data is not None:
            metrics = {_metric_name(k, spec.varied): v for k, v in data["metrics"].items() if _scalar(v)}
            rows.append({"key": p.key, **{k: p.fields.get(k, spec.base.get(k)) for k in spec.varied},
                         **metrics, "seconds": data["seconds"], "peak_mib": data["peak_mib"]})
        elif (pdir / "error.json").exists():
            failed.append(p.key)
        else:
            missing.append(p.key)
    return SweepResults(rows, missing, failed, unreadable)


#: Fields that index repetitions (averaged over), not configurations.
SEED_FIELDS = ("seed", "model_seed")

#: How the report's table explains its numbers (Markdown header and ``report.json``).
CI_NOTE = ("95% CI: a Student-t interval of the mean over the n values, in the CSV; with few seeds it is wide and "
           "is not clipped, so it can pass a metric's natural range (above 1 for a score or accuracy in [0, 1], "
           "below 0 for seconds); with n = 1 it is undefined (empty)")


@dataclass(frozen=True)
class SweepReport:
    """Aggregated results of a sweep: one row per configuration (every varied field but the seeds).

    Attributes:
        rows: per configuration, its fields, ``n_seeds`` (its finished points) and for each metric
            ``<metric>_mean``, ``_std``, ``_ci95_low``, ``_ci95_high`` (:func:`nope_interp.stats.mean_std_ci`;
            absent when no point has a value) and ``<metric>_n``: the number of values aggregated (the
            points whose value is a finite number; fewer than ``n_seeds`` where some are missing).
        metrics: metric names (in the order of the result files; ``seconds`` and ``peak_mib`` last).
        group_by: the configuration fields. points: the per-point rows (:func:`read_results`).
        missing, failed: keys of points without a result, and of failed points. unreadable: key -> why its
        ``result.json`` was refused. gaps: key -> the metrics whose value at that point is missing or not a
        finite number (left out of the aggregates). points_dir: the absolute sweep folder the points were
        read from ("" if unknown).
    """

    spec: SweepSpec
    rows: tuple[dict[str, Any], ...]
    metrics: tuple[str, ...]
    group_by: tuple[str, ...]
    points: tuple[dict[str, Any], ...]
    missing: tuple[str, ...]
    failed: tuple[str, ...]
    unreadable: dict[str, str] = field(default_factory=dict)
    gaps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    points_dir: str = ""

    def markdown(self) -> str:
        """The table as Markdown: configuration fields, then ``mean ± std (n)`` per metric, n being the number
        of values aggregated (``mean (1)``: one value, whose spread is undefined; ``- (0)``: none;
        :func:`~nope_interp.stats.fmt_mean_std`)."""
        from nope_interp.stats import fmt_mean_std

        head = [*self.group_by, *self.metrics]
        extra = "".join(f", {n} {what}" for n, what in ((len(self.unreadable), "with an unreadable result.json"),
                                                        (len(self.gaps), "with missing or non-finite values"))
                        if n)
        lines = [f"# Sweep {self.spec.name} ({self.spec.kind}): {len(self.points)} of {len(self.spec.points)} points "
                 f"finished, {len(self.failed)} failed{extra}", "",
                 "Each metric: mean ± std over seeds (n: the number of values aggregated, the finished points "
                 f"with a finite value; the mean alone when n = 1). {CI_NOTE}.", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            cells = [str(r[g]) for g in self.group_by]
            cells += [f"{fmt_mean_std(r[m + '_mean'], r[m + '_std'], r[m + '_n'])} ({r[m + '_n']})"
                      if r[m + "_n"] else "- (0)" for m in self.metrics]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def _list_keys(items: dict[str, Any], limit: int = 8) -> str:
    shown = [f"{k} ({', '.join(v)})" if isinstance(v, tuple) else k for k, v in list(items.items())[:limit]]
    more = len(items) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def report(spec: SweepSpec, out_dir: str | Path) -> SweepReport:
    """Aggregate the finished points of ``spec`` in ``out_dir`` over seeds (:func:`nope_interp.stats.mean_std_ci`).

    A metric is any entry of the points' ``metrics`` that is a number or null (undefined, e.g. a NaN) in at
    least one point, plus ``seconds`` and ``peak_mib``; per configuration it aggregates the points whose
    value is a finite number, and ``<metric>_n`` says how many those are.

    Raises:
        NopeInterpError: no finished point; ``out_dir/spec.toml`` is another sweep's or unreadable.

    Warns:
        NopeInterpWarning: one line per unreadable ``result.json`` (naming the file; the point is not counted
            as not run); one line naming the points (and metrics) whose value is missing or not a finite
            number.
    """
    from nope_interp.stats import mean_std_ci

    # another sweep's folder would report every point as not run: say whose folder it is instead
    _out_dir_spec(spec, Path(out_dir), "give the {out_dir} that {name!r} was run into")
    points, missing, failed, unreadable = read_results(spec, out_dir)
    for reason in unreadable.values():
        warnings.warn(f"{reason}: reported as unreadable, not as not run (the next sweep runs the point again)",
                      NopeInterpWarning, stacklevel=user_stacklevel())
    if not points:
        raise NopeInterpError(f"no finished point of sweep {spec.name!r} in {out_dir} "
                              f"({len(missing)} not run, {len(failed)} failed, {len(unreadable)} with an "
                              f"unreadable result.json): run `nope-interp sweep` first")
    group_by = tuple(k for k in spec.varied if k not in SEED_FIELDS)
    skip = {"key", *spec.varied, "seconds", "peak_mib"}
    def numeric(v: Any) -> bool:
        return v is None or is_real(v)

    # a column for every entry that is a number (or null) somewhere, in the files' order: a null or a string
    # in one point neither drops nor moves a column
    metrics = tuple(dict.fromkeys(k for r in points for k in r if k not in skip
                                  and any(k in q and numeric(q[k]) for q in points)))
    metrics = (*metrics, "seconds", "peak_mib")
    gaps = {r["key"]: tuple(m for m in metrics if not _is_finite_number(r.get(m))) for r in points}
    gaps = {k: v for k, v in gaps.items() if v}
    if gaps:
        warnings.warn(f"sweep {spec.name!r}: {len(gaps)} point(s) with a missing or non-finite metric value, "
                      f"left out of that metric's mean and n: {_list_keys(gaps)}", NopeInterpWarning,
                      stacklevel=user_stacklevel())
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in points:
        groups.setdefault(tuple(json.dumps(r.get(g), sort_keys=True) for g in group_by), []).append(r)
    rows = []
    for members in groups.values():
        row: dict[str, Any] = {g: members[0].get(g) for g in group_by}
        row["n_seeds"] = len(members)
        for m in metrics:
            vals = [float(r[m]) for r in members if _is_finite_number(r.get(m))]  # ints too (steps_taken)
            row[f"{m}_n"] = len(vals)
            if vals:
                st = mean_std_ci(vals)
                row.update({f"{m}_mean": st.mean, f"{m}_std": st.std, f"{m}_ci95_low": st.ci95_low,
                            f"{m}_ci95_high": st.ci95_high})
        rows.append(row)
    return SweepReport(spec=spec, rows=tuple(rows), metrics=metrics, group_by=group_by, points=tuple(points),
                       missing=tuple(missing), failed=tuple(failed), unreadable=dict(unreadable), gaps=gaps,
                       points_dir=str(io.as_path(out_dir).resolve()))


def plot_metric_vs_axis(rep: SweepReport, axis: str) -> Any:
    """Every metric against one varied field: the mean over seeds and over the other fields at each value
    (error bars: std over those points; values that are not finite numbers left out, as in :func:`report`);
    one trace per metric (click the legend to show one). Returns a plotly Figure."""
    import plotly.graph_objects as go

    from nope_interp.stats import error_bar, mean_std_ci

    values = list(dict.fromkeys(json.dumps(r.get(axis), sort_keys=True) for r in rep.points))
    fig = go.Figure()
    for i, m in enumerate(rep.metrics):
        ys, errs = [], []
        for v in values:
            vals = [float(r[m]) for r in rep.points
                    if json.dumps(r.get(axis), sort_keys=True) == v and _is_finite_number(r.get(m))]
            st = mean_std_ci(vals) if vals else None
            ys.append(None if st is None else st.mean)
            errs.append(None if st is None else error_bar(st))  # one value: no bar
        fig.add_trace(go.Scatter(x=[json.loads(v) if not v.startswith(("[", "{")) else v for v in values], y=ys,
                                 mode="lines+markers", name=m, error_y={"type": "data", "array": errs},
                                 visible=True if i < 4 and m not in ("seconds", "peak_mib") else "legendonly"))
    fig.update_layout(title=f"Sweep {rep.spec.name}: metrics against {axis} (mean ± std over all other fields "
                            f"and seeds)", xaxis_title=axis, yaxis_title="value", height=560, width=1000,
                      legend={"title": "metric (click to show)"})
    if all(isinstance(json.loads(v), str) for v in values):
        fig.update_xaxes(type="category")
    return fig


def write_report(rep: SweepReport, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/sweeps/<name>/{report.csv, report.md, points.csv, report.json}`` and
    ``figures/sweeps/<name>/<axis>.html`` (one per varied field but the seeds, with the ``plotly.min.js`` they
    load) under ``out_root``. Returns the paths written, that file last.

    The figures of axes that an earlier report of this name had and this one has not (an axis removed from
    the spec) are removed, so the folder holds this report's figures only. ``report.json`` records the sweep
    folder the points came from (``points_dir``); a report of the same name read from another sweep folder is
    overwritten with a :class:`~nope_interp.errors.NopeInterpWarning` naming both.

    Raises:
        NopeInterpError: a file cannot be written: checked for both folders and every file before the first
            is written (a folder that is a file, a file name taken by a folder), so a refusal writes nothing;
            another process is writing a report of this name under ``out_root`` (both folders are locked while
            writing: :func:`nope_interp.io.exclusive_folders`)."""

    res_dir = io.as_path(out_root, "out_root") / "results" / "sweeps" / rep.spec.name
    fig_dir = io.as_path(out_root, "out_root") / "figures" / "sweeps" / rep.spec.name
    for folder in (res_dir, fig_dir):
        io.check_writable_dir(folder, "sweep report folder")
    targets = [res_dir / n for n in ("report.csv", "report.md", "points.csv", "report.json")]
    figures = [fig_dir / f"{axis}.html" for axis in rep.group_by]
    for target in [*targets, *figures, *([fig_dir / "plotly.min.js"] if figures else [])]:  # the js the figures load
        if target.exists() and not target.is_file():
            raise NopeInterpError(f"cannot write the sweep report: {target} exists and is not a file")
    with io.exclusive_folders((res_dir, fig_dir), "sweep report folder"):  # one writer of a report at a time
        return _write_report_files(rep, res_dir, fig_dir)


def _write_report_files(rep: SweepReport, res_dir: Path, fig_dir: Path) -> list[Path]:
    """The body of :func:`write_report`, run while both of its folders are locked."""
    from nope_interp.plotting import save_figure, with_plotlyjs

    try:  # the report this one replaces: where its points came from, and which axis figures it wrote
        before = json.loads((res_dir / "report.json").read_text())
    except (OSError, ValueError):
        before = {}
    before = before if isinstance(before, dict) else {}
    old_dir = before.get("points_dir")
    if isinstance(old_dir, str) and old_dir and rep.points_dir and old_dir != rep.points_dir:
        warnings.warn(NopeInterpWarning.naming(
            "sweep report {name!r}: overwriting {res_dir}, the report of the points in {old_dir}, with the one of "
            "{points_dir} (give another {out_root} to keep both)", name=rep.spec.name, res_dir=str(res_dir),
            old_dir=old_dir, points_dir=rep.points_dir), stacklevel=user_stacklevel())
    old_axes = before.get("group_by") if isinstance(before.get("group_by"), list) else []
    paths = [io.atomic_write_text(res_dir / "report.csv", io.to_csv(list(rep.rows))),
             io.atomic_write_text(res_dir / "report.md", rep.markdown()),
             io.atomic_write_text(res_dir / "points.csv", io.to_csv(list(rep.points))),
             io.write_json(res_dir / "report.json", {"name": rep.spec.name, "kind": rep.spec.kind,
                                                     "group_by": list(rep.group_by), "metrics": list(rep.metrics),
                                                     "rows": list(rep.rows), "missing": list(rep.missing),
                                                     "failed": list(rep.failed), "unreadable": rep.unreadable,
                                                     "gaps": {k: list(v) for k, v in rep.gaps.items()},
                                                     "ci95": CI_NOTE, "points_dir": rep.points_dir})]
    for axis in rep.group_by:
        paths.append(save_figure(plot_metric_vs_axis(rep, axis), fig_dir / f"{axis}.html"))
    for axis in old_axes:  # an axis of the earlier report that this one has not: its figure would be stale
        stale = fig_dir / f"{axis}.html"
        if isinstance(axis, str) and axis not in rep.group_by and "/" not in axis and stale.is_file():
            stale.unlink()
    return with_plotlyjs(paths)
