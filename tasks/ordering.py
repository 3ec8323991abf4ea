"""Ordering: ``order(74283,87234)=`` -> ``30241`` (for each character of ``s``, its 0-based index in ``x``).

Source: the task table of ``docs/method.md``. ``x`` is uniform over the integers in ``[0, 10**n_digits)`` whose
digits are distinct (paper: up to 5 digits), written without zero padding; ``s`` is a uniformly random
permutation of ``x``'s characters.
"""

import itertools
import math
import random
import re
from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Task, TaskError, _check_int, _text


def _n_distinct_digit_numbers(length: int) -> int:
    """How many integers written with exactly ``length`` distinct digits (no zero padding)."""
    return 10 if length == 1 else 9 * math.perm(9, length - 1)


@dataclass(frozen=True)
class OrderingTask(Task):
    """Locate each character of a permutation ``s`` in ``x`` (paper: x up to 5 distinct digits)."""

    n_digits: int = 5
    name: ClassVar[str] = "ordering"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_digits", _check_int("n_digits", self.n_digits, 1, 10))

    @property
    def line_pattern(self) -> str:  # type: ignore[override]
        x = rf"(?:0|[1-9][0-9]{{0,{self.n_digits - 1}}})"
        return rf"order\({x},[0-9]{{1,{self.n_digits}}}\)=[0-9]{{1,{self.n_digits}}}"

    def _x_of_length(self, length: int, rng: random.Random) -> str:
        if length == 1:
            return str(rng.randrange(10))
        first = str(rng.randrange(1, 10))
        rest = rng.sample([d for d in "0123456789" if d != first], length - 1)
        return first + "".join(rest)

    def _prompt(self, x: str, rng: random.Random) -> str:
        s = list(x)
        rng.shuffle(s)
        return f"order({x},{''.join(s)})="

    def sample(self, rng: random.Random) -> str:
        lengths = range(1, self.n_digits + 1)
        length = rng.choices(lengths, weights=[_n_distinct_digit_numbers(k) for k in lengths])[0]
        return self._prompt(self._x_of_length(length, rng), rng)

    def sample_full_length(self, rng: random.Random) -> str:
        return self._prompt(self._x_of_length(self.n_digits, rng), rng)

    def solve(self, prompt: str) -> str:
        prompt = _text("prompt", prompt)
        m = re.fullmatch(r"order\(([0-9]+),([0-9]+)\)=", prompt)
        if not m:
            raise TaskError(f"not an ordering prompt: {prompt!r}")
        x, s = m.group(1), m.group(2)
        if (
            len(x) > self.n_digits
            or len(set(x)) != len(x)
            or sorted(s) != sorted(x)
            or (len(x) > 1 and x[0] == "0")
        ):
            raise TaskError(f"not an ordering prompt with n_digits={self.n_digits}: {prompt!r}")
        return "".join(str(x.index(ch)) for ch in s)

    def n_distinct_prompts(self) -> int:
        return sum(_n_distinct_digit_numbers(k) * math.factorial(k) for k in range(1, self.n_digits + 1))

    def all_prompts(self) -> list[str]:
        out = []
        for x in range(10**self.n_digits):
            xs = str(x)
            if len(set(xs)) == len(xs):
                out.extend(f"order({xs},{''.join(p)})=" for p in itertools.permutations(xs))
        return out

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.n_digits + 9

    @property
    def max_answer_len(self) -> int:
        return self.n_digits
