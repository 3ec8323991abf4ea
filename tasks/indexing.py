"""Indexing: ``wherex(631023235,3)=`` -> ``1`` (0-based index of the first occurrence of ``t`` in ``x``).

Source: the task table of ``docs/method.md``. ``x`` is uniform in ``[0, 10**n_digits)`` (paper: 9 digits), written
without zero padding; the target ``t`` is one of ``x``'s own characters, drawn uniformly over its
positions.
"""

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Task, TaskError, _check_int, _text


@dataclass(frozen=True)
class IndexingTask(Task):
    """Find the first index of a digit in ``x`` (1 to ``n_digits`` digits; paper: 9, at most 10)."""

    n_digits: int = 9
    name: ClassVar[str] = "indexing"

    def __post_init__(self) -> None:
        # answers are single characters, so x may have at most 10 digits (indices 0-9)
        object.__setattr__(self, "n_digits", _check_int("n_digits", self.n_digits, 1, 10))

    @property
    def _x(self) -> str:
        return rf"(?:0|[1-9][0-9]{{0,{self.n_digits - 1}}})"

    @property
    def line_pattern(self) -> str:  # type: ignore[override]
        return rf"wherex\({self._x},[0-9]\)=[0-9]"

    def _prompt(self, x: int, rng: random.Random) -> str:
        s = str(x)
        return f"wherex({s},{s[rng.randrange(len(s))]})="

    def sample(self, rng: random.Random) -> str:
        return self._prompt(rng.randrange(10**self.n_digits), rng)

    def sample_full_length(self, rng: random.Random) -> str:
        lo = 0 if self.n_digits == 1 else 10 ** (self.n_digits - 1)
        return self._prompt(rng.randrange(lo, 10**self.n_digits), rng)

    def solve(self, prompt: str) -> str:
        prompt = _text("prompt", prompt)
        m = re.fullmatch(rf"wherex\(({self._x}),([0-9])\)=", prompt)
        if not m or m.group(2) not in m.group(1):
            raise TaskError(f"not an indexing prompt with n_digits={self.n_digits}: {prompt!r}")
        return str(m.group(1).index(m.group(2)))

    def n_distinct_prompts(self) -> int:
        # sum over digits d of #{x in [0, 10**n) whose decimal string contains d}
        n, total = self.n_digits, 0
        for d in range(10):
            without = 9  # one-digit numbers 0..9 other than d
            for length in range(2, n + 1):
                without += (9 if d == 0 else 8) * 9 ** (length - 1)
            total += 10**n - without
        return total

    def all_prompts(self) -> list[str]:
        return [f"wherex({x},{d})=" for x in range(10**self.n_digits) for d in sorted(set(str(x)))]

    @property
    def max_prompt_len(self) -> int:
        return self.n_digits + 11

    @property
    def max_answer_len(self) -> int:
        return 1
