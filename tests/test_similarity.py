import math

import numpy as np
import pytest
import torch
from conftest import unhooked
from scipy.stats import kendalltau


@pytest.fixture
def S():
    import nope_interp.similarity as similarity

    return similarity


def naive_row_scores(mat: np.ndarray) -> tuple[list[int], list[int]]:
    """Successes and pairs per row by the definition, with plain loops."""
    n = mat.shape[0]
    succ, pairs = [], []
    for k in range(n):
        s = p = 0
        for i in range(k):
            for j in range(i + 1, k):
                p += 1
                s += mat[k, i] < mat[k, j]
        succ.append(s)
        pairs.append(p)
    return succ, pairs


def test_counts_and_both_reductions_equal_a_naive_triple_loop_with_ties(S, gen):
    for trial in range(6):
        n = 5 + 3 * trial
        # integer-valued matrices make ties frequent
        mats = torch.randint(-3, 4, (4, n, n), generator=gen).double()
        counts = S.adjacency_counts(mats)
        rm, pooled = S.adjacency_score(mats, "row_mean"), S.adjacency_score(mats, "pooled")
        for b in range(4):
            succ, pairs = naive_row_scores(mats[b].numpy())
            assert counts[b].tolist() == succ
            assert S.row_pair_counts(n).tolist() == pairs
            assert rm[b].item() == pytest.approx(np.mean([s / p for s, p in zip(succ[2:], pairs[2:], strict=True)]))
            assert pooled[b].item() == pytest.approx(sum(succ) / sum(pairs))


@pytest.mark.parametrize("ties", [False, True])
def test_sorted_count_equals_the_naive_reference(S, gen, ties):
    """The O(pos log pos) count gives identical integers to the all-pairs reference, ties included."""
    for n in (3, 4, 7, 48, 64, 65, 130, 300):
        if ties:
            mats = torch.randint(-4, 5, (2, n, n), generator=gen).double()
        else:
            mats = torch.randn(2, n, n, generator=gen, dtype=torch.float64)
        assert torch.equal(S.adjacency_counts_sorted(mats), S.adjacency_counts_naive(mats)), n
    succ, _ = naive_row_scores(mats[0].numpy())
    assert S.adjacency_counts_sorted(mats)[0].tolist() == succ
    for red in S.REDUCTIONS:  # the public score uses the sorted count from SORT_THRESHOLD on
        ref = S.adjacency_counts_naive(mats).double()
        pairs = S.row_pair_counts(300).double()
        expected = {"pooled": ref.sum(-1) / pairs.sum(), "row_mean": (ref[:, 2:] / pairs[2:]).mean(-1),
                    "pooled_rounded": torch.tensor([round(float(v), 2) for v in ref.sum(-1) / pairs.sum()],
                                                   dtype=torch.float64)}[red]
        torch.testing.assert_close(S.adjacency_score(mats, red), expected)


def test_row_score_is_one_plus_kendall_tau_over_two_without_ties(S, gen):
    x = torch.randn(3, 30, 16, generator=gen)
    sim = S.cosine_similarity_matrix(x)
    counts = S.adjacency_counts(sim)
    pairs = S.row_pair_counts(30)
    for b in range(3):
        for k in range(2, 30):
            tau = kendalltau(np.arange(k), sim[b, k, :k].numpy()).statistic
            assert counts[b, k].item() / pairs[k].item() == pytest.approx((1 + tau) / 2, abs=1e-12)


def test_perfect_reverse_and_random_order(S, gen):
    n = 40
    d = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    for red in S.REDUCTIONS:
        assert S.adjacency_score(-d, red).item() == 1.0
        assert S.adjacency_score(d, red).item() == 0.0
        rand = S.adjacency_score(torch.rand(200, n, n, generator=gen).double(), red)
        assert abs(rand.mean().item() - 0.5) < 0.01
    const = torch.zeros(n, n, dtype=torch.float64)
    from nope_interp.errors import DegenerateInputWarning

    with pytest.warns(DegenerateInputWarning, match="1 of 1 sequences"):
        # no order to score: NaN (before: 0.0, every tie a failure, or rounding noise for near-constant matrices)
        assert math.isnan(S.adjacency_score(const).item())
    assert S.adjacency_counts(const).sum().item() == 0  # the counts themselves still count ties as failures


def test_cosine_matrix_matches_numpy_and_is_clamped_float64(S, gen):
    x = torch.randn(2, 11, 8, generator=gen)
    c = S.cosine_similarity_matrix(x)
    assert c.dtype == torch.float64 and c.shape == (2, 11, 11)
    xn = x.double().numpy()
    ref = np.einsum("bid,bjd->bij", xn, xn) / (
        np.linalg.norm(xn, axis=-1)[:, :, None] * np.linalg.norm(xn, axis=-1)[:, None, :])
    np.testing.assert_allclose(c.numpy(), ref, atol=1e-12)
    same = torch.ones(1, 4, 8) * 1e3
    c2 = S.cosine_similarity_matrix(same)
    assert c2.max().item() <= 1.0 and c2.min().item() >= -1.0
    torch.testing.assert_close(c2, torch.ones(1, 4, 4, dtype=torch.float64))
    assert torch.equal(x, x.clone())  # the input is not modified


def test_near_zero_vectors_are_reported_not_hidden(S, gen):
    from nope_interp.errors import NopeInterpError

    x = torch.randn(6, 4, generator=gen)
    x[2] = 0
    c = S.cosine_similarity_matrix(x)
    assert torch.isnan(c[2]).all() and torch.isnan(c[:, 2]).all()
    assert not torch.isnan(c[[0, 1, 3, 4, 5]][:, [0, 1, 3, 4, 5]]).any()
    assert S.near_zero_positions(x).tolist() == [False, False, True, False, False, False]
    with pytest.raises(NopeInterpError, match="NaN"):
        S.adjacency_score(c)


def test_bad_inputs(S):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="reduction"):
        S.adjacency_score(torch.zeros(5, 5, dtype=torch.float64), "median")
    with pytest.raises(NopeInterpError, match="at least 3 positions"):
        S.adjacency_score(torch.zeros(2, 2, dtype=torch.float64))
    from jaxtyping import TypeCheckError

    # jaxtyping's runtime check (on under pytest) or our own check (for users) must refuse it
    with pytest.raises((NopeInterpError, TypeCheckError)):
        S.adjacency_counts(torch.zeros(3, 4, dtype=torch.float64))


