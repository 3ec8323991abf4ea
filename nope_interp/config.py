"""Frozen, validated configs with one JSON round-trip: the model, the presets and training.

Every config of the toolkit (these and each analysis job's config in :mod:`nope_interp.jobs`) derives
from :class:`FrozenConfig`: frozen dataclass fields with a one-line ``help`` each (the CLI's ``--help``
comes from it), ``to_dict`` / ``from_dict`` / ``to_json`` / ``from_json`` / ``replace``, and unknown keys or
bad values raise :class:`~nope_interp.errors.NopeInterpError` naming the field and what is allowed. The
method behind the defaults is described in ``docs/method.md``.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import tasks as tasks_pkg
from nope_interp.checks import in_order, is_int, is_real, repeated
from nope_interp.errors import NopeInterpError


def opt(default: Any, help: str) -> Any:  # noqa: A002 - "help" is the argparse word
    """A dataclass field with a default and a one-line help text (shown by ``nope-interp <cmd> --help``)."""
    if isinstance(default, (dict, list, set)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def check_int(name: str, value: Any, low: int = 1, high: int = 10**9) -> int:
    """``value`` as an ``int``; raise NopeInterpError unless it is an integer in ``[low, high]``: a Python or
    numpy integer, not a bool (:func:`~nope_interp.checks.is_int`)."""
    if not is_int(value) or not low <= value <= high:
        raise NopeInterpError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def check_threads(name: str, value: Any) -> int:
    """``value`` checked as a number of torch CPU threads on this machine: an integer in [1, the CPU count]
    (more threads than cores only slow torch down, and tens of thousands crash OpenMP), returned as int.

    Raises:
        NopeInterpError: not an integer in that range; the message gives this machine's CPU count.
    """
    cores = os.cpu_count() or 1
    if not is_int(value) or not 1 <= value <= cores:
        raise NopeInterpError(f"{name} must be an integer in [1, {cores}] (this machine has {cores} CPU cores), "
                              f"got {value!r}")
    return int(value)


def check_used(name: str, value: Any, default: Any, used: bool, when: str) -> None:
    """Refuse a setting given a non-default ``value`` where it would be silently ignored (``used`` False):
    ``--window 10`` with ``--protocol full``, say. ``when`` says when it is used, for the message, with the
    config fields it names as ``{field}`` (``"with {protocol} window"``): the message says ``window=10 is only
    used with protocol window``, the CLI ``--window=10 is only used with --protocol window``
    (:meth:`~nope_interp.errors.NopeInterpError.naming`).

    Raises:
        NopeInterpError: ``value != default`` and not ``used``.
    """
    if not used and value != default:
        raise NopeInterpError.naming(f"{{{name}}}={{value!r}} is only used {when}; here it would be ignored",
                                     value=value)


def check_float(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raise NopeInterpError unless ``value`` is a finite real number in ``[low, high]`` (``(low, ...`` with
    ``low_open``, ``..., high)`` with ``high_open``): a Python or numpy real, not a bool
    (:func:`~nope_interp.checks.is_real`). NaN and infinities are always refused."""
    ok = is_real(value) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise NopeInterpError(f"{name} must be a finite number in {left}{low}, {high}{right}, got {value!r}")


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raise NopeInterpError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise NopeInterpError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def check_choices(name: str, values: Any, allowed: tuple[str, ...]) -> None:
    """Raise NopeInterpError unless ``values`` is a non-empty sequence (not a single string, a set or frozenset:
    :func:`~nope_interp.checks.in_order`) and every entry is one of ``allowed``, each at most once. A generator is
    read once (before, the first check used it up and the rest saw nothing)."""
    if isinstance(values, (str, bytes)):
        raise NopeInterpError(f"{name} must be a list of names (e.g. [{allowed[0]!r}]), got the single string "
                              f"{values!r}; allowed: {', '.join(allowed)}")
    values = in_order(name, values, f"names ({', '.join(allowed)})")
    if not values:
        raise NopeInterpError(f"{name} must not be empty; allowed: {', '.join(allowed)}")
    for v in values:
        if v not in allowed:
            raise NopeInterpError(f"unknown {name} {v!r}; allowed: {', '.join(allowed)}")
    twice = sorted(repeated(values))
    if twice:  # one name twice would run (and report) it twice
        raise NopeInterpError(f"{name} names {', '.join(map(repr, twice))} more than once")


def check_tasks(names: Any) -> None:
    """Raise NopeInterpError unless ``names`` is a non-empty sequence of known task names, each once (a single
    string is refused, not read letter by letter; a set or frozenset too: :func:`check_choices`)."""
    check_choices("task", names, tasks_pkg.TASK_NAMES)


#: What a user-given name that becomes a folder or file name (a run name, an output label) may be: one path
#: component of ASCII letters, digits, ``.``, ``_``, ``+`` and ``-``, not starting with ``.`` or ``-``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}", re.ASCII)


