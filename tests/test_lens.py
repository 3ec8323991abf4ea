"""The notebook API on ActivationCaches: numbers against naive references, displays, errors."""

import re

import numpy as np
import pytest
import torch


def _naive_row_mean(x: np.ndarray) -> float:
    """Adjacency score (row mean) of one sequence by the definition: a triple loop over k > j > i."""
    unit = x / np.linalg.norm(x, axis=-1, keepdims=True)
    c = unit @ unit.T
    rows = []
    for k in range(2, len(x)):
        pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
        rows.append(sum(c[k, i] < c[k, j] for i, j in pairs) / len(pairs))
    return float(np.mean(rows))


@pytest.fixture
def reversal_cache_of_tiny_model(tiny_model):
    import tasks

    task = tasks.get_task("reversal")
    prompts = task.analysis_prompts(6, seed=3)
    _, cache = tiny_model.run_with_cache(task.prompt_tokens(prompts))
    return cache, prompts


def test_adjacency_scores_match_naive_loop(reversal_cache_of_tiny_model):
    from nope_interp.lens import adjacency_scores

    cache, _ = reversal_cache_of_tiny_model
    # sites after attention: every vector differs, so no exact ties (the embeddings of repeated characters
    # are identical vectors whose cosines tie only up to the matmul's rounding)
    scores = adjacency_scores(cache, sites=["blocks.0.attn.hook_z", "blocks.0.hook_resid_post",
                                            "blocks.1.hook_resid_post"])
    for site in scores.sites:
        acts = cache[site]
        acts = acts.reshape(acts.shape[0], acts.shape[1], -1).double().numpy()
        naive = [_naive_row_mean(a) for a in acts]
        np.testing.assert_allclose(scores.per_sequence[site].numpy(), naive, atol=1e-12)
        assert scores.summary(site)["mean"] == pytest.approx(np.mean(naive))
    assert scores.summary("blocks.0.attn.hook_z")["mean"] > 0.8


def test_default_sites_are_the_cached_vector_sites_in_forward_order(reversal_cache_of_tiny_model):
    from nope_interp.lens import adjacency_scores

    cache, _ = reversal_cache_of_tiny_model
    sites = adjacency_scores(cache).sites
    assert sites[0] == "hook_embed" and "blocks.0.attn.hook_pattern" not in sites
    assert sites.index("blocks.0.attn.hook_z") < sites.index("blocks.1.attn.hook_z")


def test_displays_and_figures(reversal_cache_of_tiny_model):
    import json

    from nope_interp.lens import adjacency_scores, averaging_check, cosine_heatmap, lag_profile

    cache, prompts = reversal_cache_of_tiny_model
    for obj in (adjacency_scores(cache), cosine_heatmap(cache, "blocks.0.attn.hook_z", 1, prompts[1]),
                averaging_check(cache, 0), lag_profile(cache)):
        assert "<table>" in obj._repr_html_()
        assert len(repr(obj)) > 10
        assert obj.figure().data
        json.dumps(obj.to_dict())


