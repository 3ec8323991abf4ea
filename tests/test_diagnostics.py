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
    from nope_interp.errors import DegenerateInputWarning

    with pytest.warns(DegenerateInputWarning, match=r"layer0_interventions: .* at 4 site\(s\)") as caught:
        d = diagnose(model, task, tokens)   # every position the same vector: warned once, not four times
    assert len([w for w in caught if issubclass(w.category, DegenerateInputWarning)]) == 1
    assert set(d) == {"l0_attention_entropy", "l0_z_positional_share", "digit_value_spread",
                      "delimiter_value_norm_ratio", "l0_z_score_none", "l0_z_score_uniform_attention",
                      "l0_z_score_neutral_delimiters", "l0_z_score_both"}


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
    from nope_interp.diagnostics import diagnose, layer0_attention_entropy, layer0_interventions
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        layer0_attention_entropy(tiny_model, tokens)
    with pytest.raises(NopeInterpError, match=match):
        diagnose(tiny_model, tasks.get_task("addition"), tokens)
    with pytest.raises(NopeInterpError, match=match):
        layer0_interventions(tiny_model, tokens)


def _reference_scores(model, tokens, pattern_kind, neutral, content_ids, seed):
    """Layer-0 ``hook_z`` recomputed by hand from the cached pattern and values, scored by the pairwise loop."""
    from nope_interp.similarity import adjacency_counts_naive, cosine_similarity_matrix, row_pair_counts

    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in ("blocks.0.attn.hook_pattern",
                                                                            "blocks.0.attn.hook_v"))
    pattern, v = cache["blocks.0.attn.hook_pattern"].double(), cache["blocks.0.attn.hook_v"].double()
    n = tokens.shape[1]
    if pattern_kind == "uniform":  # closed form: row q is 1/(q+1) on keys 0..q
        pattern = (torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]).double().expand_as(pattern)
    if neutral:
        # each content token's value from a one-token forward pass of its own
        values = torch.stack([model.run_with_cache(torch.tensor([[i]]))[1]["blocks.0.attn.hook_v"][0, 0]
                              for i in content_ids]).double()
        draw = torch.randint(len(content_ids), tokens.shape, generator=torch.Generator().manual_seed(seed))
        delimiter = torch.tensor([[int(t) not in content_ids for t in row] for row in tokens])
        v = torch.where(delimiter[..., None, None], values[draw], v)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v).flatten(-2)
    counts = adjacency_counts_naive(cosine_similarity_matrix(z)).double()[:, 2:]
    return float((counts / row_pair_counts(n)[2:]).mean(-1).mean())


@pytest.mark.parametrize(("task_name", "seed"), [("addition", 0), ("reversal", 3), ("indexing", 5)])
def test_layer0_interventions_match_a_hand_computation(tiny_cfg, task_name, seed):
    import tasks
    from nope_interp.diagnostics import INTERVENTIONS, layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=seed)).eval()
    task = tasks.get_task(task_name)
    tokens = task.prompt_tokens(task.analysis_prompts(5, seed=seed))[:, :40]
    got = layer0_interventions(model, tokens, seed=seed)
    assert list(got) == list(INTERVENTIONS)
    ids = sorted(set(tasks.encode("0123456789")))
    ref = {"none": _reference_scores(model, tokens, None, False, ids, seed),
           "uniform_attention": _reference_scores(model, tokens, "uniform", False, ids, seed),
           "neutral_delimiters": _reference_scores(model, tokens, None, True, ids, seed),
           "both": _reference_scores(model, tokens, "uniform", True, ids, seed)}
    for kind in INTERVENTIONS:
        assert got[kind] == pytest.approx(ref[kind], abs=1e-9), kind
    # the resampled values differ from the model's own, so the draw matters
    assert got["neutral_delimiters"] != got["none"]


def test_layer0_interventions_closed_forms(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=2)).eval()
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(6, seed=1))
    # every character of the prompts counts as content: nothing is resampled
    same = layer0_interventions(model, tokens, content="0123456789$+=")
    assert same["neutral_delimiters"] == same["none"] and same["both"] == same["uniform_attention"]
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()   # attention already uniform
    d = layer0_interventions(model, tokens)
    assert d["uniform_attention"] == pytest.approx(d["none"], abs=1e-12)
    assert d["both"] == pytest.approx(d["neutral_delimiters"], abs=1e-12)
    # the score at `none` is the analysis' own score at blocks.0.attn.hook_z
    from nope_interp.analysis import analyze_tokens

    res = analyze_tokens(model, tokens, task="addition")
    assert d["none"] == pytest.approx(res.scores["row_mean"]["blocks.0.attn.hook_z"]["mean"], abs=1e-12)


def test_layer0_interventions_bad_input(tiny_cfg, tiny_model):
    import tasks
    from nope_interp.diagnostics import layer0_interventions
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    tokens = tasks.get_task("addition").prompt_tokens(["$123+456="] * 2)
    with pytest.raises(NopeInterpError, match="content must be a non-empty string"):
        layer0_interventions(tiny_model, tokens, content="")
    with pytest.raises(NopeInterpError, match="content:.*not in the vocabulary"):
        layer0_interventions(tiny_model, tokens, content="0é")
    with pytest.raises(NopeInterpError, match="3 positions"):
        layer0_interventions(tiny_model, tokens[:, :2])
    learned = build_model(tiny_cfg.replace(positional="learned"))
    with pytest.raises(NopeInterpError, match="NoPE models"):
        layer0_interventions(learned, tokens)
