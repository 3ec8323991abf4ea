"""Diagnostics against closed forms: positional share, uniform attention, collapsed values."""

import pytest
import torch


def test_positional_share_closed_forms():
    from nope_interp.diagnostics import positional_share

    x = torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(0))
    assert positional_share(x[:1].expand(4, 7, 3)) == pytest.approx(1.0)   # identical prompts
    assert positional_share(torch.cat([x, -x])) == pytest.approx(0.0, abs=1e-12)                # zero mean at every p
    # by hand: batch * sum |mean|^2 / sum |h|^2
    ref = float(x.shape[0] * (x.double().mean(0) ** 2).sum() / (x.double() ** 2).sum())
    assert positional_share(x) == pytest.approx(ref)


def test_uniform_attention_has_entropy_one_and_equal_embeddings_collapse_the_values(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_attention_entropy, value_geometry
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=4))
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(6))
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
    assert layer0_attention_entropy(model, tokens) == pytest.approx(1.0, abs=1e-6)
    fresh = value_geometry(build_model(tiny_cfg.replace(seed=4)), task)
    assert fresh.digit_spread > 1.0 and fresh.delimiters == "$+="
    with torch.no_grad():
        model.embed.W_E[:] = model.embed.W_E[tasks.encode("7")[0]]   # every token the same vector
    geo = value_geometry(model, task)
    assert geo.digit_spread == pytest.approx(0.0, abs=1e-6) and geo.delimiter_norm_ratio == pytest.approx(1.0)
    d = diagnose(model, task, tokens)
    assert set(d) == {"l0_attention_entropy", "l0_z_positional_share", "digit_value_spread",
                      "delimiter_value_norm_ratio"}


def test_bad_input():
    from nope_interp.diagnostics import positional_share
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="batch >= 2"):
        positional_share(torch.ones(1, 3, 2))
    with pytest.raises(NopeInterpError, match="all-zero"):
        positional_share(torch.zeros(2, 3, 2))


@pytest.mark.parametrize(("tokens", "match"), [
    (torch.full((2, 5), -1), r"\[0, 96\).*got -1"), (torch.full((2, 5), 96), r"\[0, 96\).*got 96"),
    (torch.tensor([[1, 2], [3, 10**6]]), r"\[0, 96\).*got 1000000 at tokens\[1, 1\]"),
    (torch.zeros(2, 49, dtype=torch.long), r"n_ctx=48"),
])
def test_diagnostics_refuse_token_ids_outside_the_vocabulary(tiny_model, tokens, match):
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_attention_entropy
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        layer0_attention_entropy(tiny_model, tokens)
    with pytest.raises(NopeInterpError, match=match):
        diagnose(tiny_model, tasks.get_task("addition"), tokens)