def test_lag_profile_matches_a_naive_loop_and_the_idealised_curve(reversal_cache_of_tiny_model):
    from nope_interp.lens import lag_profile
    from nope_interp.similarity import sliding_window_lag_profile, uniform_causal_lag_profile

    cache, _ = reversal_cache_of_tiny_model
    prof = lag_profile(cache, sites=["hook_embed", "blocks.0.attn.hook_z"], max_lag=5)
    assert prof.sites == ("hook_embed", "blocks.0.attn.hook_z") and prof.max_lag == 5
    for site in prof.sites:
        acts = cache[site]
        acts = acts.reshape(acts.shape[0], acts.shape[1], -1).double().numpy()
        unit = acts / np.linalg.norm(acts, axis=-1, keepdims=True)
        n = acts.shape[1]
        naive = [[np.mean([unit[b, i] @ unit[b, i - d] for i in range(d, n)]) for d in range(1, 6)]
                 for b in range(acts.shape[0])]
        np.testing.assert_allclose(prof.per_sequence[site].numpy(), naive, atol=1e-12)
    torch.testing.assert_close(prof.uniform_causal, uniform_causal_lag_profile(prof.n_pos, 5))
    d = prof.to_dict()
    assert d["sites"]["blocks.0.attn.hook_z"]["lags"] == [1, 2, 3, 4, 5] and d["max_lag"] == 5
    assert "recency gap" in prof._repr_html_() and "uniform causal" in repr(prof)
    fig = prof.figure(window=4)
    assert {t.name for t in fig.data} >= {"embed", "L0", "idealised: uniform causal", "idealised: sliding window 4"}
    # lags 1..5 of longer sequences: the sliding-window curve is the one of prof.n_pos positions
    sliding = next(t for t in fig.data if t.name == "idealised: sliding window 4")
    assert prof.n_pos > 6 and list(sliding.y) == pytest.approx(sliding_window_lag_profile(prof.n_pos, 4, 5).tolist())
    assert lag_profile(cache).max_lag == prof.n_pos - 1


def test_cosine_heatmap_matrix_and_score(reversal_cache_of_tiny_model):
    from nope_interp.lens import cosine_heatmap

    cache, _ = reversal_cache_of_tiny_model
    view = cosine_heatmap(cache, "blocks.0.hook_resid_post", batch_index=2)
    x = cache["blocks.0.hook_resid_post"][2].double().numpy()
    unit = x / np.linalg.norm(x, axis=-1, keepdims=True)
    np.testing.assert_allclose(view.matrix.numpy(), np.clip(unit @ unit.T, -1, 1), atol=1e-12)
    assert view.adjacency == pytest.approx(_naive_row_mean(x), abs=1e-12)


def test_averaging_check_with_uniform_attention_predicts_the_closed_form(tiny_cfg):
    """Zero query weights make layer-0 attention exactly uniform: relative entropy 1 and the predicted
    cosines equal sqrt(i/k) (1-based)."""
    import tasks
    from nope_interp.averaging import closed_form_uniform_cosine
    from nope_interp.lens import averaging_check
    from nope_interp.model import build_model

    model = build_model(tiny_cfg)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
    task = tasks.get_task("addition")
    _, cache = model.run_with_cache(task.prompt_tokens(task.analysis_prompts(4)))
    check = averaging_check(cache, 0)
    assert check.relative_entropy == pytest.approx(1.0, abs=1e-6)
    n = check.predicted.shape[0]
    torch.testing.assert_close(check.predicted, closed_form_uniform_cosine(n), atol=1e-6, rtol=0)
    assert check.adjacency_predicted == pytest.approx(1.0)


@pytest.mark.parametrize("call", ["missing_site", "bad_index", "bad_tokens", "bad_reduction", "no_pattern",
                                  "bad_lag", "lag_missing_site"])
def test_bad_input_names_the_problem(reversal_cache_of_tiny_model, tiny_model, call):
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, averaging_check, cosine_heatmap, lag_profile

    cache, _ = reversal_cache_of_tiny_model
    calls = {
        "missing_site": (lambda: adjacency_scores(cache, sites=["blocks.9.hook_resid_post"]), "not in the cache"),
        "bad_index": (lambda: cosine_heatmap(cache, "hook_embed", batch_index=99), "batch_index"),
        "bad_tokens": (lambda: cosine_heatmap(cache, "hook_embed", tokens="ab"), "tokens"),
        "bad_reduction": (lambda: adjacency_scores(cache, reduction="median"), "reduction"),
        "bad_lag": (lambda: lag_profile(cache, max_lag=99), r"max_lag must be an integer in \[1, "),
        "lag_missing_site": (lambda: lag_profile(cache, sites=["blocks.9.hook_z"]), "not in the cache"),
        "no_pattern": (lambda: averaging_check(tiny_model.run_with_cache(
            torch.zeros(1, 5, dtype=torch.long), names_filter="hook_embed")[1], 0), "hook_pattern"),
    }
    fn, words = calls[call]
    with pytest.raises(NopeInterpError, match=words):
        fn()


