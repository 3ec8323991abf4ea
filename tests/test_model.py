
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
