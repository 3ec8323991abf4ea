import math

import numpy as np
import pytest
import torch
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
        expected = ref.sum(-1) / pairs.sum() if red == "pooled" else (ref[:, 2:] / pairs[2:]).mean(-1)
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
    assert S.adjacency_score(const).item() == 0.0  # all ties fail


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
