"""The trainer's hook-free forward equals the hooked model: logits, gradients and dropout masks."""

import pytest
import torch
from conftest import perturbed_model as _perturbed

OPTIONS = [{}, {"normalization": "RMS"}, {"normalization": "LNPre"}, {"normalization": "RMSPre"},
           {"normalization": "none"}, {"act_fn": "gelu_new"}, {"act_fn": "relu"}, {"act_fn": "silu"},
           {"positional": "learned"}, {"positional": "rotary"}, {"positional": "rotary", "n_heads": 2, "d_head": 16},
           {"positional": "rotary", "nope_layers": (0,)},
           {"tied_embeddings": True}, {"attention": "bidirectional"}, {"biases": True},
           {"n_layers": 3, "n_heads": 4, "d_head": 8}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_logits_and_gradients_equal_the_hooked_model(options):
    from nope_interp.config import preset
    from nope_interp.fast_forward import fast_logits, unsupported_reason

    model = _perturbed(preset("tiny", **options))
    assert unsupported_reason(model) is None
    tokens = torch.randint(0, 96, (3, 13), generator=torch.Generator().manual_seed(0))
    for length in (1, 5, 13):
        ref = model(tokens[:, :length], return_type="logits")
        got = fast_logits(model, tokens[:, :length])
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    params = [p for p in model.parameters() if p.requires_grad]
    grads_ref = torch.autograd.grad(model(tokens, return_type="logits").square().mean(), params)
    grads = torch.autograd.grad(fast_logits(model, tokens).square().mean(), params)
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_dropout_draws_the_same_masks_as_the_hooks_and_only_in_train_mode():
    from nope_interp.config import preset
    from nope_interp.fast_forward import fast_logits

    model = _perturbed(preset("tiny", dropout=0.3))
    tokens = torch.randint(0, 96, (4, 9), generator=torch.Generator().manual_seed(0))
    model.train()
    torch.manual_seed(5)
    ref = model(tokens, return_type="logits")
    torch.manual_seed(5)
    got = fast_logits(model, tokens)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    torch.manual_seed(6)
    assert not torch.allclose(fast_logits(model, tokens), ref)  # other masks: dropout is on
    model.eval()
    torch.testing.assert_close(fast_logits(model, tokens), model(tokens, return_type="logits"), atol=2e-5,
                               rtol=1e-5)
    assert torch.equal(fast_logits(model, tokens), fast_logits(model, tokens))  # eval: deterministic


@pytest.mark.parametrize("overrides,why", [({"attention": "sliding", "window": 2}, "local attention")])
def test_unsupported_models_are_named_and_the_loss_falls_back(overrides, why):
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import answer_loss
    from nope_interp.fast_forward import fast_logits, unsupported_reason
    from nope_interp.model import build_model
    from tasks import Batch

    model = build_model(preset("tiny", **overrides))
    assert why in unsupported_reason(model)
    with pytest.raises(NopeInterpError, match=why):
        fast_logits(model, torch.zeros(1, 3, dtype=torch.long))
    tokens = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))
    batch = Batch(tokens, tokens.roll(-1, 1), torch.ones(2, 6, dtype=torch.bool))
    assert answer_loss(model, batch, fast=True) == answer_loss(model, batch)
    if "window" in overrides:  # the hooked forward it fell back to masks: not the causal model's loss
        assert answer_loss(model, batch, fast=True) != answer_loss(build_model(preset("tiny")), batch, fast=True)
    with pytest.raises(NopeInterpError, match="n_ctx"):
        fast_logits(build_model(preset("tiny")), torch.zeros(1, 49, dtype=torch.long))


def test_analyze_tokens_runs_attached_hooks_on_auto_and_refuses_them_on_fast(tiny_cfg):
    """A hook attached around analyze_tokens changes what is analysed: "auto" takes the hooked path (its
    scores equal forward="hooked" with the hook and differ from the unhooked ones); "fast", which would
    skip the hook, refuses with the hook's site named."""
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=2))
    toks = torch.randint(0, 96, (6, 24), generator=torch.Generator().manual_seed(3))
    noise = torch.randn(24, tiny_cfg.d_model, generator=torch.Generator().manual_seed(4))

    def shove(x, hook):
        return x + 5.0 * noise.flip(0)  # a strong position-dependent push

    site = "blocks.1.hook_resid_post"
    plain = analyze_tokens(model, toks, forward="fast").per_sequence["row_mean"]
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", shove)]):
        auto = analyze_tokens(model, toks).per_sequence["row_mean"]
        hooked = analyze_tokens(model, toks, forward="hooked").per_sequence["row_mean"]
        with pytest.raises(NopeInterpError, match="blocks.0.hook_resid_mid"):
            analyze_tokens(model, toks, forward="fast")
    torch.testing.assert_close(auto, hooked)
    i = list(analyze_tokens(model, toks[:1]).sites).index(site)
    assert (auto[i] - plain[i]).abs().max() > 0.05


