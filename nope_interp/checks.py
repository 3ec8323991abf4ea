"""The two type tests behind every integer and real-number argument check of the toolkit, and the test for
repeated entries behind every list argument that counts each entry once.

Every validation of an integer argument (a step count, a layer, a batch size, a seed) or a real one (a
learning rate, a tolerance) goes through :func:`is_int` / :func:`is_real`, so all entry points accept
the same values. This module imports only the standard library and numpy (never ``nope_interp``), so
any module can use it without an import cycle.
"""

import numbers
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer: any :class:`numbers.Integral` (``int``, ``np.int64``, ``np.uint8``, ...)
    that is not a boolean (``bool`` or ``np.bool_``).

    Numpy integers are accepted because they are what a user holds in a notebook: an entry of
    ``np.arange``, a size from a numpy array's ``shape`` or a pandas column. Booleans are refused although
    ``bool`` is an ``int`` subclass: ``True`` given for a count is a mistake, not 1. Callers that store the
    value or hand it on (to JSON, to ``random.Random``) convert it with ``int(value)`` after the check.
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number: any :class:`numbers.Real` (``int``, ``float``, ``np.float32``,
    ``np.int64``, ``fractions.Fraction``, ...) that is not a boolean (``bool`` or ``np.bool_``).

    Numpy scalars are accepted for the same reason as in :func:`is_int` (``np.float32`` is what a float32
    array yields). NaN and infinities count as real here; callers that need a finite value check
    ``math.isfinite`` too. Callers that store the value convert it with ``float(value)`` after the check.
    """
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def repeated(values: Any) -> list[Any]:
    """The entries that ``values`` (any iterable) holds more than once, each listed once, in the order they first
    appear; [] when every entry is distinct. Equality decides (``1`` and ``1.0`` are one entry), so unhashable
    entries work too."""
    seen: list[Any] = []
    twice: list[Any] = []
    for v in values:
        if v in seen:
            if v not in twice:
                twice.append(v)
        else:
            seen.append(v)
    return twice
