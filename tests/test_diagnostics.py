"""Diagnostics against closed forms: positional share, uniform attention, collapsed values."""

import numpy as np
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
    assert 5.0 < fresh.digit_participation_ratio <= 9.0   # random init: the 10 values spread over many directions
    with torch.no_grad():
        model.embed.W_E[:] = model.embed.W_E[tasks.encode("7")[0]]   # every token the same vector
    geo = value_geometry(model, task)
    assert geo.digit_spread == pytest.approx(0.0, abs=1e-6) and geo.delimiter_norm_ratio == pytest.approx(1.0)
    from nope_interp.errors import DegenerateInputWarning

    warned = r"diagnose: .* at 4 site\(s\).*\(both, 8 draws\) \(48/48\)"
    with pytest.warns(DegenerateInputWarning, match=warned) as caught:
        d = diagnose(model, task, tokens)   # every position the same vector: warned once, not four times
    assert len([w for w in caught if issubclass(w.category, DegenerateInputWarning)]) == 1
    assert set(d) == {"l0_attention_entropy", "l0_min_head_entropy", "l0_z_positional_share", "digit_value_spread",
                      "delimiter_value_norm_ratio", "digit_value_participation_ratio",
                      "l0_z_score_none", "l0_z_score_uniform_attention",
                      "l0_z_score_neutral_delimiters", "l0_z_score_both"}


def test_bad_input():
    from nope_interp.diagnostics import positional_share
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="batch >= 2"):
        positional_share(torch.ones(1, 3, 2))
    assert np.isnan(positional_share(torch.zeros(2, 3, 2)))   # undefined (0 / 0): NaN, as participation_ratio


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


def _reference_scores(model, tokens, pattern_kind, draw, content_ids):
    """Layer-0 ``hook_z`` recomputed by hand from the cached pattern and values, scored by the pairwise loop;
    ``draw`` (batch pos: an index into ``content_ids``) resamples the non-content tokens' values. ``z`` is
    formed in the model's float32 as TransformerLens forms it (``pattern @ v``): a draw that repeats the
    first position's value makes z_0 and z_1 parallel, an exact tie in float64 that float32 rounding breaks
    either way, so a float64 reference would disagree on such rows (ties count as failures)."""
    from nope_interp.similarity import adjacency_counts_naive, cosine_similarity_matrix, row_pair_counts

    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in ("blocks.0.attn.hook_pattern",
                                                                            "blocks.0.attn.hook_v"))
    pattern, v = cache["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_v"]
    n = tokens.shape[1]
    if pattern_kind == "uniform":  # closed form: row q is 1/(q+1) on keys 0..q
        mask = torch.tril(torch.ones(n, n, dtype=torch.float64))
        pattern = (mask / mask.sum(-1, keepdim=True)).to(pattern.dtype).expand_as(pattern).clone()
    if draw is not None:
        # each content token's value from a one-token forward pass of its own
        values = torch.stack([model.run_with_cache(torch.tensor([[i]]))[1]["blocks.0.attn.hook_v"][0, 0]
                              for i in content_ids])
        delimiter = torch.tensor([[int(t) not in content_ids for t in row] for row in tokens])
        v = torch.where(delimiter[..., None, None], values[draw], v)
    z = (pattern @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).flatten(-2)
    counts = adjacency_counts_naive(cosine_similarity_matrix(z)).double()[:, 2:]
    return float((counts / row_pair_counts(n)[2:]).mean(-1).mean())


