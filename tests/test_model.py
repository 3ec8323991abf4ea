
import pytest
import torch


@pytest.fixture
def M():
    import nope_interp.model as model

    return model


def _run(model, tokens):
    with torch.inference_mode():
        return model(tokens, return_type="logits")


@pytest.mark.parametrize("positional,options", [
    ("none", {}), ("learned", {}), ("none", {"tied_embeddings": True, "dropout": 0.2}),
])
def test_one_layer_causal_last_position_invariant_to_permuting_earlier_tokens(M, positional, options):
    """NoPE: attention at the last position is a set function of the earlier tokens (docs/method.md);
    also with tied embeddings and dropout (eval mode)."""
    cfg = M.preset("tiny", n_layers=1, positional=positional, seed=3, **options)
    model = M.build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.d_vocab, (4, 12), generator=gen)
    perm = torch.cat([torch.randperm(11, generator=gen), torch.tensor([11])])
    a, b = _run(model, tokens)[:, -1], _run(model, tokens[:, perm])[:, -1]
    if positional == "none":
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("positional,options", [
    ("none", {}), ("learned", {}), ("rotary", {}), ("none", {"tied_embeddings": True, "dropout": 0.2}),
])
def test_bidirectional_model_is_permutation_equivariant_only_without_positions(M, positional, options):
    cfg = M.preset("tiny", attention="bidirectional", positional=positional, seed=4, **options)
    model = M.build_model(cfg)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.d_vocab, (3, 10), generator=gen)
    perm = torch.randperm(10, generator=gen)
    a, b = _run(model, tokens)[:, perm], _run(model, tokens[:, perm])
    if positional == "none":
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert (a - b).abs().max() > 1e-4


def test_nope_forward_equals_a_hand_written_forward_without_positions(M):
    """A golden reference (pyvene's idea, scaled down): embed -> LN -> causal attention -> LN -> MLP -> unembed."""
    cfg = M.preset("tiny", n_layers=1, seed=5)
    model = M.build_model(cfg)
    tokens = torch.randint(0, cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    blk = model.blocks[0]

    def ln(x, eps=1e-5):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    x = model.embed.W_E[tokens]
    h = ln(x)
    q = torch.einsum("bpd,hde->bphe", h, blk.attn.W_Q)
    k = torch.einsum("bpd,hde->bphe", h, blk.attn.W_K)
    v = torch.einsum("bpd,hde->bphe", h, blk.attn.W_V)
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.d_head**0.5
    mask = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)
    pattern = scores.masked_fill(mask, float("-inf")).softmax(-1)
    z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
    x = x + torch.einsum("bqhe,hed->bqd", z, blk.attn.W_O)
    x = x + torch.nn.functional.gelu(ln(x) @ blk.mlp.W_in) @ blk.mlp.W_out
    ref = ln(x) @ model.unembed.W_U
    torch.testing.assert_close(_run(model, tokens), ref, rtol=1e-4, atol=1e-5)


