"""Reversal: ``rev(5632718650825431)=`` -> ``1345280568172365``.

Source: the task table of ``docs/method.md``. ``x`` is uniform in ``[0, 10**n_digits)`` (paper: up to 16 digits),
written without zero padding; the answer is its characters reversed (it may start with zeros).
"""

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Task, TaskError, _check_int, _text


@dataclass(frozen=True)
class ReversalTask(Task):
    """Reverse the digits of ``x`` (1 to ``n_digits`` digits; paper: 16)."""

    n_digits: int = 16
    name: ClassVar[str] = "reversal"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_digits", _check_int("n_digits", self.n_digits, 1, 64))

    @property
    def _x(self) -> str:
        return rf"(?:0|[1-9][0-9]{{0,{self.n_digits - 1}}})"

    @property
    def line_pattern(self) -> str:  # type: ignore[override]
        return rf"rev\({self._x}\)=[0-9]+"

    def sample(self, rng: random.Random) -> str:
        return f"rev({rng.randrange(10**self.n_digits)})="

    def sample_full_length(self, rng: random.Random) -> str:
        lo = 0 if self.n_digits == 1 else 10 ** (self.n_digits - 1)
        return f"rev({rng.randrange(lo, 10**self.n_digits)})="

    def solve(self, prompt: str) -> str:
        prompt = _text("prompt", prompt)
        m = re.fullmatch(rf"rev\(({self._x})\)=", prompt)
        if not m:
            raise TaskError(f"not a reversal prompt with n_digits={self.n_digits}: {prompt!r}")
        return m.group(1)[::-1]

    def n_distinct_prompts(self) -> int:
        return 10**self.n_digits

    def all_prompts(self) -> list[str]:
        return [f"rev({x})=" for x in range(10**self.n_digits)]

    @property
    def max_prompt_len(self) -> int:
        return self.n_digits + 6

    @property
    def max_answer_len(self) -> int:
        return self.n_digits