def _reference_draws(tokens, ids, seed, n_draws):
    """The documented draws, by loops: per draw one uniform index per position and one redraw per sequence
    (from one generator seeded with ``seed``); content tokens keep their own value; positions 0 and 1 never
    share a value when a delimiter is among them (position 1 is redrawn if it is a delimiter, else 0)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_draws):
        draw = torch.randint(len(ids), tokens.shape, generator=gen)
        redraw = torch.randint(len(ids) - 1, (tokens.shape[0],), generator=gen)
        index = draw.clone()
        for b, row in enumerate(tokens.tolist()):
            for p, t in enumerate(row):
                if t in ids:
                    index[b, p] = ids.index(t)
            delim = [t not in ids for t in row[:2]]
            if index[b, 0] == index[b, 1] and (delim[0] or delim[1]):
                fix, other = (1, 0) if delim[1] else (0, 1)
                others = [i for i in range(len(ids)) if i != index[b, other]]
                index[b, fix] = others[redraw[b]]
        out.append(index)
    return out


def _tie_free_tokens(seed, batch=5, n=24):
    """Digits with delimiters mixed in, the first two positions distinct digits. Exact ties in a row need two
    parallel earlier vectors, which a causal average only makes from a leading run of one repeated value; a
    resampled leading delimiter can make such a run, and then float rounding decides the tie (differently in
    any two implementations), so the strict comparison uses inputs without that run."""
    import random

    import tasks

    rng = random.Random(seed)
    rows = []
    for _ in range(batch):
        head = rng.sample("0123456789", 2)
        rows.append(tasks.encode("".join(head + [rng.choice("0123456789$+=(,") for _ in range(n - 2)])))
    return torch.tensor(rows)


@pytest.mark.parametrize(("seed", "n_draws"), [(0, 1), (3, 3), (5, 2), (1, 3)])
def test_layer0_interventions_match_a_hand_computation(tiny_cfg, seed, n_draws):
    import tasks
    from nope_interp.diagnostics import INTERVENTIONS, layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=seed)).eval()
    tokens = _tie_free_tokens(seed)
    got = layer0_interventions(model, tokens, seed=seed, n_draws=n_draws)
    assert list(got) == list(INTERVENTIONS)
    ids = sorted(set(tasks.encode("0123456789")))
    draws = _reference_draws(tokens, ids, seed, n_draws)
    ref = {"none": _reference_scores(model, tokens, None, None, ids),
           "uniform_attention": _reference_scores(model, tokens, "uniform", None, ids),
           "neutral_delimiters": sum(_reference_scores(model, tokens, None, d, ids) for d in draws) / n_draws,
           "both": sum(_reference_scores(model, tokens, "uniform", d, ids) for d in draws) / n_draws}
    for kind in INTERVENTIONS:
        assert got[kind] == pytest.approx(ref[kind], abs=1e-9), kind
    # the resampled values differ from the model's own, so the draw matters
    assert got["neutral_delimiters"] != got["none"]


@pytest.mark.parametrize(("task_name", "seed", "positional"),
                         [("addition", 0, "none"), ("reversal", 3, "none"), ("ordering", 1, "none"),
                          ("indexing", 2, "none"), ("reversal", 4, "rotary")])
def test_layer0_interventions_on_task_prompts_match_the_hand_computation(tiny_cfg, task_name, seed, positional):
    """On task prompts the leading delimiters (``$``, ``rev(``) are resampled. The draw never repeats a value at
    positions 0 and 1 (the frequent exact tie); rarer ones remain where two prefixes average the same
    multiset of values (draws a, b, b, a make z_1 = z_3 under uniform attention), and rounding decides those
    differently here and in the model, hence a tolerance on the resampled scores. Rotary models qualify:
    rotary turns queries and keys, not values."""
    import tasks
    from nope_interp.diagnostics import layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=seed, positional=positional)).eval()
    task = tasks.get_task(task_name)
    tokens = task.prompt_tokens(task.analysis_prompts(16, seed=seed))
    got = layer0_interventions(model, tokens, seed=seed, n_draws=3)
    ids = sorted(set(tasks.encode("0123456789")))
    draws = _reference_draws(tokens, ids, seed, 3)
    for kind, pattern in (("none", None), ("uniform_attention", "uniform")):
        assert got[kind] == pytest.approx(_reference_scores(model, tokens, pattern, None, ids), abs=1e-9), kind
    for kind, pattern in (("neutral_delimiters", None), ("both", "uniform")):
        ref = sum(_reference_scores(model, tokens, pattern, d, ids) for d in draws) / 3
        assert got[kind] == pytest.approx(ref, abs=3e-3), kind


def test_no_draw_repeats_the_first_value():
    import tasks
    from nope_interp.diagnostics import _draw_content

    ids = sorted(set(tasks.encode("0123456789")))
    task = tasks.get_task("reversal")
    tokens = task.prompt_tokens(task.analysis_prompts(64, seed=0))      # rev( : positions 0 and 1 delimiters
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        delimiter, index = _draw_content(tokens, ids, gen)
        assert bool(delimiter[:, :4].all()) and not bool(delimiter[:, 4:-2].any())
        assert bool((index[:, 0] != index[:, 1]).all())
    add = tasks.get_task("addition").prompt_tokens(["$11+22="] * 64)   # $ then a digit: position 0 redrawn
    for _ in range(20):
        _, index = _draw_content(add, ids, gen)
        assert bool((index[:, 0] != ids.index(tasks.encode("1")[0])).all())
        assert bool((index[:, 1] == ids.index(tasks.encode("1")[0])).all())


def test_layer0_interventions_closed_forms(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=2)).eval()
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(6, seed=1))
    # every character of the prompts counts as content: nothing is resampled
    same = layer0_interventions(model, tokens, content="0123456789$+=")
    assert same["neutral_delimiters"] == pytest.approx(same["none"], abs=1e-12)   # a mean of 8 equal draws
    assert same["both"] == pytest.approx(same["uniform_attention"], abs=1e-12)
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
    with pytest.raises(NopeInterpError, match="positional embeddings"):
        layer0_interventions(learned, tokens)


def test_layer0_interventions_in_train_mode_equal_eval_mode_and_restore_the_mode(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_attention_entropy, layer0_interventions
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=1, dropout=0.3))
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(8, seed=2))
    ref = layer0_interventions(model.eval(), tokens)
    ref_d = diagnose(model, task, tokens)
    model.train()
    for _ in range(2):   # dropout would make these random
        assert layer0_interventions(model, tokens) == ref
        assert diagnose(model, task, tokens) == ref_d
        assert layer0_attention_entropy(model, tokens) == ref_d["l0_attention_entropy"]
    assert model.training


def test_layer0_interventions_content_longer_than_n_ctx_and_odd_token_layouts(tiny_cfg, tiny_model):
    import string

    import tasks
    from nope_interp.diagnostics import layer0_interventions

    tokens = tasks.get_task("addition").prompt_tokens(tasks.get_task("addition").analysis_prompts(4, seed=0))
    wide = string.ascii_letters + string.digits + "$"   # 63 distinct characters > n_ctx = 48
    assert len(wide) > tiny_model.cfg.n_ctx
    got = layer0_interventions(tiny_model, tokens, content=wide)
    assert got["neutral_delimiters"] != got["none"]   # + and = are still resampled
    # a non-contiguous view and other integer dtypes give the same numbers
    transposed = tokens.t().contiguous().t()
    assert not transposed.is_contiguous()
    assert layer0_interventions(tiny_model, transposed) == layer0_interventions(tiny_model, tokens)
    assert layer0_interventions(tiny_model, tokens.to(torch.int32)) == layer0_interventions(tiny_model, tokens)


def test_layer0_interventions_refuse_models_they_do_not_apply_to(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_interventions, layer0_interventions_unsupported
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(4, seed=0))
    for change, why in (({"positional": "learned"}, "standard positional embeddings"),
                        ({"attention": "bidirectional"}, "bidirectional attention"),
                        ({"attention": "sliding", "window": 2}, "sliding-window attention")):
        model = build_model(tiny_cfg.replace(**change))
        assert why in layer0_interventions_unsupported(model)
        with pytest.raises(NopeInterpError, match=f"does not apply to this model: {why}"):
            layer0_interventions(model, tokens)
        if "positional" not in change:   # diagnose still measures what applies, without the causal test
            d = diagnose(model, task, tokens)
            assert "l0_attention_entropy" in d and not any(k.startswith("l0_z_score") for k in d)
    assert layer0_interventions_unsupported(build_model(tiny_cfg)) is None
    assert layer0_interventions_unsupported(build_model(tiny_cfg.replace(positional="rotary"))) is None


def test_layer0_interventions_bad_arguments(tiny_cfg, tiny_model):
    from conftest import unhooked

    import tasks
    from nope_interp.diagnostics import layer0_interventions as checked
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    layer0_interventions = unhooked(checked)   # as users run it: without the test-time type checker

    tokens = tasks.get_task("addition").prompt_tokens(["$123+456="] * 2)
    for seed in (1.5, None, True, -1, 2**70):
        with pytest.raises(NopeInterpError, match="seed must be an integer"):
            layer0_interventions(tiny_model, tokens, seed=seed)
    for n in (0, 1001, 2.0):
        with pytest.raises(NopeInterpError, match="n_draws must be an integer"):
            layer0_interventions(tiny_model, tokens, n_draws=n)
    small = build_model(tiny_cfg.replace(d_vocab=20))
    with pytest.raises(NopeInterpError, match=r"content: 'x' has token id \d+, outside the model's vocabulary \[0, 20"):
        layer0_interventions(small, torch.randint(0, 20, (2, 6)), content="x")


def test_the_degenerate_warning_points_at_the_caller(tiny_cfg):
    import warnings

    from conftest import unhooked

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=4))
    with torch.no_grad():
        model.embed.W_E[:] = model.embed.W_E[tasks.encode("7")[0]]
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(4, seed=0))
    # as users run them (pytest's type checker adds a frame of its own)
    layer0_interventions, diagnose = unhooked(diagnostics.layer0_interventions), unhooked(diagnostics.diagnose)
    for call in (lambda: layer0_interventions(model, tokens), lambda: diagnose(model, task, tokens)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        found = [w for w in caught if issubclass(w.category, DegenerateInputWarning)]
        assert len(found) == 1 and found[0].filename == __file__, [(w.filename, w.lineno) for w in found]


def test_participation_ratio_closed_forms_and_numpy():
    import numpy as np

    from nope_interp.diagnostics import participation_ratio
    from nope_interp.errors import NopeInterpError

    assert participation_ratio(torch.eye(10)) == pytest.approx(9.0)              # a simplex: 9 equal directions
    u = torch.randn(7, generator=torch.Generator().manual_seed(0))
    assert participation_ratio(torch.arange(10.0)[:, None] * u) == pytest.approx(1.0)   # a line
    two = torch.tensor([[1.0, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0]])
    assert participation_ratio(two) == pytest.approx(2.0)
    x = torch.randn(10, 32, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.1, 3, 32)
    lam = np.linalg.eigvalsh(np.cov(x.double().numpy().T))
    assert participation_ratio(x) == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-9)
    assert np.isnan(participation_ratio(torch.ones(4, 3)))
    with pytest.raises(NopeInterpError, match="n >= 2"):
        participation_ratio(torch.ones(1, 3))


def test_relative_entropy_counts_the_keys_a_sliding_window_allows(tiny_cfg):
    import tasks
    from nope_interp.averaging import relative_entropy_to_uniform
    from nope_interp.diagnostics import layer0_attention_entropy
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    n, w = 7, 3
    rows = [torch.tensor([1.0 if q - w < k <= q else 0.0 for k in range(n)]) for q in range(n)]
    uniform_in_window = torch.stack([r / r.sum() for r in rows])
    rel = relative_entropy_to_uniform(uniform_in_window, causal=True, window=w)
    assert torch.isnan(rel[0]) and torch.allclose(rel[1:], torch.ones(n - 1, dtype=rel.dtype))
    # against all earlier keys the same rows look concentrated: log(3) / log(7) at the last row
    plain = relative_entropy_to_uniform(uniform_in_window, causal=True)
    assert float(plain[-1]) == pytest.approx(torch.log(torch.tensor(3.0)).item() / torch.log(torch.tensor(7.0)).item())
    assert torch.isnan(relative_entropy_to_uniform(torch.eye(n), causal=True, window=1)).all()
    # a pattern with weight outside the window it is said to have is refused, not scored
    with pytest.raises(NopeInterpError, match="outside its sliding window of 1"):
        relative_entropy_to_uniform(uniform_in_window, causal=True, window=1)
    from conftest import unhooked

    for bad in (0, -1, 2.5, True):   # as users call it (the test-time type checker would refuse 2.5 first)
        with pytest.raises(NopeInterpError, match="window must be"):
            unhooked(relative_entropy_to_uniform)(uniform_in_window, causal=True, window=bad)
    with pytest.raises(NopeInterpError, match="window must be"):
        relative_entropy_to_uniform(uniform_in_window, causal=False, window=3)
    # a sliding-window model with zero queries attends uniformly within its window: entropy 1, not "collapse"
    model = build_model(tiny_cfg.replace(attention="sliding", window=2))
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
    task = tasks.get_task("addition")
    assert layer0_attention_entropy(model, task.prompt_tokens(task.analysis_prompts(4))) == pytest.approx(1.0)


def test_eval_mode_restores_every_module_and_value_geometry_edges(tiny_cfg):
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_interventions, value_geometry
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(dropout=0.2)).train()
    model.blocks[1].eval()   # a user's per-module modes survive
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(4))
    layer0_interventions(model, tokens)
    assert model.training and model.blocks[0].training and not model.blocks[1].training
    small = build_model(tiny_cfg.replace(d_vocab=20))
    with pytest.raises(NopeInterpError, match=r"value_geometry on addition: .* outside the model's vocabulary"):
        value_geometry(small, task)
    broken = build_model(tiny_cfg)
    with torch.no_grad():
        broken.blocks[0].attn.W_V[0, 0, 0] = float("nan")
    with pytest.raises(NopeInterpError, match="value_geometry: the layer-0 value vectors are not finite"):
        value_geometry(broken, task)   # refused by name, not NaN measurements of garbage
    with pytest.raises(NopeInterpError, match="not finite"):
        diagnose(broken, task, tokens)


def test_participation_ratio_edges():
    import numpy as np
    from conftest import unhooked

    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    pr = unhooked(diagnostics.participation_ratio)
    assert pr(torch.eye(4, dtype=torch.float64) * 1e-200) == pytest.approx(3.0)    # tiny values: no underflow
    assert pr(torch.eye(4, dtype=torch.float64) * 1e200) == pytest.approx(3.0)     # huge values: no overflow
    noise = torch.ones(10, 8) + 1e-7 * torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    assert np.isnan(pr(noise))                      # equal up to float32 rounding
    assert pr(noise.double()) > 1.0                 # in float64 the same spread is real
    assert np.isnan(pr(torch.zeros(3, 4)))          # all-zero rows are equal rows: undefined, NaN
    for bad in (float("inf"), float("nan")):        # non-finite input is refused, not turned into NaN
        with pytest.raises(NopeInterpError, match=r"participation_ratio: x must be finite, got 1 NaN or inf"):
            pr(torch.tensor([[1.0, bad], [0.0, 1.0]]))
    for bad in (np.eye(3), [[1.0, 0.0], [0.0, 1.0]], torch.eye(3, dtype=torch.long), torch.ones(3),
                torch.eye(2, dtype=torch.complex64), torch.eye(3, device="meta"), torch.ones(1, 3), torch.ones(3, 0)):
        with pytest.raises(NopeInterpError, match=r"participation_ratio: x must be a real floating torch tensor"):
            pr(bad)


def test_participation_ratio_of_16_bit_values_is_the_number_not_nan():
    """The "equal up to rounding" cut-off was 128 units of the dtype's precision: 1.0 for bfloat16, so every
    bfloat16 input gave NaN, and float16 gave NaN for digit values spread 0.1 of their norm (a collapsed model).
    Checked against float64 on the same rounded values (the closed form of the definition)."""
    from conftest import unhooked

    from nope_interp import diagnostics

    pr = unhooked(diagnostics.participation_ratio)
    gen = torch.Generator().manual_seed(0)
    for spread in (1.0, 0.1, 0.03):   # rows around a shared mean, spread relative to the mean's scale
        x = torch.randn(1, 64, generator=gen) + spread * torch.randn(10, 64, generator=gen)
        for dtype in (torch.float16, torch.bfloat16):
            rounded = x.to(dtype)
            ref = pr(rounded.double())     # the same rounded values measured in float64
            assert np.isfinite(ref) and pr(rounded) == pytest.approx(ref, rel=1e-9), (spread, dtype)
            assert pr(rounded) == pytest.approx(pr(x), rel=0.1), (spread, dtype)   # rounding moves it little
    for dtype in (torch.float16, torch.bfloat16):   # equal rows, and rows equal up to the dtype's rounding
        assert np.isnan(pr(torch.ones(6, 8, dtype=dtype)))
        eps = torch.finfo(dtype).eps
        assert np.isnan(pr(torch.ones(6, 8, dtype=dtype) + (torch.arange(6) % 2).to(dtype)[:, None] * eps))


def test_a_loaded_run_or_absent_content_is_one_clear_error(tiny_model):
    """As users run it: in a subprocess without pytest's type checker (which would refuse the LoadedRun
    inside the first annotated helper, before the toolkit's own message)."""
    import subprocess
    import sys

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    script = """
import tasks
from nope_interp import diagnostics
from nope_interp.errors import NopeInterpError
from nope_interp.pretrained import load_pretrained
run = load_pretrained("addition")
task = tasks.get_task("addition")
tokens = task.prompt_tokens(task.analysis_prompts(4))
from nope_interp import analysis, averaging_checks, evaluate, interventions
calls = ((diagnostics.layer0_interventions, (run, tokens)), (diagnostics.diagnose, (run, task, tokens)),
         (diagnostics.value_geometry, (run, task)), (diagnostics.layer0_attention_entropy, (run, tokens)),
         (analysis.analyze_model, (run, task, 4)), (analysis.analyze_tokens, (run, tokens)),
         (averaging_checks.averaging_report, (run, task, 4)), (evaluate.predict, (run, task, ["$1+1="])),
         (lambda m: interventions.replaced_pattern(m, 0, "uniform").__enter__(), (run,)))
for fn, args in calls:
    try:
        fn(*args)
    except NopeInterpError as exc:
        print(fn.__name__, exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 9 and all("got a LoadedRun: a loaded run, pass its .model" in line for line in lines), out
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(4))
    with pytest.raises(NopeInterpError, match="content 'abc': none of its characters occurs in tokens"):
        diagnostics.layer0_interventions(tiny_model, tokens, content="abc")


def test_positional_share_and_participation_ratio_treat_bad_and_undefined_input_alike():
    """One convention for both: non-finite or non-float input is refused by name; an undefined result of finite
    input (all-zero activations, equal rows) is NaN, as the docstrings say."""
    from conftest import unhooked

    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    ps, pr = unhooked(diagnostics.positional_share), unhooked(diagnostics.participation_ratio)
    for fn, shape in ((ps, (3, 4, 5)), (pr, (4, 5))):
        name = "acts" if fn is ps else "x"
        assert np.isnan(fn(torch.zeros(shape))) and np.isnan(fn(torch.zeros(shape, dtype=torch.float64)))
        for bad in (float("nan"), float("inf"), -float("inf")):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
            x.view(-1)[3] = bad
            with pytest.raises(NopeInterpError, match=rf"{fn.__name__}: {name} must be finite, got 1 NaN or inf"):
                fn(x)
        for bad in (torch.ones(shape, dtype=torch.long), torch.ones(shape, dtype=torch.complex64),
                    torch.ones(shape, dtype=torch.bool), torch.ones(shape).numpy(), torch.ones(shape).tolist(),
                    torch.ones(shape, device="meta")):
            with pytest.raises(NopeInterpError, match=rf"{fn.__name__}: {name} must be a real floating torch tensor"):
                fn(bad)
    with pytest.raises(NopeInterpError, match=r"positional_share: acts must .* dimension 1, got shape \(2, 0, 4\)"):
        ps(torch.ones(2, 0, 4))
    # scale-free: tiny and huge activations give the share of the same activations at scale 1
    x = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for scale in (1e-200, 1e200):
        assert ps(x * scale) == pytest.approx(ps(x), rel=1e-12)


def test_a_model_converted_with_half_is_refused_by_name_and_one_converted_with_to_is_measured(tiny_cfg):
    """``model.half()`` keeps ``cfg.dtype`` float32, and TransformerLens's own forward then fails on a dtype
    mismatch (a raw RuntimeError before); ``model.to(torch.float16)`` converts both and works."""
    import copy

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import answer_loss
    from nope_interp.model import build_model
    from nope_interp.positional import layer_positional_types

    task = tasks.get_task("addition")
    tokens = task.analysis_tokens(4)
    batch = task.training_batch([task.example(p) for p in task.analysis_prompts(4)])
    model = build_model(tiny_cfg)
    for convert, got in ((lambda m: m.half(), "torch.float16"), (lambda m: m.bfloat16(), "torch.bfloat16"),
                         (lambda m: m.double(), "torch.float64")):
        bad = convert(copy.deepcopy(model))
        calls = {"layer0_interventions": lambda m: diagnostics.layer0_interventions(m, tokens),
                 "layer0_attention_entropy": lambda m: diagnostics.layer0_attention_entropy(m, tokens),
                 "value_geometry": lambda m: diagnostics.value_geometry(m, task),
                 "diagnose": lambda m: diagnostics.diagnose(m, task, tokens),
                 "answer_loss": lambda m: answer_loss(m, batch),                # a raw matmul RuntimeError before
                 "layer_positional_types": lambda m: layer_positional_types(m)}  # the same
        for fn, call in calls.items():
            with pytest.raises(NopeInterpError, match=rf"{fn}: model's parameters are {got} but model.cfg.dtype is "
                                                      rf"torch.float32 .* model.to\({got}\)"):
                call(bad)
    half = copy.deepcopy(model).to(torch.float16)
    got = diagnostics.layer0_interventions(half, tokens, n_draws=1)
    ref = diagnostics.layer0_interventions(model, tokens, n_draws=1)
    assert got.keys() == ref.keys() and all(abs(got[k] - ref[k]) < 0.05 for k in got)
    assert diagnostics.diagnose(half, task, tokens)["l0_attention_entropy"] == pytest.approx(
        diagnostics.layer0_attention_entropy(model, tokens), abs=1e-3)


def test_diagnose_refuses_tokens_that_are_not_the_tasks_prompts(tiny_model):
    """diagnose's delimiter measurements come from the task's prompts (value_geometry) and the rest from the
    tokens: the two must be the same task's, else the result mixes two tasks."""
    from conftest import unhooked

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    addition, reversal = tasks.get_task("addition"), tasks.get_task("reversal")
    rev_tokens = reversal.analysis_tokens(4)
    with pytest.raises(NopeInterpError, match=r"diagnose: tokens must be prompts of the task 'addition' .*got row 0 = "
                                              r"'rev\("):
        diagnostics.diagnose(tiny_model, addition, rev_tokens)
    add_tokens = addition.analysis_tokens(4)
    with pytest.raises(NopeInterpError, match=r"tokens must be prompts of the task 'reversal' .*got row 0 = '\$"):
        diagnostics.diagnose(tiny_model, reversal, add_tokens)
    mixed = add_tokens.clone()
    mixed[2, -1] = tasks.encode("+")[0]   # one row that is no longer a prompt ("...+" instead of "...=")
    with pytest.raises(NopeInterpError, match=r"got row 2 = '\$\d+\+\d+\+'"):
        diagnostics.diagnose(tiny_model, addition, mixed)
    other = tasks.get_task("addition", n_digits=2)   # the same task with other parameters: other prompts
    with pytest.raises(NopeInterpError, match="tokens must be prompts of the task 'addition'"):
        diagnostics.diagnose(tiny_model, other, add_tokens)
    assert set(diagnostics.diagnose(tiny_model, addition, add_tokens)) >= {"delimiter_value_norm_ratio"}
    for fn, call in (("value_geometry", lambda t: unhooked(diagnostics.value_geometry)(tiny_model, t)),
                     ("diagnose", lambda t: unhooked(diagnostics.diagnose)(tiny_model, t, add_tokens))):
        for bad in ("addition", None, tasks.AdditionTask):
            with pytest.raises(NopeInterpError, match=rf"{fn}: task must be a tasks.Task"):
                call(bad)


def test_diagnose_draws_with_its_seed(tiny_model):
    """diagnose's resampled delimiters follow ``seed`` (jobs give each model its own; before, every model of a
    job drew with seed 0): the same seed repeats the interventions' scores, another moves them, and the
    deterministic diagnostics never move; a bad seed is refused before any work."""
    from conftest import unhooked

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    addition = tasks.get_task("addition")
    tokens = addition.analysis_tokens(6)
    a, b = (diagnostics.diagnose(tiny_model, addition, tokens, seed=s) for s in (3, 4))
    assert diagnostics.diagnose(tiny_model, addition, tokens, seed=3) == a
    assert diagnostics.diagnose(tiny_model, addition, tokens) == diagnostics.diagnose(tiny_model, addition, tokens,
                                                                                     seed=0)
    assert a["l0_z_score_neutral_delimiters"] != b["l0_z_score_neutral_delimiters"]
    direct = diagnostics.layer0_interventions(tiny_model, tokens, seed=4)
    assert b["l0_z_score_neutral_delimiters"] == direct["neutral_delimiters"] and b["l0_z_score_both"] == direct["both"]
    for key in ("l0_attention_entropy", "l0_z_positional_share", "digit_value_spread", "l0_z_score_none",
                "l0_z_score_uniform_attention"):
        assert a[key] == b[key]
    for bad in (-1, 2**63, 1.0, True, "0", None):
        with pytest.raises(NopeInterpError, match="seed"):
            unhooked(diagnostics.diagnose)(tiny_model, addition, tokens, seed=bad)


def test_diagnose_on_one_prompt_names_itself(tiny_model):
    """Before: diagnose(model, task, tokens[:1]) was refused by positional_share, a function the caller never
    called, without diagnose's name."""
    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    task = tasks.get_task("addition")
    tokens = task.analysis_tokens(4)
    with pytest.raises(NopeInterpError, match=r"^diagnose needs at least 2 prompts .* got tokens of shape \(1, "):
        diagnostics.diagnose(tiny_model, task, tokens[:1])


@pytest.mark.parametrize("seed", [0, 3])
def test_layer0_head_entropies_against_a_naive_loop_and_one_collapsed_head(tiny_cfg, seed):
    """Each head's entropy equals a per-row loop over the cached pattern; their mean is the model's entropy; a
    head made to attend to key 0 alone reads about 0 while the mean over heads hides it."""
    import math

    import tasks
    from nope_interp.diagnostics import layer0_attention_entropy, layer0_head_entropies
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=seed))
    task = tasks.get_task("reversal")
    tokens = task.prompt_tokens(task.analysis_prompts(5, seed=seed))
    def boost(scores, hook):   # [batch, head, query, key]; head 0: a score of 60 added to key 0
        scores[:, 0, :, 0] = scores[:, 0, :, 0] + 60.0
        return scores

    model.blocks[0].attn.hook_attn_scores.add_hook(boost)
    try:
        per_head = layer0_head_entropies(model, tokens)
        mean = layer0_attention_entropy(model, tokens)
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    finally:
        model.reset_hooks()
    pattern = cache["blocks.0.attn.hook_pattern"].double()
    naive = []
    for h in range(pattern.shape[1]):
        rows = []
        for b in range(pattern.shape[0]):
            for q in range(1, pattern.shape[2]):
                p = [float(pattern[b, h, q, k]) for k in range(q + 1)]
                rows.append(-sum(x * math.log(x) for x in p if x > 0) / math.log(q + 1))
        naive.append(sum(rows) / len(rows))
    assert per_head.shape == (model.cfg.n_heads,) and per_head.dtype == torch.float32
    assert per_head.tolist() == pytest.approx(naive, abs=1e-5)
    assert float(per_head[0]) < 0.01 and float(per_head[1:].min()) > 0.5
    assert mean == pytest.approx(float(per_head.mean()), abs=1e-6) and mean > 0.3
    # diagnose reports the lowest head beside the mean, which reads this model as mildly non-uniform
    from nope_interp.diagnostics import diagnose

    model.blocks[0].attn.hook_attn_scores.add_hook(boost)
    try:
        d = diagnose(model, task, tokens)
    finally:
        model.reset_hooks()
    assert d["l0_min_head_entropy"] == pytest.approx(float(per_head.min()), abs=1e-6)
    assert d["l0_min_head_entropy"] < 0.01
    assert d["l0_attention_entropy"] == pytest.approx(mean, abs=1e-6)


@pytest.mark.parametrize("fn", ["layer0_attention_entropy", "layer0_head_entropies"])
def test_entropy_of_one_position_is_refused_not_nan(fn):
    """Before: layer0_attention_entropy(model, tokens[:, :1]) returned NaN without a word."""
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    with pytest.raises(NopeInterpError, match=r"at least 2 positions.*got shape \(3, 1\)"):
        getattr(diagnostics, fn)(model, torch.zeros(3, 1, dtype=torch.long))
    assert 0 <= float(torch.as_tensor(getattr(diagnostics, fn)(model, torch.zeros(3, 2, dtype=torch.long))).mean()) <= 1
