"""Addition: ``$123+456=`` -> ``975$`` (the sum least-significant digit first, then ``$``).

Source: the task table of ``docs/method.md``. Operands are uniform in ``[0, 10**n_digits)`` written without zero
padding. The authors' raw files hold plain ``a+b=c``; their model saw ``$a+b=`` and the reversed sum,
which is the format generated here. :meth:`AdditionTask.check_line` accepts both.
"""

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Example, Task, TaskError, _check_int, _text


@dataclass(frozen=True)
class AdditionTask(Task):
    """Addition of two non-negative integers of 1 to ``n_digits`` digits (paper: 3)."""

    n_digits: int = 3
    name: ClassVar[str] = "addition"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_digits", _check_int("n_digits", self.n_digits, 1, 18))

    @property
    def _operand(self) -> str:
        return rf"(?:0|[1-9][0-9]{{0,{self.n_digits - 1}}})"

    @property
    def line_pattern(self) -> str:  # type: ignore[override]
        return rf"\${self._operand}\+{self._operand}=[0-9]+\$"

    def sample(self, rng: random.Random) -> str:
        hi = 10**self.n_digits
        return f"${rng.randrange(hi)}+{rng.randrange(hi)}="

    def sample_full_length(self, rng: random.Random) -> str:
        lo, hi = (0 if self.n_digits == 1 else 10 ** (self.n_digits - 1)), 10**self.n_digits
        return f"${rng.randrange(lo, hi)}+{rng.randrange(lo, hi)}="

    def solve(self, prompt: str) -> str:
        prompt = _text("prompt", prompt)
        m = re.fullmatch(rf"\$({self._operand})\+({self._operand})=", prompt)
        if not m:
            raise TaskError(f"not an addition prompt with n_digits={self.n_digits}: {prompt!r}")
        return str(int(m.group(1)) + int(m.group(2)))[::-1] + "$"

    def n_distinct_prompts(self) -> int:
        return 10 ** (2 * self.n_digits)

    def all_prompts(self) -> list[str]:
        hi = 10**self.n_digits
        return [f"${a}+{b}=" for a in range(hi) for b in range(hi)]

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.n_digits + 3

    @property
    def max_answer_len(self) -> int:
        return self.n_digits + 2

    def check_line(self, line: str) -> bool:
        """True for a correct line in either format: ``$a+b=<reversed sum>$`` or the authors' ``a+b=c``."""
        line = _text("line", line).rstrip("\n")
        if line.startswith("$"):
            return super().check_line(line)
        m = re.fullmatch(rf"({self._operand})\+({self._operand})=(0|[1-9][0-9]*)", line)
        return bool(m) and int(m.group(1)) + int(m.group(2)) == int(m.group(3))

    def parse_line(self, line: str) -> Example:
        """Parse either format into this project's ``$a+b=`` / reversed-sum :class:`Example`."""
        if not self.check_line(line):
            raise TaskError(f"not a correct addition line: {line!r}")
        line = line.rstrip("\n")
        if not line.startswith("$"):
            line = "$" + line.split("=")[0] + "="
            return self.example(line)
        prompt, _, answer = line.partition("=")
        return Example(prompt + "=", answer)