def test_hooks_that_force_the_hooked_path_on_long_inputs_are_said(tiny_cfg):
    from nope_interp.analysis import analyze_tokens
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(n_ctx=600))
    toks = torch.randint(0, 96, (1, 520), generator=torch.Generator().manual_seed(0))
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook: x)]):
        with pytest.warns(UserWarning, match="hooks are attached at blocks.0.hook_resid_mid.*pos\\^2"):
            analyze_tokens(model, toks, points=("resid_post",), max_lag=4)


def test_fast_paths_check_their_tokens_as_the_hooked_paths_do(tiny_cfg):
    """Before: a token id of -1 silently read the last embedding row (the same activations as id 95), and a
    1-D or float batch failed deep in torch."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.fast_forward import fast_activations, fast_logits
    from nope_interp.model import build_model

    model = build_model(tiny_cfg)
    for bad, words in ((torch.full((1, 4), -1), "in \\[0, 96\\).* got -1"), (torch.full((1, 4), 96), "got 96"),
                       (torch.zeros(4, dtype=torch.long), "2-D"), (torch.zeros(2, 4), "integer token ids"),
                       (torch.zeros(2, 4, dtype=torch.long).numpy(), "torch tensor")):
        with pytest.raises(NopeInterpError, match=words):
            unhooked(fast_logits)(model, bad)
        with pytest.raises(NopeInterpError, match=words):
            unhooked(fast_activations)(model, bad, ["hook_embed"])
    for bad in (1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(NopeInterpError, match="dropout must be"):
            unhooked(fast_logits)(model, torch.zeros(2, 4, dtype=torch.long), dropout=bad)


def test_fast_activations_refuses_a_hook_name_given_twice(tiny_cfg):
    """Before: the names were taken as a set, so a name given twice came back once and said nothing."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.fast_forward import fast_activations
    from nope_interp.model import build_model

    model, tokens = build_model(tiny_cfg), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(NopeInterpError, match=r"^fast_activations: names holds 'blocks.0.attn.hook_z' more than once$"):
        fast_activations(model, tokens, ["blocks.0.attn.hook_z", "hook_embed", "blocks.0.attn.hook_z"])
    assert set(fast_activations(model, tokens, ["hook_embed", "blocks.0.attn.hook_z"])) == {
        "hook_embed", "blocks.0.attn.hook_z"}


def test_a_transposed_token_batch_gives_the_contiguous_batch_s_numbers(tiny_cfg):
    """Before: a non-contiguous batch failed in TransformerLens's embedding (view size is not compatible)."""
    from nope_interp.activations import collect_activations
    from nope_interp.evaluate import greedy_decode
    from nope_interp.fast_forward import fast_logits
    from nope_interp.model import build_model

    model = build_model(tiny_cfg)
    tokens = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(0))
    strided = tokens.t().contiguous().t()
    assert not strided.is_contiguous()
    got = collect_activations(model, strided, points=("embed",))
    want = collect_activations(model, tokens, points=("embed",))
    assert got.labels == want.labels
    torch.testing.assert_close(got.acts, want.acts)
    torch.testing.assert_close(fast_logits(model, strided), fast_logits(model, tokens))
    prompts = torch.zeros(2, 3, dtype=torch.long)
    assert torch.equal(greedy_decode(model, prompts.t().contiguous().t(), 2), greedy_decode(model, prompts, 2))