def test_pos_embed_is_zero_and_stays_zero_after_an_optimizer_step(M):
    cfg = M.preset("tiny")
    model = M.build_model(cfg)
    assert not model.pos_embed.W_pos.requires_grad and torch.all(model.pos_embed.W_pos == 0)
    tokens = torch.randint(0, 96, (2, 9))
    _, cache = model.run_with_cache(tokens, names_filter="hook_pos_embed")
    assert torch.all(cache["hook_pos_embed"] == 0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    model(tokens, return_type="loss").backward()
    opt.step()
    assert torch.all(model.pos_embed.W_pos == 0)
    M.check_nope(model, cfg)


def test_init_draws_every_matrix_from_the_configured_normal_with_a_local_generator(M):
    cfg = M.preset("tiny", init_mean=4.0, init_std=0.2, d_model=64, d_head=32, d_mlp=256)
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    model = M.build_model(cfg)
    assert torch.equal(torch.rand(3), before), "build_model must not touch the global RNG"
    seen = set()
    for name, p in model.named_parameters():
        leaf = name.split(".")[-1]
        if leaf in M.WEIGHT_MATRICES:
            seen.add(leaf)
            assert abs(p.mean().item() - 4.0) < 0.05 and abs(p.std().item() - 0.2) < 0.03, name
        elif leaf.startswith("b") or leaf == "W_pos":
            assert torch.all(p == 0) and not p.requires_grad, name
    assert seen == set(M.WEIGHT_MATRICES)
    again = M.build_model(cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_tied_embeddings_share_one_parameter_through_training_and_save_load(M, tmp_path):
    from nope_interp import io
    from nope_interp.config import TrainConfig
    from nope_interp.train import make_optimizer

    cfg = M.preset("tiny", tied_embeddings=True, seed=7)
    model = M.build_model(cfg)
    assert "unembed.W_U" not in model.state_dict() and model.unembed.W_U.data_ptr() == model.embed.W_E.data_ptr()
    tokens = torch.randint(0, cfg.d_vocab, (4, 9), generator=torch.Generator().manual_seed(2))
    opt = make_optimizer(model, TrainConfig(lr=1e-2))
    for _ in range(3):
        model.train()
        loss = model(tokens, return_type="loss")
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    torch.testing.assert_close(model.W_U, model.W_E.T, rtol=0, atol=0)
    # logits are residual @ W_E.T exactly
    _, cache = model.run_with_cache(tokens, names_filter="unembed.hook_in")
    torch.testing.assert_close(_run(model, tokens), cache["unembed.hook_in"] @ model.W_E.T)
    io.save_weights(tmp_path / "w.safetensors", model.state_dict())
    again = M.build_model(cfg)
    again.load_state_dict(io.load_weights(tmp_path / "w.safetensors"))
    torch.testing.assert_close(_run(again, tokens), _run(model, tokens), rtol=0, atol=0)
    untied = M.build_model(M.preset("tiny", seed=7))
    assert "unembed.W_U" in untied.state_dict()


def test_dropout_acts_in_train_mode_only(M):
    cfg = M.preset("tiny", dropout=0.3, seed=8)
    model, plain = M.build_model(cfg), M.build_model(cfg.replace(dropout=0.0))
    plain.load_state_dict(model.state_dict())
    tokens = torch.randint(0, cfg.d_vocab, (3, 10), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(_run(model, tokens), _run(plain, tokens), rtol=0, atol=0)   # eval: no dropout
    model.reset_hooks()  # permanent hooks survive a reset
    model.train()
    a, b = _run(model, tokens), _run(model, tokens)
    assert (a - b).abs().max() > 1e-3 and (a - _run(plain, tokens)).abs().max() > 1e-3
    _, cache = model.run_with_cache(tokens, names_filter="hook_embed")
    zeros = (cache["hook_embed"] == 0).double().mean()
    assert 0.2 < zeros < 0.4   # about p of the embedding entries are dropped
    model.eval()
    torch.testing.assert_close(_run(model, tokens), _run(plain, tokens), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs,match", [({"dropout": 1.0}, "dropout"), ({"dropout": -0.1}, "dropout"),
                                          ({"dropout": float("nan")}, "dropout")])
def test_bad_architecture_options(M, kwargs, match):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        M.preset("tiny", **kwargs)


def test_paper_recipe_preset(M):
    cfg = M.preset("paper-recipe")
    assert cfg.tied_embeddings and cfg.dropout == 0.2
    assert cfg.replace(tied_embeddings=False, dropout=0.0) == M.preset("paper")


#: Token batches that are not ids in [0, d_vocab=96) of a 2-D integer tensor, and what the message must say.
BAD_TOKENS = [
    (lambda: torch.full((1, 5), -1), r"tokens must be token ids in \[0, 96\).*got -1 at tokens\[0, 0\]"),
    (lambda: torch.tensor([[3, 4, 96]]), r"in \[0, 96\).*got 96 at tokens\[0, 2\]"),
    (lambda: torch.tensor([[1, 2], [500, 7]]), r"in \[0, 96\).*got 500 at tokens\[1, 0\].*max 500"),
    (lambda: torch.tensor([[0, -2**40]]), r"in \[0, 96\).*min -1099511627776"),
    (lambda: torch.tensor([[1, -3]], dtype=torch.int32), r"in \[0, 96\).*got -3 at tokens\[0, 1\]"),
    (lambda: torch.tensor([[1, 200]], dtype=torch.uint8), r"in \[0, 96\).*got 200"),
    (lambda: torch.tensor([[1.0, 2.0]]), r"integer token ids.*float32"),
    (lambda: torch.tensor([[True, False]]), r"integer token ids.*bool"),
    (lambda: torch.tensor([1, 2, 3]), r"2-D.*\(3,\)"),
    (lambda: torch.zeros(0, 5, dtype=torch.long), r"2-D \(batch >= 1, pos >= 1\).*\(0, 5\)"),
    (lambda: torch.zeros(2, 0, dtype=torch.long), r"2-D \(batch >= 1, pos >= 1\).*\(2, 0\)"),
    (lambda: [[1, 2, 3]], r"torch tensor of integer token ids, got list"),
]


@pytest.mark.parametrize(("make", "match"), BAD_TOKENS)
def test_check_tokens_refuses_what_is_not_an_id_batch_of_the_vocabulary(M, tiny_model, make, match):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        M.check_tokens(tiny_model, make())


def test_check_tokens_returns_valid_ids_as_long(M, tiny_model):
    for toks in (torch.tensor([[0, 95, 7]]), torch.tensor([[0, 95]], dtype=torch.int32),
                 torch.tensor([[5]], dtype=torch.uint8), torch.arange(96).reshape(2, 48)):
        out = M.check_tokens(tiny_model, toks)
        assert out.dtype == torch.long and torch.equal(out, toks.long())


@pytest.mark.parametrize("device,match", [
    ("tpu", "device must be one of auto, cpu, cuda or cuda:N"), ("gpu", "device must be one of"),
    ("CPU", "device must be one of"), (" cpu", "device must be one of"), ("cuda:x", "device must be one of"),
    ("cuda:\u0661", "device must be one of"), ("meta", "got 'meta'"), ("cuda:99", "cuda:99"),
])
def test_build_model_names_a_bad_device_in_one_line(M, tiny_cfg, device, match):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match) as err:
        M.build_model(tiny_cfg, device=device)
    assert "\n" not in str(err.value)


def test_check_device_accepts_the_documented_devices(M):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    assert M.check_device("cpu") == torch.device("cpu") == M.check_device(torch.device("cpu"))
    assert M.check_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in (3, None, b"cpu"):
        with pytest.raises(NopeInterpError, match="device must be one of"):
            unhooked(M.check_device)(bad)
    if not torch.cuda.is_available():
        with pytest.raises(NopeInterpError, match="CUDA is not available"):
            M.check_device("cuda")


def test_build_model_refuses_a_config_that_is_not_a_model_config(M):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    for bad in ({"n_layers": 2}, "tiny", None):
        with pytest.raises(NopeInterpError, match="cfg must be a ModelConfig"):
            unhooked(M.build_model)(bad)


def test_load_state_names_missing_unexpected_and_mismatched_keys(M, tiny_model):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    good = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    cases = [
        ({k: v for k, v in good.items() if k != "blocks.0.attn.W_Q"}, "1 missing keys: 'blocks.0.attn.W_Q'"),
        ({**good, "blocks.9.mlp.W_in": torch.zeros(2)}, "1 unexpected keys: 'blocks.9.mlp.W_in'"),
        ({**good, "embed.W_E": torch.zeros(3, 3)}, "'embed.W_E' is (3, 3) in the file, (96, 32) in the model"),
        ({**good, "unembed.b_U": [0.0]}, "entries that are not tensors: 'unembed.b_U' (list)"),
        ({k: v for k, v in good.items() if not k.startswith("blocks.1.")}, "'blocks.1.ln2.w' and 15 more"),
    ]
    for state, match in cases:
        with pytest.raises(NopeInterpError, match="do not match the model config") as err:
            M.load_state(tiny_model, state, "the weights x.safetensors")
        assert match in str(err.value) and "\n" not in str(err.value)
    assert "18 missing keys" in str(pytest.raises(NopeInterpError, M.load_state, tiny_model,
                                             {k: v for k, v in good.items() if not k.startswith("blocks.1.")}).value)
    with pytest.raises(NopeInterpError, match="is not a state dict"):
        unhooked(M.load_state)(tiny_model, [1, 2], "the weights x")
    M.load_state(tiny_model, good)  # a matching state loads


def test_n_parameters_counts_what_transformer_lens_allocates(M):
    for cfg in [*M.PRESETS.values(), M.preset("tiny", tied_embeddings=True), M.preset("tiny", positional="rotary"),
                M.preset("tiny", positional="learned", biases=True)]:
        model = M.build_model(cfg)
        assert M.n_parameters(cfg) == sum(p.numel() for p in model.parameters())


def test_build_model_refuses_a_model_larger_than_the_free_memory_before_allocating(M):
    for overrides in ({"d_model": 1_000_000, "n_heads": 1, "d_head": 1_000_000},
                      {"n_layers": 1_000_000}, {"d_mlp": 1_000_000, "n_layers": 100_000}):
        cfg = M.preset("paper", **overrides)
        with pytest.raises(M.NopeInterpError, match=r"needs about [0-9.]+ [GT]iB \(weights .*\) but only .* is free"):
            M.build_model(cfg)
    assert M.available_memory_bytes("cpu") > M.model_memory_bytes(M.preset("paper"))
    assert M.available_memory_bytes("tpu") is None and M.format_bytes(3 * 2**30) == "3.0 GiB"


def _logits(model, tokens):
    with torch.inference_mode():
        return model(tokens, return_type="logits")


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_sliding_window_position_sees_exactly_the_last_window_tokens(M, window):
    """One sliding-window NoPE layer: the output at position i depends on tokens i - window + 1 .. i only.
    Changing every token before the window leaves it unchanged (exactly); changing one token inside does not.
    With several layers the receptive field grows to n_layers * (window - 1) + 1, so one layer proves the mask."""
    cfg = M.preset("tiny", n_layers=1, attention="sliding", window=window, seed=7)
    model = M.build_model(cfg)
    gen = torch.Generator().manual_seed(window)
    n = 12
    tokens = torch.randint(0, cfg.d_vocab, (3, n), generator=gen)
    base = _logits(model, tokens)
    for i in range(window, n):
        first = i - window + 1  # the first position inside the window
        outside = tokens.clone()
        outside[:, :first] = (tokens[:, :first] + 1 + torch.randint(0, cfg.d_vocab - 1, (3, first), generator=gen)) \
            % cfg.d_vocab
        assert bool((outside[:, :first] != tokens[:, :first]).all())
        torch.testing.assert_close(_logits(model, outside)[:, i], base[:, i], rtol=0, atol=0)
        for j in range(first, i + 1):  # any one token inside the window (the query included) matters
            inside = tokens.clone()
            inside[:, j] = (tokens[:, j] + 1) % cfg.d_vocab
            assert float((_logits(model, inside)[:, i] - base[:, i]).abs().max()) > 1e-5


def test_sliding_window_in_two_layers_grows_the_receptive_field(M):
    """Two layers of window w: position i sees tokens from i - 2 (w - 1) on, and nothing before."""
    w, n = 3, 12
    cfg = M.preset("tiny", attention="sliding", window=w, seed=8)
    model = M.build_model(cfg)
    tokens = torch.randint(0, cfg.d_vocab, (2, n), generator=torch.Generator().manual_seed(3))
    base, i = _logits(model, tokens), n - 1
    first = i - 2 * (w - 1)
    outside = tokens.clone()
    outside[:, :first] = (tokens[:, :first] + 1) % cfg.d_vocab
    torch.testing.assert_close(_logits(model, outside)[:, i], base[:, i], rtol=0, atol=0)
    inside = tokens.clone()
    inside[:, first] = (tokens[:, first] + 1) % cfg.d_vocab
    assert float((_logits(model, inside)[:, i] - base[:, i]).abs().max()) > 1e-5


@pytest.mark.parametrize("extra", [0, 5])
def test_sliding_window_at_least_the_context_is_the_causal_model(M, extra):
    cfg = M.preset("tiny", seed=9)
    sliding = M.build_model(cfg.replace(attention="sliding", window=cfg.n_ctx + extra))
    causal = M.build_model(cfg)
    assert sliding.blocks[0].attn.attn_type == "local" and sliding.cfg.window_size == cfg.n_ctx + extra
    tokens = torch.randint(0, cfg.d_vocab, (3, cfg.n_ctx), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_logits(sliding, tokens), _logits(causal, tokens), rtol=0, atol=0)


def test_sliding_window_model_falls_back_from_the_fast_forward(M):
    from nope_interp.fast_forward import unsupported_reason

    model = M.build_model(M.preset("tiny", attention="sliding", window=4))
    assert model.cfg.attention_dir == "causal" and model.cfg.attn_types == ["local", "local"]
    assert "local attention" in unsupported_reason(model)
    assert unsupported_reason(M.build_model(M.preset("tiny"))) is None


def test_normalization_none_has_no_norm_modules_and_nope_stays_exact(M):
    from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

    from nope_interp.fast_forward import unsupported_reason

    cfg = M.preset("tiny", n_layers=1, normalization="none", seed=3)
    model = M.build_model(cfg)
    assert model.cfg.normalization_type is None
    assert not any(isinstance(m, (LayerNorm, LayerNormPre, RMSNorm, RMSNormPre)) for m in model.modules())
    assert not any(".ln" in name or name.startswith("ln") for name, _ in model.named_parameters())
    assert not any(name.endswith(".w") or ".ln" in name for name in model.state_dict())
    assert unsupported_reason(model) is None  # the trainer's fast forward covers it
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.d_vocab, (4, 12), generator=gen)
    perm = torch.cat([torch.randperm(11, generator=gen), torch.tensor([11])])
    torch.testing.assert_close(_logits(model, tokens)[:, -1], _logits(model, tokens[:, perm])[:, -1],
                               rtol=1e-5, atol=1e-5)
    with_ln = M.build_model(cfg.replace(normalization="LN"))
    assert float((_logits(with_ln, tokens) - _logits(model, tokens)).abs().max()) > 1e-4


