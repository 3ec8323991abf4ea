"""The ``nope-interp`` command line: ``train`` and one command per analysis job.

Every flag is derived from a frozen config: ``train`` from :class:`~nope_interp.config.ModelConfig`
(``--model-*``) and :class:`~nope_interp.config.TrainConfig`; each analysis command from its job's
config (:mod:`nope_interp.jobs`), plus the shared model-source options
(:class:`~nope_interp.jobs.common.ModelSource`) and ``--out-root``. This module parses, dispatches and
prints; it holds no analysis and writes no file. Bad input prints one line,
``nope-interp: error: ...``, and exits with status 2.
"""

import argparse
import dataclasses
import functools
import importlib
import os
import re
import shlex
import sys
import time
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from nope_interp.errors import Named, NopeInterpError, NopeInterpWarning, Terminated, one_line, sigterm_as_exit

# the tasks package imports torch (seconds): imported where used, after main() has its Ctrl-C/SIGTERM handling

#: ModelConfig fields offered as ``--model-*`` flags.
MODEL_FLAGS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "act_fn", "normalization",
               "positional", "attention", "init_mean", "init_std", "seed", "tied_embeddings", "dropout", "window",
               "nope_layers")
_TRAIN_SKIP = ("task", "task_params")
_SOURCE_SKIP = ("model_overrides",)


_ASCII_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_ASCII_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|nan|inf|infinity)",
                          re.ASCII | re.IGNORECASE)


