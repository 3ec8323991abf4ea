"""The toolkit's user-facing error type.

Every bad-input case (unknown preset, hook point or task; sizes that make no sense; a missing or
corrupt run directory) raises :class:`NopeInterpError` with a one-line message that names the parameter
and the allowed values. The CLI turns it into exit status 2.
"""

import contextlib
import signal
import string
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar


def one_line(text: str) -> str:
    """``text`` on one line: each line break (any that ``str.splitlines`` knows, with the spaces and tabs around
    it) becomes one space, and leading and trailing blanks go; every other run of spaces is kept, so a quoted
    value (``'a  b'``) reads as it was typed. For messages built from other libraries' multi-line errors and for
    the CLI's one-line errors and warnings. Idempotent.

    Raises:
        TypeError: ``text`` not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"one_line takes a string, got {type(text).__name__}")
    return " ".join(part for part in (line.strip(" \t") for line in text.splitlines()) if part).strip()


class Named:
    """What :class:`NopeInterpError`, :class:`NopeInterpWarning` and :class:`Message` share: a text that names
    config fields, spelt as their Python names (``str``) or, through :meth:`spelt`, as the command's flags.

    Attributes:
        template, values, names: set by :meth:`naming` (None, {} and {} otherwise): the text with the config
            fields it names as ``{field}`` placeholders, the other placeholders' values, and the Python spelling of
            a placeholder that is not a field's own name. :meth:`spelt` fills them in.
        config: the config class (:class:`~nope_interp.config.FrozenConfig`) whose fields the text names, where the
            command has two flags of one name (``window``: ``--window`` of the job or training, ``--model-window``
            of ModelConfig); None otherwise. For an error, the config whose own checks refused a value, set as the
            error leaves them (the innermost config, when one config builds another).
    """

    config: type | None = None
    template: str | None = None
    values: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance, never mutated
    names: dict[str, str] = {}  # noqa: RUF012

    @classmethod
    def naming(cls: type["_N"], template: str, names: dict[str, str] | None = None, /, **values: Any) -> "_N":
        """An instance whose text names config fields anywhere in it, not only at its start: ``template`` is a
        :meth:`str.format` text whose placeholders that ``values`` does not fill are field names (``"{from_sweep}
        and {retrain} exclude each other"``, ``"{window}={value!r} is only used with {objective} packed"`` with
        ``value=8``). The text (what Python users see) spells each field as its name, or as ``names[field]``
        (``{"model_n_layers": "model_overrides['n_layers']"}``); the CLI spells it as the flag that sets it
        (``--from-sweep and --retrain exclude each other``) through :meth:`spelt`.

        ``template`` is the raise site's own text: a user's text (a path, a ``model_overrides`` key, a name)
        goes in a value (``path=path``) or in ``names``, never into ``template`` itself, where its ``{``, ``}``,
        ``.``, ``[`` or ``!`` would be read as format syntax. A value that is :class:`Fields` lists config fields:
        in Python every one, on the CLI only those the command has a flag for.

        Raises:
            KeyError, IndexError, ValueError: ``template`` is not a valid format text (a bug at the raise site).
        """
        names = dict(names or {})
        named = {k: v.spelt(lambda field: names.get(field, field)) if isinstance(v, Fields)
                 else "" if isinstance(v, CommandLineOnly) else v for k, v in values.items()}
        new = cls(_fill(template, lambda field: names.get(field, field), named))
        new.template, new.values, new.names = template, values, names
        return new

    def spelt(self, spell: Callable[[str], str | None]) -> str:
        """The text with each field that :meth:`naming` marked spelt as ``spell(field)`` (its flag on the
        command line), or as in the text where ``spell`` gives None; the text itself for one not made by
        :meth:`naming`. A :class:`Fields` value keeps only the fields that ``spell`` spells (the options of the
        command in use)."""
        if self.template is None:
            return str(self)
        values = {k: v.spelt(spell) if isinstance(v, Fields | CommandLineOnly) else v for k, v in self.values.items()}
        return _fill(self.template, lambda field: spell(field) or self.names.get(field, field), values)


_N = TypeVar("_N", bound=Named)


class NopeInterpError(Named, ValueError):
    """Bad input to the toolkit: the message names the parameter and what is allowed.

    :meth:`naming` (``NopeInterpError.naming("{window}={value} ...", value=8)``) makes one whose message names
    config fields, spelt as flags on the command line (:meth:`spelt`).

    Attributes:
        config, template, values, names: see :class:`Named`; the CLI names ``config``'s flags (``--model-window``,
            not the training ``--window``).
    """

    def prefixed(self, where: str) -> "NopeInterpError":
        """This error with ``where + ": "`` before its message (``"addition initialised: n_ctx=48 is too small
        ..."``: which model), keeping what :meth:`naming` marked and :attr:`config`, so the CLI still spells the
        fields as flags. ``where`` is text, never a template.

        Raises:
            Nothing: a new error is returned.
        """
        if self.template is None:
            err = type(self)(f"{where}: {self}")
        else:
            key = "where"
            while key in self.values or "{" + key in self.template:  # a placeholder the template does not use
                key += "_"
            err = type(self).naming("{" + key + "}: " + self.template, self.names, **self.values, **{key: where})
        err.config = self.config
        return err


class Fields(tuple):
    """A value of :meth:`NopeInterpError.naming` listing config fields (``Fields("run", "pretrained", "init")``
    for ``"give at most one of {sources}"``): in Python each field's name (or its spelling in ``names``), joined
    by ``sep``; on the CLI (:meth:`NopeInterpError.spelt`) only the fields the command has a flag for, so a
    message never names an option that the command does not take. ``around`` (a format text with one ``{}``)
    wraps the list, and the whole of it goes when no field is left (``around=" (or {})"``)."""

    sep: str = ", "
    around: str = "{}"

    def __new__(cls, *fields: str, sep: str = ", ", around: str = "{}") -> "Fields":
        new = super().__new__(cls, fields)
        new.sep, new.around = sep, around
        return new

    def spelt(self, spell: Callable[[str], str | None]) -> "_Verbatim":
        """The list with each field spelt as ``spell(field)``, the fields it gives None for left out."""
        kept = [s for s in map(spell, self) if s is not None]
        return _Verbatim(self.around.format(self.sep.join(kept)) if kept else "")


class CommandLineOnly:
    """A value of :meth:`NopeInterpError.naming` shown on the command line only (:meth:`NopeInterpError.spelt`) and
    as nothing in Python: a note about what the CLI itself does, which a Python caller's message must not claim
    (``train-text`` sets the model's ``n_ctx`` to 2 x ``--window`` when ``--model-n-ctx`` is not given; Python's
    ``train_text`` never does). ``template`` is a :meth:`str.format` text of the raise site, its placeholders that
    ``values`` does not fill config fields spelt as the command's flags (their names where it has none)."""

    def __init__(self, template: str, **values: Any):
        self.template, self.values = template, values

    def spelt(self, spell: Callable[[str], str | None]) -> "_Verbatim":
        """The text with each field spelt as ``spell(field)``, or as its name where that gives None."""
        return _Verbatim(_fill(self.template, lambda field: spell(field) or field, self.values))


def _fill(template: str, spell: Callable[[str], str], values: dict[str, Any]) -> str:
    """``template`` formatted with ``values``, each other placeholder (a field) replaced by ``spell(field)``."""
    fields = {name for _, name, _, _ in string.Formatter().parse(template) if name and name not in values}
    return template.format(**{field: _Verbatim(spell(field)) for field in fields}, **values)


class _Verbatim(str):
    """A spelt field name: its ``!r`` conversion is the name itself, as its ``!s``."""

    def __repr__(self) -> str:
        return str(self)


class Terminated(SystemExit):
    """SIGTERM (``kill``, ``timeout``, a scheduler) during a training: raised in the main thread so that the run
    directory's cleanup runs, then turned by the CLI into one line and exit status ``code`` (128 + 15)."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called by the caller of this function, that names the first
    frame outside the ``nope_interp`` package: the user's line, however deep the toolkit's calls went (a job's
    ``write`` through its lock, a helper of a helper). A fixed number was right for one call path only (a public
    helper called directly got a frame above its caller). The frames of a runtime type checker wrapped around the
    package's functions (jaxtyping, beartype: an import hook, as the tests use) and of :mod:`contextlib` (a
    warning given when one of the toolkit's ``with`` blocks ends) are skipped too. Every warning of the package
    uses it. Raises nothing."""
    import contextlib
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    checkers = (f"{os.sep}jaxtyping{os.sep}", f"{os.sep}beartype{os.sep}")
    plumbing = os.path.abspath(contextlib.__file__)  # a warning given as a with-block of the toolkit ends

    def checker(filename: str) -> bool:
        path = os.path.abspath(filename)
        return filename.startswith("<@beartype") or path == plumbing or any(c in path for c in checkers)

    frame = sys._getframe(1)
    while frame is not None and checker(frame.f_code.co_filename):  # a checker wrapped around this function
        frame = frame.f_back
    # frame: the function that calls warnings.warn (level 1); up to the first frame outside the toolkit
    frame, level = (frame.f_back if frame is not None else None), 2
    while frame is not None and (os.path.abspath(frame.f_code.co_filename).startswith(package)
                                 or checker(frame.f_code.co_filename)):
        frame, level = frame.f_back, level + 1
    return level


class NopeInterpWarning(Named, UserWarning):
    """A toolkit warning: the input is accepted but probably not what was meant (the CLI shows it as one
    line, ``nope-interp: warning: ...``). Made by :meth:`naming`, it names config fields as Python names and,
    on the command line, as the flags that set them."""


class Message(Named, str):
    """A progress or log line (what a job passes to its ``log``) that names config fields: made by
    :meth:`naming`, it is the text with Python's names (``label 'x' names the output of one model``), and the CLI
    prints :meth:`spelt` with the command's flags (``--label 'x' names ...``)."""


class ScheduleWarning(NopeInterpWarning):
    """A training schedule that cannot do what its settings say (a warmup as long as the whole run)."""


class DegenerateInputWarning(NopeInterpWarning):
    """Sequences whose cosine similarity matrix is constant below the diagonal up to rounding (every vector
    parallel, e.g. a window of one repeated token): they have no order to score (their adjacency scores are
    NaN, left out of every summary).

    Attributes:
        what: the activations or matrices warned about (e.g. ``"activations at blocks.0.attn.hook_z"``).
        n_degenerate: how many sequences are degenerate. n_sequences: how many were scored.
    """

    def __init__(self, message: str, what: str = "", n_degenerate: int = 0, n_sequences: int = 0):
        super().__init__(message)
        self.what, self.n_degenerate, self.n_sequences = what, n_degenerate, n_sequences


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block (main thread only), SIGTERM (``kill``, ``timeout``, a scheduler) raises
    :class:`Terminated` (a SystemExit) like Ctrl-C raises KeyboardInterrupt, so cleanups run (a training's
    run directory, a sweep's stopping of its points) and the CLI says in one line what was kept; the old
    handler is restored after. Off the main thread it does nothing (signals reach that thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated(128 + signum)

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """Within the block (main thread only), Ctrl-C (SIGINT) and SIGTERM are recorded instead of raising, so a
    cleanup that is already stopping a command (terminating a sweep's workers) runs to its end when a second
    stop arrives (before: a SIGTERM after Ctrl-C raised in the middle of the loop that terminates the workers,
    and the rest kept training). Yields the list of signal numbers received; the old handlers are restored
    after. Off the main thread it holds nothing (signals reach the main thread only)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)

    old = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