def test_sites_and_reductions_given_as_one_string_are_refused():
    import torch
    from conftest import unhooked

    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores
    from nope_interp.model import build_model
    from nope_interp.similarity import adjacency_scores_of_activations

    model = build_model(preset("tiny"))
    _, cache = model.run_with_cache(torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0)))
    for site in ("hook_embed", "blocks.0.attn.hook_z"):
        with pytest.raises(NopeInterpError, match="single string"):
            unhooked(adjacency_scores)(cache, site)
    assert adjacency_scores(cache, ["hook_embed"]).sites == ("hook_embed",)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    for reductions in ("row_mean", "pooled"):
        with pytest.raises(NopeInterpError, match="single string"):
            unhooked(adjacency_scores_of_activations)(x, reductions)


def test_attention_sites_are_refused_naming_the_hook_and_its_shape(reversal_cache_of_tiny_model):
    """hook_pattern / hook_attn_scores are (batch, head, query, key): their heads axis was read as positions
    ("needs at least 3 positions, got pos=2" for a 2-head model) or, with more heads, scored as garbage."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, cosine_heatmap, lag_profile, site_activations

    cache, _ = reversal_cache_of_tiny_model
    for layer in (0, 1):
        for hook in ("hook_pattern", "hook_attn_scores"):
            site = f"blocks.{layer}.attn.{hook}"
            shape = tuple(cache[site].shape)
            words = rf"hook '{site}' holds attention weights of shape {re.escape(str(shape))} \(batch, head, query"
            for call in (lambda s=site: adjacency_scores(cache, [s]), lambda s=site: lag_profile(cache, [s]),
                         lambda s=site: cosine_heatmap(cache, s), lambda s=site: site_activations(cache, s)):
                with pytest.raises(NopeInterpError, match=words):
                    call()
    # a (logits, cache) tuple or a dict is not a cache
    for bad, fn in (((None, cache), adjacency_scores), ({}, lag_profile)):
        with pytest.raises(NopeInterpError, match=rf"{fn.__name__}: cache must be a transformer_lens ActivationCache"):
            unhooked(fn)(bad)
    with pytest.raises(NopeInterpError, match="sites must name at least one hook"):
        adjacency_scores(cache, [])
    for fn in (adjacency_scores, lag_profile):  # a site twice: two table rows, one dict entry
        with pytest.raises(NopeInterpError, match=f"{fn.__name__}: sites names 'hook_embed' more than once"):
            fn(cache, ["hook_embed", "blocks.0.attn.hook_z", "hook_embed"])
    with pytest.raises(NopeInterpError, match="batch_index must be an integer"):
        unhooked(cosine_heatmap)(cache, "hook_embed", batch_index=1.0)
    with pytest.raises(NopeInterpError, match="tokens must be a string or a list of strings"):
        unhooked(cosine_heatmap)(cache, "hook_embed", tokens=list(range(cache["hook_embed"].shape[1])))


def test_sites_with_heads_are_scored_as_heads_concatenated(tiny_model):
    """hook_q/k/v/z are (batch, pos, head, d_head): one vector per position, heads concatenated, batched or not."""
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, site_activations
    from nope_interp.similarity import adjacency_score_of_activations

    task = tasks.get_task("reversal")
    tokens = task.analysis_tokens(3, seed=1)
    _, cache = tiny_model.run_with_cache(tokens)
    sites = [f"blocks.0.attn.hook_{h}" for h in "qkvz"]
    scores = adjacency_scores(cache, sites)
    for site in sites:
        a = cache[site]
        assert a.ndim == 4 and a.shape[1] == tokens.shape[1]
        flat = a.reshape(a.shape[0], a.shape[1], -1)
        torch.testing.assert_close(site_activations(cache, site), flat)
        torch.testing.assert_close(scores.per_sequence[site], adjacency_score_of_activations(flat))
    _, single = tiny_model.run_with_cache(tokens[:1])
    single = single.remove_batch_dim()
    assert not single.has_batch_dim
    z = site_activations(single, "blocks.0.attn.hook_z")
    assert z.shape == (1, tokens.shape[1], tiny_model.cfg.n_heads * tiny_model.cfg.d_head)
    with pytest.raises(NopeInterpError, match=r"hook 'blocks.0.attn.hook_pattern' holds attention weights of shape "
                                              r"\(2, 22, 22\)"):
        site_activations(single, "blocks.0.attn.hook_pattern")


def test_caches_of_an_empty_batch_are_refused_by_every_lens_function(tiny_model):
    """averaging_check on run_with_cache(tokens[:0]) failed with "cannot reshape tensor of 0 elements"."""
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, averaging_check, cosine_heatmap, lag_profile, site_activations

    task = tasks.get_task("reversal")
    _, cache = tiny_model.run_with_cache(task.prompt_tokens(task.analysis_prompts(2, seed=3))[:0])
    for fn in (lambda: averaging_check(cache, 0), lambda: adjacency_scores(cache),
               lambda: cosine_heatmap(cache, "blocks.0.attn.hook_z"), lambda: lag_profile(cache),
               lambda: site_activations(cache, "blocks.0.attn.hook_z")):
        with pytest.raises(NopeInterpError, match=r"an empty batch|empty"):
            fn()


def test_heatmap_axes_show_whole_tokens(tiny_model):
    """Multi-character tokens (subword text) were cut to their first character, so " the" showed as blank."""
    import torch

    from nope_interp.lens import cosine_heatmap

    _, cache = tiny_model.run_with_cache(torch.randint(0, 96, (1, 4), generator=torch.Generator().manual_seed(0)))
    fig = cosine_heatmap(cache, "blocks.0.attn.hook_z", tokens=[" the", "cat", "\n\n", "s"]).figure()
    assert list(fig.data[0].x) == ["0: the", "1:cat", "2:␤␤", "3:s"] == list(fig.data[0].y)
    fig = cosine_heatmap(cache, "blocks.0.attn.hook_z", tokens="ab\nc").figure()  # a string: its characters
    assert list(fig.data[0].x) == ["0:a", "1:b", "2:␤", "3:c"]
    assert list(cosine_heatmap(cache, "hook_embed").figure().data[0].x) == ["0:", "1:", "2:", "3:"]


def test_averaging_check_on_too_short_sequences_names_itself(tiny_model):
    import torch

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check

    for pos in (1, 2):
        _, cache = tiny_model.run_with_cache(torch.zeros(2, pos, dtype=torch.long))
        with pytest.raises(NopeInterpError, match=f"averaging_check: the cache holds sequences of {pos} positions"):
            averaging_check(cache, 0)


def test_a_site_that_was_not_scored_is_a_one_line_error(tiny_model):
    """Before: SiteScores.summary("blocks.0.attn.hook_z") of scores at hook_embed only raised a bare KeyError, and
    summary(["hook_embed"]) (SiteScores or LagProfile) a TypeError (unhashable list); LagProfile named the site."""
    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import LagProfile, SiteScores, adjacency_scores, lag_profile

    _, cache = tiny_model.run_with_cache(torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0)))
    scores = adjacency_scores(cache, sites=["hook_embed"])
    lags = lag_profile(cache, sites=["hook_embed", "blocks.0.attn.hook_z"])
    for result, summary, done, allowed in ((scores, SiteScores.summary, "scored", "hook_embed"),
                                           (lags, LagProfile.summary, "profiled", "hook_embed, blocks.0.attn.hook_z")):
        for site in ("blocks.1.attn.hook_z", ["hook_embed"], None):
            with pytest.raises(NopeInterpError, match=f"^site .* was not {done}; {done}: {allowed}$"):
                unhooked(summary)(result, site)
    assert scores.summary("hook_embed")["n"] == 2 and lags.summary("blocks.0.attn.hook_z")["n"] == 2


@pytest.mark.parametrize("n_sequences", [1, 3])
def test_displays_show_a_spread_over_sequences_only_where_there_is_one(tiny_model, n_sequences):
    """A cache of one sequence has no spread over sequences: the adjacency and lag-profile displays show the mean
    alone and the figures draw no error bar (before: ``± 0.000`` and bars of 0, a certainty nobody measured);
    three sequences show mean ± std."""
    import tasks
    from nope_interp.lens import adjacency_scores, lag_profile

    task = tasks.get_task("reversal")
    _, cache = tiny_model.run_with_cache(task.prompt_tokens(task.analysis_prompts(n_sequences, seed=3)))
    sites = ["blocks.0.attn.hook_z", "blocks.1.hook_resid_post"]
    scores, prof = adjacency_scores(cache, sites=sites), lag_profile(cache, sites=sites)
    many = n_sequences > 1
    for site in sites:
        st, gap = scores.summary(site), prof.summary(site)["recency_gap"]
        line = next(ln for ln in repr(scores).splitlines() if site in ln)
        assert line.rstrip().endswith(f"{st['mean']:.3f} ± {st['std']:.3f}" if many else f"{st['mean']:.3f}")
        row = next(ln for ln in repr(prof).splitlines() if site in ln)
        assert row.rstrip().endswith(f"{gap['mean']:+.3f} ± {gap['std']:.3f}" if many else f"{gap['mean']:+.3f}")
    assert ("n/a" in scores._repr_html_()) != many
    for trace in scores.figure().data:
        assert all((v is not None) == many for v in trace.error_y.array)
    lines = [t for t in prof.figure().data if t.name.startswith("L")]
    assert lines and all(all((v is not None) == many for v in t.error_y.array) for t in lines)
    assert all(("±" in h) == many for t in lines for h in t.customdata)


def _hand_built(cache, **entries):
    """A copy of ``cache`` (with its model) in which ``entries`` replace or add hook entries."""
    from transformer_lens import ActivationCache

    return ActivationCache({**cache.cache_dict, **entries}, cache.model)


def test_hand_built_cache_entries_that_are_not_float_tensors_are_refused_by_every_lens_function(
        reversal_cache_of_tiny_model):
    """A numpy array or list in a hand-built cache raised AttributeError (no .double / .shape) in
    averaging_check and adjacency_scores."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, averaging_check, cosine_heatmap, lag_profile

    cache, _ = reversal_cache_of_tiny_model
    for name in ("blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern"):
        good = cache[name]
        for bad in (good.numpy(), good.tolist(), good.long()):
            c = _hand_built(cache, **{name: bad})
            calls = [(averaging_check, (c, 0))]
            if name.endswith("hook_z"):
                calls += [(adjacency_scores, (c, [name])), (lag_profile, (c, [name])), (cosine_heatmap, (c, name))]
            for fn, args in calls:
                with pytest.raises(NopeInterpError, match=rf"the cache entry '{re.escape(name)}' must be a real "
                                                          "floating torch tensor"):
                    fn(*args)