def path_arg(text: str) -> str:
    """argparse type of a folder flag (``--out-root``, ``--runs-dir``, ``--out-dir``): any path but an empty or
    blank one, which would silently mean the current folder.

    Raises:
        argparse.ArgumentTypeError: an empty or blank path (a one-line error, exit status 2).
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a folder path, got the empty path {text!r} (write . for the "
                                         f"current folder)")
    return os.path.expanduser(text)  # '~/x' quoted, or --out-root=~/x (which the shell leaves alone)


def ascii_int(text: str) -> int:
    """argparse type: an integer written with the ASCII digits 0-9 and an optional sign.

    Python's ``int`` also reads other scripts' digits (``"\u0663"`` is 3), ``"1_000"`` and padded
    spaces; none of them is a flag value here.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse reports it as a one-line error, exit status 2).
    """
    if not _ASCII_INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be an integer written with the digits 0-9, got {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """argparse type: a decimal number in ASCII (``0.1``, ``-2``, ``1e-4``; ``nan``/``inf`` are read and
    then refused by the config's range checks, which name the field).

    Raises:
        argparse.ArgumentTypeError: anything else (other scripts' digits, ``"1_0"``, words).
    """
    if not _ASCII_FLOAT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a number written with the digits 0-9 (e.g. 0.1, 1e-4), got {text!r}")
    return float(text)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, ``nope-interp: error: ...`` (the first word
    of ``prog``: a script using it names itself), with exit status 2 (argparse's own prints the whole usage
    first). Sub-commands inherit it. ``full_parser``, where set, builds the parser with every sub-command's
    flags (a parser built lazily holds only the named command's), to say which commands take an unknown flag."""

    full_parser: Callable[[], "OneLineParser"] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # no abbreviations: argparse's default took `--with-seed` for --with-seeds and ran every shipped model
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line (pointing at ``--help``) and exit with status 2."""
        self.exit(2, f"{self.prog.split()[0]}: error: {one_line(message)} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        """argparse's ``parse_args``, but an unknown flag points at the sub-command's ``--help`` (where the
        flags it accepts are listed), not the top level's, and a flag that other sub-commands take names them
        (:data:`WHY_NOT_HERE` adds why, where one reason holds for every command without it)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            elsewhere, subs = [], None
            for flag in dict.fromkeys(e.split("=")[0] for e in extras if e.startswith("--")):
                if subs is None:  # built once, on this error path only: it imports every job
                    subs = (self.full_parser() if self.full_parser else self)._sub_commands()
                takers = [name for name, p in subs.items() if name != command and flag in p._option_string_actions]
                if takers:
                    why = f" ({WHY_NOT_HERE[flag][1]})" if command in WHY_NOT_HERE.get(flag, ((), ""))[0] else ""
                    elsewhere.append(f"{flag} is taken by {', '.join(takers)}{why}")
            hint = f"; {'; '.join(elsewhere)}" if elsewhere else ""
            self.exit(2, f"{self.prog.split()[0]}: error: unrecognized arguments: {' '.join(extras)}{hint} "
                         f"(see {prog} --help)\n")
        return ns

    def _sub_commands(self) -> dict[str, argparse.ArgumentParser]:
        """The sub-command parsers by name (empty for a parser without sub-commands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


#: Why a command lacks a flag that others take: flag -> (the commands the reason holds for, the reason).
WHY_NOT_HERE = {"--hf-path": (("averaging", "ablate", "compare", "trajectory", "length-gen", "demo"),
                              "a Hugging Face model has no task to score: this command needs one of the four tasks")}


_ARG_TYPES = {int: ascii_int, float: ascii_float}


def _flag_type(tp: Any) -> tuple[Any, bool, bool]:
    """(element type, is a list, is a bool) of a config field's annotation."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):  # X | None
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return args[0], True, False
    return tp, False, tp is bool


def add_config_flags(parser: argparse.ArgumentParser | Any, cls: type, prefix: str = "",
                     only: Sequence[str] | None = None, skip: Sequence[str] = (), defaults_from: str = "") -> None:
    """Add one flag per field of the dataclass ``cls`` (``--<prefix><field-name>``), help from the field.

    Every flag defaults to None, so :func:`config_kwargs` passes on only what the user gave and the
    config's own defaults apply. Dict-typed fields are skipped. ``defaults_from`` (e.g. "the preset")
    replaces the shown default where another source decides it.
    """
    for f in dataclasses.fields(cls):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        elem, many, is_bool = _flag_type(f.type)
        if elem is dict or typing.get_origin(elem) is dict:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse %-formats help ("99%" is text)
        shown = " ".join(map(str, default)) if many and default is not None else default
        if defaults_from:
            help_text += f" (default: from {defaults_from})"
        elif not is_bool and "default" not in help_text and shown not in (None, ""):
            help_text += f" (default: {shown})"  # none shown for an empty list or a None decided elsewhere
        flag, dest = f"--{prefix}{f.name.replace('_', '-')}", f"{prefix.replace('-', '_')}{f.name}"
        if is_bool:
            parser.add_argument(flag, dest=dest, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=_ARG_TYPES.get(elem, str),
                                nargs="+" if many else None, default=None, help=help_text)


def config_kwargs(args: argparse.Namespace, cls: type, prefix: str = "") -> dict[str, Any]:
    """The fields of ``cls`` that were given on the command line (lists become tuples)."""
    out = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f"{prefix.replace('-', '_')}{f.name}", None)
        if value is not None:
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


#: A config field leading a message: ``dropout must be ...``, ``nope_layers lists ...``, ``window needs ...``.
_LEADING_FIELD = re.compile(r"([a-z][a-z0-9_]*)(?= must | lists | is | has | needs )")
#: A setting a message quotes as ``field=value`` (``window=8``, ``attention='sliding'``): not part of a flag
#: (``--window=8``), a dotted name (``model.n_ctx=``) or a quoted text.
_SETTING = re.compile(r"(?<![\w.'\"-])([a-z][a-z0-9_]*)=('[^'\s]*'|[^\s,;:()'\"\[\]]+)")


def flag_named(message: str, args: argparse.Namespace, config: type | None = None) -> str:
    """``message`` with the config fields it names spelt as the command-line flags that set them: the configs
    check their fields by name, and a user of the CLI knows the flags.

    A leading field name (``dropout must be ...``) becomes the flag that set it (``--model-dropout must be ...``);
    a message saying ``got None`` names the flag of that field that was not given (``--model-window`` for a
    sliding window, not the training ``--window``). A setting quoted as ``field=value`` (``window=8``,
    ``attention='sliding'``) becomes ``--flag=value`` (``--model-window=8``, ``--model-attention=sliding``) when a
    flag gave that value, or when a config's own check raised the message (its fields are the flags or their
    defaults); a value from elsewhere (a ``--pretrained`` model's ``n_layers=3``) keeps its name. ``config``: the
    config class whose check raised it (``NopeInterpError.config``): ModelConfig's fields are the ``--model-*``
    flags, every other config's the plain ones. Without it, a field that two flags set (``--seed`` and
    ``--model-seed``) is the flag whose value the message quotes. A name is left as it is when no flag, or more
    than one that the message cannot tell apart, fits."""
    match = _LEADING_FIELD.match(message)
    if match is None and _SETTING.match(message) is None:
        return _flag_of_unknown_value(message, args)
    if match is not None:
        field = match.group(1)
        options = _flags_of(field, args, config)
        unset = "got None" in message   # the field was left unset: the flag the user did not give
        if unset:
            options = {flag: v for flag, v in options.items() if v is None}
        else:
            options = {flag: v for flag, v in options.items() if v is not None and v is not False}
            if len(options) > 1:  # both set a field of this name: the one whose value the message quotes
                options = {flag: v for flag, v in options.items()
                           if re.search(rf"got {re.escape(str(v))}\b", message)}
        if len(options) == 1:
            message = next(iter(options)) + message[len(field):]
    for m in reversed(list(_SETTING.finditer(message))):  # from the end: the spans before stay where they are
        value = m.group(2).strip("'")
        flag = _flag_of_setting(m.group(1), value, args, config)
        if flag is not None:
            message = f"{message[:m.start()]}{flag}={value}{message[m.end():]}"
    return message


def spelt_as_flags(err: NopeInterpError, args: argparse.Namespace, config: type | None = None) -> str:
    """The message of ``err`` with the config fields that :meth:`~nope_interp.errors.NopeInterpError.naming` marked
    in it spelt as this command's flags (:func:`flag_of_field`; a field without one keeps its name), and a quoted
    word after a flag's ``=`` unquoted, as typed (``--runs-dir=elsewhere``); the message of any other error as it
    is."""
    if err.template is None:
        return str(err)
    message = err.spelt(lambda field: flag_of_field(field, args, config))
    return re.sub(r"(?<![\w-])(--[a-z][a-z0-9-]*)='([^'\s]*)'", r"\1=\2", message)


def flag_of_field(field: str, args: argparse.Namespace, config: type | None = None) -> str | None:
    """The flag that sets the config field ``field`` in this command (``--from-sweep`` for ``from_sweep``;
    ``--model-window`` for ModelConfig's ``window``): the one flag of ``config``'s field, or of the two that may set
    it (``--seed``, ``--model-seed``) the one given; None when the command has no such flag or cannot tell."""
    options = _flags_of(field, args, config)
    if len(options) > 1:
        options = {flag: v for flag, v in options.items() if v is not None}
    return next(iter(options)) if len(options) == 1 else None


def _flags_of(field: str, args: argparse.Namespace, config: type | None) -> dict[str, Any]:
    """The flags that may set the config field ``field``, with their values: ``--<field>`` and
    ``--model-<field>``, or only the one of ``config`` (the ``--model-*`` flags are ModelConfig's). An on/off flag
    that was not given (``--resume``: False) is one too: a message may name it as what to give."""
    dests = (field, f"model_{field}")
    if config is not None:
        from nope_interp.config import ModelConfig  # imported already: a config raised the message

        dests = dests[1:] if config is ModelConfig else dests[:1]
    return {f"--{dest.replace('_', '-')}": value for dest, value in vars(args).items() if dest in dests}


def _flag_of_setting(field: str, value: str, args: argparse.Namespace, config: type | None) -> str | None:
    """The flag of the setting ``field=value`` in a message, or None: the flag that gave the value, else with
    ``config`` (a config's own check raised the message) the one flag of that config's field, else the one flag
    of another config that gave exactly that value (a job's error quoting an ``--init`` model's
    ``--model-n-ctx=10``)."""
    options = _flags_of(field, args, config)
    given = [flag for flag, v in options.items() if v is not None and value in (str(v), repr(v))]
    if len(given) == 1:
        return given[0]
    if config is not None and len(options) == 1:
        return next(iter(options))
    if config is not None:  # a setting another config's flag gave exactly (a job's error quoting --model-n-ctx=10)
        given = [flag for flag, v in _flags_of(field, args, None).items()
                 if v is not None and v is not False and value in (str(v), repr(v))]
        return given[0] if len(given) == 1 else None
    return None


def _flag_of_unknown_value(message: str, args: argparse.Namespace) -> str:
    """``message`` refusing an unknown name (``unknown task 'ordring'; allowed: ...``, ``kinds: unknown
    ablation 'x'``, ``unknown site(s) ['blocks.9.x']``) prefixed with the one flag whose value holds that name
    (``--pretrained: unknown task 'ordring'; ...``), and a leading ``field:`` dropped: the check that raised it
    knows the config field or nothing, the user knows the flag. Left as it is when no flag, or more than one,
    holds the name."""
    match = re.match(r"(?:([a-z][a-z0-9_]*): )?unknown [^'\"]*?(['\"])(.*?)\2", message)
    if match is None:
        return message
    name = match.group(3)
    flags = [f"--{dest.replace('_', '-')}" for dest, value in vars(args).items()
             if value == name or (isinstance(value, list | tuple) and name in value)]
    if len(flags) != 1:
        return message
    return f"{flags[0]}: {message[len(match.group(1)) + 2:] if match.group(1) else message}"


def _jobs() -> tuple[Any, ...]:
    """Every job module, in ``nope-interp --help`` order (imports them all, TransformerLens with them)."""
    from nope_interp.jobs import JOB_HELP

    return tuple(_job(name) for name in JOB_HELP)


def _job(command: str) -> Any:
    """The job module run by ``command`` (imported on demand: only the command given pays its imports)."""
    from nope_interp.jobs import job_module_name

    return importlib.import_module(job_module_name(command))


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first argument that is not an option (None if there is none)."""
    return next((a for a in argv if not a.startswith("-")), None)


def source_flags(job: Any) -> tuple[str, ...]:
    """The :class:`~nope_interp.jobs.common.ModelSource` fields a job offers as flags: its ``SOURCES`` when
    it declares them, else every source but ``hf_path``, which only jobs with ``TAKES_HF`` get. A flag a
    job would refuse is not in its ``--help`` (argparse then refuses it as unknown, exit status 2)."""
    from nope_interp.jobs.common import ModelSource

    every = tuple(f.name for f in dataclasses.fields(ModelSource) if f.name not in _SOURCE_SKIP)
    declared = getattr(job, "SOURCES", None)
    if declared is not None:
        return tuple(n for n in every if n in declared)
    return tuple(n for n in every if n != "hf_path" or getattr(job, "TAKES_HF", False))


def _given_by(job: Any) -> list[str]:
    """The flags of ``job`` that give it models (``--run``, ``--pretrained``, ``--init``, ``--hf-path``: those
    it has), for messages that must not name an option the command lacks."""
    return [f"--{n.replace('_', '-')}" for n in ("run", "pretrained", "init", "hf_path") if n in source_flags(job)]


def _or(words: list[str]) -> str:
    """``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``nope-interp`` parser. Only the job that ``argv`` names gets its flags (and imports its module);
    the other jobs are listed with their one-line help, so ``nope-interp --help`` does not import every job and
    TransformerLens. Without ``argv`` every job gets its flags."""
    from nope_interp.config import ModelConfig, TextTrainConfig, TrainConfig, describe_presets
    from nope_interp.jobs import JOB_HELP

    parser = OneLineParser(prog="nope-interp", description=__doc__.splitlines()[0].replace("``", ""))
    if argv is not None:
        parser.full_parser = lambda: _build_parser(None)  # type: ignore[assignment,return-value]
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train-text", help="train a character-level language model on Shakespeare (text extra); "
                                          "writes runs/<name>/",
                       description="Train a character-level language model on the training plays' dialogue "
                                   "(NoPE by default; --model-positional learned or rotary for the twins).")
    p.add_argument("--preset", default="cpu",
                   help=f"model preset: {describe_presets()}; default cpu (the shipped task models' shape; indexing's "
                        "has --model-n-layers 6)")
    p.add_argument("--name", default=None, help="run name (default: text-<positional>-<preset>-s<seed>)")
    p.add_argument("--runs-dir", type=path_arg, default="runs", help="parent of the run directory (default runs/)")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]")
    p.add_argument("--threads", type=ascii_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (none either when stderr is not a terminal)")
    add_config_flags(p, ModelConfig, prefix="model-", only=MODEL_FLAGS, defaults_from="--preset")
    add_config_flags(p, TextTrainConfig)

    p = sub.add_parser("train", help="train a NoPE model on a task; writes runs/<name>/")
    from tasks import TASK_NAMES

    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASK_NAMES)}")
    p.add_argument("--n-digits", type=ascii_int, default=None, help="task size (default: the paper's)")
    p.add_argument("--preset", default="cpu",
                   help=f"model preset: {describe_presets()}; default cpu (the shipped task models' shape; indexing's "
                        "has --model-n-layers 6)")
    p.add_argument("--name", default=None, help="run name (default: <task>-<preset>-s<seed>)")
    p.add_argument("--runs-dir", type=path_arg, default="runs", help="parent of the run directory (default runs/)")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--finalize", action="store_true",
                   help="no training: score a stopped run's last checkpoint on the test set, write summary.json")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]")
    p.add_argument("--threads", type=ascii_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: one line per evaluation instead (so too when stderr is not a terminal)")
    add_config_flags(p, ModelConfig, prefix="model-", only=MODEL_FLAGS, defaults_from="--preset")
    add_config_flags(p, TrainConfig, skip=_TRAIN_SKIP)

    from nope_interp.sweep import EXECUTORS, available_specs

    shipped = ", ".join(available_specs())
    p = sub.add_parser("sweep", help="run every point of a sweep spec (resumable; local pool or Ray)",
                       description="Run every unfinished point of a sweep spec (a TOML file, or a shipped spec: "
                                   f"{shipped}); finished points are skipped, failed ones retried.")
    p.add_argument("spec", help=f"a spec file, or a shipped spec: {shipped}")
    p.add_argument("--executor", default="local", help=f"{', '.join(EXECUTORS)} (default local)")
    p.add_argument("--workers", type=ascii_int, default=None,
                   help="points at a time (default: 2 with the local pool; with Ray, as many as the cluster fits)")
    p.add_argument("--threads", type=ascii_int, default=1, help="torch threads per point (default 1)")
    p.add_argument("--ray-address", default=None, help="address of a running Ray cluster (host:port); "
                                                        "default: start a local one")
    p.add_argument("--out-dir", type=path_arg, default=None, help="where the points go (default runs/sweeps/<name>/)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (none either when stderr is not a terminal)")
    p = sub.add_parser("sweep-report", help="aggregate a sweep over seeds: table (CSV, Markdown) and figures",
                       description="Aggregate the finished points of a sweep over seeds (mean, std, 95% CI).")
    p.add_argument("spec", help=f"a spec file, or a shipped spec: {shipped}")
    p.add_argument("--out-dir", type=path_arg, default=None, help="where the points are (default runs/sweeps/<name>/)")
    p.add_argument("--out-root", type=path_arg, default=".",
                   help="writes results/sweeps/<name>/ and figures/sweeps/<name>/ under this folder (default .)")

    command = None if argv is None else _command_of(argv)
    for name, help_text in JOB_HELP.items():
        if argv is not None and name != command:  # listed only: its flags are built when it is the command
            sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text)
            continue
        from nope_interp.jobs.common import ModelSource

        job = _job(name)
        p = sub.add_parser(job.NAME, help=job.HELP.replace("%", "%%"), description=job.HELP)
        add_config_flags(p.add_argument_group(f"{job.NAME} options"), job.CONFIG)
        if job.TAKES_MODELS:
            group = p.add_argument_group("models (default: " + job.DEFAULT_MODELS + ")")
            sources = source_flags(job)
            add_config_flags(group, ModelSource, only=sources)
            if "init" in sources:  # the --model-* flags shape an --init model only (refused with any other)
                others = [f for f in _given_by(job) if f != "--init"]  # this command's own flags only
                shape = p.add_argument_group(f"shape of an --init model (refused with "
                                             f"{_or([*others, 'the default models'])})")
                add_config_flags(shape, ModelConfig, prefix="model-", only=MODEL_FLAGS, defaults_from="--preset")
        p.add_argument("--out-root", type=path_arg, default=".",
                       help=f"writes results/{job.NAME.replace('-', '_')}/ and figures/{job.NAME.replace('-', '_')}/ "
                            "under this folder (default .)")
    return parser


def _set_threads(threads: int | None) -> None:
    """``--threads``: torch's CPU threads (None: torch's choice).

    Raises:
        NopeInterpError: not in [1, this machine's CPU count] (:func:`nope_interp.config.check_threads`).
    """
    if threads is None:
        return
    from nope_interp.config import check_threads

    check_threads("--threads", threads)
    import torch

    torch.set_num_threads(threads)


def _cmd_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp.config import ModelConfig, TrainConfig, check_name, preset
    from nope_interp.stats import fmt_fraction
    from nope_interp.train import finalize, train

    _set_threads(args.threads)
    if args.name is not None:
        check_name("--name", args.name)
    if args.finalize:
        model_kw = config_kwargs(args, ModelConfig, prefix="model-")
        ignored = [f"--model-{k.replace('_', '-')}" for k in model_kw if k != "seed"]
        ignored += [f"--{k.replace('_', '-')}" for k in config_kwargs(args, TrainConfig) if k not in _TRAIN_SKIP]
        ignored += ["--resume"] * args.resume + ["--n-digits"] * (args.n_digits is not None)
        if ignored:  # finalize reads every setting from the run: these would be silently ignored
            raise NopeInterpError(f"--finalize scores a stopped run with its own settings; {', '.join(ignored)} "
                                  f"would be ignored: drop {'it' if len(ignored) == 1 else 'them'}")
        # the name training gives the run by default (its --model-seed included), or --name
        name = args.name or f"{args.task}-{args.preset}-s{preset(args.preset, **model_kw).seed}"
        check_name("run name", name)
        config_path = Path(args.runs_dir) / name / "config.json"
        if config_path.is_file():  # finalize scores the run's own task: a different --task would be ignored
            from nope_interp import io

            saved = io.read_json(config_path, "run config")
            run_task = saved["task"].get("name") if isinstance(saved, dict) and isinstance(saved.get("task"), dict) \
                else None
            if isinstance(run_task, str) and run_task != args.task:
                raise NopeInterpError(f"--task {args.task} but run {name} was trained on {run_task}: --finalize scores "
                                      f"a run on its own task (give --task {run_task})")
        from nope_interp.train import resolve_device

        summary = finalize(Path(args.runs_dir) / name, device=resolve_device(args.device))
        print(f"test exact match {fmt_fraction(summary['test_acc'])} at step {summary['steps']}; "
              f"summary: {Path(args.runs_dir) / name / 'summary.json'}")
        return 0
    model_cfg = preset(args.preset, **config_kwargs(args, ModelConfig, prefix="model-"))
    task_params = {} if args.n_digits is None else {"n_digits": args.n_digits}
    train_kw = {k: v for k, v in config_kwargs(args, TrainConfig).items() if k not in _TRAIN_SKIP}
    cfg = TrainConfig(task=args.task, task_params=task_params, **train_kw)
    name = args.name or f"{args.task}-{args.preset}-s{model_cfg.seed}"
    check_name("run name", name)
    run_dir = Path(args.runs_dir) / name
    bar = _progress_bar(args)
    result = train(model_cfg, cfg, run_dir, resume=args.resume, device=args.device,
                   command=shlex.join(["nope-interp", *argv]), progress=bar,
                   log=None if bar else (lambda line: print(line, flush=True)))
    print(f"test exact match {fmt_fraction(result.test_acc)} after {result.steps} steps "
          f"({result.wall_time_s / 60:.1f} min); outputs in {run_dir}/")
    return 0


def _progress_bar(args: argparse.Namespace) -> bool:
    """Whether a training or sweep command draws its progress bar: not with ``--no-progress``, nor when stderr
    is not a terminal (a log file gets one line per evaluation instead of carriage-return redraws)."""
    from nope_interp.jobs.common import stderr_is_terminal

    return not args.no_progress and stderr_is_terminal()


def _cmd_train_text(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp.config import ModelConfig, TextTrainConfig, check_name, preset
    from nope_interp.text_train import train_text

    _set_threads(args.threads)
    if args.name is not None:
        check_name("--name", args.name)
    model_kw = config_kwargs(args, ModelConfig, prefix="model-")
    cfg = TextTrainConfig(**config_kwargs(args, TextTrainConfig))
    model_kw.setdefault("n_ctx", 2 * cfg.window)  # room for the 2x evaluation (and for learned positions)
    model_cfg = preset(args.preset, **model_kw)
    hybrid = model_cfg.positional_label.removeprefix("rotary") if model_cfg.nope_layers else ""  # not its twin's
    name = args.name or f"text-{model_cfg.positional}{hybrid}-{args.preset}-s{model_cfg.seed}"
    check_name("run name", name)
    run_dir = Path(args.runs_dir) / name
    result = train_text(model_cfg, cfg, run_dir, resume=args.resume, device=args.device,
                        command=shlex.join(["nope-interp", *argv]), progress=_progress_bar(args))
    print(f"held-out bits per character {result.eval_bpc:.4f} after {result.steps} steps "
          f"({result.wall_time_s / 60:.1f} min); outputs in {run_dir}/")
    return 0


def _cmd_job(job: Any, args: argparse.Namespace) -> int:
    from nope_interp import io
    from nope_interp.config import ModelConfig
    from nope_interp.jobs.common import ModelSource, load_models

    t0 = time.perf_counter()  # "done in" counts loading the models too (the result's wall time does not)
    cfg = job.CONFIG(**config_kwargs(args, job.CONFIG))
    res_dir, fig_dir = io.job_dirs(args.out_root, job.NAME.replace("-", "_"))
    for folder in (res_dir, fig_dir):  # before any work: a file or a read-only folder fails here
        io.check_writable_dir(folder, "--out-root output folder")
    if getattr(cfg, "retrain", False):  # demo --retrain writes runs under --runs-dir
        io.check_writable_dir(cfg.runs_dir, "--runs-dir")
    models = None
    if job.TAKES_MODELS:
        source = ModelSource(**config_kwargs(args, ModelSource),
                             model_overrides=config_kwargs(args, ModelConfig, prefix="model-"))
        unused = [f"--{f.replace('_', '-')}" for f in getattr(job, "DEFAULT_ONLY", ())
                  if f in config_kwargs(args, job.CONFIG)]
        if source.given and unused:  # options that shape the job's default models only
            raise NopeInterpError(f"{', '.join(unused)} shape{'s' if len(unused) == 1 else ''} {job.NAME}'s default "
                                  f"models ({job.DEFAULT_MODELS}), not the models given by "
                                  f"{_or(_given_by(job))}: drop {'it' if len(unused) == 1 else 'them'}")
        models = (load_models(source, default_with_seeds=getattr(job, "DEFAULT_WITH_SEEDS", False)) or None) \
            if source.given else None  # load_models: [] when the source names no model (the job's defaults)
        text_runs = [m.label for m in models or () if m.kind == "text"]
        if text_runs and not getattr(job, "TAKES_TEXT", False):
            raise NopeInterpError(f"{', '.join(text_runs)}: a train-text language model works with long-context, "
                                  f"analyze, ablate and probe, not {job.NAME} (it has no task of its own)")
        if text_runs and job.NAME != "long-context" and (source.task is not None or source.n_digits is not None):
            raise NopeInterpError(f"{', '.join(text_runs)}: {job.NAME} reads a train-text model's held-out text "
                                  "windows, so --task / --n-digits would be ignored: drop them (long-context "
                                  "--inputs task reads task text)")
    with io.exclusive_folders((res_dir, fig_dir), "--out-root output folder"):  # one writer per job and out-root
        result = job.run(cfg, models, log=_log_for(args))
        with io.recording_writes() as written:
            try:
                paths = job.write(result, args.out_root)
            except BaseException as err:  # Ctrl-C, SIGTERM or a file that cannot be written, part-way through
                if written:
                    err.partial_writes = tuple(written)  # type: ignore[union-attr]  # read by _run_command
                raise
    print(f"done in {time.perf_counter() - t0:.0f}s\noutputs:\n" + "\n".join(f"  {p}" for p in paths))
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from nope_interp import io, sweep

    spec = sweep.load_spec(args.spec)
    out_dir = Path(args.out_dir) if args.out_dir else Path("runs") / "sweeps" / spec.name
    if args.command == "sweep":
        status = sweep.run_sweep(spec, out_dir, executor=args.executor, workers=args.workers, threads=args.threads,
                                 ray_address=args.ray_address, log=_log_for(args), progress=_progress_bar(args))
        print(f"points in {out_dir}/points/; aggregate with: nope-interp sweep-report {args.spec}"
              + (f" --out-dir {out_dir}" if args.out_dir else ""))
        return 1 if status.failed else 0
    for folder in (Path(args.out_root) / "results" / "sweeps", Path(args.out_root) / "figures" / "sweeps"):
        io.check_writable_dir(folder, "--out-root output folder")
    rep = sweep.report(spec, out_dir)
    paths = sweep.write_report(rep, args.out_root)
    unreadable = f", {len(rep.unreadable)} with an unreadable result.json" if rep.unreadable else ""
    print(f"{len(rep.points)} of {len(spec.points)} points finished ({len(rep.failed)} failed, "
          f"{len(rep.missing)} not run{unreadable}); {len(rep.rows)} configurations\noutputs:\n"
          + "\n".join(f"  {p}" for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nope-interp`` console script. Returns the exit status (0, or 2 on bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # building the parser imports the job's modules (torch, TransformerLens): seconds a user may stop
        with sigterm_as_exit():
            parser = _build_parser(argv)
            try:
                args = parser.parse_args(argv)
            except Terminated:
                raise
            except SystemExit as stop:  # --help (0) or a one-line usage error (2)
                return stop.code if isinstance(stop.code, int) else 2
    except (KeyboardInterrupt, Terminated, ImportError) as caught:  # one line, as once the command runs
        stop = _interrupt_in(caught)
        if stop is None:  # an ImportError of its own
            raise
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        command = next((a for a in argv if not a.startswith("-")), "")
        print(f"nope-interp: {how} while starting{f' ({command})' if command else ''}; nothing was written: "
              "rerun the same command", file=sys.stderr)
        return int(stop.code) if isinstance(stop, Terminated) else 130
    with warnings.catch_warnings():
        # restored on exit: the CLI's one-line warnings stay in the CLI
        warnings.showwarning = functools.partial(_show_warning, args=args)
        return _run_command(args, argv)


def as_flags(text: str | Warning, args: argparse.Namespace | None) -> str:
    """``text`` as the command line shows it: a :class:`~nope_interp.errors.Message` or warning made by ``naming``
    with the config fields it names spelt as this command's flags (:func:`flag_of_field`); any other text, or any
    text without ``args``, as it is."""
    if args is not None and isinstance(text, Named) and text.template is not None:
        return text.spelt(lambda field: flag_of_field(field, args, text.config))
    return str(text)


def _show_warning(message, category, filename, lineno, file=None, line=None, *,  # noqa: ANN001
                  args: argparse.Namespace | None = None) -> None:
    """The toolkit's own warnings as one line on stderr (``nope-interp: warning: ...``), the config fields they
    name spelt as the command's flags; others as Python shows them."""
    if issubclass(category, NopeInterpWarning):
        print(f"nope-interp: warning: {one_line(as_flags(message, args))}", file=sys.stderr if file is None else file)
    else:
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _log_for(args: argparse.Namespace) -> Callable[[str], None]:
    """The ``log`` a command passes to a job or sweep: each line on stdout through ``tqdm.write`` (a progress bar
    on stderr stays whole), the config fields a :class:`~nope_interp.errors.Message` names spelt as flags."""
    from tqdm import tqdm

    return lambda line: tqdm.write(as_flags(line, args))


#: What a stopped command (Ctrl-C, SIGTERM) kept and how to go on, by command (analysis jobs: the default).
STOPPED_ADVICE = {
    "train": "what finished is kept: rerun the same command with --resume (a run stopped before its first "
             "checkpoint is removed, so rerun that one without --resume)",
    "sweep": "what finished is kept (each finished point's result.json): rerun the same command to run the rest "
             "(a point cut short resumes from its last checkpoint)",
}
STOPPED_ADVICE["train-text"] = STOPPED_ADVICE["train"]
STOPPED_JOB_ADVICE = "nothing was written (a job writes its files when it ends): rerun the same command"


def _open_progress_bars() -> set[typing.Any]:
    """The tqdm bars open now (tqdm's own registry), e.g. a notebook's around a call of :func:`main`."""
    from tqdm import tqdm

    return set(getattr(tqdm, "_instances", ()))


def _close_progress_bars(keep: set[typing.Any] | frozenset[typing.Any] = frozenset()) -> None:
    """Close the tqdm bars still open (a command stopped in the middle of one), so what is printed next starts
    on a line of its own; the bars in ``keep`` (open before the command started: a caller's) stay open."""
    for bar in _open_progress_bars() - keep:
        bar.close()


def _run_command(args: argparse.Namespace, argv: list[str]) -> int:
    from tasks import TaskError  # imported by the parser already

    before = _open_progress_bars()  # a caller's bars (a notebook's) are not the command's to close
    try:
        with sigterm_as_exit():  # every command: a scheduler's or `timeout`'s SIGTERM gets the line below too
            if args.command == "train":
                return _cmd_train(args, argv)
            if args.command == "train-text":
                return _cmd_train_text(args, argv)
            if args.command in ("sweep", "sweep-report"):
                return _cmd_sweep(args)
            return _cmd_job(_job(args.command), args)
    except (NopeInterpError, TaskError) as err:
        config = getattr(err, "config", None)  # a TaskError has none
        message = spelt_as_flags(err, args, config) if isinstance(err, NopeInterpError) else str(err)
        print(f"nope-interp: error: {one_line(flag_named(message, args, config))}{_partial_writes(err)}",
              file=sys.stderr)
        return 2
    except OSError as err:  # a path the operating system refuses (permission, a name too long, a full disk)
        where = f": {err.filename}" if err.filename else ""
        print(f"nope-interp: error: {one_line(err.strerror or str(err))}{where}{_partial_writes(err)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated, ImportError) as caught:  # Ctrl-C or SIGTERM: one line, not a traceback
        stop = _interrupt_in(caught)
        if stop is None:  # an ImportError of its own
            raise
        how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
        _close_progress_bars(before)  # the line below on a line of its own, not after a half-drawn bar
        if getattr(caught, "partial_writes", None):  # stopped while writing: some files are new, others not
            advice = f"stopped while writing its files{_partial_writes(caught)}: rerun the same command"
        else:
            advice = STOPPED_ADVICE.get(args.command, STOPPED_JOB_ADVICE)
        print(f"nope-interp: {how} ({args.command}); {advice}", file=sys.stderr)
        return int(stop.code) if isinstance(stop, Terminated) else 130


def _interrupt_in(err: BaseException) -> KeyboardInterrupt | Terminated | None:
    """The Ctrl-C (``KeyboardInterrupt``) or SIGTERM (:class:`~nope_interp.errors.Terminated`) that ``err`` is or
    was raised from or during (its ``__cause__`` / ``__context__`` chain), else None: a library that imports
    lazily (Hugging Face ``transformers``) turns a Ctrl-C during its import into an ImportError (before: some 90
    lines of traceback ending in "Could not import module 'BertForPreTraining'", as if the install were broken)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt | Terminated):
            return e
        todo += [e.__cause__, e.__context__]
    return None


def _partial_writes(err: BaseException) -> str:
    """``"; 2 files were replaced (a, b), the job's other files are as before"`` for a job's write stopped part-way
    (``err.partial_writes``, set by :func:`_cmd_job`), else ``""``."""
    written = getattr(err, "partial_writes", None)
    if not written:
        return ""
    names = ", ".join(str(p) for p in written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
    return (f"; {len(written)} of its files {'was' if len(written) == 1 else 'were'} written before ({names}), its "
            "other files are as before (a run's earlier results, or none)")


if __name__ == "__main__":
    sys.exit(main())
