import json

import pytest
import torch


@pytest.fixture
def M():
    import nope_interp.model as model

    return model


def _run(model, tokens):
    with torch.inference_mode():
        return model(tokens, return_type="logits")


@pytest.mark.parametrize("positional", ["none", "learned"])
def test_one_layer_causal_last_position_invariant_to_permuting_earlier_tokens(M, positional):
    """NoPE: attention at the last position is a set function of the earlier tokens (docs/method.md)."""
    cfg = M.preset("tiny", n_layers=1, positional=positional, seed=3)
    model = M.build_model(cfg)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.d_vocab, (4, 12), generator=gen)
    perm = torch.cat([torch.randperm(11, generator=gen), torch.tensor([11])])
    a, b = _run(model, tokens)[:, -1], _run(model, tokens[:, perm])[:, -1]
    if positional == "none":
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("positional", ["none", "learned", "rotary"])
def test_bidirectional_model_is_permutation_equivariant_only_without_positions(M, positional):
    cfg = M.preset("tiny", attention="bidirectional", positional=positional, seed=4)
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
