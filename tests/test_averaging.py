import math

import pytest
import torch


@pytest.fixture
def A():
    import nope_interp.averaging as averaging

    return averaging


def test_hook_z_is_the_pattern_weighted_sum_of_values(tiny_model, A):
    tokens = torch.randint(0, 96, (3, 11), generator=torch.Generator().manual_seed(0))
    _, cache = tiny_model.run_with_cache(tokens)
    for layer in range(tiny_model.cfg.n_layers):
        z = A.pattern_weighted_values(cache[f"blocks.{layer}.attn.hook_pattern"], cache[f"blocks.{layer}.attn.hook_v"])
        torch.testing.assert_close(z, cache[f"blocks.{layer}.attn.hook_z"], rtol=1e-5, atol=1e-7)
    # a naive loop for one head, one position
    p, v = cache["blocks.0.attn.hook_pattern"][1, 1], cache["blocks.0.attn.hook_v"][1, :, 1]
    naive = sum(p[5, j] * v[j] for j in range(6))
    torch.testing.assert_close(cache["blocks.0.attn.hook_z"][1, 5, 1], naive, rtol=1e-5, atol=1e-7)


def test_sqrt_i_over_k_closed_form_by_monte_carlo(A):
    """Uniform causal averaging of i.i.d. N(0, 1) vectors, d = 8192: |cos - sqrt(i/k)| < 0.03 everywhere."""
    from nope_interp.similarity import cosine_similarity_matrix

    n, d = 16, 8192
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = A.uniform_causal_pattern(n) @ x
    err = (cosine_similarity_matrix(y) - A.closed_form_uniform_cosine(n)).abs().max().item()
    assert err < 0.03
    assert A.closed_form_uniform_cosine(4)[1, 3].item() == pytest.approx(math.sqrt(2 / 4))
    # the pattern-only prediction of a uniform pattern is exactly the closed form
    torch.testing.assert_close(A.attention_row_cosine(A.uniform_causal_pattern(n)), A.closed_form_uniform_cosine(n))


def test_variance_of_uniform_average_is_one_over_k(A):
    """Chi et al.: per-coordinate variance of the uniform causal average of unit-variance inputs ~ 1/k."""
    x = torch.randn(200, 12, 512, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    var = A.per_position_variance(A.uniform_causal_pattern(12) @ x).mean(0)
    k = torch.arange(1, 13, dtype=torch.float64)
    torch.testing.assert_close(var, 1 / k, rtol=0.05, atol=0.0)


def test_entropy_and_matched_random_patterns(A):
    n = 10
    rel = A.relative_entropy_to_uniform(A.uniform_causal_pattern(n))[1:]
    assert torch.allclose(rel, torch.ones(n - 1, dtype=torch.float64))
    assert torch.all(A.relative_entropy_to_uniform(A.identity_pattern(n))[1:] == 0)
    gen = torch.Generator().manual_seed(5)
    max_entropy = torch.log(torch.arange(1, n + 1, dtype=torch.float64))
    target = torch.rand(4, n, generator=gen, dtype=torch.float64) * max_entropy
    pat = A.random_causal_pattern(target, torch.Generator().manual_seed(6))
    torch.testing.assert_close(A.attention_entropy(pat), target, atol=1e-5, rtol=0)
    torch.testing.assert_close(pat.sum(-1), torch.ones(4, n, dtype=torch.float64))
    assert torch.all(pat.triu(1) == 0)


def test_relative_entropy_of_bidirectional_uniform_is_one(A):
    n = 7
    uniform_bi = torch.full((n, n), 1 / n, dtype=torch.float64)
    rel = A.relative_entropy_to_uniform(uniform_bi, causal=False)
    torch.testing.assert_close(rel, torch.ones(n, dtype=torch.float64))