def test_averaging_closed_form_sqrt_i_over_k(S, gen):
    """Uniform causal averaging of i.i.d. zero-mean vectors: cos(y_i, y_k) -> sqrt(i/k) (docs/method.md)."""
    n, d = 12, 4096
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = x.cumsum(0) / torch.arange(1, n + 1, dtype=torch.float64)[:, None]
    c = S.cosine_similarity_matrix(y)
    for i in range(1, n + 1):
        for k in range(i, n + 1):
            assert c[i - 1, k - 1].item() == pytest.approx(math.sqrt(i / k), abs=0.03)
    assert S.adjacency_score(c).item() == 1.0


def test_summarize(S):
    s = S.summarize(torch.tensor([0.2, 0.4, 0.9], dtype=torch.float64))
    assert s.mean == pytest.approx(0.5) and s.std == pytest.approx(np.std([0.2, 0.4, 0.9], ddof=1)) and s.n == 3


def test_chunked_score_of_activations_equals_the_direct_score(S, gen):
    x = torch.randn(3, 4, 60, 16, generator=gen)
    direct = S.adjacency_score(S.cosine_similarity_matrix(x), "pooled")
    chunked = S.adjacency_score_of_activations(x, "pooled", max_elements=60 * 60)  # one sequence per chunk
    assert chunked.shape == (3, 4) and torch.equal(direct, chunked)


def exact_cosines(x: torch.Tensor) -> np.ndarray:
    """Cosine matrix of float64 vectors in exact rational arithmetic (and a 40-digit square root)."""
    from decimal import Decimal, getcontext
    from fractions import Fraction

    getcontext().prec = 40
    v = [[Fraction(float(a)) for a in row] for row in x.double().tolist()]
    n = len(v)
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            dot = sum((a * b for a, b in zip(v[i], v[j], strict=True)), Fraction(0))
            nn = sum((a * a for a in v[i]), Fraction(0)) * sum((b * b for b in v[j]), Fraction(0))
            num = Decimal(dot.numerator) / Decimal(dot.denominator)
            den = (Decimal(nn.numerator) / Decimal(nn.denominator)).sqrt()
            out[i, j] = float(num / den)
    return out


SCALES = [10.0**k for k in (-300, -200, -160, -150, -100, -50, -8, 0, 8, 50, 100, 150, 160, 200, 300)]


@pytest.mark.parametrize("scale", SCALES)
def test_cosine_matrix_is_exact_at_every_scale_of_float64(S, gen, scale):
    """Vectors scaled by 1e-300 .. 1e300 give the exact cosines (old code: 0 or NaN from 1e160 / 1e-160 on)."""
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64) * scale
    c = S.cosine_similarity_matrix(x, min_norm=0.0)
    np.testing.assert_allclose(c.numpy(), exact_cosines(x), rtol=0, atol=4e-16)
    assert not S.near_zero_positions(x, min_norm=0.0).any()
    norms = [math.hypot(*row) for row in x.tolist()]  # an independent overflow-safe norm
    assert S.near_zero_positions(x, min_norm=min(norms) * 0.99).tolist() == [False] * 7
    assert S.near_zero_positions(x, min_norm=max(norms) * 1.01).tolist() == [True] * 7


def test_cosine_matrix_mixes_scales_within_one_sequence_and_powers_of_two_are_exact(S, gen):
    x = torch.randn(2, 9, 6, generator=gen, dtype=torch.float64)
    scales = [1e-300, 1e300, 1.0, 1e-160, 1e160, 3e-310, 1e-20, 1e20, 7.0]
    mixed = x * torch.tensor(scales, dtype=torch.float64)[:, None]
    for b in range(2):
        np.testing.assert_allclose(S.cosine_similarity_matrix(mixed[b], min_norm=0.0).numpy(), exact_cosines(mixed[b]),
                                   rtol=0, atol=4e-16)
    ref = S.cosine_similarity_matrix(x)
    for k in (-1000, -600, -300, -1, 1, 300, 600, 1000):  # scaling by 2**k is exact: identical matrices
        assert torch.equal(S.cosine_similarity_matrix(torch.ldexp(x, torch.tensor(k)), min_norm=0.0), ref), k
        assert torch.equal(S.adjacency_score_of_activations(torch.ldexp(x, torch.tensor(k)), min_norm=0.0),
                           S.adjacency_score_of_activations(x)), k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_cosine_matrix_of_every_float_dtype_up_to_its_range(S, gen, dtype):
    """Any float dtype, values up to the dtype's max and down to its subnormals: exact float64 cosines."""
    info = torch.finfo(dtype)
    base = torch.rand(6, 4, generator=gen, dtype=torch.float64) * 2 - 1
    for scale in (info.max / 2, 1.0, info.tiny, info.smallest_normal * 64):
        x = (base * scale).to(dtype)
        keep = x.double().abs().amax(-1) > 0
        c = S.cosine_similarity_matrix(x, min_norm=0.0)
        assert c.dtype == torch.float64
        ref = exact_cosines(x[keep])
        np.testing.assert_allclose(c[keep][:, keep].numpy(), ref, rtol=0, atol=4e-16)
        assert torch.isnan(c[~keep]).all()  # an all-zero vector (underflow in the dtype) has no cosine


def test_diagonal_is_exactly_one_and_the_matrix_exactly_symmetric(S, gen):
    """[1, 1] gave 0.9999999999999998 on the diagonal; matrix products are not symmetric bit for bit."""
    cases = [torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0], [3.0, 1e-5]]),
             torch.randn(4, 37, 19, generator=gen), torch.randn(2, 5, 3, 7, generator=gen),
             torch.randn(3, 64, 384, generator=gen, dtype=torch.float64) * 1e200]
    for x in cases:
        c = S.cosine_similarity_matrix(x)
        assert (c.diagonal(dim1=-2, dim2=-1) == 1.0).all()
        assert torch.equal(c, c.transpose(-1, -2))
        assert c.abs().max() <= 1.0


