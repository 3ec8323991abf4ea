import pytest
import torch
from conftest import assert_no_hooks


def test_collect_activations_shapes_labels_and_values(tiny_model):
    from nope_interp.activations import collect_activations
    from nope_interp.hooks import hook_name

    tokens = torch.randint(0, 96, (5, 9), generator=torch.Generator().manual_seed(0))
    acts = collect_activations(tiny_model, tokens, batch_size=2)
    n_layers, d_model = tiny_model.cfg.n_layers, tiny_model.cfg.d_model
    assert acts.acts.shape == (1 + 4 * n_layers, 5, 9, d_model)
    assert acts.labels[:5] == ("hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_z",
                               "blocks.0.hook_resid_mid", "blocks.0.hook_resid_post")
    _, cache = tiny_model.run_with_cache(tokens)
    for layer in range(n_layers):
        z = cache[hook_name("z", layer)]
        torch.testing.assert_close(acts[hook_name("z", layer)], z.reshape(5, 9, d_model))
        torch.testing.assert_close(acts[hook_name("resid_post", layer)], cache[hook_name("resid_post", layer)])
    # z with heads concatenated, projected by W_O, is the attention output
    w_o = tiny_model.blocks[0].attn.W_O.reshape(d_model, d_model)
    attn_out = cache["blocks.0.hook_attn_out"]
    torch.testing.assert_close(acts["blocks.0.attn.hook_z"] @ w_o, attn_out, rtol=1e-4, atol=1e-6)
    assert_no_hooks(tiny_model)


def test_bad_points_and_lengths(tiny_model):
    from nope_interp.activations import collect_activations
    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import hook_name

    with pytest.raises(NopeInterpError, match="allowed: embed, resid_pre"):
        collect_activations(tiny_model, torch.zeros(1, 4, dtype=torch.long), points=("resid_final",))
    with pytest.raises(NopeInterpError, match="n_ctx=48"):
        collect_activations(tiny_model, torch.zeros(1, 49, dtype=torch.long))
    with pytest.raises(NopeInterpError, match="unknown hook point 'mlp'"):
        hook_name("mlp", 0)
    with pytest.raises(NopeInterpError, match="out of range"):
        hook_name("resid_pre", 2, n_layers=2)
    assert hook_name("pattern", 1) == "blocks.1.attn.hook_pattern"


@pytest.mark.parametrize(("tokens", "match"), [
    (torch.full((1, 5), -1), r"\[0, 96\).*got -1"),          # silently took the last embedding row
    (torch.full((2, 5), 500), r"\[0, 96\).*got 500"),        # a raw IndexError
    (torch.tensor([[1, 2, 96, 3]]), r"\[0, 96\).*got 96 at tokens\[0, 2\]"),
    (torch.zeros(0, 4, dtype=torch.long), r"batch >= 1, pos >= 1"),
    (torch.zeros(3, 0, dtype=torch.long), r"batch >= 1, pos >= 1"),
])
def test_token_ids_outside_the_vocabulary_are_refused_before_any_forward_pass(tiny_model, tokens, match, monkeypatch):
    from nope_interp.activations import collect_activations, iter_activations
    from nope_interp.errors import NopeInterpError

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran on bad tokens")

    monkeypatch.setattr(tiny_model, "run_with_cache", no_forward)
    with pytest.raises(NopeInterpError, match=match):
        collect_activations(tiny_model, tokens)
    with pytest.raises(NopeInterpError, match=match):
        iter_activations(tiny_model, tokens)


def test_iter_activations_streams_chunks_equal_to_collect_activations(tiny_model):
    from nope_interp.activations import collect_activations, iter_activations

    tokens = torch.randint(0, 96, (7, 6), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    chunks = list(iter_activations(tiny_model, tokens, ("embed", "z"), batch_size=3))
    assert [c.acts.shape[1] for c in chunks] == [3, 3, 1]
    whole = collect_activations(tiny_model, tokens.long(), ("embed", "z"), batch_size=3)
    torch.testing.assert_close(torch.cat([c.acts for c in chunks], dim=1), whole.acts, rtol=0, atol=0)
    assert chunks[0].labels == whole.labels


def test_sites_of_two_widths_are_refused_by_name_and_each_width_alone_is_analysed():
    """n_heads * d_head != d_model (legal in TransformerLens) failed in torch.stack with "stack expects each
    tensor to be equal size" in analyze_tokens, collect_activations and iter_activations."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from nope_interp.activations import collect_activations, iter_activations
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=4, n_heads=4,
                                                      d_vocab=20, act_fn="relu")).eval()
    tokens = torch.randint(0, 20, (3, 10), generator=torch.Generator().manual_seed(0))
    for fn in (lambda p: analyze_tokens(model, tokens, p), lambda p: collect_activations(model, tokens, p),
               lambda p: next(iter_activations(model, tokens, p))):
        with pytest.raises(NopeInterpError, match=r"n_heads \* d_head = 16 features and its residual stream "
                                                  r"d_model = 32: analyse points \('z',\)"):
            fn(("z", "resid_post"))
    z = analyze_tokens(model, tokens, ("z",))
    _, cache = model.run_with_cache(tokens)
    from nope_interp.lens import adjacency_scores

    ref = adjacency_scores(cache, ["blocks.1.attn.hook_z"])
    assert z.scores["row_mean"]["blocks.1.attn.hook_z"]["mean"] == pytest.approx(
        ref.summary("blocks.1.attn.hook_z")["mean"], abs=1e-6)
    assert collect_activations(model, tokens, ("resid_post",)).acts.shape == (2, 3, 10, 32)


@pytest.mark.parametrize("batch_size", [True, False, 2.5, None, "2", 0, -1])
@pytest.mark.parametrize("fn", ["collect_activations", "iter_activations"])
def test_a_batch_size_that_is_not_an_integer_of_at_least_one_is_refused_by_name(tiny_model, fn, batch_size):
    """Before: True was taken as 1, and 2.5, None and '2' raised a raw TypeError from range()."""
    from conftest import unhooked

    import nope_interp.activations as A
    from nope_interp.errors import NopeInterpError

    tokens = torch.randint(0, 96, (3, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NopeInterpError, match=rf"^{fn}: batch_size must be an integer in \[1, 1000000000\], got "):
        out = unhooked(getattr(A, fn))(tiny_model, tokens, ("z",), batch_size)
        list(out) if fn == "iter_activations" else None
