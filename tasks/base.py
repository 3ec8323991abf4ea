"""What every synthetic task provides: examples, disjoint splits, token batches and an exact-match checker.

A task is a frozen dataclass of its parameters (validated in ``__post_init__``) with methods that draw
examples from an explicit ``random.Random`` (never the global RNG). Formats follow the task table of ``docs/method.md``.

Training batches, two objectives (``docs/method.md``, "Models and training"):

* answer-only (:meth:`Task.training_batch`): one example per row, ``prompt + answer + "\\n"``,
  right-padded with newlines, next-token targets, and a loss mask that is True only where the target is
  an answer character or the final newline. With causal attention, right padding never changes the
  activations at earlier positions, so no attention mask is needed.
* packed, the authors' (:func:`packed_stream`, :func:`packed_batch`): the shuffled training lines joined
  by newlines into one stream; each row is a random fixed-length window of it, with the loss on every
  position.
"""

import bisect
import numbers
import random
import re
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import ItemsView, KeysView, Set
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from tasks.vocab import EOS, encode


class TaskError(ValueError):
    """Bad task parameters or an impossible request (one line, names the parameter)."""


@dataclass(frozen=True)
class Example:
    """One prompt and its answer, e.g. ``Example("$123+456=", "975$")``."""

    prompt: str
    answer: str

    @property
    def line(self) -> str:
        """The example as one line of a task file, without the newline: ``prompt + answer``."""
        return self.prompt + self.answer


@dataclass(frozen=True)
class Splits:
    """Disjoint train and test examples (no prompt appears in both)."""

    train: tuple[Example, ...]
    test: tuple[Example, ...]


#: Splits built by :meth:`Task.splits`, least recently used first: loading many runs of one task (seeds,
#: candidates) rebuilt the same 40,000 examples for each (1.3 s a run).
_SPLITS_CACHE: "OrderedDict[tuple, Splits]" = OrderedDict()
_SPLITS_CACHE_SIZE = 8


@dataclass(frozen=True)
class Batch:
    """Token batch for next-token training with an answer-only loss.

    Attributes:
        tokens: input ids, ``Int[Tensor, "batch pos"]``: the example line without its last character.
        targets: next-token ids, ``Int[Tensor, "batch pos"]``: ``targets[b, p] = line[b][p + 1]``.
        loss_mask: ``Bool[Tensor, "batch pos"]``, True where the target is an answer character or the
            terminating newline; False on prompt and padding positions.
    """

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    loss_mask: Bool[Tensor, "batch pos"]


def _check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as a Python ``int`` when it is an integer in [low, high]: any ``numbers.Integral`` (a numpy
    integer from ``np.arange`` included; ``random.Random`` refuses those, so it is converted) but not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise TaskError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _seed(seed: object) -> object:
    """A numpy (or other ``numbers.Integral``) seed as the Python ``int`` ``random.Random`` takes; any other
    seed unchanged."""
    return int(seed) if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) else seed


def _text(name: str, value: object) -> str:
    """``value`` if it is a ``str``; else TaskError naming ``name`` (``re`` would raise a bare TypeError)."""
    if not isinstance(value, str):
        raise TaskError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    return value


def _sequence(name: str, values: object, of: type, example: str, ordered: bool = True) -> list:
    """``values`` as a list, read once (a generator too), after checking it is a sequence (not a single string)
    of ``of`` instances; with ``ordered`` (the result follows its order) not a set or frozenset either, whose
    order is arbitrary (and for strings changes from one run to the next); a dict view keeps its dict's order."""
    if isinstance(values, (str, bytes)):
        raise TaskError(f"{name} must be a sequence of {example}, got the single string {values!r}")
    if ordered and isinstance(values, Set) and not isinstance(values, (KeysView, ItemsView)):  # dict views keep order
        raise TaskError(f"{name} must be a list or tuple of {example}, whose order is the result's order; got an "
                        f"unordered {type(values).__name__}: give a list in the order you want")
    try:
        items = list(values)  # type: ignore[call-overload]
    except TypeError:
        raise TaskError(f"{name} must be a sequence of {example}, got {type(values).__name__}") from None
    for i, v in enumerate(items):
        if not isinstance(v, of):
            article = "an" if of.__name__[0] in "AEIOU" else "a"
            raise TaskError(f"{name}[{i}] must be {article} {of.__name__}, got {type(v).__name__} {v!r}")
    return items


