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


@pytest.mark.parametrize("zero_at", [(0,), (2,), (1, 3)])
def test_attention_row_cosine_refuses_zero_rows(A, zero_at):
    """Before: all-zero rows had no direction but were read as equal rows (tied), so torch.zeros(3, 3) gave a
    matrix of 1s; a zero row among weights gave cosine 1 with nothing. Rows with weights still match a naive loop."""
    from nope_interp.errors import NopeInterpError

    pattern = A.uniform_causal_pattern(4).clone()
    for q in zero_at:
        pattern[q] = 0.0
    with pytest.raises(NopeInterpError, match=rf"{len(zero_at)} all-zero rows \(first at index \({zero_at[0]},\)\)"):
        A.attention_row_cosine(pattern)
    with pytest.raises(NopeInterpError, match="all-zero rows"):
        A.attention_row_cosine(torch.zeros(2, 3, 3, dtype=torch.float64))
    full = A.attention_row_cosine(A.uniform_causal_pattern(4))
    rows = A.uniform_causal_pattern(4)
    for i in range(4):
        for k in range(4):
            want = float(rows[i] @ rows[k]) / math.sqrt(float(rows[i] @ rows[i]) * float(rows[k] @ rows[k]))
            assert full[i, k].item() == pytest.approx(want, abs=1e-12)


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


def test_a_pattern_that_is_not_softmax_weights_of_its_kind_is_refused_not_scored(A):
    """Before the check, a bidirectional pattern scored as causal gave a relative entropy of 2.0 (range [0, 1]),
    negative entries an entropy of -345, and rows that do not sum to 1 any number."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    u = A.uniform_causal_pattern(5)
    full = torch.full((5, 5), 0.2, dtype=torch.float64)
    cases = [
        (A.relative_entropy_to_uniform, (full,), {}, "puts weight 0.2 on a later key .*causal=False"),
        (A.relative_entropy_to_uniform, (u,), {"window": 2}, "puts weight 0.333 on a key outside its sliding window"),
        (A.relative_entropy_to_uniform, (torch.cat([u, torch.zeros(5, 1, dtype=u.dtype)], 1),), {}, "must be square"),
        (A.relative_entropy_to_uniform, (u,), {"causal": "no"}, "causal must be True or False"),
        (A.attention_entropy, (-u,), {}, "must be non-negative"),
        (A.attention_entropy, (u * 2,), {}, "rows must sum to 1 .* 1 away"),
        (A.attention_entropy, (u * 1.5,), {}, "rows must sum to 1 .* 0.5 away"),
    ]
    for fn, args, kwargs, words in cases:
        with pytest.raises(NopeInterpError, match=f"^{fn.__name__}: .*{words}"):
            unhooked(fn)(*args, **kwargs)
    # the same patterns scored as what they are: in [0, 1]
    assert torch.allclose(A.relative_entropy_to_uniform(full, causal=False), torch.ones(5, dtype=torch.float64))
    h = A.relative_entropy_to_uniform(u.half().float())   # float16 rounding of the rows is within tolerance
    assert torch.isnan(h[0]) and torch.allclose(h[1:], torch.ones(4, dtype=torch.float64), atol=1e-3)


def test_shapes_that_disagree_are_refused_not_truncated_or_broadcast(A):
    """Before: a 5x5 against a 6x6 matrix gave 1.0 (the 6x6 cut to 5x5), two 5x3 matrices -1.0."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    c5, c6 = A.closed_form_uniform_cosine(5), A.closed_form_uniform_cosine(6)
    v = torch.randn(2, 5, 2, 3)
    for fn, args, words in [
        (A.lower_triangle_spearman, (c5, c6), "square matrices of one shape, got \\(5, 5\\) and \\(6, 6\\)"),
        (A.lower_triangle_spearman, (torch.randn(5, 3), torch.randn(5, 3)), "square"),
        (A.vector_spearman, (torch.ones(3), torch.ones(4)), "one length"),
        (A.vector_spearman, (torch.ones(1), torch.ones(1)), "one length >= 2"),
        (A.pattern_weighted_values, (torch.rand(2, 2, 5, 6), v), "disagree"),
        (A.pattern_weighted_values, (torch.rand(2, 3, 5, 5), v), "disagree"),
    ]:
        with pytest.raises(NopeInterpError, match=words):
            unhooked(fn)(*args)
    # the shapes that agree give the naive answer (pattern @ v per head), float64 kept
    p = torch.rand(2, 2, 5, 5, dtype=torch.float64)
    z = A.pattern_weighted_values(p, v)
    assert z.dtype == torch.float64
    naive = sum(p[1, 0, 3, k] * v[1, k, 0].double() for k in range(5))
    torch.testing.assert_close(z[1, 3, 0], naive)