def _lens_model(**kw):
    """A tiny HookedTransformer built directly with TransformerLens (not build_model), weights perturbed."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4,
                                                      d_vocab=20, act_fn="relu", **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("kw", [
    {"positional_embedding_type": "rotary", "rotary_dim": 4},
    {"positional_embedding_type": "rotary", "rotary_adjacent_pairs": True},
    {"positional_embedding_type": "rotary", "use_NTK_by_parts_rope": True, "NTK_original_ctx_len": 8},
    {"positional_embedding_type": "rotary", "rotary_base": 50},
    {"use_attn_result": True, "use_split_qkv_input": True, "use_hook_mlp_in": True, "use_hook_tokens": True},
    {"eps": 1e-2, "init_mode": "xavier_normal", "model_name": "x", "default_prepend_bos": False},
], ids=lambda kw: ",".join(kw))
def test_config_fields_the_fast_path_accepts_at_any_value_give_the_hooked_numbers(kw):
    """The fields :func:`unsupported_reason` lets through with a non-default value must not change the result."""
    from nope_interp.fast_forward import fast_activations, fast_logits, unsupported_reason

    model = _lens_model(**kw)
    assert unsupported_reason(model) is None
    tokens = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fast_logits(model, tokens), model(tokens, return_type="logits"), atol=2e-5, rtol=1e-5)
    _, cache = model.run_with_cache(tokens)
    acts = fast_activations(model, tokens, ["blocks.1.attn.hook_z", "blocks.1.hook_resid_post"])
    for name, got in acts.items():
        ref = cache[name].flatten(-2) if name.endswith("hook_z") else cache[name]
        torch.testing.assert_close(got.reshape(ref.shape), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kw,why", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ({"post_embedding_ln": True}, "post_embedding_ln=True"),
    ({"use_attention_sinks": True}, "use_attention_sinks=True"),
    ({"num_experts": 2, "experts_per_token": 1}, "num_experts=2"),
    ({"positional_embedding_type": "rotary", "use_yarn_rope": True}, "use_yarn_rope=True"),
    ({"normalization_type": "RMS", "original_architecture": "Olmo2ForCausalLM"}, "original_architecture='Olmo2"),
], ids=lambda x: str(x) if isinstance(x, str) else ",".join(x))
def test_config_options_the_fast_path_does_not_know_send_every_caller_to_the_hooked_model(kw, why):
    """scale_attn_by_inverse_layer_idx and post_embedding_ln passed the old check: ``analyze_tokens`` scored
    0.887 where the hooked model gives 0.953, ``answer_loss(fast=True)`` dropped the scaling, and MoE raised an
    AttributeError. Every option not known to compute the same now names itself and falls back."""
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import answer_loss
    from nope_interp.fast_forward import fast_activations, fast_logits, unsupported_reason
    from tasks import Batch

    model = _lens_model(**kw)
    assert why in unsupported_reason(model)
    tokens = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    with pytest.raises(NopeInterpError, match=why.split("=")[0]):
        fast_logits(model, tokens)
    if "original_architecture" in why:  # the hooked model computes something else than the fused pass would
        from nope_interp.fast_forward import _forward

        assert not torch.allclose(_forward(model, tokens, 0.0)[0], model(tokens, return_type="logits"), atol=1e-3)
    with pytest.raises(NopeInterpError, match=why.split("=")[0]):
        fast_activations(model, tokens, ["blocks.0.attn.hook_z"])
    batch = Batch(tokens, tokens.roll(-1, 1), torch.ones(3, 12, dtype=torch.bool))
    assert answer_loss(model, batch, fast=True) == answer_loss(model, batch)
    auto = analyze_tokens(model, tokens, ("z", "resid_post"))
    hooked = analyze_tokens(model, tokens, ("z", "resid_post"), forward="hooked")
    assert auto.scores == hooked.scores


def test_the_field_lists_name_real_config_fields_and_a_plain_name_is_not_special():
    import dataclasses

    from transformer_lens import HookedTransformerConfig

    from nope_interp import fast_forward as ff

    names = {f.name for f in dataclasses.fields(HookedTransformerConfig)}
    assert ff._FIELDS_ANY_VALUE <= names and ff._FIELDS_CHECKED <= names  # no typo hides a field
    assert not ff._FIELDS_ANY_VALUE & ff._FIELDS_CHECKED
    # every other field must keep its default: one that does not is named
    model = _lens_model(d_vocab_out=20)
    assert ff.unsupported_reason(model) is None
    assert not ff._special_architecture("GPT2LMHeadModel") and ff._special_architecture("Olmo3ForCausalLM")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_model_is_analysed_by_the_hooked_forward(dtype):
    """Before: the default (fast) path of a 16-bit model gave other scores than the hooked forward (up to 0.004
    per sequence in bfloat16, 0.001 in float16, on this model): TransformerLens normalises 16-bit models in
    float32, the fast forward did not. Now the default path is the hooked one, exactly."""
    import copy

    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError
    from nope_interp.fast_forward import fast_activations_unsupported
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    toks = torch.randint(0, model.cfg.d_vocab, (8, 16), generator=torch.Generator().manual_seed(1))
    low = copy.deepcopy(model).to(dtype)  # TransformerLens's to(dtype) sets cfg.dtype too
    assert low.cfg.dtype == dtype
    assert "layer norms in float32" in fast_activations_unsupported(low, ["blocks.0.attn.hook_z"])
    auto = analyze_tokens(low, toks).per_sequence["row_mean"]
    hooked = analyze_tokens(low, toks, forward="hooked").per_sequence["row_mean"]
    torch.testing.assert_close(auto, hooked, rtol=0, atol=0)
    with pytest.raises(NopeInterpError, match="forward='fast' does not support .*16 weights"):
        analyze_tokens(low, toks, forward="fast")