def test_nan_and_inf_vectors_are_named_as_such_not_as_near_zero(S, gen):
    from nope_interp.errors import NopeInterpError

    for bad_value in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(2, 6, 4, generator=gen)
        x[1, 3, 2] = bad_value
        c = S.cosine_similarity_matrix(x)
        assert torch.isnan(c[1, 3]).all() and torch.isnan(c[1, :, 3]).all()
        assert not torch.isnan(c[0]).any() and not torch.isnan(c[1, :3, :3]).any()
        assert S.nonfinite_positions(x)[1].tolist() == [False, False, False, True, False, False]
        assert not S.near_zero_positions(x).any()
        with pytest.raises(NopeInterpError, match=r"not finite: 1 of 12 vectors have NaN or inf.*index \(1, 3\)"):
            S.adjacency_score_of_activations(x)
        with pytest.raises(NopeInterpError, match="NaN/inf"):
            S.adjacency_score(c)
    x = torch.randn(6, 4, generator=gen)
    x[4] = 0
    with pytest.raises(NopeInterpError, match=r"1 near-zero vectors .*index \(4,\)"):
        S.adjacency_score_of_activations(x)


def test_near_zero_positions_uses_a_norm_that_neither_overflows_nor_underflows(S):
    x = torch.tensor([[1e-170, 0.0], [1e200, 1e200], [0.0, 0.0], [5e-324, 0.0]], dtype=torch.float64)
    # the squares of 1e-170 underflow to 0 and those of 1e200 overflow: the norm must not
    assert S.near_zero_positions(x, min_norm=1e-200).tolist() == [False, False, True, True]
    assert S.near_zero_positions(x, min_norm=0.0).tolist() == [False, False, True, False]
    assert S.near_zero_positions(x).tolist() == [True, False, True, True]
    c = S.cosine_similarity_matrix(x, min_norm=0.0)
    assert c[1, 0].item() == pytest.approx(math.sqrt(0.5), abs=2.3e-16) and c[3, 0].item() == 1.0


# --- the lag profile --------------------------------------------------------------------------------------------

def naive_lag_profile(x: np.ndarray, max_lag: int) -> np.ndarray:
    """c(d) of one sequence by the definition, with plain loops over query positions and lags."""
    n = x.shape[0]
    out = []
    for d in range(1, max_lag + 1):
        cos = []
        for i in range(d, n):
            a, b = x[i].astype(np.float64), x[i - d].astype(np.float64)
            cos.append(min(1.0, max(-1.0, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))))
        out.append(sum(cos) / len(cos))
    return np.array(out)


@pytest.mark.parametrize("shape,max_lag", [((2, 3, 7, 5), None), ((4, 12, 3), 5), ((1, 2, 4), None), ((16, 2), 15)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lag_profile_equals_a_naive_loop(S, shape, max_lag, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) + 0.3).to(dtype)
    n = shape[-2]
    got = S.lag_profile(x, max_lag)
    d_max = max_lag or n - 1
    assert got.shape == (*shape[:-2], d_max) and got.dtype == torch.float64
    flat = x.reshape(-1, n, shape[-1]).numpy()
    ref = np.stack([naive_lag_profile(s, d_max) for s in flat]).reshape(got.shape)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12)
    # tiny blocks and chunks give the same numbers (memory bound, not a different method)
    np.testing.assert_allclose(S.lag_profile(x, max_lag, max_elements=1).numpy(), ref, rtol=0, atol=1e-12)