@pytest.mark.parametrize("overrides", [{"normalization": n} for n in ("LN", "LNPre", "RMS", "RMSPre", "none")]
                         + [{"attention": "sliding", "window": 3}])
def test_n_parameters_for_every_normalization_and_sliding_window(M, overrides):
    cfg = M.preset("tiny", **overrides)
    assert M.n_parameters(cfg) == sum(p.numel() for p in M.build_model(cfg).parameters())


def test_hybrid_rotary_model_has_nope_layers_where_asked():
    """nope_layers: measured per layer from the hooks; every layer NoPE gives exactly the NoPE model's function
    (same weights), one NoPE layer differs from the all-rotary model; with_context keeps the hybrid."""
    import dataclasses

    from nope_interp.config import preset
    from nope_interp.model import build_model, with_context
    from nope_interp.positional import layer_positional_types

    cfg = preset("tiny", n_layers=3, positional="rotary", nope_layers=(1,))
    hybrid = build_model(cfg)
    assert layer_positional_types(hybrid) == ("rope", "nope", "rope")
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    rotary = build_model(dataclasses.replace(cfg, nope_layers=None))
    rotary.load_state_dict(hybrid.state_dict())
    assert not torch.allclose(rotary(tokens), hybrid(tokens), atol=1e-4)
    all_nope = build_model(dataclasses.replace(cfg, nope_layers=(0, 1, 2)))
    nope = build_model(dataclasses.replace(cfg, positional="none", nope_layers=None))
    params = dict(all_nope.named_parameters())
    nope.load_state_dict({k: params.get(k, v) for k, v in nope.state_dict().items()})
    assert layer_positional_types(all_nope) == ("nope", "nope", "nope")
    torch.testing.assert_close(all_nope(tokens), nope(tokens), atol=1e-5, rtol=1e-5)
    longer, longer_cfg = with_context(hybrid, cfg, 96)
    assert longer_cfg.nope_layers == (1,) and layer_positional_types(longer) == ("rope", "nope", "rope")
    torch.testing.assert_close(longer(tokens), hybrid(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides,match", [
    ({"nope_layers": (1,)}, "needs positional='rotary'"),
    ({"positional": "rotary", "nope_layers": ()}, "must not be empty"),
    ({"positional": "rotary", "nope_layers": (2,)}, "nope_layers"),
    ({"positional": "rotary", "nope_layers": (1, 0)}, "strictly increasing"),
    ({"positional": "rotary", "nope_layers": (0, 0)}, "nope_layers lists 0 more than once"),
    ({"positional": "rotary", "nope_layers": (-1,)}, "nope_layers"),
])
def test_bad_nope_layers_are_refused(overrides, match):
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        preset("tiny", **overrides)