def test_sizes_and_generators_are_checked_and_numpy_integers_accepted(A):
    import numpy as np
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    for fn in (A.uniform_causal_pattern, A.identity_pattern, A.closed_form_uniform_cosine):
        for bad in (0, -3, 2.5, True, "3", None):
            with pytest.raises(NopeInterpError, match="n_pos must be an integer >= 1"):
                unhooked(fn)(bad)
        assert unhooked(fn)(np.int64(4)).shape == (4, 4)
    with pytest.raises(NopeInterpError, match="generator must be a torch.Generator"):
        unhooked(A.random_causal_pattern)(torch.ones(5), None)   # the global RNG would not be reproducible
    for bad in (0, -1, 1.5):
        with pytest.raises(NopeInterpError, match="iters must be an integer >= 1"):
            unhooked(A.random_causal_pattern)(torch.ones(5), torch.Generator(), bad)


def test_averaging_check_reads_the_attention_direction_from_the_model(tiny_cfg):
    """Before: a bidirectional model's cache was scored as causal by default (relative entropy 1.57)."""
    from transformer_lens import ActivationCache

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check
    from nope_interp.model import build_model

    tokens = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    model = build_model(tiny_cfg.replace(attention="bidirectional"))
    _, cache = model.run_with_cache(tokens)
    check = averaging_check(cache)
    assert 0.0 <= check.relative_entropy <= 1.0
    with pytest.raises(NopeInterpError, match="causal=True, but the cache's model has bidirectional attention"):
        averaging_check(cache, causal=True)
    bare = ActivationCache(dict(cache.cache_dict), None)   # no model to read: the pattern itself is checked
    with pytest.raises(NopeInterpError, match="later key"):
        averaging_check(bare, causal=True)
    _, causal_cache = build_model(tiny_cfg).run_with_cache(tokens)
    assert 0.99 <= averaging_check(causal_cache).relative_entropy <= 1.0   # near-uniform at init
    assert averaging_check(causal_cache, causal=True).to_dict() == averaging_check(causal_cache).to_dict()


def test_averaging_check_refuses_a_causal_flag_that_contradicts_the_model(tiny_cfg):
    """Before: causal=False on a causal model's cache scored its pattern against the uniform over all keys:
    exactly uniform causal attention read 0.73 of uniform (1.00), with no word. Without the model in the cache
    the flag is the user's to give, and uniform causal attention scored as bidirectional is checked against a
    naive per-query loop."""
    import math

    from conftest import unhooked
    from transformer_lens import ActivationCache

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check
    from nope_interp.model import build_model

    model = build_model(tiny_cfg)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()   # exactly uniform causal attention
    tokens = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    assert averaging_check(cache).relative_entropy == pytest.approx(1.0, abs=1e-6)   # float32 pattern
    with pytest.raises(NopeInterpError, match="causal=False, but the cache's model has causal attention: leave "
                                              "causal out, or give True"):
        averaging_check(cache, causal=False)
    for bad in ("yes", 1, None.__class__):
        with pytest.raises(NopeInterpError, match="causal must be True, False or None"):
            unhooked(averaging_check)(cache, causal=bad)
    bare = ActivationCache(dict(cache.cache_dict), None)
    n = tokens.shape[1]
    # query q (0-based) spreads over q + 1 keys: entropy log(q + 1) against log(n) for all keys, queries 1..n-1
    naive = sum(math.log(q + 1) / math.log(n) for q in range(1, n)) / (n - 1)
    assert averaging_check(bare, causal=False).relative_entropy == pytest.approx(naive, abs=1e-6)


def test_grouped_query_attention_values_serve_their_query_heads():
    """With n_key_value_heads < n_heads, hook_v has fewer heads than the pattern: averaging_report failed with
    "disagree in ... n_heads". Each key/value head now serves its group of query heads, as in TransformerLens:
    pattern @ v equals the cached hook_z exactly."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    import tasks
    from nope_interp.averaging import pattern_weighted_values
    from nope_interp.averaging_checks import averaging_report
    from nope_interp.errors import NopeInterpError

    for n_kv in (1, 2):
        torch.manual_seed(0)
        model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4,
                                                          d_vocab=96, act_fn="relu", n_key_value_heads=n_kv)).eval()
        _, cache = model.run_with_cache(torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(1)))
        for layer in range(2):
            pattern, v = cache[f"blocks.{layer}.attn.hook_pattern"], cache[f"blocks.{layer}.attn.hook_v"]
            assert v.shape[2] == n_kv
            z = pattern_weighted_values(pattern, v)
            torch.testing.assert_close(z.float(), cache[f"blocks.{layer}.attn.hook_z"], atol=1e-6, rtol=1e-5)
            # by hand: query head i reads value head i // (4 / n_kv)
            for head in range(4):
                ref = torch.einsum("bqk,bkd->bqd", pattern[:, head].double(), v[:, :, head // (4 // n_kv)].double())
                torch.testing.assert_close(z[:, :, head].double(), ref)
        assert len(averaging_report(model, tasks.get_task("reversal", n_digits=4), n_prompts=4).layers) == 2
    with pytest.raises(NopeInterpError, match="disagree in batch, key_pos or n_heads"):
        pattern_weighted_values(torch.rand(1, 4, 5, 5), torch.rand(1, 5, 3, 8))  # 3 does not divide 4
