"""Seed statistics against a hand computation and scipy's own interval."""

import math

import pytest


def test_mean_std_ci_against_hand_computation():
    from nope_interp.stats import mean_std_ci

    s = mean_std_ci([1.0, 2.0, 6.0])
    assert s.mean == pytest.approx(3.0) and s.n_seeds == 3
    assert s.std == pytest.approx(math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2))
    half = 4.302652729911275 * s.std / math.sqrt(3)  # t_{0.975, 2}
    assert (s.ci95_low, s.ci95_high) == pytest.approx((3 - half, 3 + half))


def test_mean_std_ci_equals_scipy_interval():
    from scipy import stats

    from nope_interp.stats import mean_std_ci

    vals = [0.2, 0.25, 0.31, 0.18, 0.4]
    s = mean_std_ci(vals)
    lo, hi = stats.t.interval(0.95, len(vals) - 1, loc=stats.tmean(vals), scale=stats.sem(vals))
    assert (s.ci95_low, s.ci95_high) == pytest.approx((lo, hi))


def test_one_value_and_no_value():
    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import mean_std_ci

    s = mean_std_ci([0.7])
    assert s.mean == 0.7 and s.std == 0.0 and math.isnan(s.ci95_low) and s.to_dict()["n_seeds"] == 1
    with pytest.raises(NopeInterpError, match="at least one value"):
        mean_std_ci([])


def test_mean_std_ci_refuses_strings():
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import mean_std_ci

    for bad in ("123", ["1", 2.0], [1.0, b"2"], ["\u0663"]):
        with pytest.raises(NopeInterpError, match="needs a sequence of numbers"):
            unhooked(mean_std_ci)(bad)
    assert mean_std_ci((1.0, 3.0)).mean == 2.0


def test_the_undefined_interval_of_one_seed_is_null_in_result_json(tmp_path):
    import json

    from nope_interp.io import write_json
    from nope_interp.stats import mean_std_ci

    one = mean_std_ci([0.7])
    assert math.isnan(one.ci95_low) and math.isnan(one.ci95_high)
    text = write_json(tmp_path / "s.json", one.to_dict()).read_text()
    assert "NaN" not in text
    assert json.loads(text) == {"mean": 0.7, "std": 0.0, "ci95_low": None, "ci95_high": None, "n_seeds": 1}


def test_mean_std_ci_refuses_what_is_not_a_sequence_of_real_numbers():
    """A number, None or a None value gave a raw TypeError; an infinite value an inf mean with a NaN std."""
    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import mean_std_ci

    for bad in (5, None, 2.5, [None], [1.0, None], [True, 1.0], [1 + 2j], [torch.ones(2)], [object()]):
        with pytest.raises(NopeInterpError, match="mean_std_ci needs a sequence of numbers"):
            unhooked(mean_std_ci)(bad)
    for bad in ([float("inf"), 1.0], [1.0, -float("inf")]):
        with pytest.raises(NopeInterpError, match=r"mean_std_ci needs finite values \(or NaN for an undefined one\)"):
            mean_std_ci(bad)
    undefined = mean_std_ci([float("nan"), 1.0])   # an undefined measurement: every statistic undefined, documented
    assert math.isnan(undefined.mean) and math.isnan(undefined.ci95_low) and undefined.n_seeds == 2
    assert unhooked(mean_std_ci)([torch.tensor(1.0), 3]).mean == 2.0


@pytest.mark.parametrize("n", [20_000, 5_000, 500, 64, 40])
def test_fmt_fraction_rounds_k_of_n_half_up_like_integer_arithmetic(n):
    """Independent reference: round k / n half up to 4 decimals with integers only."""
    from nope_interp.stats import fmt_fraction

    for k in range(n + 1):
        q, r = divmod(k * 10_000, n)
        q += 2 * r >= n
        assert fmt_fraction(k / n) == f"{q // 10_000}.{q % 10_000:04d}", (k, n)