def test_eval_mode_restores_every_submodules_mode_also_on_an_exception():
    from nope_interp.config import preset
    from nope_interp.model import build_model, eval_mode, evaluates

    model = build_model(preset("tiny", dropout=0.3))
    model.train()
    model.blocks[0].eval()  # a mixed state must come back as it was
    before = [m.training for m in model.modules()]
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == before
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("boom")
    assert [m.training for m in model.modules()] == before

    @evaluates
    def gen(model, n):
        for _ in range(n):
            yield model.training  # seen while iterating

    assert list(gen(model, 2)) == [False, False] and [m.training for m in model.modules()] == before
    drawn = gen(model, 3)   # before: a half-drawn generator held the model in eval mode until collected
    assert next(drawn) is False and [m.training for m in model.modules()] == before
    assert next(drawn) is False and [m.training for m in model.modules()] == before
    drawn.close()
    assert [m.training for m in model.modules()] == before
    assert evaluates(lambda model: model.training)(model=model) is False
    with eval_mode("not a module"):  # anything else is left alone
        pass


@pytest.mark.parametrize("measure", ["analyze_tokens", "collect_activations", "averaging_report",
                                     "exact_match_accuracy", "layer_positional_types", "cosine_example"])
def test_every_measurement_of_a_model_left_in_train_mode_runs_without_dropout(measure):
    """A user who trained or fine-tuned a model and forgot ``model.eval()``: the numbers must not move from
    call to call (dropout 0.5 would move them), must equal those in eval mode, and the mode is handed back."""
    import tasks
    from nope_interp import activations, analysis, averaging_checks, evaluate, positional
    from nope_interp.config import preset
    from nope_interp.model import build_model

    task = tasks.get_task("reversal", n_digits=4)
    tokens = task.analysis_tokens(8, 0)
    calls = {
        "analyze_tokens": lambda m: analysis.analyze_tokens(m, tokens, ("z", "resid_post")).scores["row_mean"],
        "collect_activations": lambda m: activations.collect_activations(m, tokens, ("z",)).acts.sum().item(),
        "averaging_report": lambda m: averaging_checks.averaging_report(m, task, n_prompts=8).to_dict(),
        "exact_match_accuracy": lambda m: evaluate.predict(m, task, task.analysis_prompts(8, 1)),
        "layer_positional_types": lambda m: positional.layer_positional_types(m, tokens),
        "cosine_example": lambda m: averaging_checks.cosine_example(m, task).observed.sum().item(),
    }
    model = build_model(preset("tiny", dropout=0.5, seed=3))
    model.eval()
    reference = calls[measure](model)
    model.train()
    assert calls[measure](model) == reference and calls[measure](model) == reference
    assert all(m.training for m in model.modules())


