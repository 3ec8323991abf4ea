"""The two type tests behind every integer and real-number argument check of the toolkit, the test for
repeated entries behind every list argument that counts each entry once, and the reading of every list argument
whose order matters (:func:`in_order`).

Every validation of an integer argument (a step count, a layer, a batch size, a seed) or a real one (a
learning rate, a tolerance) goes through :func:`is_int` / :func:`is_real`, so all entry points accept
the same values. This module imports only the standard library, numpy and :mod:`nope_interp.errors` (which
imports nothing of ``nope_interp``), so any module can use it without an import cycle.
"""

import numbers
from collections.abc import Callable, ItemsView, Iterable, KeysView, Set
from typing import Any

import numpy as np

from nope_interp.errors import NopeInterpError


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


def in_order(name: str, values: Any, what: str = "names", fn: str = "",
             key: Callable[[Any], Any] | None = None) -> list[Any]:
    """``values``, a list argument whose order matters (sites, hook names, points, options: the results follow it),
    as a list, read once: a list, a tuple, a 1-D numpy array, a dict view (insertion-ordered) or any other ordered
    iterable, a generator or an iterator (``iter([...])``) too, which a check that read it first would have left
    empty for the work after it. The checks of the caller then run on the list. With ``key`` (for arguments whose
    results come in a fixed order whatever order they are given in, e.g. points in forward order), a set or
    frozenset is accepted too and read as ``sorted(values, key=key)``.

    Raises:
        NopeInterpError: ``values`` is a single string (``str``, ``bytes``), which would be read letter by letter
            (``"blocks.0.hook_z"`` as 15 names): give a list of one; a set or a frozenset (without ``key``), whose
            order the results would follow at random; a 0-d numpy array; not iterable. One line, naming ``name``
            (after ``fn: `` when ``fn`` is given) and ``what`` it lists.
    """
    where = f"{fn}: " if fn else ""
    if isinstance(values, (str, bytes, bytearray)):
        raise NopeInterpError(f"{where}{name} must be a list or tuple of {what}, got the single string {values!r} "
                              f"(write [{values!r}] for a list of one)"[:300])
    if isinstance(values, Set) and not isinstance(values, (KeysView, ItemsView)):  # dict views keep order
        if key is not None:
            return sorted(values, key=key)
        raise NopeInterpError(f"{where}{name} must be a list or tuple of {what}, whose order is the results' order; "
                              f"got an unordered {type(values).__name__}: give a list in the order you want")
    if isinstance(values, np.ndarray) and values.ndim == 0:
        raise NopeInterpError(f"{where}{name} must be a list or tuple of {what}, got a 0-d array {values!r}"[:300])
    if not isinstance(values, Iterable):
        raise NopeInterpError(f"{where}{name} must be a list or tuple of {what}, got {type(values).__name__} "
                              f"{values!r}"[:300])
    return list(values)