def test_fmt_fraction_examples_and_bad_input():
    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import fmt_fraction

    assert [fmt_fraction(x) for x in (0.99135, 0.20325, 0.01925, 0.99045, 1.0, 0, 1)] == [
        "0.9914", "0.2033", "0.0193", "0.9905", "1.0000", "0.0000", "1.0000"]
    assert f"{0.99135:.4f}" == "0.9913"  # what the plain format gives: the reason for this function
    assert fmt_fraction(0.125, 2) == "0.13" and fmt_fraction(0.5, 0) == "1"
    for bad in (float("nan"), float("inf"), None, "0.5", True):
        with pytest.raises(NopeInterpError, match="finite number"):
            fmt_fraction(bad)
    for digits in (-1, 11, 2.0, True):
        with pytest.raises(NopeInterpError, match="digits must be an integer"):
            fmt_fraction(0.5, digits)


def test_mean_std_ci_refuses_sets_dicts_and_bool_or_complex_scalars_of_any_library():
    """Before: a set collapsed two seeds with one value (n_seeds 2 for 3 seeds), a dict gave its keys, numpy and
    torch booleans counted as 1.0 and numpy complex values lost their imaginary part."""
    import numpy as np
    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import mean_std_ci

    for bad, words in (({0.5, 0.7}, "got a set"), ({0.5: 1}, "got a dict"), ([np.bool_(True), 0.2], "numbers"),
                       ([torch.tensor(True)], "numbers"), ([np.complex128(1)], "numbers")):
        with pytest.raises(NopeInterpError, match=words):
            unhooked(mean_std_ci)(bad)
    got = unhooked(mean_std_ci)([np.float32(0.5), torch.tensor(0.75), 0.25, np.int64(1)])
    assert got.n_seeds == 4 and got.mean == pytest.approx(0.625, abs=1e-7)


@pytest.mark.parametrize("values", [[1e200, 0.0], [1e-300, 3e-300], [1e-200, -1e-200, 5e-201], [3e150, 1e150, 2e150],
                                    [0.3, 0.5, 0.9], [1e307, -1e307], [1.79e308, -1.79e308] * 99 + [1.79e308]])
def test_mean_std_ci_is_exact_at_any_scale(values):
    """Spreads near the float range's ends: no overflow of the squares (1e200), no underflow to 0 (1e-300);
    statistics.stdev (exact rational arithmetic) is the reference."""
    import statistics

    from nope_interp.stats import mean_std_ci

    s = mean_std_ci(values)
    assert s.mean == pytest.approx(statistics.fmean(values), rel=1e-15)
    assert s.std == pytest.approx(statistics.stdev(values), rel=1e-14) and s.std > 0
    assert math.isfinite(s.ci95_low) and math.isfinite(s.ci95_high)


@pytest.mark.parametrize("values", [[1e308, -1e308], [1.7e308, 0.0], [1.7e308, -1.7e308], [1.7e308, -1.7e308, 1.7e308]])
def test_mean_std_ci_refuses_an_interval_past_the_float_range_in_one_line(values):
    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import mean_std_ci

    with pytest.raises(NopeInterpError, match="too large for floating point"):
        mean_std_ci(values)


def test_mean_std_ci_of_ordinary_scores_is_the_plain_formula_bit_for_bit():
    """Scaling only applies near the float range's ends: ordinary scores give the same bits as before."""
    from nope_interp.stats import mean_std_ci

    for values in ([0.3, 0.5, 0.9], [0.1] * 7, [0.97, 0.955, 0.991, 0.988], [1.5e308] * 3):
        mean = math.fsum(values) / len(values) if values[0] < 1 else values[0]
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if values[0] < 1 else 0.0
        s = mean_std_ci(values)
        assert (s.mean, s.std) == (mean, std)


