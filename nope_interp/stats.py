"""Statistics over seeds (or any small set of repeated measurements): mean, std and a 95% CI.

One implementation for every job that aggregates over seeds. The interval is Student's t for the
mean of n independent measurements (``scipy.stats.t``): mean +- t_{0.975, n-1} * std / sqrt(n), with
the sample standard deviation (n - 1 in the denominator). With 3 seeds it is wide, on purpose.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from nope_interp.checks import is_int, is_real
from nope_interp.errors import NopeInterpError


@dataclass(frozen=True)
class SeedStats:
    """Mean, sample std and 95% CI of the mean over ``n_seeds`` values.

    Attributes:
        mean, std: in the unit of the values (std is 0.0 for one value).
        ci95_low, ci95_high: Student-t interval of the mean; NaN for one value (written as ``null`` in
            result JSON, see :func:`nope_interp.io.write_json`).
        n_seeds: number of values (>= 1).
    """

    mean: float
    std: float
    ci95_low: float
    ci95_high: float
    n_seeds: int

    def to_dict(self) -> dict[str, Any]:
        """``{"mean", "std", "ci95_low", "ci95_high", "n_seeds"}``."""
        return asdict(self)


def error_bar(stats: SeedStats, half: str = "std") -> float | None:
    """The error bar to draw for ``stats`` (a :class:`SeedStats`): its ``std`` (``half="std"``) or the upper half
    of its 95% CI (``half="ci"``), in the values' unit; None (plotly draws no bar) for one value, whose spread is
    undefined: a bar of 0 would read as a measured certainty.

    Raises:
        NopeInterpError: ``stats`` not a :class:`SeedStats`; ``half`` not ``"std"`` or ``"ci"``.
    """
    if not isinstance(stats, SeedStats):
        raise NopeInterpError(f"error_bar: stats must be a SeedStats, got {type(stats).__name__}")
    if half not in ("std", "ci"):
        raise NopeInterpError(f"error_bar: half must be 'std' or 'ci', got {half!r}")
    if stats.n_seeds < 2:
        return None
    value = stats.std if half == "std" else stats.ci95_high - stats.mean
    return None if math.isnan(value) else value


def mean_std_ci(values: Sequence[float]) -> SeedStats:
    """Mean, sample std and the 95% Student-t confidence interval of the mean of ``values``.

    A NaN value (an undefined measurement, e.g. of a degenerate model) makes every statistic NaN (written as
    ``null`` in result JSON): it is reported as undefined, not dropped.

    Raises:
        NopeInterpError: no values; not a sequence (a number, None), or a set or dict (a set collapses two
            seeds with one value, a dict would give its keys); a string (for the sequence or one of its
            values: ``float`` would read ``"12"`` as 12, and a string as a sequence of its characters); a value
            that is not a real number (None, a bool, a complex number, a tensor of more than one element); an
            infinite value; finite values whose mean, std or interval passes the float range (about 1e308).
    """
    from scipy import stats

    try:
        raw = None if isinstance(values, (str, bytes)) else list(values)
    except TypeError:
        raw = None
    if isinstance(values, (set, frozenset, dict)):   # a set collapses equal seeds' values, a dict gives its keys
        raise NopeInterpError(f"mean_std_ci needs an ordered sequence of numbers (a list or tuple, one per seed), got "
                              f"a {type(values).__name__}")
    if raw is None or any(isinstance(v, (str, bytes, bool, complex)) or "bool" in str(getattr(v, "dtype", ""))
                          or "complex" in str(getattr(v, "dtype", "")) for v in raw):
        raise NopeInterpError(f"mean_std_ci needs a sequence of numbers, got {values!r}"[:300])
    try:
        vals = [float(v) for v in raw]
    except (TypeError, ValueError, RuntimeError):
        raise NopeInterpError(f"mean_std_ci needs a sequence of numbers, got {values!r}"[:300]) from None
    if any(math.isinf(v) for v in vals):
        first = next(i for i, v in enumerate(vals) if math.isinf(v))
        raise NopeInterpError(f"mean_std_ci needs finite values (or NaN for an undefined one), got {vals[first]} at "
                              f"index {first}")
    n = len(vals)
    if n == 0:
        raise NopeInterpError("mean_std_ci needs at least one value")
    too_large = NopeInterpError(f"mean_std_ci: values too large for floating point (their mean, spread or "
                                f"interval passes about 1e308), got {vals!r}"[:300])
    # values near the float range's ends are scaled by the largest first (their squares, sums and differences
    # would overflow or underflow); in between nothing is scaled, so ordinary scores are computed as always
    big = max((abs(v) for v in vals if not math.isnan(v)), default=0.0)
    scale = big if big > 1e150 or 0.0 < big < 1e-150 else 1.0
    xs = [v / scale for v in vals]
    mean_s = math.fsum(xs) / n
    if all(v == vals[0] for v in vals):  # constant values: mean exactly the value, spread exactly 0 (no rounding)
        mean_s, scale = vals[0], 1.0
        xs = [mean_s] * n
    if n > 1:
        std_s = math.sqrt(math.fsum((x - mean_s) ** 2 for x in xs) / (n - 1))
    else:  # one value: std 0.0 by convention (no spread to estimate), NaN when that value is undefined
        std_s = math.nan if math.isnan(mean_s) else 0.0
    mean, std = mean_s * scale, std_s * scale
    half = float(stats.t.ppf(0.975, n - 1)) * (std / n**0.5) if n > 1 else float("nan")
    if any(math.isinf(x) for x in (mean, std, half, mean - half, mean + half)):
        raise too_large
    return SeedStats(mean=mean, std=std, ci95_low=mean - half, ci95_high=mean + half, n_seeds=n)


def fmt_mean_std(mean: Any, std: Any, n: Any, digits: Any = 3, sep: str = " ± ") -> str:
    """``mean ± std`` of ``n`` values (seeds, random draws) as text, or the mean alone when the spread is undefined.

    The sample std of one value is undefined (:func:`mean_std_ci` gives 0.0 for it), so with ``n == 1`` the
    mean is shown alone: ``fmt_mean_std(0.5, 0.0, 1)`` is ``"0.500"``, not ``"0.500 ± 0.000"``. So is it when
    ``std`` is NaN or None (undefined; result JSON writes NaN as ``null``). One rule for every report of a spread
    over seeds or draws (a spread over prompts of one model is its own matter).

    Args:
        mean: the mean of the values, a real number (NaN, undefined, is written ``nan``).
        std: their sample standard deviation, a real number >= 0, or NaN or None (undefined).
        n: the number of values aggregated, an int >= 0, or None when not known (the spread is then shown);
            0 (every value undefined, e.g. every prompt degenerate) needs a NaN mean and is written ``nan``.
        digits: decimals of the mean and the std, an int in [0, 10] (default 3).
        sep: the text between mean and std (default ``" ± "``; init-grid's heatmap cells use ``"±"``).

    Returns:
        ``f"{mean:.{digits}f}{sep}{std:.{digits}f}"``, or ``f"{mean:.{digits}f}"`` when ``n == 1`` or ``std`` is
        NaN or None. For example ``fmt_mean_std(0.6, 0.1414, 2, 2)`` is ``"0.60 ± 0.14"``.

    Raises:
        NopeInterpError: ``mean`` not a real number (None, a bool, a string) or infinite; ``std`` neither a real
            number nor None, negative or infinite; ``n`` not an int >= 0 or None; ``n`` 0 with a mean that is not
            NaN; ``digits`` not an int in [0, 10]; ``sep`` not a str.
    """

    if not is_real(mean) or math.isinf(mean):
        raise NopeInterpError(f"fmt_mean_std needs a finite real number for the mean (NaN: undefined), got "
                              f"{mean!r}"[:300])
    if std is not None and (not is_real(std) or std < 0 or math.isinf(std)):
        raise NopeInterpError(f"fmt_mean_std needs a finite std >= 0 (NaN or None: undefined), got {std!r}"[:300])
    if n is not None and (not is_int(n) or n < 0):
        raise NopeInterpError(f"fmt_mean_std needs n, the number of values, as an int >= 0 (or None), got {n!r}"[:300])
    if n == 0 and not math.isnan(mean):
        raise NopeInterpError(f"fmt_mean_std: a mean of n=0 values is undefined (NaN), got {mean!r}"[:300])
    if not is_int(digits) or not 0 <= digits <= 10:
        raise NopeInterpError(f"digits must be an integer in [0, 10], got {digits!r}")
    digits = int(digits)
    if not isinstance(sep, str):
        raise NopeInterpError(f"fmt_mean_std: sep must be a str, got {type(sep).__name__}")
    head = f"{float(mean):.{digits}f}"
    if n in (0, 1) or std is None or math.isnan(std):
        return head
    return f"{head}{sep}{float(std):.{digits}f}"


def fmt_fraction(x: Any, digits: Any = 4) -> str:
    """``x`` (a fraction such as an exact match of k correct out of n prompts, in [0, 1]) rounded half up to
    ``digits`` decimals, as a string: 0.99135 (19,827 of 20,000) reads 0.9914, as a reader rounds it, where
    ``f"{x:.4f}"`` rounds the nearest binary float (0.991349999...) to 0.9913.

    Rounds the shortest decimal that gives back ``x`` (``repr``), so it agrees with the decimal the value
    stands for whenever that decimal has at most 17 significant digits (every k / n with n a power of 2
    times a power of 5, such as 20,000, 5,000, 500). Source: round half up, the convention for reported
    accuracies; ``decimal.ROUND_HALF_UP`` on the decimal string.

    Raises:
        NopeInterpError: ``x`` not a finite real number; ``digits`` not an integer in [0, 10].
    """
    from decimal import ROUND_HALF_UP, Decimal, localcontext

    if not is_int(digits) or not 0 <= digits <= 10:
        raise NopeInterpError(f"digits must be an integer in [0, 10], got {digits!r}")
    digits = int(digits)  # Decimal.scaleb refuses a numpy integer
    if not is_real(x) or not math.isfinite(x):
        raise NopeInterpError(f"fmt_fraction needs a finite number, got {x!r}")
    value = Decimal(repr(float(x)))
    with localcontext() as ctx:  # enough digits for any finite float (1e308 has 309 before the point)
        ctx.prec = 330 + digits
        return str(value.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