def test_results_of_caches_that_require_grad_hold_no_graph_and_draw(tiny_model):
    """AveragingCheck.figure() failed with "Can't call numpy() on Tensor that requires grad"; lag profiles and
    heatmaps kept the autograd graph."""
    import tasks
    from nope_interp.lens import adjacency_scores, averaging_check, cosine_heatmap, lag_profile

    task = tasks.get_task("reversal")
    tokens = task.prompt_tokens(task.analysis_prompts(4, seed=3))
    _, cache = tiny_model.run_with_cache(tokens)
    grad_cache = _hand_built(cache, **{k: v.detach().clone().requires_grad_(True) for k, v in cache.items()})
    assert grad_cache["blocks.0.attn.hook_z"].requires_grad
    check = averaging_check(grad_cache, 0)
    assert not check.predicted.requires_grad and not check.observed.requires_grad
    check.figure()
    assert check.to_dict() == averaging_check(cache, 0).to_dict()
    view = cosine_heatmap(grad_cache, "blocks.0.attn.hook_z")
    assert not view.matrix.requires_grad
    view.figure()
    prof = lag_profile(grad_cache)
    assert not any(t.requires_grad for t in prof.per_sequence.values())
    assert prof.to_dict() == lag_profile(cache).to_dict()
    assert not any(t.requires_grad for t in adjacency_scores(grad_cache).per_sequence.values())