def test_fmt_mean_std_shows_the_mean_alone_when_the_spread_is_undefined():
    """One value (or a NaN/None std) has no spread: the mean alone, not ``± 0.000``; n >= 2 gives mean ± std."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import fmt_mean_std, mean_std_ci

    assert fmt_mean_std(0.5, 0.0, 1) == "0.500"  # one seed
    assert fmt_mean_std(0.6, 0.1414213562, 2) == "0.600 ± 0.141"  # two seeds
    assert fmt_mean_std(0.6, 0.1414213562, 2, 2) == "0.60 ± 0.14"  # decimals as an argument
    assert fmt_mean_std(0.6, 0.1414213562, 2, digits=3, sep="±") == "0.600±0.141"  # init-grid's cells
    assert fmt_mean_std(0.6, 0.1414213562, 2, 0) == "1 ± 0"
    assert fmt_mean_std(0.6, float("nan"), 3) == "0.600"  # NaN std: undefined
    assert fmt_mean_std(0.6, None, 3) == "0.600"  # None: NaN as result JSON writes it
    assert fmt_mean_std(float("nan"), float("nan"), 2) == "nan"
    assert fmt_mean_std(0.6, 0.1, None) == "0.600 ± 0.100"  # count not known: the spread is shown
    assert fmt_mean_std(1, 0, 2) == "1.000 ± 0.000"  # two equal values: a spread of 0, which is defined
    assert fmt_mean_std(float("nan"), float("nan"), 0) == "nan"  # no value (every prompt degenerate)
    one, two = mean_std_ci([0.5]), mean_std_ci([0.5, 0.7])
    assert fmt_mean_std(one.mean, one.std, one.n_seeds) == "0.500"
    assert fmt_mean_std(two.mean, two.std, two.n_seeds) == "0.600 ± 0.141"
    for args, match in [((None, 0.1, 2), "mean"), (("0.5", 0.1, 2), "mean"), ((True, 0.1, 2), "mean"),
                        ((0.5, -0.1, 2), "std"), ((0.5, "0.1", 2), "std"), ((0.5, 0.1, 0), "n=0"),
                        ((0.5, 0.1, -1), "n"),
                        ((0.5, 0.1, 2.0), "n"), ((0.5, 0.1, True), "n"), ((0.5, 0.1, 2, 11), "digits"),
                        ((0.5, 0.1, 2, 2.0), "digits")]:
        with pytest.raises(NopeInterpError, match=match):
            fmt_mean_std(*args)


def test_error_bar_is_none_for_one_value_and_the_std_or_ci_half_otherwise():
    import math

    import pytest
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import error_bar, mean_std_ci

    assert error_bar(mean_std_ci([0.5])) is None and error_bar(mean_std_ci([0.5]), "ci") is None
    two = mean_std_ci([0.4, 0.6])
    assert error_bar(two) == pytest.approx(math.sqrt(0.02))   # sample std of 0.4, 0.6
    assert error_bar(two, "ci") == pytest.approx(12.706204736 * math.sqrt(0.02) / math.sqrt(2), rel=1e-6)
    for bad in ((0.5, 0.1), None):
        with pytest.raises(NopeInterpError, match="stats must be a SeedStats"):
            unhooked(error_bar)(bad)
    with pytest.raises(NopeInterpError, match="half must be 'std' or 'ci'"):
        error_bar(two, "sem")


@pytest.mark.parametrize("x,digits,want", [(1e300, 2, "1" + "0" * 300 + ".00"), (-1e300, 0, "-1" + "0" * 300),
                                           (1.7976931348623157e308, 4, "17976931348623157" + "0" * 292 + ".0000"),
                                           (123456789012345678901234567890.0, 1, "123456789012345680000000000000.0")])
def test_fmt_fraction_of_a_large_number_is_its_decimal_not_a_decimal_error(x, digits, want):
    """Before: fmt_fraction(1e300) raised decimal.InvalidOperation (the context's 28 digits). The shortest decimal
    of the float (its repr) is rounded, as for fractions."""
    from nope_interp.stats import fmt_fraction

    assert fmt_fraction(x, digits) == want


@pytest.mark.parametrize("mean,std", [(math.inf, 0.1), (-math.inf, 0.1), (0.5, math.inf), (math.inf, None)])
def test_fmt_mean_std_refuses_infinities(mean, std):
    """Before: fmt_mean_std(inf, 0.1, 3) returned "inf ± 0.100"."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.stats import fmt_mean_std

    with pytest.raises(NopeInterpError, match=r"^fmt_mean_std needs a finite "):
        fmt_mean_std(mean, std, 3)


@pytest.mark.parametrize("values", [[0.1] * 3, [0.7] * 5, [1e-320] * 4, [1e300] * 2, [0.3, 0.3], [1 / 3] * 7])
def test_constant_values_have_exactly_their_mean_and_zero_spread(values):
    """Before: mean_std_ci([0.1] * 3) gave std 1.7e-17 and a CI that was not the point."""
    from nope_interp.stats import mean_std_ci

    st = mean_std_ci(values)
    assert st.mean == values[0] and st.std == 0.0 and st.ci95_low == st.ci95_high == values[0]