def check_name(name: str, value: Any) -> None:
    """Raise NopeInterpError unless ``value`` is a safe single path component (:data:`NAME_PATTERN`):
    1-200 characters of ``A-Z a-z 0-9 . _ + -``, not starting with ``.`` or ``-`` (so never ``..``,
    a path with ``/``, a hidden file or an option-like word)."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise NopeInterpError(f"{name} must be one folder name of 1-200 characters from A-Z a-z 0-9 . _ + - "
                              f"(not starting with . or -), got {value!r}")


def check_field_value(cls: type, name: str, value: Any, label: str | None = None) -> None:
    """Raise NopeInterpError (naming ``label``, default ``name``, and the expected type) unless ``value`` fits
    the annotation of the field ``name`` of the config class ``cls``: the check a config runs on itself, for
    callers that assemble configs from untyped input (a sweep spec) and want the error before construction."""
    tp = _field_types(cls)[name]
    ok, _ = _conform(tp, value)
    if not ok:
        raise NopeInterpError(f"{label or name} must be {_type_words(tp)}, got {_describe(tp, value)}")


C = TypeVar("C", bound="FrozenConfig")


class _Recorded(dict):  # a dict: it passes the ``_filled`` InitVar's annotation, under a type-checking import hook
    """The type of :data:`RECORDED` (empty; only its identity counts)."""

    def __repr__(self) -> str:
        return "RECORDED"


#: What :meth:`FrozenConfig.from_dict` passes as a filling config's ``_filled``: its values were read back from a
#: dict that does not say which were given, and one equal to what the config fills counts as filled.
RECORDED = _Recorded()


def _type_words(tp: Any) -> str:
    """How a field's annotation reads in an error message (``a list of integers``, ``true or false``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _type_words(a) for a in args)
    if origin is tuple:
        return f"a list of {_type_words(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        values = f" of {_type_words(args[1]).split(' ', 1)[-1]}s" if len(args) == 2 and args[1] is not Any else ""
        return "a JSON object" + values
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _python_number(value: Any) -> Any:
    """``value`` with a numpy (or other non-builtin) integer as an ``int`` and real as a ``float``, so that a
    config stays JSON-serialisable and equal to the one built from Python numbers; a Python ``int`` or
    ``float``, a bool and anything that is not a number unchanged."""
    if is_int(value):
        return value if type(value) is int else int(value)
    if is_real(value):
        return value if type(value) is float else float(value)
    return value