def test_iter_activations_left_half_drawn_hands_the_model_back_in_train_mode():
    """Between chunks the model is in the caller's mode; each chunk is still computed without dropout."""
    import tasks
    from nope_interp.activations import collect_activations, iter_activations
    from nope_interp.config import preset
    from nope_interp.model import build_model

    tokens = tasks.get_task("reversal", n_digits=4).analysis_tokens(6, 0)
    model = build_model(preset("tiny", dropout=0.5, seed=3))
    reference = collect_activations(model.eval(), tokens, ("z",), batch_size=2).acts
    model.train()
    chunks = iter_activations(model, tokens, ("z",), batch_size=2)
    first = next(chunks)
    assert all(m.training for m in model.modules())     # the user's model, as they left it
    torch.testing.assert_close(first.acts, reference[:, :2], rtol=0, atol=0)
    model.blocks[0].eval()                                # a change made between chunks is kept
    second = next(chunks)
    torch.testing.assert_close(second.acts, reference[:, 2:4], rtol=0, atol=0)
    assert not model.blocks[0].training and model.blocks[1].training


def test_a_config_that_does_not_describe_the_model_is_refused_not_applied(tiny_cfg):
    """Before: with_context copied a learned-position model without its positions (logits moved by 0.38) and
    init_weights wrote positional weights into a NoPE model, both without a word."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model, init_weights, with_context

    nope = build_model(tiny_cfg)
    learned_cfg = tiny_cfg.replace(positional="learned")
    learned = build_model(learned_cfg)
    cases = [
        (lambda: with_context(learned, tiny_cfg, 100), "has positional embeddings .*positional='none'"),
        (lambda: init_weights(nope, learned_cfg), "no positional embeddings .*positional='learned'"),
        (lambda: init_weights(learned, tiny_cfg), "has positional embeddings"),
        (lambda: with_context(nope, tiny_cfg.replace(n_ctx=20), 100), "n_ctx=48 in the model, 20 from cfg"),
        (lambda: with_context(nope, tiny_cfg.replace(d_mlp=2 * tiny_cfg.d_mlp), 100), "d_mlp"),
        (lambda: with_context(nope, tiny_cfg.replace(tied_embeddings=not tiny_cfg.tied_embeddings), 100),
         "tied embeddings"),
        (lambda: unhooked(init_weights)(nope, 3), "cfg must be a ModelConfig"),
    ]
    for call, words in cases:
        with pytest.raises(NopeInterpError, match=f"does not describe this model: .*{words}|{words}"):
            call()
    w_pos = nope.pos_embed.W_pos.clone()
    init_weights(nope, tiny_cfg)   # the matching config still re-initialises
    assert torch.equal(nope.pos_embed.W_pos, w_pos) and not bool(w_pos.any())
    assert with_context(nope, tiny_cfg, 100)[1].n_ctx == 100


def test_a_model_or_cache_on_the_meta_device_is_one_line_error():
    """A meta-device model failed in Tensor.item() (analyze_tokens) or NotImplementedError (entropy, the lens)."""
    import torch

    from nope_interp.analysis import analyze_tokens
    from nope_interp.config import preset
    from nope_interp.diagnostics import layer0_attention_entropy
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores, averaging_check
    from nope_interp.model import build_model

    real = build_model(preset("tiny"))
    tokens = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(0))
    meta = build_model(preset("tiny")).to("meta")
    for fn in (lambda: analyze_tokens(meta, tokens), lambda: layer0_attention_entropy(meta, tokens)):
        with pytest.raises(NopeInterpError, match="parameters on the meta device"):
            fn()
    _, cache = real.run_with_cache(tokens)
    cache.cache_dict["blocks.0.attn.hook_pattern"] = cache["blocks.0.attn.hook_pattern"].to("meta")
    for fn in (lambda: averaging_check(cache, 0), lambda: adjacency_scores(cache)):
        with pytest.raises(NopeInterpError, match="meta-device tensors .* at blocks.0.attn.hook_pattern"):
            fn()


@pytest.mark.parametrize("entry", ["check_tokens", "collect_activations", "analyze_tokens", "layer_positional_types",
                                   "diagnose"])
@pytest.mark.parametrize("device", ["meta", "sparse"])
def test_tokens_without_data_are_refused_by_every_entry_point(tiny_model, entry, device):
    """Before: tokens on the meta device raised "Tensor.item() cannot be called on meta tensors"."""
    import importlib

    import tasks
    from nope_interp.errors import NopeInterpError

    good = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(0))
    tokens = good.to("meta") if device == "meta" else good.to_sparse()
    module = {"check_tokens": "model", "collect_activations": "activations", "analyze_tokens": "analysis",
              "layer_positional_types": "positional", "diagnose": "diagnostics"}[entry]
    fn = getattr(importlib.import_module(f"nope_interp.{module}"), entry)
    args = (tiny_model, tasks.get_task("addition"), tokens) if entry == "diagnose" else (tiny_model, tokens)
    with pytest.raises(NopeInterpError, match=r"tokens must be a dense tensor with data, got one (on the meta|of la)"):
        fn(*args)
