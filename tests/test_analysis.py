"""The adjacency analysis of one model (nope_interp.analysis): the pattern at init, and the input protocols."""

import pytest


def test_analyze_model_reproduces_the_pattern_at_init():
    """The paper's claims 1-2 on an initialised NoPE model of moderate width: ~0.5 at the embeddings,
    high after the first causal attention layer; and no pattern with bidirectional attention."""
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.model import build_model, preset

    task = tasks.get_task("reversal")
    res = analyze_model(build_model(preset("cpu", d_model=256, d_head=64, seed=2)), task, n_prompts=48)
    sc = res.scores["row_mean"]
    assert 0.4 < sc["hook_embed"]["mean"] < 0.6
    assert sc["blocks.0.attn.hook_z"]["mean"] > 0.9
    assert set(res.scores) == {"row_mean", "pooled"} and res.per_sequence["pooled"].shape == (len(res.sites), 48)
    bi_model = build_model(preset("cpu", d_model=256, d_head=64, attention="bidirectional"))
    bi = analyze_model(bi_model, task, n_prompts=48)
    assert 0.35 < bi.scores["row_mean"]["blocks.0.attn.hook_z"]["mean"] < 0.65


@pytest.mark.parametrize("protocol", ["full", "authors", "window"])
def test_protocol_is_recorded_and_inputs_have_the_protocol_length(tiny_model, protocol):
    import tasks
    from nope_interp.analysis import analyze_model

    task = tasks.get_task("reversal")
    res = analyze_model(tiny_model, task, 6, seed=2, points=("embed",), protocol=protocol, window=30)
    length = {"full": 22, "authors": 22, "window": 30}[protocol]
    assert res.protocol == protocol and res.to_dict()["protocol"] == protocol
    assert len(res.example_prompt) == length and res.example_sim.shape[-1] == length


def test_unknown_protocol_and_inputs_longer_than_n_ctx(tiny_model):
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError

    task = tasks.get_task("reversal")
    with pytest.raises(NopeInterpError, match="unknown protocol 'padded'"):
        analyze_model(tiny_model, task, 4, protocol="padded")
    with pytest.raises(NopeInterpError, match="window inputs of 100 tokens"):
        analyze_model(tiny_model, task, 4, protocol="window", window=100)


def test_typed_score_accessor_equals_the_json_scores(tiny_model):
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError

    res = analyze_model(tiny_model, tasks.get_task("addition"), 5, points=("embed", "z"))
    s = res.score("blocks.0.attn.hook_z", "pooled")
    assert (s.mean, s.std, s.n) == tuple(res.scores["pooled"]["blocks.0.attn.hook_z"][k] for k in ("mean", "std", "n"))
    with pytest.raises(NopeInterpError, match="was not analysed"):
        res.score("blocks.0.hook_resid_post")
    with pytest.raises(NopeInterpError, match="unknown reduction"):
        res.score("hook_embed", "median")