def _python_numbers(value: Any) -> Any:
    """:func:`_python_number` through lists, tuples and dict values (the values of ``Any`` fields, such as
    ``model_overrides={"nope_layers": [np.int64(0)]}``); the same object when nothing changes."""
    if isinstance(value, (list, tuple)):
        items = [_python_numbers(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        entries = {k: _python_numbers(v) for k, v in value.items()}
        return value if all(entries[k] is value[k] for k in value) else entries
    return _python_number(value)


def _conform(tp: Any, value: Any) -> tuple[bool, Any]:
    """``(ok, value)``: whether ``value`` fits the annotation ``tp``; lists become tuples for tuple types,
    numpy numbers Python ones (:func:`_python_number`; an ``int`` given for a ``float`` field stays an ``int``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return True, _python_numbers(value)
    if origin in (types.UnionType, typing.Union):
        for a in args:
            ok, conformed = (value is None, None) if a is type(None) else _conform(a, value)
            if ok:
                return True, conformed
        return False, value
    if origin is tuple:  # tuple[X, ...]; a str is a sequence too, but never a list of names
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return False, value
        items = [_conform(args[0], v) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            return False, value
        if len(args) != 2:
            return True, value
        entries = {k: _conform(args[1], v) for k, v in value.items()}
        conformed = {k: c for k, (_, c) in entries.items()}
        same = all(conformed[k] is value[k] for k in value)
        return all(ok for ok, _ in entries.values()), value if same else conformed
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return (True, _python_number(value)) if is_int(value) else (False, value)
    if tp is float:
        return (True, _python_number(value)) if is_real(value) else (False, value)
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value


def _describe(tp: Any, value: Any) -> str:
    """What ``value`` is, for the error message of a field annotated ``tp``."""
    def what(v: Any) -> str:
        return "null" if v is None else f"{type(v).__name__} {v!r}"

    seq = next((a for a in (tp, *typing.get_args(tp)) if typing.get_origin(a) is tuple), None)
    if isinstance(value, str) and seq is not None:
        hint = f" (write [{value!r}] for a list of one)" if typing.get_args(seq)[0] is str else ""
        return f"the single string {value!r}{hint}"
    if isinstance(value, (list, tuple)) and seq is not None:
        for i, v in enumerate(value):
            if not _conform(typing.get_args(seq)[0], v)[0]:
                return f"{list(value)!r} (entry {i} is {what(v)})"
    if isinstance(value, dict):
        bad = next(((k, v) for k, v in value.items() if not isinstance(k, str)
                    or not _conform(typing.get_args(tp)[1] if len(typing.get_args(tp)) == 2 else Any, v)[0]), None)
        if bad is not None:
            return f"{value!r} (key {bad[0]!r} has {what(bad[1])})"
    return what(value)


def _repeated_entry(tp: Any, value: Any) -> Any:
    """The first entry that ``value`` repeats when ``tp`` is a variable-length tuple (``tuple[X, ...]``,
    possibly optional), else None. Equal numbers count as repeats (``1`` and ``1.0``)."""
    seq = next((a for a in (tp, *typing.get_args(tp)) if typing.get_origin(a) is tuple), None)
    if seq is None or typing.get_args(seq)[-1:] != (Ellipsis,) or not isinstance(value, tuple):
        return None
    twice = repeated(value)
    return twice[0] if twice else None


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in fields(cls)}  # type: ignore[arg-type]


@contextlib.contextmanager
def _refused_by(cls: type) -> Iterator[None]:
    """Mark a NopeInterpError leaving a config's checks with that config's class (``err.config``), unless a config
    built inside them marked it first (a ModelSource's ModelConfig): the CLI names the flags of that config."""
    try:
        yield
    except NopeInterpError as err:
        if err.config is None:
            err.config = cls
        raise


def _a(noun: str) -> str:
    """``noun`` with its indefinite article (``an InitGridConfig``, ``a LongContextConfig``)."""
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


class FrozenConfig:
    """Mixin for frozen dataclass configs: JSON round-trip, validated copies, field help.

    Every field's value is checked against its annotation before the config's own ``__post_init__``
    runs (``beta1="0.9"``, ``biases="no"`` or a single string where a list is expected raise
    :class:`~nope_interp.errors.NopeInterpError` naming the field and the expected type; an ``int`` is
    accepted for a ``float`` field). Numpy scalars are accepted too (``np.int64`` from ``np.arange`` or an
    array's shape, ``np.float32``) and stored as Python numbers (a numpy integer as ``int``, another numpy
    real as ``float``; also as values of ``Any`` or ``dict`` fields), so the config equals the one built from
    Python numbers and stays JSON-serialisable. Tuple-typed fields accept lists (JSON has no tuples), stored
    as tuples, and are written as lists.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None:  # run the type checks first, then the config's own checks

            @functools.wraps(own)
            def __post_init__(self: "FrozenConfig", *initvars: Any) -> None:  # noqa: N807 - the dataclass hook's name
                with _refused_by(type(self)):
                    self._check_field_types()  # a config may first normalise its values
                    own(self, *initvars)
                if isinstance(getattr(self, "_filled", None), dict):  # the values filled, as the checks left them
                    object.__setattr__(self, "_filled", {name: getattr(self, name) for name in self._filled})

            cls.__post_init__ = __post_init__  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        """Check every field against its annotation (configs without checks of their own)."""
        with _refused_by(type(self)):
            self._check_field_types()

    def _check_field_types(self) -> None:
        """Raise NopeInterpError for a field whose value does not fit its annotation; lists -> tuples."""
        for name, tp in _field_types(type(self)).items():
            value = getattr(self, name)
            ok, conformed = _conform(tp, value)
            if not ok:
                raise NopeInterpError(f"{name} must be {_type_words(tp)}, got {_describe(tp, value)}")
            repeated = _repeated_entry(tp, conformed)
            if repeated is not None:  # a list option counts each entry once (as seeds, rows or runs)
                raise NopeInterpError(f"{name} lists {repeated!r} more than once; give each value once")
            if conformed is not value:
                object.__setattr__(self, name, conformed)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict of every field (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """Inverse of :meth:`to_dict`. A config that fills fields itself (``quick``'s seeds; :meth:`_fill_unset`)
        records the filled values in its dict like any other, and the dict cannot say which were given: a value
        equal to what the config's settings fill counts as filled (as :meth:`given_fields` counts it), so
        ``from_dict(cfg.to_dict()).replace(quick=False)`` has the full defaults like ``cfg.replace(quick=False)``,
        and ``dataclasses.replace`` of it refuses ``quick=False`` as it does for ``cfg`` (before: both kept the
        quick values while recording ``quick=False``).

        Raises:
            NopeInterpError: ``data`` not a dict; unknown keys; bad values.
        """
        known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        if not isinstance(data, dict):
            raise NopeInterpError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise NopeInterpError(f"unknown {cls.__name__} field(s) {unknown}; allowed: {', '.join(sorted(known))}")
        kw = {k: (tuple(v) if isinstance(v, list) and "tuple" in str(known[k].type) else v) for k, v in data.items()}
        if "_filled" in cls.__dataclass_fields__:  # type: ignore[attr-defined] # a config that fills fields
            kw["_filled"] = RECORDED  # a value equal to what it would fill was filled (_fill_unset)
        try:
            return cls(**kw)
        except TypeError as err:
            raise NopeInterpError(f"{cls.__name__}: {err}") from None

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict` (sorted keys)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls: type[C], text: str) -> C:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def replace(self: C, **changes: Any) -> C:
        """A copy with some fields changed (validated again). A field that the config filled itself because it
        was not given (:meth:`_fill_unset`: what ``quick`` sets) is left unset again unless ``changes`` sets it,
        so it is filled anew from the new settings: ``LongContextConfig(quick=True).replace(quick=False)`` has the
        full defaults (before: it kept the quick ones while recording ``quick=False``). ``dataclasses.replace``
        does the same where it can (:meth:`_fill_unset`).

        Raises:
            NopeInterpError: unknown fields; a bad value.
        """
        known = {f.name for f in fields(self)}  # type: ignore[arg-type]
        bad = sorted(set(changes) - known)
        if bad:
            raise NopeInterpError(f"unknown {type(self).__name__} field(s) {bad}; allowed: {', '.join(sorted(known))}")
        unset = {name: None for name in self.filled_fields() if name not in changes}
        # what changes gives counts as given, even a value equal to the one filled: nothing is carried over
        carried = {"_filled": None} if "_filled" in self.__dataclass_fields__ else {}  # type: ignore[attr-defined]
        return dataclasses.replace(self, **unset, **changes, **carried)  # type: ignore[type-var]

    def _fill_unset(self, values: dict[str, Any], carried: dict[str, Any] | None = None) -> None:
        """For a config's ``__post_init__``: set each field named in ``values`` that is None (not given) to its
        value, and remember it as filled (:meth:`filled_fields`), so that :meth:`replace` fills it anew.

        A config that fills fields declares ``_filled: InitVar[dict[str, Any] | None] = None`` and passes it on as
        ``carried``: ``dataclasses.replace`` copies every field it is not given, the filled ones too, and with
        them this InitVar, the values the copied config filled. A field still holding its carried value was not
        given a new one (or was given the same): it is filled anew, as :meth:`replace` does, when these settings
        fill it with that same value; when they would fill another (``dataclasses.replace(cfg, quick=False)``), a
        copy cannot tell a carried value from one given, and refuses rather than keep the old settings' value.
        :meth:`from_dict` passes :data:`RECORDED` instead: every value equal to the one these settings fill is
        filled (a dict read back records filled values as if given).

        Raises:
            NopeInterpError: a field carried over that these settings would fill with another value.
        """
        if carried is RECORDED:  # from_dict: a value equal to the one these settings fill counts as filled
            carried = {name: value for name, value in values.items() if getattr(self, name) == value}
        carried = carried if isinstance(carried, dict) else {}
        kept = [name for name, value in carried.items()
                if name in values and getattr(self, name) is not None and getattr(self, name) == value]
        stale = [name for name in kept if values[name] != carried[name]]
        if stale:
            raise NopeInterpError(
                f"dataclasses.replace cannot tell whether {', '.join(f'{n}={carried[n]!r}' for n in stale)} "
                f"{'was' if len(stale) == 1 else 'were'} given or copied from {_a(type(self).__name__)} that filled "
                f"{'it' if len(stale) == 1 else 'them'}, and these settings fill {'it' if len(stale) == 1 else 'them'} "
                f"otherwise: use the config's replace method, which fills {'it' if len(stale) == 1 else 'them'} anew")
        for name in kept:  # carried over: filled again, with the same value
            object.__setattr__(self, name, None)
        filled = set(self.filled_fields())
        for name, value in values.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
                filled.add(name)
        object.__setattr__(self, "_filled", {f.name: getattr(self, f.name) for f in fields(self)  # type: ignore
                                             if f.name in filled})

    def filled_fields(self) -> frozenset[str]:
        """The fields this config filled itself because they were not given (``quick``'s seeds, say)."""
        return frozenset(getattr(self, "_filled", None) or ())

    def given_fields(self) -> tuple[str, ...]:
        """The fields set to something other than their default, in field order. A field the config filled
        itself (:meth:`filled_fields`) does not count, nor one of default None holding what the config would
        fill it with (a copy made by ``dataclasses.replace`` forgets what was filled); a value equal to the
        default cannot be told from one left out, so it does not count either."""
        out: list[str] = []
        refill: Any = None
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.name in self.filled_fields() or value == default:
                continue
            if f.default is None:
                if refill is None:  # the same config with every such field left unset: what it fills them with
                    try:
                        refill = dataclasses.replace(self, **{g.name: None for g in fields(self)  # type: ignore
                                                              if g.default is None})
                    except NopeInterpError:
                        refill = False
                if refill is not False and getattr(refill, f.name) == value:
                    continue
            out.append(f.name)
        return tuple(out)

    @classmethod
    def field_help(cls, name: str) -> str:
        """The one-line help of field ``name`` ("" if it has none)."""
        return next((f.metadata.get("help", "") for f in fields(cls) if f.name == name), "")  # type: ignore[arg-type]


POSITIONAL_CHOICES = ("none", "learned", "rotary")
OBJECTIVES = ("answer_only", "packed")
#: ``"sliding"``: causal attention to the last ``ModelConfig.window`` positions only (the query included).
ATTENTION_CHOICES = ("causal", "bidirectional", "sliding")
ACT_FN_CHOICES = ("gelu", "gelu_new", "relu", "silu")
#: Largest ``|init_mean|`` and ``init_std`` accepted: far beyond the init grids (mean <= 8, std <= 2), and
#: float32 weights, activations and gradients stay finite there (larger draws overflow to inf).
INIT_MEAN_MAX = 1e3
INIT_STD_MAX = 1e3
#: ``"none"``: no LayerNorm or RMSNorm anywhere (TransformerLens ``normalization_type=None``).
NORMALIZATION_CHOICES = ("LN", "LNPre", "RMS", "RMSPre", "none")


@dataclass(frozen=True)
class ModelConfig(FrozenConfig):
    """A model's shape and initialisation (TransformerLens names). Frozen; JSON round-trip.

    Attributes:
        n_layers, d_model, n_heads, d_head, d_mlp, n_ctx, d_vocab: TransformerLens sizes (positive);
            ``n_heads * d_head`` must equal ``d_model`` so that ``hook_z`` with heads concatenated has
            width ``d_model`` (as in the paper's nanoGPT).
        act_fn: MLP activation, one of :data:`ACT_FN_CHOICES`.
        normalization: TransformerLens ``normalization_type``, one of :data:`NORMALIZATION_CHOICES`;
            ``"none"`` builds no normalisation layer at all (TransformerLens ``None``), a control for
            whether the adjacency pattern needs LayerNorm.
        positional: ``"none"`` (NoPE, default), ``"learned"`` (absolute) or ``"rotary"``.
        attention: ``"causal"`` (default), ``"bidirectional"`` (a control: no adjacency pattern) or
            ``"sliding"`` (causal sliding-window attention of width ``window``, every layer).
        window: with ``attention="sliding"``, the number of keys each query sees, itself included: query
            position i attends to key positions ``max(0, i - window + 1) .. i``. An integer >= 1 (a window
            >= the sequence length is plain causal attention); must be None (default) for other attention.
            It is TransformerLens's ``window_size`` of local attention (key j is kept iff
            ``i - window_size < j <= i``).
        init_mean, init_std: every weight matrix is drawn from N(init_mean, init_std**2)
            (paper: N(0, 0.02); grid mean {0, 4, 8} x std {0.002, 0.02, 0.2}; see ``docs/method.md``).
        biases: if False (default, nanoGPT ``bias=False``), all biases are zero and frozen.
        seed: seed of the local generator used by the init (the global RNG is never touched).
        tied_embeddings: the unembedding is the transpose of the token embedding (``W_U = W_E.T``),
            one parameter, as in nanoGPT (the authors' model). Default off.
        dropout: probability in [0, 1) of dropout on the embeddings, every attention output and every
            MLP output, in train mode only (nanoGPT's placement; the authors used 0.2). Default 0.
        nope_layers: with ``positional="rotary"``, the layers whose queries and keys are not rotated: NoPE
            layers in a RoPE model, the hybrid of SmolLM3 (RoPE left out of every fourth layer) and Llama 4.
            Strictly increasing layer indices in [0, n_layers); None (default) for no hybrid.

    Raises:
        NopeInterpError: a size outside [1, 1e6], ``n_heads * d_head != d_model``, an unknown choice,
            ``init_mean`` outside [-1000, 1000] or ``init_std`` outside (0, 1000] (NaN and inf never pass),
            a negative seed, ``attention="sliding"`` without an integer ``window`` >= 1, or a ``window``
            with other attention; ``nope_layers`` without rotary positions, empty, out of range or not
            strictly increasing.
    """

    n_layers: int = opt(2, "number of transformer blocks")
    d_model: int = opt(128, "residual stream width")
    n_heads: int = opt(4, "attention heads per layer")
    d_head: int = opt(32, "width of each head (--model-n-heads times it must equal --model-d-model)")
    d_mlp: int = opt(512, "MLP hidden width")
    n_ctx: int = opt(64, "maximum sequence length")
    d_vocab: int = opt(96, "vocabulary size (the tasks use 96 characters)")
    act_fn: str = opt("gelu", f"MLP activation: {', '.join(ACT_FN_CHOICES)}")
    normalization: str = opt("LN", f"normalisation: {', '.join(NORMALIZATION_CHOICES)}")
    positional: str = opt("none", f"positional encoding: {', '.join(POSITIONAL_CHOICES)} (none = NoPE)")
    attention: str = opt("causal", f"attention direction: {', '.join(ATTENTION_CHOICES)}")
    init_mean: float = opt(0.0, "mean of the normal init of every weight matrix")
    init_std: float = opt(0.02, "std of the normal init of every weight matrix (> 0)")
    biases: bool = opt(False, "trainable biases (default off, as nanoGPT bias=False)")
    seed: int = opt(0, "seed of the init")
    tied_embeddings: bool = opt(False, "tie the unembedding to the token embedding (W_U = W_E.T), as nanoGPT")
    dropout: float = opt(0.0, "dropout on embeddings, attention and MLP outputs in train mode, in [0, 1)")
    window: int | None = opt(None, "keys each query sees with --model-attention sliding, itself included (>= 1)")
    nope_layers: tuple[int, ...] | None = opt(
        None, "with --model-positional rotary: layers left without rotation (NoPE), a hybrid as SmolLM3 or Llama 4")

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab"):
            check_int(name, getattr(self, name), 1, 1_000_000)
        if self.n_heads * self.d_head != self.d_model:
            raise NopeInterpError(f"d_model={self.d_model} must equal n_heads={self.n_heads} times "
                                  f"d_head={self.d_head} ({self.n_heads * self.d_head})")
        check_choice("act_fn", self.act_fn, ACT_FN_CHOICES)
        check_choice("normalization", self.normalization, NORMALIZATION_CHOICES)
        check_choice("positional", self.positional, POSITIONAL_CHOICES)
        check_choice("attention", self.attention, ATTENTION_CHOICES)
        check_float("init_mean", self.init_mean, -INIT_MEAN_MAX, INIT_MEAN_MAX)
        check_float("init_std", self.init_std, 0.0, INIT_STD_MAX, low_open=True)
        check_int("seed", self.seed, 0, 2**63 - 1)
        if not isinstance(self.tied_embeddings, bool):
            raise NopeInterpError(f"tied_embeddings must be true or false, got {self.tied_embeddings!r}")
        if self.nope_layers is not None:
            if self.positional != "rotary":
                raise NopeInterpError(f"nope_layers needs positional='rotary' (a hybrid of RoPE and NoPE layers), "
                                      f"got positional={self.positional!r}")
            if not self.nope_layers:
                raise NopeInterpError("nope_layers must not be empty (None: every layer rotary)")
            for layer in self.nope_layers:
                check_int("nope_layers", layer, 0, self.n_layers - 1)
            if list(self.nope_layers) != sorted(set(self.nope_layers)):
                raise NopeInterpError(f"nope_layers must be strictly increasing, got {list(self.nope_layers)}")
        check_float("dropout", self.dropout, 0.0, 1.0, high_open=True)
        if self.attention == "sliding":
            if self.window is None:
                raise NopeInterpError("window must be an integer >= 1 (keys per query, itself included) "
                                      "with attention='sliding', got None")
            check_int("window", self.window, 1, 1_000_000)
        elif self.window is not None:
            raise NopeInterpError(f"window needs attention='sliding' (it is the sliding window's width), got "
                                  f"window={self.window!r} with attention={self.attention!r}")

    @property
    def positional_label(self) -> str:
        """The positional scheme in one name: ``nope``, ``learned``, ``rotary``, or for a hybrid ``rotary-nope``
        and its NoPE layers (``rotary-nope2``, ``rotary-nope1-3``), so a hybrid is never filed as its RoPE twin."""
        if self.nope_layers:
            return "rotary-nope" + "-".join(str(layer) for layer in self.nope_layers)
        return "nope" if self.positional == "none" else self.positional


#: Named model shapes. ``paper``: the paper's nanoGPT shape. ``paper-recipe``: the same with the authors'
#: architecture options on (tied embeddings, dropout 0.2). ``cpu``: the shape the shipped models use,
#: chosen by measurement on 2 CPU cores (README, "Trained models that ship"). ``tiny``: tests.
PRESETS: dict[str, ModelConfig] = {
    "paper": ModelConfig(n_layers=6, d_model=384, n_heads=6, d_head=64, d_mlp=1536, n_ctx=256),
    "paper-recipe": ModelConfig(n_layers=6, d_model=384, n_heads=6, d_head=64, d_mlp=1536, n_ctx=256,
                                tied_embeddings=True, dropout=0.2),
    "cpu": ModelConfig(n_layers=3, d_model=128, n_heads=4, d_head=32, d_mlp=512, n_ctx=64),
    "tiny": ModelConfig(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, n_ctx=48),
}


def describe_presets() -> str:
    """Every preset with its shape in one line, for help texts: ``"paper (6 layers x d_model 384, n_ctx 256),
    ..."``; the shipped task models are ``cpu`` (3x128) but indexing's, which is ``cpu`` with 6 layers."""
    parts = []
    for name, cfg in PRESETS.items():
        extra = ", tied embeddings" if cfg.tied_embeddings else ""
        extra += f", dropout {cfg.dropout:g}" if cfg.dropout else ""
        parts.append(f"{name} ({cfg.n_layers} layers x d_model {cfg.d_model}, n_ctx {cfg.n_ctx}{extra})")
    return ", ".join(parts)


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset ``name`` (one of :data:`PRESETS`) with optional field overrides.

    Raises:
        NopeInterpError: unknown preset name or field, or invalid values.
    """
    if name not in PRESETS:
        raise NopeInterpError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def check_optimizer_fields(cfg: Any) -> None:
    """Check the optimiser and schedule fields shared by :class:`TrainConfig` and :class:`TextTrainConfig`:
    lr in (0, 10], min_lr_ratio in [0, 1], beta1 and beta2 in [0, 1), weight_decay in [0, 1000] with
    lr * weight_decay <= 1, grad_clip in (0, 1e9]. NaN and inf never pass.

    Raises:
        NopeInterpError: the first field out of range, named.
    """
    check_float("lr", cfg.lr, 0.0, 10.0, low_open=True)
    for name in ("min_lr_ratio", "beta1", "beta2"):
        check_float(name, getattr(cfg, name), 0.0, 1.0)
    for name in ("beta1", "beta2"):  # Adam divides by 1 - beta**t: a beta of 1 gives NaN at once
        if getattr(cfg, name) >= 1.0:
            raise NopeInterpError(f"{name} must be in [0, 1), got {getattr(cfg, name)!r}")
    check_float("weight_decay", cfg.weight_decay, 0.0, 1e3)
    if cfg.lr * cfg.weight_decay > 1.0:  # AdamW multiplies the weights by 1 - lr * weight_decay
        raise NopeInterpError(f"lr={cfg.lr!r} times weight_decay={cfg.weight_decay!r} must be at most 1 (AdamW scales "
                              f"the weights by 1 minus their product each step)")
    check_float("grad_clip", cfg.grad_clip, 0.0, 1e9, low_open=True)


@dataclass(frozen=True)
class TrainConfig(FrozenConfig):
    """Training settings (frozen; JSON round-trip via :meth:`to_dict` / :meth:`from_dict`).

    Defaults are the authors' optimiser settings (``docs/method.md``, "Training").

    Attributes:
        task: task name (see ``tasks.TASK_NAMES``); task_params: overrides such as ``{"n_digits": 3}``.
        n_train, n_test, data_seed: the task's disjoint splits (paper: 20,000 each).
        steps: maximum optimizer steps (also the end of the cosine decay).
        batch_size: examples per step.
        lr, min_lr_ratio, warmup_steps: linear warmup to ``lr``, cosine decay to ``lr * min_lr_ratio``.
        weight_decay, beta1, beta2, grad_clip: AdamW and clipping (decay on matrices only).
        eval_every: steps between evaluations on ``eval_n`` test prompts (greedy exact match).
        target_acc: early stop once the full test set reaches this exact match (paper: 0.99).
        checkpoint_every: steps between checkpoints (for ``--resume``).
        seed: seed of the batch sampler.
        objective: ``answer_only`` (one example per row, loss on the answer tokens) or ``packed`` (the
            authors': random ``window``-token windows of the newline-joined, shuffled training lines, loss on
            every position; evaluated with a leading newline, as every example but the first follows one).
        window: window length in tokens of the packed objective (authors: 256); at most the model's n_ctx.

    Raises:
        NopeInterpError: unknown task, task parameter or objective, a non-positive count, a learning rate
            outside (0, 10], a ratio outside [0, 1], a beta outside [0, 1), a weight decay outside [0, 1000]
            or with ``lr * weight_decay > 1``, a grad clip outside (0, 1e9]; a ``window`` other than 256 with
            objective ``answer_only`` (it would be ignored). NaN and inf never pass.
    """

    task: str = opt("addition", "task name")
    task_params: dict[str, int] = opt({}, "task parameters, e.g. {'n_digits': 3}")
    n_train: int = opt(20_000, "training examples")
    n_test: int = opt(20_000, "held-out test examples")
    data_seed: int = opt(0, "seed of the train/test split")
    steps: int = opt(5_000, "maximum optimizer steps (end of the cosine decay)")
    batch_size: int = opt(256, "examples per step")
    lr: float = opt(2.6441e-4, "peak learning rate")
    min_lr_ratio: float = opt(0.1, "final lr as a fraction of the peak")
    warmup_steps: int = opt(400, "linear warmup steps")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "gradient-norm clip")
    eval_every: int = opt(250, "steps between evaluations")
    eval_n: int = opt(1_000, "test prompts per evaluation")
    target_acc: float = opt(0.99, "early stop at this test exact match")
    checkpoint_every: int = opt(250, "steps between checkpoints")
    seed: int = opt(0, "seed of the batch sampler")
    objective: str = opt("answer_only", f"training objective: {', '.join(OBJECTIVES)}")
    window: int = opt(256, "tokens per window of the packed objective (at most --model-n-ctx)")

    def __post_init__(self) -> None:
        if not isinstance(self.task_params, dict):
            raise NopeInterpError(f"task_params must be a dict, got {self.task_params!r}")
        tasks_pkg.get_task(self.task, **self.task_params)  # validates the name and parameters
        for name in ("n_train", "n_test", "steps", "batch_size", "eval_every", "eval_n", "checkpoint_every"):
            check_int(name, getattr(self, name), 1)
        for name in ("data_seed", "seed", "warmup_steps"):
            check_int(name, getattr(self, name), 0, 2**63 - 1)
        check_float("target_acc", self.target_acc, 0.0, 1.0)
        check_optimizer_fields(self)
        check_choice("objective", self.objective, OBJECTIVES)
        check_int("window", self.window, 1, 1_000_000)
        check_used("window", self.window, 256, self.objective == "packed", "with {objective} packed")
        if self.eval_n > self.n_test:
            raise NopeInterpError(f"eval_n={self.eval_n} is more than n_test={self.n_test}: each evaluation would use "
                                  f"only the {self.n_test} test prompts (lower the first or raise the second)")

    @property
    def eval_prefix(self) -> str:
        """Text put before every prompt when this run's model is evaluated: ``"\\n"`` for ``packed``
        (in training every example but the first follows a newline), ``""`` for ``answer_only``."""
        return "\n" if self.objective == "packed" else ""

    def make_task(self) -> tasks_pkg.Task:
        """The configured task object."""
        return tasks_pkg.get_task(self.task, **self.task_params)


@dataclass(frozen=True)
class TextTrainConfig(FrozenConfig):
    """Settings of a character-level language model trained on text (:mod:`nope_interp.text_train`).

    The data is the ``train`` split of :func:`nope_interp.text.corpus` (Shakespeare's dialogue, held-out
    plays excluded) as one character stream; each step takes ``batch_size`` windows of ``window``
    characters at random offsets, loss on every position (next-character cross-entropy). Optimiser and
    schedule fields mean what they mean in :class:`TrainConfig`.

    Attributes:
        steps: optimizer steps (end of the cosine decay). batch_size: windows per step. window: characters
            per window (the training context). eval_every / eval_windows: held-out bits per character on
            this many fixed windows of ``window`` characters. checkpoint_every: steps between checkpoints.
        seed: seed of the window sampler.

    Raises:
        NopeInterpError: a non-positive count, or an optimiser field out of range (as :class:`TrainConfig`).
    """

    steps: int = opt(5_000, "optimizer steps (end of the cosine decay)")
    batch_size: int = opt(32, "windows per step")
    window: int = opt(128, "characters per training window: the training context (at most --model-n-ctx)")
    lr: float = opt(1e-3, "peak learning rate")
    min_lr_ratio: float = opt(0.1, "final lr as a fraction of the peak")
    warmup_steps: int = opt(200, "linear warmup steps")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "gradient-norm clip")
    eval_every: int = opt(250, "steps between evaluations")
    eval_windows: int = opt(64, "held-out windows per evaluation (bits per character)")
    checkpoint_every: int = opt(250, "steps between checkpoints")
    seed: int = opt(0, "seed of the window sampler")

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_windows", "checkpoint_every"):
            check_int(name, getattr(self, name), 1)
        check_int("window", self.window, 2, 1_000_000)
        for name in ("seed", "warmup_steps"):
            check_int(name, getattr(self, name), 0, 2**63 - 1)
        check_optimizer_fields(self)


def _of_training(err: NopeInterpError) -> NopeInterpError:
    """``err`` marked as refusing TrainConfig's fields (the CLI names ``--window``, not ``--model-window``)."""
    err.config = TrainConfig
    return err


def check_train_fits(model_cfg: "ModelConfig", task: tasks_pkg.Task, cfg: "TrainConfig") -> None:
    """What a training of ``model_cfg`` on ``task`` with ``cfg`` needs before it starts (checked by ``train``
    and when a sweep spec loads): ``n_ctx`` holds the longest example (prefix, prompt, answer, newline) and,
    for the packed objective, the window, which holds that example too (a shorter one never shows the model a
    whole example: 1- or 2-token windows trained silently before 2026-12-03); ``d_vocab`` is the task
    vocabulary's; the task has ``n_train + n_test`` distinct prompts.

    Raises:
        NopeInterpError: the first of these that fails, naming the value and what it needs.
    """
    need = len(cfg.eval_prefix) + task.max_prompt_len + task.max_answer_len + 1
    if cfg.objective == "packed" and cfg.window > model_cfg.n_ctx:
        raise NopeInterpError(f"window={cfg.window} is longer than the model's n_ctx={model_cfg.n_ctx}; "
                              f"use window <= {model_cfg.n_ctx} or a larger model n_ctx (--window, --model-n-ctx; in a "
                              f"sweep TOML window, model_n_ctx)")
    if model_cfg.n_ctx < need:
        raise NopeInterpError(
            f"n_ctx={model_cfg.n_ctx} is too small for task {task.name!r}: its examples need {need} positions"
        )
    if cfg.objective == "packed" and cfg.window < need:  # no window would ever hold a whole example
        raise _of_training(NopeInterpError.naming(
            "{window}={value} cannot hold one whole {task} example with the newlines around it ({need} tokens: "
            "newline, prompt, answer, newline): use {window} >= {need}", value=cfg.window, task=task.name, need=need))
    if model_cfg.d_vocab != tasks_pkg.D_VOCAB:
        raise NopeInterpError(f"d_vocab must be {tasks_pkg.D_VOCAB} (the task vocabulary), got {model_cfg.d_vocab}")
    space = task.n_distinct_prompts()
    if cfg.n_train + cfg.n_test > space:
        raise _of_training(NopeInterpError.naming(
            "{n_train} + {n_test} = {total} but task {task!r} with {params} has only {space} distinct prompts; lower "
            "{n_train} or {n_test}", total=cfg.n_train + cfg.n_test, task=task.name, params=task.params(), space=space))