def test_averaging_check_refuses_zero_vectors_and_mismatched_heads_by_name(reversal_cache_of_tiny_model):
    """A zero vector in hook_z was reported as "obs must be finite, got 43 NaN or inf entries" (the user put in
    no NaN); a pattern with another head count than hook_z was scored."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, averaging_check

    cache, _ = reversal_cache_of_tiny_model
    z = cache["blocks.0.attn.hook_z"].clone()
    z[0, 3] = 0.0
    c = _hand_built(cache, **{"blocks.0.attn.hook_z": z})
    for fn, args in ((averaging_check, (c, 0)), (adjacency_scores, (c, ["blocks.0.attn.hook_z"]))):
        with pytest.raises(NopeInterpError, match=r"activations at blocks.0.attn.hook_z have 1 near-zero vectors "
                                                  r".*first at index \(0, 3\)"):
            fn(*args)
    p = cache["blocks.0.attn.hook_pattern"]
    n_heads = p.shape[1]
    for heads in (1, n_heads + 1):
        pat = p[:, :1].expand(-1, heads, -1, -1).clone()
        c = _hand_built(cache, **{"blocks.0.attn.hook_pattern": pat})
        with pytest.raises(NopeInterpError, match=rf"hook_pattern has {heads} heads and blocks.0.attn.hook_z "
                                                  rf"{n_heads}: they must come from the same layer"):
            averaging_check(c, 0)


def test_sites_of_different_shapes_are_refused_not_mislabelled(reversal_cache_of_tiny_model):
    """lag_profile labelled a 5-lag site "c(9)" (the first site's length) and its figure then failed."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, lag_profile

    cache, _ = reversal_cache_of_tiny_model
    short = cache["blocks.0.hook_resid_post"][:, :6].clone()
    fewer = cache["blocks.0.hook_resid_post"][:3].clone()
    for bad in (short, fewer):
        c = _hand_built(cache, **{"blocks.0.hook_resid_post": bad})
        for fn in (adjacency_scores, lag_profile):
            with pytest.raises(NopeInterpError, match=rf"{fn.__name__}: the sites hold different \(batch, pos\)"):
                fn(c)
            fn(c, ["blocks.0.hook_resid_post"])   # alone, the site is scored


def test_averaging_check_layer_messages_say_integer_and_n_layers(reversal_cache_of_tiny_model, tiny_model):
    from conftest import unhooked

    from nope_interp import hooks
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check

    cache, _ = reversal_cache_of_tiny_model
    # averaging_check's layer goes to hook_name, whose message users see (without the suite's type checker)
    for bad in (1.0, "0", None, True, -1):
        with pytest.raises(NopeInterpError, match=r"hook point 'pattern' needs a layer, an integer >= 0, got"):
            unhooked(hooks.hook_name)("pattern", bad, 2)
    n = tiny_model.cfg.n_layers
    with pytest.raises(NopeInterpError, match=rf"layer {n} is out of range for a model with n_layers={n}"):
        averaging_check(cache, n)
    assert unhooked(averaging_check)(cache, np.int64(n - 1)).layer == n - 1   # numpy integers as users pass them


def test_averaging_check_takes_the_window_of_a_cache_without_its_model():
    """A sliding-window model's cache built without its model read as global attention (relative entropy 0.63
    for a uniform window-3 pattern, 1.00 with the model); ``window`` gives the window."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny", attention="sliding", window=3))
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    from transformer_lens import ActivationCache

    bare = ActivationCache(dict(cache.cache_dict), None)
    with_model = averaging_check(cache, 0).to_dict()
    assert averaging_check(bare, 0, window=3).to_dict() == with_model
    assert averaging_check(cache, 0, window=3).to_dict() == with_model
    assert averaging_check(bare, 0).relative_entropy < with_model["relative_entropy"] - 0.1
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(NopeInterpError, match=r"window must be an integer in \[1,"):
            unhooked(averaging_check)(bare, 0, window=bad)
    with pytest.raises(NopeInterpError, match=r"window \(a causal sliding window\) needs causal attention"):
        averaging_check(bare, 0, causal=False, window=3)
    for other in (2, 5):   # another window than the model's own understated or overstated the entropy silently
        with pytest.raises(NopeInterpError, match=rf"window={other}, but the cache's model attends over 3 keys"):
            averaging_check(cache, 0, window=other)


def test_averaging_check_leaves_degenerate_sequences_out_of_the_correlation_and_names_them(tiny_model):
    """One repeated token gives observed cosines constant up to rounding: their rank correlation ranked rounding
    noise (-0.24) into the mean, and the warning named neither matrix. The mean is now over the other sequences,
    checked against the check of those sequences alone."""
    import warnings

    from transformer_lens import ActivationCache

    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.lens import averaging_check

    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (4, 10), generator=gen)
    tokens[1] = 7                                                    # one sequence of one repeated token
    _, cache = tiny_model.run_with_cache(tokens)
    with pytest.warns(DegenerateInputWarning, match=r"averaging_check, layer 0: of 4 sequences, 1 with constant "
                                                    r"observed cosines at blocks.0.attn.hook_z") as rec:
        check = averaging_check(cache, 0)
    assert rec[0].message.n_degenerate == 1 and rec[0].message.n_sequences == 4
    keep = [0, 2, 3]
    kept = ActivationCache({k: v[keep] for k, v in cache.items()}, tiny_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateInputWarning)   # the others are not degenerate
        ref = averaging_check(kept, 0)
    assert check.spearman_pred_obs == pytest.approx(ref.spearman_pred_obs, abs=1e-12)
    _, one = tiny_model.run_with_cache(tokens[1:2])
    with pytest.warns(DegenerateInputWarning, match=r"of 1 sequences, 1 with constant observed"):
        assert np.isnan(averaging_check(one, 0).spearman_pred_obs)   # none left: undefined


def test_averaging_check_judges_degenerate_sequences_at_the_caches_own_precision(tiny_cfg):
    """z and the pattern are converted to float64 before the cosines: a bfloat16 cache's rounding noise (one vector
    times scales, so its cosines are 1 up to bfloat16 rounding) was judged at float32 precision, kept and ranked.
    adjacency_scores flagged the same data; both now flag it, and the shared rule (averaging.sequence_spearmans)
    gives the averaging job the same verdicts."""
    import warnings

    from transformer_lens import ActivationCache

    from nope_interp.averaging import lower_triangle_spearman, sequence_spearmans
    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.lens import adjacency_scores, averaging_check
    from nope_interp.model import build_model

    model = build_model(tiny_cfg).to(torch.bfloat16)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 10), generator=torch.Generator().manual_seed(4))
    _, cache = model.run_with_cache(tokens)
    z = cache["blocks.0.attn.hook_z"].clone()
    z[1] = (z[1, 4:5].float() * torch.linspace(0.7, 1.3, 10)[:, None, None]).to(torch.bfloat16)
    c = ActivationCache({**cache.cache_dict, "blocks.0.attn.hook_z": z}, model)
    for fn in (lambda: adjacency_scores(c, ["blocks.0.attn.hook_z"]), lambda: averaging_check(c, 0)):
        with pytest.warns(DegenerateInputWarning, match=r"blocks.0.attn.hook_z"):
            fn()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateInputWarning)
        check = averaging_check(c, 0)
    from nope_interp.averaging_checks import _heads_summed_cosine
    from nope_interp.similarity import cosine_similarity_matrix

    pred = _heads_summed_cosine(c["blocks.0.attn.hook_pattern"].double())
    obs = cosine_similarity_matrix(z.flatten(-2).double())
    rho, bad_pred, bad_obs = sequence_spearmans(pred, obs, torch.bfloat16, torch.bfloat16)
    assert bad_obs.tolist() == [False, True, False] and not bad_pred.any() and np.isnan(rho[1])
    assert rho[0] == lower_triangle_spearman(pred[0], obs[0]) and rho[2] == lower_triangle_spearman(pred[2], obs[2])
    assert check.spearman_pred_obs == pytest.approx((rho[0] + rho[2]) / 2, abs=1e-6)


@pytest.mark.parametrize("dropout", [0.1, 0.5])
def test_a_cache_from_a_model_with_dropout_in_training_mode_is_warned_about(dropout):
    """Before: a cache made in train mode (dropout on) was scored without a word (0.950 vs 0.944 in eval mode)."""
    import warnings

    from nope_interp.errors import NopeInterpWarning
    from nope_interp.lens import adjacency_scores, lag_profile
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny", dropout=dropout))
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    model.train()
    _, cache = model.run_with_cache(tokens)
    for fn in (adjacency_scores, lag_profile):
        with pytest.warns(NopeInterpWarning, match=f"training mode with dropout {dropout:g}.*model.eval"):
            fn(cache, ["blocks.0.attn.hook_z"])
        with warnings.catch_warnings(record=True) as caught:  # once per call, not once per inner check
            warnings.simplefilter("always")
            fn(cache)
        assert len([w for w in caught if issubclass(w.category, NopeInterpWarning)]) == 1, caught
    model.eval()
    _, cache = model.run_with_cache(tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NopeInterpWarning)
        adjacency_scores(cache, ["blocks.0.attn.hook_z"])
    model.train()  # no dropout at all: training mode alone is not warned about
    plain = build_model(preset("tiny")).train()
    _, cache = plain.run_with_cache(tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NopeInterpWarning)
        adjacency_scores(cache, ["blocks.0.attn.hook_z"])


def test_a_hugging_face_attention_dropout_counts_as_dropout():
    """Before: a Mistral bridge with attention_dropout 0.5 in train mode read as no dropout (Hugging Face applies
    it by a function call, not a Dropout module)."""
    pytest.importorskip("transformers")
    from transformers import MistralConfig, MistralForCausalLM

    from nope_interp.hf import bridge_from_hf
    from nope_interp.lens import active_dropout

    hf = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.3,
                                          attn_implementation="eager"))
    bridge = bridge_from_hf(hf)
    assert active_dropout(bridge) == 0.0  # bridge_from_hf puts it in eval mode
    assert active_dropout(bridge.train()) == pytest.approx(0.3)


@pytest.mark.parametrize("window", [3, 5])
def test_the_lag_profile_of_a_sliding_model_draws_its_window(window):
    """Before: the figure's idealised curve was the uniform causal one only, whatever the model's window."""
    from nope_interp.lens import lag_profile
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny", attention="sliding", window=window))
    _, cache = model.run_with_cache(torch.randint(0, model.cfg.d_vocab, (2, 12)))
    prof = lag_profile(cache, ["blocks.0.attn.hook_z"])
    assert prof.window == window
    assert [t.name for t in prof.figure().data][-1] == f"idealised: sliding window {window}"
    _, plain = build_model(preset("tiny")).run_with_cache(torch.randint(0, 20, (2, 12)))
    assert lag_profile(plain, ["blocks.0.attn.hook_z"]).window is None