def test_lag_profile_is_the_mean_diagonal_of_the_cosine_matrix_and_scale_free(S):
    x = torch.randn(3, 11, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    c = S.cosine_similarity_matrix(x)
    ref = torch.stack([c.diagonal(-d, dim1=-2, dim2=-1).mean(-1) for d in range(1, 11)], dim=-1)
    torch.testing.assert_close(S.lag_profile(x), ref, rtol=0, atol=1e-14)
    assert torch.equal(S.lag_profile(x * 2.0**-900, min_norm=0.0), S.lag_profile(x))  # power-of-two scale: bit for bit
    torch.testing.assert_close(S.recency_gap(S.lag_profile(x)), ref[..., 0] - ref[..., -1])


def test_lag_profile_of_uniform_causal_averaging_matches_the_closed_form(S):
    # i.i.d. Gaussian inputs through exact uniform causal attention (the running mean)
    batch, n, dm = 6, 12, 2048
    x = torch.randn(batch, n, dm, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = x.cumsum(-2) / torch.arange(1, n + 1, dtype=torch.float64)[:, None]
    got = S.lag_profile(y).mean(0)
    ideal = S.uniform_causal_lag_profile(n)
    # each cosine fluctuates by about 1/sqrt(dm) around its limit; c(d) averages batch * (n - d) of them
    tol = 4 / math.sqrt(dm * batch)
    assert (got - ideal).abs().max() < tol
    assert (got - S.sliding_window_lag_profile(n, 3)).abs().max() > 10 * tol  # the test can tell them apart
    torch.testing.assert_close(S.recency_gap(got), ideal[0] - ideal[-1], rtol=0, atol=2 * tol)


def test_lag_profile_of_sliding_window_averaging_matches_the_closed_form(S):
    batch, n, dm, w = 6, 14, 2048, 4
    x = torch.randn(batch, n, dm, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    c = torch.cat([torch.zeros(batch, 1, dm, dtype=torch.float64), x.cumsum(-2)], dim=-2)
    idx = torch.arange(n)
    y = (c[:, idx + 1] - c[:, (idx + 1 - w).clamp(min=0)])  # sum of the last w inputs (a mean: same cosine)
    got = S.lag_profile(y).mean(0)
    ideal = S.sliding_window_lag_profile(n, w)
    assert (got - ideal).abs().max() < 4 / math.sqrt(dm * batch)
    # away from the start each term is 1 - d / w; 0 from d = w on
    assert torch.all(ideal[w - 1 :] == 0) and ideal[0] > 1 - 1 / w - 1e-12


def test_idealised_curves(S):
    n = 9
    i = np.arange(n)
    ref = [np.mean([math.sqrt((k - d + 1) / (k + 1)) for k in i if k >= d]) for d in range(1, n)]
    np.testing.assert_allclose(S.uniform_causal_lag_profile(n).numpy(), ref, rtol=0, atol=1e-15)
    # a window as long as the sequence is uniform causal attention
    torch.testing.assert_close(S.sliding_window_lag_profile(n, n), S.uniform_causal_lag_profile(n))
    assert S.uniform_causal_lag_profile(n, 3).shape == (3,)
    # long sequences: every small lag tends to 1 under global averaging, not under a window
    assert S.uniform_causal_lag_profile(4096, 8)[-1] > 0.99
    np.testing.assert_allclose(S.sliding_window_lag_profile(4096, 16, 8).numpy(),
                               [1 - d / 16 for d in range(1, 9)], atol=1e-2)


@pytest.mark.parametrize("call,match", [
    (lambda S: S.lag_profile(torch.randn(2, 1, 4)), "at least 2 positions"),
    (lambda S: unhooked(S.lag_profile)(torch.randn(5)), "shape"),
    (lambda S: S.lag_profile(torch.randn(2, 5, 4), 0), r"max_lag must be an integer in \[1, 4\]"),
    (lambda S: S.lag_profile(torch.randn(2, 5, 4), 5), r"max_lag must be an integer in \[1, 4\]"),
    (lambda S: S.lag_profile(torch.randn(2, 5, 4), True), "max_lag"),
    (lambda S: unhooked(S.lag_profile)(torch.randn(2, 5, 4), 2.0), "max_lag"),
    (lambda S: S.lag_profile(torch.zeros(2, 5, 4)), "near-zero"),
    (lambda S: S.lag_profile(torch.tensor([[1.0, 0], [float("nan"), 1]])), "not finite"),
    (lambda S: S.lag_profile(torch.tensor([[1.0, 0], [float("inf"), 1]])), "not finite"),
    (lambda S: S.uniform_causal_lag_profile(1), "at least 2 positions"),
    (lambda S: S.uniform_causal_lag_profile(5, 5), "max_lag"),
    (lambda S: unhooked(S.uniform_causal_lag_profile)(5.0), "n_pos"),
    (lambda S: S.sliding_window_lag_profile(5, 0), "window must be an integer >= 1"),
    (lambda S: S.recency_gap(torch.zeros(3, 0)), "at least one lag"),
])
def test_lag_profile_bad_input_is_one_line(S, call, match):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match) as err:
        call(S)
    assert "\n" not in str(err.value)


@pytest.fixture
def fresh_ckernel(monkeypatch, tmp_path):
    """The compiled counter's module with its load state forgotten and a private build cache."""
    from nope_interp import ckernel

    monkeypatch.setattr(ckernel, "_STATE", {})
    monkeypatch.setenv("NOPE_INTERP_CACHE_DIR", str(tmp_path / "cache"))
    return ckernel


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_count_equals_the_naive_reference(S, gen, ties, threads):
    """The C merge-sort count gives the all-pairs integers (odd sizes, run and merge boundaries, ties)."""
    from nope_interp import ckernel

    assert ckernel.available(), ckernel.unavailable_reason()  # CI has a C compiler: the fast path is tested
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in (3, 4, 8, 9, 16, 17, 33, 100, 257):
            if ties:
                mats = torch.randint(-4, 5, (3, n, n), generator=gen).double()
            else:
                mats = torch.randn(3, n, n, generator=gen, dtype=torch.float64)
            got = ckernel.adjacency_counts_c(mats)
            assert torch.equal(got, S.adjacency_counts_naive(mats)), n
            assert torch.equal(S.adjacency_counts(mats), got), n  # the public count takes this path on the CPU
    finally:
        torch.set_num_threads(before)
    succ, _ = naive_row_scores(mats[1].numpy())
    assert got[1].tolist() == succ


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_compiled_count_of_every_float_dtype_and_batch_shape(S, gen, dtype):
    from nope_interp import ckernel

    mats = torch.randn(2, 3, 40, 40, generator=gen).to(dtype)  # low precision: many ties
    got = ckernel.adjacency_counts_c(mats)
    assert got.shape == (2, 3, 40) and got.dtype == torch.int64
    assert torch.equal(got, S.adjacency_counts_naive(mats.double()))
    assert torch.equal(got, S.adjacency_counts_naive(mats))  # widening to float64 keeps every comparison
    view = mats.double().transpose(-1, -2).transpose(-1, -2)[:, :, :30, :30]  # a non-contiguous view
    assert torch.equal(ckernel.adjacency_counts_c(view), S.adjacency_counts_naive(view))


def test_compiled_count_rejects_what_the_torch_counts_reject(S):
    for bad, match in ((torch.zeros(3, 4), "square"), (torch.zeros(2, 3, 4), "square"),
                       (torch.full((5, 5), float("nan")), "NaN"), (torch.full((2, 6, 6), float("nan")), "NaN")):
        with pytest.raises(S.NopeInterpError, match=match):
            unhooked(S.adjacency_counts)(bad)


def test_without_a_compiler_the_torch_count_is_used_with_one_warning(S, gen, fresh_ckernel, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    mats = torch.randn(2, 60, 60, generator=gen, dtype=torch.float64)
    with pytest.warns(UserWarning, match="could not build the C adjacency counter.*torch counter"):
        got = S.adjacency_counts(mats)
    assert torch.equal(got, S.adjacency_counts_naive(mats))
    assert not fresh_ckernel.available() and "/nonexistent/cc" in fresh_ckernel.unavailable_reason()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process, not at every call
        assert torch.equal(S.adjacency_counts(mats), got)


def test_a_compiler_error_is_reported_in_one_line(S, gen, fresh_ckernel, monkeypatch, tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fatal: out of coffee' >&2\necho 'second line' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(UserWarning) as record:
        assert fresh_ckernel.adjacency_counts_c(torch.zeros(4, 4, dtype=torch.float64)) is None
    (message,) = [str(w.message) for w in record]
    assert "exited with 3: fatal: out of coffee" in message and "\n" not in message


def test_switched_off_means_the_torch_count_and_no_warning(S, gen, fresh_ckernel, monkeypatch):
    monkeypatch.setenv("NOPE_INTERP_C_KERNEL", "0")
    import warnings

    mats = torch.randint(-2, 3, (2, 50, 50), generator=gen).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(S.adjacency_counts(mats), S.adjacency_counts_naive(mats))
    assert fresh_ckernel.unavailable_reason() == "switched off by NOPE_INTERP_C_KERNEL=0"


def test_the_build_is_cached_once_per_source(fresh_ckernel, tmp_path):
    assert fresh_ckernel.available()
    built = sorted((tmp_path / "cache").glob("adjacency_count-*.so"))
    assert len(built) == 1 and not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # no temp dirs left
    fresh_ckernel._STATE.clear()
    mtime = built[0].stat().st_mtime_ns
    assert fresh_ckernel.available() and built[0].stat().st_mtime_ns == mtime  # loaded, not rebuilt


def test_infinite_similarities_are_refused_like_nan_ones(S, gen):
    """An inf below the diagonal scored 0 (a full matrix of inf: every pair tied) with no warning; cosines are
    in [-1, 1], so an inf is garbage upstream, refused as NaN is. The upper triangle is not read."""
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=r"adjacency_score: sim must be finite below the diagonal .* 20 inf"):
        S.adjacency_score(torch.full((2, 5, 5), float("inf")))
    good = S.cosine_similarity_matrix(torch.randn(3, 7, 4, generator=gen))
    for value in (float("inf"), -float("inf")):
        bad = good.clone()
        bad[2, 5, 1] = value
        for fn in ("adjacency_score", "adjacency_counts", "adjacency_counts_naive", "adjacency_counts_sorted"):
            with pytest.raises(NopeInterpError, match=rf"{fn}: sim must be finite below the diagonal.* 1 inf"):
                getattr(S, fn)(bad)
        for fn in ("cosine_spread", "degenerate_sequences"):
            with pytest.raises(NopeInterpError, match=r"cosine_spread: sim must have no inf entry below the diagonal"):
                getattr(S, fn)(bad)
        upper = good.clone()
        upper[2, 1, 5] = value   # not read: accepted, same score
        torch.testing.assert_close(S.adjacency_score(upper), S.adjacency_score(good))
    bad = good.clone()
    bad[0, 4, 2] = float("nan")
    with pytest.raises(NopeInterpError, match=r"adjacency_score: sim has 1 NaN entries below the diagonal"):
        S.adjacency_score(bad)


def test_row_pair_counts_refuses_what_is_not_a_count(S):
    from nope_interp.errors import NopeInterpError

    assert S.row_pair_counts(0).tolist() == [] and S.row_pair_counts(4).tolist() == [0, 0, 1, 3]
    for bad in (-1, -7, True, 2.5, "3", None):
        with pytest.raises(NopeInterpError, match=r"row_pair_counts: n_pos must be an integer >= 0, got"):
            unhooked(S.row_pair_counts)(bad)


def test_empty_or_non_list_reductions_are_refused(S, gen):
    """reductions=() returned {} (nothing scored, nothing said)."""
    from nope_interp.errors import NopeInterpError

    x = torch.randn(2, 6, 4, generator=gen)
    for bad in ((), [], set(), None, 5):
        with pytest.raises(NopeInterpError,
                           match=r"reductions must be a non-empty list of row_mean, pooled, pooled_rounded, got"):
            unhooked(S.adjacency_scores_of_activations)(x, bad)
    assert set(S.adjacency_scores_of_activations(x, ["pooled"])) == {"pooled"}
    assert set(S.adjacency_scores_of_activations(x, ("row_mean", "pooled"))) == {"row_mean", "pooled"}


def test_a_reduction_given_twice_is_refused(S, gen):
    """Before: ``reductions=("row_mean", "row_mean")`` returned one score, the second silently dropped."""
    from nope_interp.errors import NopeInterpError

    x = torch.randn(2, 6, 4, generator=gen)
    for bad in (("row_mean", "row_mean"), ["pooled", "row_mean", "pooled"]):
        with pytest.raises(NopeInterpError, match=f"^reductions names {bad[0]!r} more than once$"):
            S.adjacency_scores_of_activations(x, bad)


def test_min_norm_and_chunk_sizes_are_checked(S, gen):
    from nope_interp.errors import NopeInterpError

    x = torch.randn(2, 6, 4, generator=gen)
    for fn in ("cosine_similarity_matrix", "near_zero_positions", "adjacency_scores_of_activations", "lag_profile"):
        for bad in (-1.0, float("nan"), float("inf"), "1e-8", True, None):
            with pytest.raises(NopeInterpError, match=rf"{fn}: min_norm must be a finite number >= 0, got"):
                unhooked(getattr(S, fn))(x, min_norm=bad)
    for fn in ("adjacency_scores_of_activations", "lag_profile"):
        for bad in (0, -5, 2.5):
            with pytest.raises(NopeInterpError, match="max_elements must be an integer"):
                unhooked(getattr(S, fn))(x, max_elements=bad)
    assert S.cosine_similarity_matrix(x, min_norm=0.0).shape == (2, 6, 6)
    for bad in ("float32", None, np.float32):
        with pytest.raises(NopeInterpError, match="degenerate_tolerance needs a float dtype"):
            unhooked(S.degenerate_tolerance)(bad)


def test_scores_and_profiles_with_nan_are_refused_not_summarised(S):
    """summarize, recency_gap and lag_summary turned a NaN into NaN statistics silently. (summarize now reads a
    NaN score as undefined, a degenerate sequence, and leaves it out: next test; inf is still refused.)"""
    from nope_interp.errors import NopeInterpError

    for fn, good in (("recency_gap", torch.tensor([[0.9, 0.5], [0.8, 0.4]])),
                     ("lag_summary", torch.tensor([[0.9, 0.5], [0.8, 0.4]]))):
        getattr(S, fn)(good)
        for value in (float("nan"), float("inf")):
            bad = good.clone()
            bad.view(-1)[1] = value
            with pytest.raises(NopeInterpError, match=rf"{fn}: \w+ must be finite, got 1 NaN or inf entries"):
                getattr(S, fn)(bad)
    for value in (float("inf"), float("-inf")):
        with pytest.raises(NopeInterpError, match="summarize: scores has inf entries"):
            S.summarize(torch.tensor([0.5, value], dtype=torch.float64))


@pytest.mark.parametrize("values", [[0.5, float("nan"), 0.7, float("nan")], [0.25, 0.5, 0.9], [float("nan"), 0.6],
                                    [float("nan")] * 3])
def test_summarize_leaves_undefined_scores_out_as_numpy_nan_statistics_do(S, values):
    """A degenerate sequence scores NaN (no order to score); the summary is over the others (numpy's nanmean
    and nanstd with ddof=1 as the reference) and counts the ones left out. Before: rounding noise was averaged
    in with the real scores."""
    got = S.summarize(torch.tensor(values, dtype=torch.float64))
    a = np.array(values)
    n = int((~np.isnan(a)).sum())
    assert got.n == n and got.n_degenerate == len(values) - n
    if n == 0:
        assert math.isnan(got.mean) and math.isnan(got.std)
    else:
        assert got.mean == pytest.approx(np.nanmean(a), abs=1e-15)
        assert got.std == (pytest.approx(np.nanstd(a, ddof=1), abs=1e-15) if n > 1 else 0.0)
    assert ("n_degenerate" in got.to_dict()) == (n < len(values))


def test_degenerate_sequences_score_nan_and_leave_the_others_untouched(S, gen):
    """One repeated vector among real sequences: its score is NaN under every reduction, the others' equal
    the scores of those sequences alone."""
    x = torch.randn(4, 9, 6, generator=gen)
    x[2] = x[2, :1].expand(9, 6)  # every position the same vector
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = S.adjacency_scores_of_activations(x)
        alone = S.adjacency_scores_of_activations(x[[0, 1, 3]])
        by_matrix = S.adjacency_score(S.cosine_similarity_matrix(x), "pooled")
    for r in S.REDUCTIONS:
        assert math.isnan(got[r][2].item())
        assert torch.equal(got[r][[0, 1, 3]], alone[r])
    assert math.isnan(by_matrix[2].item()) and torch.equal(by_matrix[[0, 1, 3]], alone["pooled"])
    assert S.summarize(got["row_mean"]).mean == pytest.approx(float(alone["row_mean"].mean()), abs=1e-15)


def test_lag_profile_of_no_sequence_is_refused_like_the_scores():
    """Before: torch.cat() of an empty list failed with a raw ValueError."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.similarity import lag_profile

    for shape in ((0, 5, 4), (2, 0, 5, 4)):
        with pytest.raises(NopeInterpError, match="a batch of 0"):
            lag_profile(torch.zeros(shape))


def test_pooled_rounded_is_pythons_round_of_pooled_to_two_decimals(S, gen):
    """The authors' reported score: Python's round(pooled, 2) of each sequence, decimal halves included."""
    from fractions import Fraction

    for n in (3, 4, 5, 9, 17, 40):
        mats = torch.randn(64, n, n, generator=gen, dtype=torch.float64)
        pooled = S.adjacency_score(mats, "pooled")
        got = S.adjacency_score(mats, "pooled_rounded")
        assert got.tolist() == [round(v, 2) for v in pooled.tolist()]
        assert (got - pooled).abs().max() <= 0.005 + 1e-12
    # a pooled score that is a decimal half (17 positions: 680 pairs; 323 / 680 = 0.475, stored just below it):
    # Python's round gives 0.47, multiplying by 100 first (torch.round(decimals=2), np.round) would give 0.48
    assert Fraction(323, int(S.row_pair_counts(17).sum())) == Fraction(475, 1000)
    assert S._reduce(torch.tensor([[0, 0, 323] + [0] * 14]), "pooled_rounded").item() == round(0.475, 2) == 0.47
    assert S._reduce(torch.tensor([[0, 0, 323] + [0] * 14]), "pooled").item() == 0.475


def test_mean_cosine_similarity_matrix_is_the_mean_of_numpy_cosines(S, gen):
    """Against numpy: the mean over sequences of x_i . x_j / (|x_i| |x_j|), in chunks of any size."""
    x = torch.randn(7, 12, 5, generator=gen) * torch.logspace(-3, 3, 7)[:, None, None]
    a = x.double().numpy()
    unit = a / np.linalg.norm(a, axis=-1, keepdims=True)
    expected = np.einsum("bid,bjd->bij", unit, unit).mean(0)
    for max_elements in (1, 144, 300, 2**25):
        got = S.mean_cosine_similarity_matrix(x, max_elements=max_elements)
        assert got.dtype == torch.float64 and got.shape == (12, 12)
        np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-12)
        assert torch.equal(got, got.T) and bool((got.diagonal() == 1).all())
    # its score is not the mean of the per-sequence scores (a different quantity)
    mean_of_scores = float(S.adjacency_score(S.cosine_similarity_matrix(x), "pooled").mean())
    assert float(S.adjacency_score(got, "pooled")) != pytest.approx(mean_of_scores, abs=1e-3)


def test_mean_cosine_similarity_matrix_refuses_bad_input(S):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    fn = unhooked(S.mean_cosine_similarity_matrix)

    cases = [(torch.zeros(2, 4, 3), {}, "near-zero vectors"),
             (torch.full((2, 4, 3), float("nan")), {}, "NaN or inf|non-finite"),
             (torch.ones(4, 3), {}, r"shape \(batch, pos, d_model\)"),
             (torch.ones(0, 4, 3), {}, "at least 1 along dimension 0"),
             (torch.ones(2, 4, 3, dtype=torch.long), {}, "real floating"),
             (torch.ones(2, 4, 3), {"max_elements": 0}, "max_elements"),
             (torch.ones(2, 4, 3), {"min_norm": -1.0}, "min_norm")]
    for x, kwargs, match in cases:
        with pytest.raises(NopeInterpError, match=match):
            fn(x, **kwargs)


def _naive_window_profile(n_pos, window, max_lag):
    """c(d) by counting shared inputs of two averaging windows, position by position (sets, no formula)."""
    out = []
    for d in range(1, max_lag + 1):
        total = 0.0
        for i in range(d, n_pos):
            a, b = set(range(max(0, i - window + 1), i + 1)), set(range(max(0, i - d - window + 1), i - d + 1))
            total += len(a & b) / math.sqrt(len(a) * len(b))
        out.append(total / (n_pos - d))
    return out


@pytest.mark.parametrize("chunk", [1, 5, 1 << 22])
@pytest.mark.parametrize(("n_pos", "max_lag"), [(2, 1), (7, 6), (40, 4), (60, 59)])
def test_idealised_lag_profiles_match_naive_sums_built_in_any_block_of_lags(monkeypatch, chunk, n_pos, max_lag):
    """Both closed forms against position-by-position sums, whatever block of lags is built at once (memory
    stays bounded on long sequences); a window of n_pos keys or more (even 10**30) is uniform causal."""
    import nope_interp.similarity as S

    monkeypatch.setattr(S, "_LAG_CHUNK", chunk)
    uniform = [sum(math.sqrt((i - d + 1) / (i + 1)) for i in range(d, n_pos)) / (n_pos - d)
               for d in range(1, max_lag + 1)]
    assert S.uniform_causal_lag_profile(n_pos, max_lag).tolist() == pytest.approx(uniform, abs=1e-12)
    for window in (1, 3, 8, n_pos - 1, n_pos, 10**30):
        want = _naive_window_profile(n_pos, min(window, n_pos), max_lag)
        assert S.sliding_window_lag_profile(n_pos, window, max_lag).tolist() == pytest.approx(want, abs=1e-12)
    assert S.sliding_window_lag_profile(n_pos, 10**30, max_lag).tolist() == pytest.approx(uniform, abs=1e-12)


def _naive_row_mean_with_exact_ties(x):
    """Row-mean adjacency score by loops, each cosine a dot product of unit vectors on its own (equal vectors
    give bit-equal cosines), ties failing: the independent reference."""
    u = x.double() / x.double().norm(dim=-1, keepdim=True)
    n = u.shape[0]
    rows = []
    for k in range(2, n):
        cos = [float(torch.dot(u[k], u[i])) for i in range(k)]
        ok = sum(cos[i] < cos[j] for i in range(k) for j in range(i + 1, k))
        rows.append(ok / (k * (k - 1) / 2))
    return sum(rows) / len(rows)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_repeated_vectors_tie_exactly_and_ties_fail(seed):
    """A repeated token's embedding is the same vector at two positions: its cosines with a third must be
    equal, so the pair is a tie and fails. Before, the matrix product gave them values that differ in the last
    bit in 177 of 200 random trials, deciding the tie at random (hook_embed scores +0.002 to +0.004)."""
    from nope_interp.similarity import adjacency_score, cosine_similarity_matrix

    gen = torch.Generator().manual_seed(seed)
    vocab = torch.randn(5, 96, generator=gen)
    tokens = torch.randint(0, 5, (3, 14), generator=gen)
    x = vocab[tokens]  # (3, 14, 96): many repeats per sequence
    c = cosine_similarity_matrix(x)
    for b in range(3):
        for i in range(14):
            for j in range(14):
                if torch.equal(x[b, i], x[b, j]):
                    assert torch.equal(c[b, i], c[b, j]) and c[b, i, j] == 1.0
    got = adjacency_score(c)
    want = [_naive_row_mean_with_exact_ties(x[b]) for b in range(3)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    # scaled copies are the same direction: tied too; a sequence without repeats is left as the product gave it
    assert torch.equal(cosine_similarity_matrix(x * 4.0), c)
    distinct = torch.randn(2, 9, 16, generator=gen, dtype=torch.float64)
    u = distinct / distinct.norm(dim=-1, keepdim=True)
    lower = torch.tril(torch.ones(9, 9, dtype=torch.bool), -1)
    assert torch.equal(cosine_similarity_matrix(distinct)[:, lower], (u @ u.transpose(-1, -2)).clamp(-1, 1)[:, lower])


def test_equal_attention_rows_get_equal_predicted_cosines():
    """Collapsed attention (several queries putting all weight on one key) gives equal pattern rows: their
    predicted cosines with any other row must be equal (and 1 with each other)."""
    from nope_interp.averaging import attention_row_cosine
    from nope_interp.similarity import tie_equal_vectors

    gen = torch.Generator().manual_seed(5)
    n = 12
    a = torch.rand(n, n, generator=gen, dtype=torch.float64).tril()
    a = a / a.sum(-1, keepdim=True)
    a[[4, 7, 9]] = 0.0
    a[[4, 7, 9], 2] = 0.3
    a[[4, 7, 9], 3] = 0.7
    cos = attention_row_cosine(a)
    for i, j in ((4, 7), (4, 9), (7, 9)):
        assert torch.equal(cos[i], cos[j]) and cos[i, j] == 1.0
    with pytest.raises(Exception, match="tie_equal_vectors"):
        from conftest import unhooked

        unhooked(tie_equal_vectors)(cos, a[:5])


# Sizes given as numbers are refused before allocating when their tensors would not fit the free memory (before: a
# raw "DefaultCPUAllocator: can't allocate memory" or, for sliding_window_lag_profile(10**9, 3, 5), the process
# killed by the operating system). The free memory is patched: nothing large is allocated here.
def _gen():
    return torch.Generator().manual_seed(0)


#: name: (module, call of the function with size n).
SIZE_CALLS = {
    "sliding_window_lag_profile": ("similarity", lambda f, n: f(n, 3, 5)),
    "uniform_causal_lag_profile": ("similarity", lambda f, n: f(n, 2)),
    "row_pair_counts": ("similarity", lambda f, n: f(n)),
    "closed_form_uniform_cosine": ("averaging", lambda f, n: f(n)),
    "uniform_causal_pattern": ("averaging", lambda f, n: f(n)),
    "identity_pattern": ("averaging", lambda f, n: f(n)),
    "random_causal_pattern": ("averaging", lambda f, n: f(torch.zeros(1, n), _gen(), iters=1)),
    "noise_activations": ("probing", lambda f, n: f(n, n, n)),
    "random_subspace": ("ablations", lambda f, n: f(n, n, _gen())),
    "derangement": ("ablations", lambda f, n: f(n, _gen())),
}
#: A size whose estimate passes 1 MiB but allocates little, and one that no machine holds.
SMALL_SIZES = {"sliding_window_lag_profile": 40_000, "uniform_causal_lag_profile": 40_000, "row_pair_counts": 50_000,
               "closed_form_uniform_cosine": 300, "uniform_causal_pattern": 300, "identity_pattern": 400,
               "random_causal_pattern": 200, "noise_activations": 70, "random_subspace": 200, "derangement": 70_000}
HUGE_SIZES = {"sliding_window_lag_profile": 10**13, "uniform_causal_lag_profile": 10**13, "row_pair_counts": 10**13,
              "closed_form_uniform_cosine": 10**7, "uniform_causal_pattern": 10**7, "identity_pattern": 10**7,
              "random_causal_pattern": 10**5, "noise_activations": 10**6, "random_subspace": 10**9,
              "derangement": 10**13}


@pytest.mark.parametrize("name", sorted(SIZE_CALLS))
@pytest.mark.parametrize("which", ["small", "huge"])
def test_sizes_whose_tensors_do_not_fit_memory_are_refused_before_allocating(name, which, monkeypatch):
    import nope_interp.model as M
    import nope_interp.similarity as S
    from nope_interp.errors import NopeInterpError

    monkeypatch.setattr(S, "MEMORY_CHECK_FROM", 0, raising=False)
    monkeypatch.setattr(M, "_cpu_available_bytes", lambda: 2**20 if which == "small" else 2**34)
    import importlib

    module, call = SIZE_CALLS[name]
    fn = getattr(importlib.import_module(f"nope_interp.{module}"), name)
    n = (SMALL_SIZES if which == "small" else HUGE_SIZES)[name]
    with pytest.raises(NopeInterpError, match=rf"^{name}\(.*\) needs about .* but only .* is free on cpu; use ") as e:
        call(fn, n)
    assert "\n" not in str(e.value)
    if which == "small":  # the same call with the memory there runs
        monkeypatch.setattr(M, "_cpu_available_bytes", lambda: 2**40)
        call(fn, n)


@pytest.mark.parametrize("value", [0, -3, 2.5, True, None, "8"])
@pytest.mark.parametrize("fn,name", [("adjacency_counts_sorted", "max_elements"),
                                     ("adjacency_counts_naive", "max_elements"), ("cosine_spread", "block_elements")])
def test_a_chunk_size_that_is_not_an_integer_of_at_least_one_is_refused(S, fn, name, value):
    """Before: adjacency_counts_sorted(max_elements=0 or 2.5) was accepted (a chunk of one sequence) and
    cosine_spread(block_elements='a') raised a raw TypeError."""
    from nope_interp.errors import NopeInterpError

    sim = S.cosine_similarity_matrix(torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(NopeInterpError, match=rf"^{fn}: {name} must be an integer in \[1, {2**62}\], got "):
        unhooked(getattr(S, fn))(sim, **{name: value})


def _naive_tie(sim, vectors):
    """tie_equal_vectors by its definition, with loops: each position takes the row and column of the first
    position of its sequence whose vector has the same bits, and similarity exactly 1 with it."""
    import itertools

    sim2, v2 = sim.reshape(-1, *sim.shape[-2:]).clone(), vectors.reshape(-1, *vectors.shape[-2:])
    out = sim2.clone()
    for b in range(v2.shape[0]):
        n = v2.shape[1]
        rep = [next(j for j in range(n) if v2[b, j].numpy().tobytes() == v2[b, k].numpy().tobytes())
               for k in range(n)]
        for k, j in itertools.product(range(n), range(n)):
            out[b, k, j] = 1.0 if rep[k] == rep[j] else sim2[b, rep[k], rep[j]]
    return out.reshape(sim.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("d", [1, 3, 5, 8])
def test_tie_equal_vectors_takes_every_float_width_and_odd_widths(S, dtype, d):
    """Before: float32 vectors of odd width raised a raw RuntimeError ("must be divisible by 2 to view Float as
    Long"), float16 ones of width not a multiple of 4 too."""
    g = torch.Generator().manual_seed(d)
    vectors = torch.randn(3, 7, d, generator=g).to(dtype)
    vectors[0, 4] = vectors[0, 1]
    vectors[2, 6] = vectors[2, 0]
    vectors[2, 3] = vectors[2, 0]
    sim = torch.rand(3, 7, 7, generator=g, dtype=torch.float64)
    got = S.tie_equal_vectors(sim, vectors)
    assert torch.equal(got, _naive_tie(sim, vectors.float() if dtype == torch.bfloat16 else vectors))
    assert got[0, 4, 1] == 1.0 and torch.equal(got[2, 6], got[2, 0])
    distinct = torch.arange(10.0 * d).reshape(2, 5, d).to(dtype)
    assert S.tie_equal_vectors(sim[:2, :5, :5], distinct) is not None


@pytest.mark.parametrize("bad,words", [
    (lambda v: v.int(), "vectors must be a real floating torch tensor"),
    (lambda v: v.tolist(), "vectors must be a real floating torch tensor"),
    (lambda v: v.to("meta"), "meta device"),
    (lambda v: v.to(torch.complex64), "vectors must be a real floating torch tensor"),
    (lambda v: v[0, 0, 0], "vectors must be a real floating torch tensor"),
])
def test_tie_equal_vectors_refuses_vectors_that_are_not_float_tensors(S, bad, words):
    """Before: int32, list and other inputs raised raw errors from torch."""
    from nope_interp.errors import NopeInterpError

    v = torch.randn(2, 5, 3)
    with pytest.raises(NopeInterpError, match=rf"^tie_equal_vectors: .*{words}"):
        unhooked(S.tie_equal_vectors)(torch.rand(2, 5, 5, dtype=torch.float64), bad(v))
    with pytest.raises(NopeInterpError, match=r"^tie_equal_vectors: sim must be a real floating torch tensor"):
        unhooked(S.tie_equal_vectors)(bad(torch.rand(2, 5, 5)), v)


@pytest.mark.parametrize("shape", [(2, 2, 4), (1, 1, 3), (2, 5, 2, 4)])
@pytest.mark.parametrize("fn", ["adjacency_score_of_activations", "adjacency_scores_of_activations",
                                "adjacency_score"])
def test_too_few_positions_names_the_function_and_the_shape(S, fn, shape):
    """Before: only "the adjacency score needs at least 3 positions", without the function or the shape."""
    from nope_interp.errors import NopeInterpError

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    if fn == "adjacency_score":
        x = x[..., : shape[-2]].expand(*shape[:-1], shape[-2]).clone()
    name = "adjacency_scores_of_activations" if fn != "adjacency_score" else fn
    with pytest.raises(NopeInterpError, match=rf"^{name}: the adjacency score needs at least 3 positions, got "
                                              rf"pos={shape[-2]} \(shape \({shape[0]}, "):
        getattr(S, fn)(x)