def _exclude(exclude: object, task: "Task") -> frozenset[str]:
    """``exclude`` as a frozenset of prompts; a single string (whose ``in`` would test substrings) is refused.
    A full line of ``task`` (prompt + answer, e.g. a training file's ``$1+2=3$``, with or without its newline)
    excludes its prompt: before, it matched no prompt and excluded nothing, silently. Entries that are not
    ``task``'s (another task size's training prompts, as length generalisation passes) exclude nothing."""
    items = _sequence("exclude", exclude, str, "prompts, e.g. frozenset({'$1+2='})", ordered=False)
    out = set(items)
    for e in items:
        line = e.rstrip("\n")
        if line.endswith("="):
            out.add(line)
        elif "=" in line and task.check_line(line):
            out.add(line.partition("=")[0] + "=")
    return frozenset(out)


@dataclass(frozen=True)
class Task(ABC):
    """Abstract base. Subclasses set ``name``, implement the abstract methods and validate parameters."""

    name: ClassVar[str] = "task"
    #: Regular expression for one full line (prompt + answer) of the task file format.
    line_pattern: ClassVar[str] = ""

    # --- to implement -------------------------------------------------------------------------
    @abstractmethod
    def sample(self, rng: random.Random) -> str:
        """Draw one prompt (uniformly, as the task table of ``docs/method.md`` specifies) from ``rng``."""

    @abstractmethod
    def sample_full_length(self, rng: random.Random) -> str:
        """Draw one prompt of the maximal prompt length (used for analysis batches)."""

    @abstractmethod
    def solve(self, prompt: str) -> str:
        """The correct answer to ``prompt``.

        Only the vocabulary's ASCII characters are accepted: digits are ``0``-``9``; other characters that
        Python calls digits (Arabic-Indic, fullwidth, superscripts, ...) make the prompt malformed.

        Raises:
            TaskError: the prompt is not a string or is malformed.
        """

    @abstractmethod
    def n_distinct_prompts(self) -> int:
        """How many different prompts these parameters allow."""

    @abstractmethod
    def all_prompts(self) -> list[str]:
        """Every prompt, in a fixed order (only called when the prompt space is small)."""

    @property
    @abstractmethod
    def max_prompt_len(self) -> int:
        """Characters in the longest prompt (through ``=``)."""

    @property
    @abstractmethod
    def max_answer_len(self) -> int:
        """Characters in the longest answer (without the newline)."""

    # --- shared -----------------------------------------------------------------------------
    @property
    def max_seq_len(self) -> int:
        """Tokens a model must hold for one example: prompt + answer + newline, minus the last target."""
        return self.max_prompt_len + self.max_answer_len

    def example(self, prompt: str) -> Example:
        """The :class:`Example` for ``prompt`` with its correct answer."""
        return Example(prompt, self.solve(prompt))

    def is_correct(self, prompt: str, predicted: str) -> bool:
        """Exact-match checker: True iff ``predicted`` equals the whole correct answer."""
        return predicted == self.solve(prompt)

    def check_line(self, line: str) -> bool:
        """True iff ``line`` (prompt + answer, optional trailing newline) is well formed and correct.

        Digits must be ASCII ``0``-``9`` (as in the vocabulary): a line with any other digit is False.

        Raises:
            TaskError: ``line`` is not a string.
        """
        line = _text("line", line).rstrip("\n")
        if not re.fullmatch(self.line_pattern, line):
            return False
        prompt, _, answer = line.partition("=")
        try:
            return self.is_correct(prompt + "=", answer)
        except TaskError:
            return False

    def parse_line(self, line: str) -> Example:
        """Split a task-file line into an :class:`Example`. Raises TaskError if it is not a correct line."""
        if not self.check_line(line):
            raise TaskError(f"not a correct {self.name} line: {line!r}")
        prompt, _, answer = line.rstrip("\n").partition("=")
        return Example(prompt + "=", answer)

    def splits(self, n_train: int = 20_000, n_test: int = 20_000, seed: int = 0) -> Splits:
        """Deterministic, disjoint train/test splits of distinct prompts.

        Args:
            n_train: training examples (paper: 20,000).
            n_test: test examples (paper: 20,000).
            seed: seed of a local ``random.Random``; same seed and parameters give the same splits.

        Raises:
            TaskError: if a count is negative or more distinct prompts are asked for than exist.
        """
        n_train = _check_int("n_train", n_train, 0, 10**9)
        n_test = _check_int("n_test", n_test, 0, 10**9)
        seed = _seed(seed)  # a numpy integer seeds (and caches) as the int it equals
        key: tuple | None = None  # the splits of one task, counts and integer seed are built once (immutable)
        if type(seed) is int:  # not a float equal to an int (random.Random seeds them differently), nor None
            try:
                key = (type(self), tuple(sorted(self.params().items())), n_train, n_test, seed)
                hash(key)
            except TypeError:  # a task with unhashable parameters: built every time
                key = None
        if key is not None and key in _SPLITS_CACHE:
            _SPLITS_CACHE.move_to_end(key)
            return _SPLITS_CACHE[key]
        prompts = self.distinct_prompts(n_train + n_test, seed)
        examples = tuple(self.example(p) for p in prompts)
        splits = Splits(train=examples[:n_train], test=examples[n_train:])
        if key is not None:
            _SPLITS_CACHE[key] = splits
            while len(_SPLITS_CACHE) > _SPLITS_CACHE_SIZE:
                _SPLITS_CACHE.popitem(last=False)
        return splits

    def distinct_prompts(self, n: int, seed: int) -> list[str]:
        """``n`` distinct prompts drawn with ``random.Random(seed)``.

        Rejection sampling when the space is large; exact sampling without replacement from the
        enumerated space when ``n`` is more than a quarter of it.
        """
        space = self.n_distinct_prompts()
        if n > space:
            raise TaskError(
                f"asked for {n} distinct {self.name} prompts (n_train + n_test) but the parameters "
                f"{self.params()} allow only {space}"
            )
        rng = random.Random(_seed(seed))
        if 4 * n > space:
            return rng.sample(self.all_prompts(), n)
        seen: dict[str, None] = {}
        while len(seen) < n:
            seen.setdefault(self.sample(rng))
        return list(seen)

    def analysis_prompts(self, n: int = 256, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[str]:
        """``n`` distinct prompts of the maximal prompt length (``docs/method.md``, "Analysis inputs").

        Args:
            n: number of prompts (paper: 256).
            seed: seed of a local ``random.Random``.
            exclude: prompts not to use (for example the training prompts; a full line, prompt + answer,
                excludes its prompt).

        Raises:
            TaskError: if fewer than ``n`` such prompts can be found; ``exclude`` is a single string
                (``in`` would test substrings) or holds a non-string.
        """
        n = _check_int("n", n, 1, 10**7)
        seed = _seed(seed)
        exclude = _exclude(exclude, self)
        space = self.n_distinct_prompts()
        if n > space:  # fail at once, not after 50 n samples
            raise TaskError(f"could not find {n} distinct full-length {self.name} prompts: the parameters "
                            f"{self.params()} allow {space} prompts of any length; lower n")
        rng = random.Random(seed)
        seen: dict[str, None] = {}
        tries = 0
        while len(seen) < n:
            tries += 1
            if tries > 50 * n + 10_000:
                left = f" outside the {len(exclude)} excluded ones" if exclude else ""
                raise TaskError(f"could not find {n} distinct full-length {self.name} prompts{left} (found "
                                f"{len(seen)}); lower n{' or exclude fewer prompts' if exclude else ''}")
            p = self.sample_full_length(rng)
            if p not in exclude:
                seen.setdefault(p)
        return list(seen)

    def prompt_tokens(self, prompts: list[str]) -> Int[Tensor, "batch pos"]:
        """Encode prompts of equal length as one batch (no padding).

        Raises:
            TaskError: ``prompts`` is empty, a single string, a set or frozenset (the rows follow its order), or
                holds a non-string or an empty prompt; the prompts do not all have the same length.
            UnknownCharacterError: a character outside the vocabulary.
        """
        prompts = _sequence("prompts", prompts, str, "prompt strings")
        if not prompts or not all(prompts):
            raise TaskError(f"prompt_tokens needs at least one prompt and no empty prompt, got {prompts!r}"[:200])
        lengths = {len(p) for p in prompts}
        if len(lengths) != 1:
            raise TaskError(f"prompts must share one length for an unpadded batch, got lengths {sorted(lengths)}")
        return torch.tensor([encode(p) for p in prompts], dtype=torch.long)

    def analysis_tokens(self, n: int = 256, seed: int = 0,
                        exclude: frozenset[str] = frozenset()) -> Int[Tensor, "n pos"]:
        """The tokens of :meth:`analysis_prompts` (``n`` distinct full-length prompts, ``pos`` =
        ``max_prompt_len``): the inputs every analysis of a task model reads under the ``full`` protocol.

        Raises:
            TaskError: as :meth:`analysis_prompts`.
        """
        return self.prompt_tokens(self.analysis_prompts(n, seed, exclude))

    def training_batch(self, examples: "list[Example] | tuple[Example, ...]") -> Batch:
        """Right-padded per-example batch with an answer-only loss mask (see the module docstring).

        Raises:
            TaskError: no examples; ``examples`` is not a sequence of :class:`Example`, or is a set or frozenset
                (the rows follow its order).
        """
        examples = _sequence("examples", examples, Example, "Example, e.g. task.example('$1+2=')")
        if not examples:
            raise TaskError("training_batch needs at least one example")
        lines = [ex.prompt + ex.answer + EOS for ex in examples]
        width = max(len(line) for line in lines) - 1
        tokens = torch.full((len(lines), width), encode(EOS)[0], dtype=torch.long)
        targets = torch.full((len(lines), width), encode(EOS)[0], dtype=torch.long)
        mask = torch.zeros((len(lines), width), dtype=torch.bool)
        for b, (ex, line) in enumerate(zip(examples, lines, strict=True)):
            ids = encode(line)
            tokens[b, : len(ids) - 1] = torch.tensor(ids[:-1])
            targets[b, : len(ids) - 1] = torch.tensor(ids[1:])
            # target index t predicts line[t + 1]; answer chars start at line index len(prompt)
            mask[b, len(ex.prompt) - 1 : len(ids) - 1] = True
        return Batch(tokens=tokens, targets=targets, loss_mask=mask)

    def params(self) -> dict[str, int]:
        """The task's parameters as a dict (for configs and error messages)."""
        from dataclasses import asdict

        return asdict(self)


def packed_stream(examples: "list[Example] | tuple[Example, ...]", seed: int) -> Int[Tensor, " n"]:
    """The token stream of the packed objective: the examples' lines in an order shuffled by
    ``random.Random(seed)``, each followed by a newline, concatenated (the authors' training file).

    Raises:
        TaskError: no examples; ``examples`` is not a sequence of :class:`Example`, or is a set or frozenset
            (the shuffle by ``seed`` starts from its order: a set's would make the stream differ between runs).
    """
    examples = _sequence("examples", examples, Example, "Example, e.g. task.example('$1+2=')")
    if not examples:
        raise TaskError("packed_stream needs at least one example")
    lines = [ex.prompt + ex.answer + EOS for ex in examples]
    random.Random(_seed(seed)).shuffle(lines)
    return torch.tensor(encode("".join(lines)), dtype=torch.long)


def packed_batch(stream: Int[Tensor, " n"], window: int, batch_size: int, generator: torch.Generator) -> Batch:
    """``batch_size`` windows of ``window`` tokens at uniformly random offsets of ``stream`` (drawn with
    ``generator``), their next-token targets, and a loss mask that is True everywhere (loss on every
    position, no padding).

    Raises:
        TaskError: ``window`` < 1, or the stream is not longer than ``window``.
    """
    window = _check_int("window", window, 1, 10**7)
    if stream.numel() <= window:
        raise TaskError(f"the packed stream has {stream.numel()} tokens; a window of {window} needs more")
    starts = torch.randint(0, stream.numel() - window, (batch_size,), generator=generator)
    idx = starts[:, None] + torch.arange(window + 1)
    rows = stream[idx]
    return Batch(tokens=rows[:, :-1], targets=rows[:, 1:], loss_mask=torch.ones(batch_size, window, dtype=torch.bool))


#: Input protocols of the analyses: ``full`` (full-length held-out prompts, ours), ``authors`` (test lines
#: cut to a fixed length and left-padded with newlines, as the authors' analysis code) and ``window``
#: (windows of the concatenated test lines, as a packed model was trained).
PROTOCOLS = ("full", "authors", "window")
#: The default length (characters) of a ``window``-protocol input; the other protocols accept only this value.
DEFAULT_WINDOW = 64
#: The authors' fixed analysis length per task (characters), for the paper's task sizes.
AUTHORS_LENGTH = {"addition": 9, "reversal": 22, "ordering": 19, "indexing": 19}


def authors_length(task: Task) -> int:
    """The fixed length of the ``authors`` protocol: the authors' value for the paper's task size, else the
    task's longest prompt."""
    default = type(task)()
    return AUTHORS_LENGTH[task.name] if task == default else task.max_prompt_len


def held_out_lines(task: Task, n: int, seed: int, exclude: frozenset[str] = frozenset(),
                   at_least: int | None = None) -> list[str]:
    """``n`` lines ``prompt + answer`` of distinct prompts of every length, none of them in ``exclude``
    (a stand-in for the test file that the ``authors`` and ``window`` protocols read).

    With ``at_least``, a task whose parameters allow fewer than ``n`` prompts outside ``exclude`` (a
    small task size) gives all of them, as long as there are ``at_least``.

    Raises:
        TaskError: fewer than ``n`` (or ``at_least``) distinct prompts outside ``exclude``; ``exclude`` is a
            single string or holds a non-string.
    """
    exclude = _exclude(exclude, task)
    prompts = [p for p in task.distinct_prompts(min(task.n_distinct_prompts(), n + len(exclude)), seed)
               if p not in exclude][:n]
    need = n if at_least is None else min(n, at_least)
    if len(prompts) < need:
        params = ", ".join(f"{k}={v}" for k, v in task.params().items())
        raise TaskError(f"only {len(prompts)} held-out {task.name} prompts ({params}) available outside the "
                        f"excluded ones, {need} needed")
    return [task.example(p).line for p in prompts]


def authors_inputs(task: Task, n: int, seed: int = 0, exclude: frozenset[str] = frozenset(),
                   window_chars: int = 1024) -> list[str]:
    """``n`` analysis inputs built as the authors' analysis code built them.

    Random ``window_chars``-character windows of the newline-joined held-out lines are split into lines;
    each line is cut to :func:`authors_length` characters and left-padded with newlines when shorter;
    lines shorter than a quarter of that length are dropped, and addition lines must start with ``$``.
    The inputs may contain answer characters and may be cut mid-prompt, as theirs did, and the same line
    may come back (the windows are drawn with replacement, as theirs were).

    A task whose parameters allow fewer held-out lines than the 2,000 (or 4 ``n``) the text is built from
    uses all of them.

    Raises:
        TaskError: ``n`` < 1; ``exclude`` is a single string or holds a non-string; no held-out line, or none
            long enough.
    """
    n = _check_int("n", n, 1, 10**7)
    seed = _check_int("seed", seed, 0, 2**63 - 1)
    exclude = _exclude(exclude, task)
    length = authors_length(task)
    rng = random.Random(seed)
    lines = held_out_lines(task, max(4 * n, 2000), seed, exclude, at_least=1)  # all of a small task's
    if not any(len(ln) >= length // 4 and (task.name != "addition" or ln.startswith("$")) for ln in lines):
        raise TaskError(f"no held-out {task.name} line is long enough for the authors protocol ({length // 4} chars)")
    text = EOS.join(lines) + EOS
    out: list[str] = []
    while len(out) < n:
        start = rng.randrange(max(1, len(text) - window_chars))
        for line in text[start : start + window_chars].split(EOS):
            if len(line) < length // 4 or (task.name == "addition" and not line.startswith("$")):
                continue
            out.append(line[:length].rjust(length, EOS))
            if len(out) == n:
                break
    return out


def window_inputs(task: Task, n: int, window: int, seed: int = 0, exclude: frozenset[str] = frozenset()) -> list[str]:
    """``n`` windows of ``window`` characters at random offsets of the newline-joined held-out lines (what a
    model trained on packed windows sees).

    Raises:
        TaskError: ``n`` or ``window`` < 1; ``exclude`` is a single string or holds a non-string.
    """
    n = _check_int("n", n, 1, 10**7)
    window = _check_int("window", window, 1, 10**7)
    seed = _check_int("seed", seed, 0, 2**63 - 1)
    exclude = _exclude(exclude, task)
    rng = random.Random(seed)
    lines = held_out_lines(task, max(2 * n, (2 * window) // max(1, task.max_seq_len) + 2), seed, exclude,
                           at_least=1)
    text = EOS.join(lines) + EOS
    while len(text) <= window:
        text += text
    return [text[s : s + window] for s in (rng.randrange(len(text) - window) for _ in range(n))]


def _held_out_prompts(task: Task, n: int, seed: int, exclude: frozenset[str], max_len: int) -> list[str]:
    """Up to ``n`` distinct prompts of at most ``max_len`` characters outside ``exclude``, drawn with ``seed``
    (fewer only when the task's prompt space has no more)."""
    space = task.n_distinct_prompts()
    k = min(space, n + len(exclude))
    while True:
        got = [p for p in task.distinct_prompts(k, seed) if p not in exclude and len(p) <= max_len][:n]
        if len(got) >= n or k == space:
            return got
        k = min(space, 4 * k)


def protocol_examples(task: Task, protocol: str, n: int, seed: int = 0, exclude: frozenset[str] = frozenset(),
                      window: int = DEFAULT_WINDOW) -> list[Example]:
    """``n`` examples to score a model's answers on the inputs of ``protocol``: each ``prompt`` is a context of
    exactly :func:`protocol_length` characters, built the protocol's way and ending with a complete held-out
    prompt, and ``answer`` is that prompt's answer. What a position-by-position intervention on the
    protocol's inputs (``nope-interp ablate --protocol``) is scored on.

    * ``full``: the full-length prompts of :meth:`Task.analysis_prompts` (context = prompt).
    * ``authors``: held-out prompts of at most :func:`authors_length` characters, left-padded with newlines
      to that length (longer prompts would be cut before their ``=`` by the authors' builder: they are not
      drawn).
    * ``window``: ``window`` characters of newline-joined held-out lines that end with a newline and then
      the prompt (prompts of every length), so the context starts at a random point of the text, possibly
      mid-line, as a window of a packed model's training text does.

    The final prompts are distinct and outside ``exclude``; the lines before them (``window``) are other held-out
    lines, none in ``exclude`` and none of the final prompts.

    Raises:
        TaskError: unknown protocol, or a ``window`` with another protocol (as :func:`protocol_length`);
            ``n`` < 1; ``seed`` not an integer >= 0; ``exclude`` a single string or holding a non-string;
            fewer than ``n`` held-out prompts that fit; a ``window`` shorter than the task's longest prompt
            plus its newline.
    """
    exclude = _exclude(exclude, task)
    n = _check_int("n", n, 1, 10**7)
    seed = _check_int("seed", seed, 0, 2**63 - 1)
    length = protocol_length(task, protocol, window)
    if protocol == "full":
        return [task.example(p) for p in task.analysis_prompts(n, seed, exclude)]
    if protocol == "window" and length < task.max_prompt_len + 1:
        raise TaskError(f"window={length} cannot hold a newline and the longest {task.name} prompt "
                        f"({task.max_prompt_len} characters): window must be >= {task.max_prompt_len + 1}")
    prompts = _held_out_prompts(task, n, seed, exclude, length)
    if len(prompts) < n:
        raise TaskError(f"only {len(prompts)} held-out {task.name} prompts ({task.params()}) of at most {length} "
                        f"characters outside the excluded ones, {n} needed")
    if protocol == "authors":
        return [Example(p.rjust(length, EOS), task.example(p).answer) for p in prompts]
    rng = random.Random(seed)
    lines = held_out_lines(task, max(2 * n, (2 * length) // max(1, task.max_seq_len) + 2), rng.randrange(2**62),
                           exclude | frozenset(prompts), at_least=1)
    text = EOS.join(lines) + EOS
    while len(text) < length:
        text += text
    ends = [i for i, c in enumerate(text) if c == EOS]  # ascending; the last is the text's last character
    out = []
    for p in prompts:
        fill = length - len(p)  # characters before the prompt, the last of them a newline
        e = ends[rng.randrange(bisect.bisect_left(ends, fill - 1), len(ends))]
        out.append(Example(text[e - fill + 1 : e + 1] + p, task.example(p).answer))
    return out


def _check_window_used(protocol: str, window: Any) -> None:
    """Refuse a non-default ``window`` with a protocol that would ignore it (a silent no-op otherwise)."""
    if protocol != "window" and not (isinstance(window, numbers.Integral) and not isinstance(window, bool)
                                     and window == DEFAULT_WINDOW):
        raise TaskError(f"window={window!r} is only used with protocol 'window'; with protocol {protocol!r} it would "
                        f"be ignored: drop it, or pass protocol='window'")


def protocol_length(task: Task, protocol: str, window: int = DEFAULT_WINDOW) -> int:
    """The length (characters = tokens) of every input of ``protocol``: the task's longest prompt for
    ``full``, :func:`authors_length` for ``authors``, ``window`` for ``window``.

    Raises:
        TaskError: unknown protocol (the message lists them); ``task`` not a Task; for ``window``, ``window``
            not an integer in [1, 10**7]; for another protocol, a ``window`` other than
            :data:`DEFAULT_WINDOW` (it would be ignored).
    """
    if not isinstance(task, Task):
        raise TaskError(f"task must be a tasks.Task (e.g. tasks.get_task('reversal')), got {type(task).__name__}")
    if protocol not in PROTOCOLS:
        raise TaskError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    _check_window_used(protocol, window)
    if protocol == "window":
        window = _check_int("window", window, 1, 10**7)
        return window
    return {"full": task.max_prompt_len, "authors": authors_length(task)}[protocol]


def protocol_inputs(task: Task, protocol: str, n: int, seed: int = 0, exclude: frozenset[str] = frozenset(),
                    window: int = DEFAULT_WINDOW) -> list[str]:
    """``n`` analysis inputs of equal length under ``protocol`` (one of :data:`PROTOCOLS`): ``full`` is
    :meth:`Task.analysis_prompts`, ``authors`` :func:`authors_inputs`, ``window`` :func:`window_inputs`.

    Raises:
        TaskError: unknown protocol (the message lists them); ``seed`` not an integer >= 0 (every call must give
            the same inputs); too few inputs available; ``exclude`` is a
            single string (``in`` would test substrings) or holds a non-string; a ``window`` other than
            :data:`DEFAULT_WINDOW` with a protocol other than ``window`` (it would be ignored).
    """
    exclude = _exclude(exclude, task)
    seed = _check_int("seed", seed, 0, 2**63 - 1)
    if protocol in PROTOCOLS:
        _check_window_used(protocol, window)
    if protocol == "full":
        return task.analysis_prompts(n, seed, exclude)
    if protocol == "authors":
        return authors_inputs(task, n, seed, exclude)
    if protocol == "window":
        return window_inputs(task, n, window, seed, exclude)
    raise TaskError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
