"""What every synthetic task provides: examples, disjoint splits, token batches and an exact-match checker.

A task is a frozen dataclass of its parameters (validated in ``__post_init__``) with methods that draw
examples from an explicit ``random.Random`` (never the global RNG). Formats follow the task table of ``docs/method.md``.

Training batches (a documented choice, ``docs/method.md`` "Models and training"): one example per row,
``prompt + answer + "\\n"``, right-padded with newlines, next-token targets, and a loss mask that is
True only where the target is an answer character or the final newline (answer-only loss). With
causal attention, right padding never changes the activations at earlier positions, so no attention
mask is needed. The authors' packed 256-character windows with loss on every token are not used: on
these machines per-example sequences with an answer-only loss learned faster (README, "Trained models that ship").
"""

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

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


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TaskError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


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
        """The correct answer to ``prompt``. Raises TaskError if the prompt is malformed."""

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
        """True iff ``line`` (prompt + answer, optional trailing newline) is well formed and correct."""
        line = line.rstrip("\n")
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
        _check_int("n_train", n_train, 0, 10**9)
        _check_int("n_test", n_test, 0, 10**9)
        prompts = self.distinct_prompts(n_train + n_test, seed)
        examples = tuple(self.example(p) for p in prompts)
        return Splits(train=examples[:n_train], test=examples[n_train:])

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
        rng = random.Random(seed)
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
            exclude: prompts not to use (for example the training prompts).

        Raises:
            TaskError: if fewer than ``n`` such prompts can be found.
        """
        _check_int("n", n, 1, 10**7)
        rng = random.Random(seed)
        seen: dict[str, None] = {}
        tries = 0
        while len(seen) < n:
            tries += 1
            if tries > 50 * n + 10_000:
                raise TaskError(f"could not find {n} distinct full-length {self.name} prompts; lower n")
            p = self.sample_full_length(rng)
            if p not in exclude:
                seen.setdefault(p)
        return list(seen)

    def prompt_tokens(self, prompts: list[str]) -> Int[Tensor, "batch pos"]:
        """Encode prompts of equal length as one batch (no padding).

        Raises:
            TaskError: if the prompts do not all have the same length.
        """
        lengths = {len(p) for p in prompts}
        if len(lengths) != 1:
            raise TaskError(f"prompts must share one length for an unpadded batch, got lengths {sorted(lengths)}")
        return torch.tensor([encode(p) for p in prompts], dtype=torch.long)

    def training_batch(self, examples: "list[Example] | tuple[Example, ...]") -> Batch:
        """Right-padded per-example batch with an answer-only loss mask (see the module docstring)."""
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
