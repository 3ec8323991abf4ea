"""Long sequences: the hook-free activation path, running a NoPE model past its n_ctx, analyze_tokens, and
the ``long-context`` job (against the closed-form lag profiles and with real files)."""

import json
import re

import pytest
import torch
from conftest import assert_lists_every_file, assert_strict_json_files, build_unhooked, unhooked
from conftest import perturbed_model as _perturbed

ARCHS = [{}, {"normalization": "RMS"}, {"normalization": "none"}, {"attention": "sliding", "window": 3},
         {"attention": "sliding", "window": 1}, {"tied_embeddings": True, "dropout": 0.2},
         {"positional": "learned"}, {"positional": "rotary"},
         {"positional": "rotary", "attention": "sliding", "window": 3}, {"positional": "rotary", "nope_layers": (1,)},
         {"n_layers": 3, "n_heads": 4, "d_head": 8}]


@pytest.mark.parametrize("options", ARCHS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_fast_activations_equal_run_with_cache_at_every_site(options):
    from nope_interp.config import preset
    from nope_interp.fast_forward import fast_activations
    from nope_interp.hooks import activation_hook_names

    model = _perturbed(preset("tiny", **options))
    model.eval()
    names = activation_hook_names(model.cfg.n_layers)
    for length in (1, 4, 17):
        tokens = torch.randint(0, 96, (3, length), generator=torch.Generator().manual_seed(length))
        _, cache = model.run_with_cache(tokens)
        got = fast_activations(model, tokens, names)
        assert sorted(got) == sorted(names)
        for name in names:
            torch.testing.assert_close(got[name], cache[name].reshape(got[name].shape), atol=3e-5, rtol=1e-5)


def test_fast_activations_run_only_the_layers_asked_for_and_refuse_what_they_cannot_compute():
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.fast_forward import fast_activations, fast_activations_unsupported
    from nope_interp.model import build_model

    model = _perturbed(preset("tiny"))
    model.eval()
    tokens = torch.randint(0, 96, (2, 6))
    calls = []
    handle = model.blocks[1].register_forward_pre_hook(lambda *a: calls.append(1))
    assert set(fast_activations(model, tokens, ["blocks.0.attn.hook_z"])) == {"blocks.0.attn.hook_z"}
    handle.remove()
    assert calls == []  # the fast path never calls the modules
    for bad in (["blocks.0.attn.hook_pattern"], ["blocks.2.hook_resid_post"], ["hook_pos_embed"]):
        assert "hook names" in fast_activations_unsupported(model, bad)
        with pytest.raises(NopeInterpError, match="hook names"):
            fast_activations(model, tokens, bad)
    for flag, value, why in (("use_logn_attn", True, "log-n"), ("use_dynamic_ntk_rope", True, "dynamic-NTK"),
                             ("clip_qkv", 8.0, "clip_qkv"), ("positional_embedding_type", "alibi", "alibi")):
        odd = build_model(preset("tiny", positional="rotary"))
        setattr(odd.cfg, flag, value)  # options TransformerLens has and the fast path does not implement
        assert why in fast_activations_unsupported(odd)
    with pytest.raises(NopeInterpError, match="more than n_ctx"):
        fast_activations(model, torch.zeros(1, model.cfg.n_ctx + 1, dtype=torch.long), ["hook_embed"])


@pytest.mark.parametrize("options", [{}, {"tied_embeddings": True}, {"attention": "sliding", "window": 4},
                                     {"positional": "rotary"}, {"normalization": "none"}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_with_context_keeps_the_function_and_accepts_longer_sequences(options):
    from nope_interp.config import preset
    from nope_interp.model import with_context

    cfg = preset("tiny", **options)
    model = _perturbed(cfg)
    model.eval()
    bigger, new_cfg = with_context(model, cfg, 3 * cfg.n_ctx)
    assert new_cfg.n_ctx == 3 * cfg.n_ctx and bigger.cfg.n_ctx == 3 * cfg.n_ctx and model.cfg.n_ctx == cfg.n_ctx
    tokens = torch.randint(0, 96, (2, cfg.n_ctx), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(bigger(tokens), model(tokens), atol=0, rtol=0)
    long = torch.randint(0, 96, (1, 3 * cfg.n_ctx))
    assert bigger(long).shape == (1, 3 * cfg.n_ctx, cfg.d_vocab)
    assert not bigger.training
    assert with_context(model, cfg, cfg.n_ctx) == (model, cfg)  # no copy when it already fits


def test_with_context_refuses_learned_positions_and_bad_lengths():
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model, with_context

    cfg = preset("tiny", positional="learned")
    with pytest.raises(NopeInterpError, match="learned positional embeddings"):
        with_context(build_model(cfg), cfg, 500)
    cfg = preset("tiny")
    for bad in (0, -3, 2.5, True, "100"):
        with pytest.raises(NopeInterpError, match="n_ctx must be an integer"):
            unhooked(with_context)(build_model(cfg), cfg, bad)


def test_analyze_tokens_fast_and_hooked_agree_and_match_analyze_model():
    import tasks
    from nope_interp.analysis import analyze_model, analyze_tokens
    from nope_interp.config import preset

    model = _perturbed(preset("tiny"))
    model.eval()
    task = tasks.get_task("reversal")
    ref = analyze_model(model, task, 6, seed=3)
    prompts = task.analysis_prompts(6, 3)
    for forward in ("hooked", "fast", "auto"):
        got = analyze_tokens(model, task.prompt_tokens(prompts), forward=forward)
        assert got.sites == ref.sites
        for r in ("row_mean", "pooled"):
            torch.testing.assert_close(got.per_sequence[r], ref.per_sequence[r], atol=1e-9, rtol=0)
        torch.testing.assert_close(got.lag_per_sequence, ref.lag_per_sequence, atol=1e-5, rtol=0)


def test_analyze_tokens_checks_its_inputs():
    from nope_interp.analysis import analyze_tokens
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    model = build_model(preset("tiny"))
    ok = torch.randint(0, 96, (2, 10))
    cases = [({"tokens": ok[:, :2]}, "at least 3 positions"),
             ({"tokens": torch.randint(0, 96, (1, 49))}, "n_ctx=48"),
             ({"tokens": ok + 96}, "out of range"),
             ({"tokens": ok, "forward": "quick"}, "unknown forward"),
             ({"tokens": ok, "max_lag": 10}, "max_lag"),
             ({"tokens": ok, "points": ("pattern",)}, "unknown activation point")]
    for kwargs, match in cases:
        with pytest.raises(NopeInterpError, match=match):
            analyze_tokens(model, **kwargs)
    clipped = build_model(preset("tiny", positional="rotary"))
    clipped.cfg.clip_qkv = 8.0  # a TransformerLens option the fast path does not implement
    with pytest.raises(NopeInterpError, match="forward='fast' does not support clip_qkv"):
        analyze_tokens(clipped, ok, forward="fast")
    assert analyze_tokens(clipped, ok).n_prompts == 2  # auto falls back to the hooked forward


@pytest.mark.parametrize(("attention", "window"), [("causal", None), ("sliding", 8), ("sliding", 3)])
def test_lag_profile_of_uniform_attention_follows_the_closed_form(attention, window):
    """With near-zero query/key weights attention is uniform over the keys each query sees, and with random
    token ids the layer-0 z vectors are means of nearly independent value vectors: the lag profile must then
    follow the idealised curve of that attention (uniform causal or sliding window)."""
    from nope_interp.analysis import analyze_tokens
    from nope_interp.config import preset
    from nope_interp.model import build_model
    from nope_interp.similarity import sliding_window_lag_profile, uniform_causal_lag_profile

    extra = {"window": window} if window else {}
    cfg = preset("paper", n_layers=1, n_ctx=256, d_vocab=8192, attention=attention, normalization="none", **extra)
    model = build_model(cfg)
    with torch.no_grad():  # uniform attention; i.i.d. Gaussian embeddings of a large vocabulary
        model.blocks[0].attn.W_Q.zero_()
        model.embed.W_E.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, cfg.d_vocab, (8, 256), generator=torch.Generator().manual_seed(1))
    res = analyze_tokens(model, tokens, ("z",), max_lag=40)
    got = torch.tensor(res.lag_profile["blocks.0.attn.hook_z"]["mean"], dtype=torch.float64)
    ideal = (uniform_causal_lag_profile(256, 40) if attention == "causal"
             else sliding_window_lag_profile(256, window, 40))
    # a large vocabulary: with 96 token vectors, repeated tokens add about window / 96 at every lag
    assert (got - ideal).abs().max() < 0.03, (got - ideal).abs().max()
    wrong = sliding_window_lag_profile(256, 16, 40) if attention == "causal" else uniform_causal_lag_profile(256, 40)
    assert (got - wrong).abs().max() > 0.3  # the other attention's curve is far: the test can fail


def test_long_context_job_runs_the_grid_and_writes_strict_files(tmp_path):
    from nope_interp.jobs import long_context

    cfg = long_context.LongContextConfig(lengths=(8, 40), n_sequences=2, max_lag=6, seeds=2, grid_preset="tiny",
                                         normalizations=("LN", "none"), window=4)
    res = long_context.run(cfg)
    assert len(res.rows) == 2 * 2 * 2 * 2 * 2  # norms x attentions x seeds x lengths x inputs
    row = res.rows[0]
    assert row.arch == {"normalization": "LN", "attention": "causal", "window": None} and row.seed == 0
    assert len(row.scores[row.sites[0]]["lag_mean"]) == 6 and row.scores[row.sites[0]]["row_mean"]["n"] == 2
    summary = res.summary()
    assert {s["config"] for s in summary} == {"LN causal", "LN sliding w4", "none causal", "none sliding w4"}
    assert all(s["score_n_seeds"] == 2 for s in summary)
    assert res.idealised(40) == pytest.approx(
        __import__("nope_interp.similarity", fromlist=["x"]).uniform_causal_lag_profile(40, 6).tolist())
    paths = long_context.write(res, tmp_path)
    names = {p.name for p in paths}
    assert {"long_context.json", "long_context.csv", "summary.csv", "score_vs_n_random.html", "grid_task.html",
            "lag_profile_task.html", "recency_gap_vs_n_random.html", "plotly.min.js"} <= names
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    assert_strict_json_files(tmp_path / "results")
    data = json.loads((tmp_path / "results/long_context/long_context.json").read_text())
    assert data["config"]["lengths"] == [8, 40] and len(data["rows"]) == 32
    # each row records the seed its inputs were drawn with: the grid seed (both seeds appear)
    assert [r["input_seed"] for r in data["rows"]] == [r["seed"] for r in data["rows"]]
    assert {r["input_seed"] for r in data["rows"]} == {0, 1}
    csv_rows = list(__import__("csv").DictReader((tmp_path / "results/long_context/long_context.csv").open()))
    assert {r["input_seed"] for r in csv_rows} == {"0", "1"}


def test_long_context_on_a_given_model_runs_it_past_its_context(tiny_run):
    import tasks
    from nope_interp.jobs import long_context
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    entry = entry_from_run(load_run(tiny_run), "tiny-run")
    n = entry.model_cfg.n_ctx * 2
    res = long_context.run(long_context.LongContextConfig(lengths=(n,), n_sequences=1, max_lag=4),
                           [entry])
    assert [r.n for r in res.rows] == [n, n] and res.rows[0].seed is None and res.rows[0].model == "tiny-run"
    # a given model has no grid seed, but its inputs were drawn with seed 0: recorded (before: only seed null)
    assert [r.input_seed for r in res.rows] == [0, 0] and res.to_dict()["rows"][0]["input_seed"] == 0
    assert {r.input for r in res.rows} == {"random", "task"}
    assert entry.model.cfg.n_ctx < n  # the given model itself is untouched
    assert isinstance(entry.task, tasks.Task)


def test_an_input_kind_no_model_reads_is_refused_before_any_work(tiny_run, tmp_path):
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import long_context
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    entry = entry_from_run(load_run(tiny_run), "tiny-run")
    # what a train-text language model is, in a directory of its own (one directory twice is one model twice)
    as_text = dataclasses.replace(entry, kind="text", label="lm", run=dataclasses.replace(entry.run, path=tmp_path))
    cfg = long_context.LongContextConfig(lengths=(8,), n_sequences=1, max_lag=4, inputs=("task",))
    with pytest.raises(NopeInterpError, match="^inputs task: no model here reads them .*lm is a train-text"):
        long_context.run(cfg, [as_text])
    foreign = dataclasses.replace(entry, model_cfg=None, kind="hf", label="hf-x")
    with pytest.raises(NopeInterpError, match="^inputs task text: no model .*hf-x's vocabulary.*read: random$"):
        long_context.run(dataclasses.replace(cfg, inputs=("task", "text")), [foreign])
    # with another model that reads them, the language model's task rows are skipped, the others kept
    res = long_context.run(cfg, [as_text, entry])
    assert [(r.model, r.input) for r in res.rows] == [("tiny-run", "task")]
    assert long_context.why_no_inputs(as_text, "random") is None and long_context.why_no_inputs(entry, "task") is None
    assert "vocabulary" in long_context.why_no_inputs(foreign, "text")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lengths": ()}, "lengths must not be empty"), ({"lengths": (10,), "max_lag": 31}, "length"),
    ({"inputs": ("poems",)}, "input"), ({"normalizations": ("BN",)}, "normalization"),
    ({"attentions": ("global",)}, "attention"), ({"n_sequences": 0}, "n_sequences"), ({"seeds": 0}, "seeds"),
    ({"text_task": "sorting"}, "task"), ({"grid_preset": "huge"}, "grid_preset"), ({"quick": "yes"}, "quick"),
    ({"points": ("pattern",)}, "point"), ({"window": 0}, "window"), ({"lengths": (64, 70000)}, "length"),
    ({"lengths": (2,), "max_lag": 1}, r"^lengths must be an integer in \[3, 65536\]")])  # a score needs 3 positions
def test_bad_config_is_one_clear_error(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.long_context import LongContextConfig

    with pytest.raises(NopeInterpError, match=match):
        build_unhooked(LongContextConfig, **kwargs)


def test_quick_fills_only_what_was_not_given():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.long_context import LongContextConfig

    q = LongContextConfig(quick=True)
    assert (q.lengths, q.seeds, q.n_sequences) == ((32, 128, 512), 2, 2)
    q = LongContextConfig(quick=True, seeds=5, lengths=(512, 64))
    assert (q.lengths, q.seeds, q.n_sequences) == ((64, 512), 5, 2)
    with pytest.raises(NopeInterpError, match="lengths lists 64 more than once"):
        LongContextConfig(quick=True, lengths=(512, 64, 64))  # a repeat would count as another measurement


@pytest.mark.parametrize("given", [
    {"seeds": 3}, {"lengths": (32, 128, 512, 2048)}, {"n_sequences": 4},
    {"seeds": 3, "lengths": (32, 128, 512, 2048), "n_sequences": 4}, {"seeds": 1, "lengths": (64,)}])
def test_quick_keeps_every_explicit_value_even_one_equal_to_the_full_default(given):
    """Before: ``quick=True, seeds=3`` ran 2 seeds and ``quick=True, lengths=(32, 128, 512, 2048)`` ran 3 lengths
    (a value equal to the full default read as not given)."""
    from nope_interp.jobs.long_context import QUICK, LongContextConfig

    q = LongContextConfig(quick=True, **given)
    for name, value in QUICK.items():
        assert getattr(q, name) == (tuple(sorted(given[name])) if name == "lengths" and name in given
                                    else given.get(name, value)), name


@pytest.mark.parametrize("given", [{}, {"seeds": 5}, {"lengths": (64,)}, {"n_sequences": 7}, {"max_lag": 5},
                                   {"seeds": 2, "lengths": (32, 128, 512), "n_sequences": 2}])
def test_replace_quick_recomputes_what_quick_filled(given):
    """Before: ``LongContextConfig(quick=True).replace(quick=False)`` kept the quick lengths, seeds and sequences
    while recording ``quick=False``."""
    from nope_interp.jobs.long_context import LongContextConfig

    q = LongContextConfig(quick=True, **given)
    full = q.replace(quick=False)
    assert full == LongContextConfig(**given) and full.quick is False
    assert full.replace(quick=True) == q
    assert q.replace(window=8) == LongContextConfig(quick=True, window=8, **given)


@pytest.mark.parametrize("given", [{}, {"seeds": 5}, {"lengths": (64,)}, {"max_lag": 5},
                                   {"seeds": 2, "lengths": (32, 128, 512), "n_sequences": 2}])
def test_dataclasses_replace_fills_anew_as_replace_does_or_refuses(given):
    """Before: ``dataclasses.replace(LongContextConfig(quick=True), quick=False)`` kept the quick lengths, seeds
    and sequences while recording ``quick=False`` (only ``.replace`` knew what quick had filled), and a copy with
    any other change forgot what was filled, so that its ``.replace(quick=False)`` kept them too."""
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.long_context import LongContextConfig

    q = LongContextConfig(quick=True, **given)
    copy = dataclasses.replace(q, window=8)
    assert copy == q.replace(window=8) and copy.filled_fields() == q.filled_fields()
    assert copy.replace(quick=False) == LongContextConfig(window=8, **given)
    assert dataclasses.replace(q) == q and dataclasses.replace(q).filled_fields() == q.filled_fields()
    filled = [name for name in ("lengths", "n_sequences", "seeds") if name in q.filled_fields()]
    if filled:  # the quick values carried into a full config cannot be told from values given: refused, not kept
        with pytest.raises(NopeInterpError, match=rf"^dataclasses.replace cannot tell whether {filled[0]}=.* given "
                                                  r"or copied from a LongContextConfig .* use the config's replace"):
            dataclasses.replace(q, quick=False)
    else:
        assert dataclasses.replace(q, quick=False) == q.replace(quick=False)
    new = {"lengths": (64,), "seeds": 4, "n_sequences": 3}  # values other than the filled ones: given
    assert dataclasses.replace(q, quick=False, **new) == q.replace(quick=False, **new) == \
        LongContextConfig(**{**given, **new})


@pytest.mark.parametrize("given", [{}, {"seeds": 5}, {"lengths": (64,)}, {"n_sequences": 7}, {"max_lag": 5},
                                   {"seeds": 2, "lengths": (32, 128, 512), "n_sequences": 2}])
@pytest.mark.parametrize("quick", [True, False])
def test_replace_after_from_dict_fills_anew_as_for_the_config_written(given, quick):
    """Before: ``LongContextConfig.from_dict(LongContextConfig(quick=True).to_dict())`` took the quick values it read
    back as given, so ``.replace(quick=False)`` and ``dataclasses.replace(..., quick=False)`` kept them while recording
    ``quick=False``. A value read back equal to what the settings fill now counts as filled (a dict cannot say
    which were given): ``.replace`` fills it anew and ``dataclasses.replace`` refuses, as for a config just built."""
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.long_context import FULL, QUICK, LongContextConfig

    cfg = LongContextConfig(quick=quick, **given)
    for back in (LongContextConfig.from_dict(cfg.to_dict()), LongContextConfig.from_json(cfg.to_json())):
        assert back == cfg
        fill = QUICK if quick else FULL
        kept = {k: v for k, v in given.items() if fill.get(k, object()) != v}  # equal to the filled: filled
        assert back.filled_fields() == set(fill) - set(kept)
        assert back.replace(quick=not quick) == LongContextConfig(quick=not quick, **kept)
        assert back.replace(window=8) == LongContextConfig(quick=quick, window=8, **kept)
        if back.filled_fields():
            with pytest.raises(NopeInterpError, match=r"^dataclasses.replace cannot tell whether .* use the config's "
                                                      r"replace method"):
                dataclasses.replace(back, quick=not quick)
        else:  # every value given: nothing to fill anew
            assert dataclasses.replace(back, quick=not quick) == LongContextConfig(quick=not quick, **kept)
        assert dataclasses.replace(back, max_lag=7) == LongContextConfig(quick=quick, **{**kept, "max_lag": 7})


def test_cli_long_context_writes_and_reports(tmp_path, capsys):
    from nope_interp.cli import main

    code = main(["long-context", "--lengths", "8", "24", "--max-lag", "5", "--n-sequences", "1", "--seeds", "1",
                 "--grid-preset", "tiny", "--normalizations", "none", "--attentions", "causal",
                 "--out-root", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "outputs:" in out and "long_context.json" in out
    assert (tmp_path / "figures/long_context/score_vs_n_task.html").exists()
    assert main(["long-context", "--lengths", "4", "--out-root", str(tmp_path)]) == 2
    assert "length" in capsys.readouterr().err


def _row(model, types, n, value):
    from nope_interp.jobs.long_context import LongContextRow

    sites = tuple(f"blocks.{i}.attn.hook_z" for i in range(len(types)))
    score = {"row_mean": {"mean": value, "std": 0.0, "n": 1}, "pooled": {"mean": value, "std": 0.0, "n": 1},
             "recency_gap": {"mean": 0.1, "std": 0.0, "n": 1}, "lag_mean": [0.5, 0.4]}
    return LongContextRow(model=model, arch={"normalization": "LN", "attention": "causal", "window": None},
                          seed=None, input="random", n=n, sites=sites, scores={s: score for s in sites},
                          seconds=0.0, layer_types=types)


@pytest.mark.parametrize("kinds", [(("nope", "rope"), ("rope", "rope", "nope")),
                                   (("rope", "nope", "rope"), ("nope", "nope")),
                                   (("nope", "nope"), ("learned", "nope", "nope", "nope"))])
def test_figures_of_models_with_different_layers_mark_each_models_own_types(kinds):
    """Two models whose layers differ in number and positional type: every site of either appears, no
    subplot title claims one model's type for the other's layer, each trace's hover names its own layer's
    type, and the legend gives each model's types layer by layer."""
    from nope_interp.jobs.long_context import (
        LongContextConfig,
        LongContextResult,
        layer_type_letters,
        plot_gap_vs_n,
        plot_lag_profiles,
        plot_score_vs_n,
        site_title,
    )

    a, b = kinds
    rows = tuple(_row(m, t, n, 0.5) for m, t in (("model-a", a), ("model-b", b)) for n in (16, 32))
    result = LongContextResult(config=LongContextConfig(lengths=(16, 32), inputs=("random",), max_lag=2),
                               rows=rows, wall_time_s=0.0)
    deepest = max(len(a), len(b))
    for fig in (plot_score_vs_n(result), plot_gap_vs_n(result)):
        titles = [ann.text for ann in fig.layout.annotations if ann.text != "chance"]
        assert titles == [f"L{i} z" for i in range(deepest)]  # plain: the types differ between models
        for trace in fig.data:
            model_types = a if trace.legendgroup == "model-a" else b
            layer = int(re.search(r"L(\d+) z", trace.hovertemplate).group(1))
            assert site_title(f"blocks.{layer}.attn.hook_z", model_types) in trace.hovertemplate
        names = {t.name for t in fig.data if t.showlegend}
        assert names == {f"model-a [{layer_type_letters(a)}]", f"model-b [{layer_type_letters(b)}]"}
    deep_site = f"blocks.{deepest - 1}.attn.hook_z"  # only in the deeper model: the lag profile skips the other
    assert {t.name for t in plot_lag_profiles(result, site=deep_site).data if not t.name.startswith("idealised")} \
        == {"model-a" if len(a) == deepest else "model-b"}


def test_figure_of_one_hybrid_model_keeps_types_in_the_titles():
    from nope_interp.jobs.long_context import LongContextConfig, LongContextResult, plot_score_vs_n

    rows = tuple(_row("hybrid", ("rope", "nope"), n, 0.5) for n in (16, 32))
    fig = plot_score_vs_n(LongContextResult(config=LongContextConfig(lengths=(16, 32), inputs=("random",),
                                                                     max_lag=2), rows=rows, wall_time_s=0.0))
    assert [ann.text for ann in fig.layout.annotations if ann.text != "chance"] == ["L0 z (RoPE)", "L1 z (NoPE)"]
    assert [t.name for t in fig.data] == ["hybrid", "hybrid"]
    # one seed per length: no error bars (before: bars of 0, a certainty nobody measured)
    assert all(list(t.error_y.array) == [None, None] for t in fig.data)


def test_up_to_24_models_get_distinct_line_colours():
    from nope_interp.jobs.long_context import LongContextConfig, LongContextResult, plot_score_vs_n

    rows = tuple(_row(f"m{i}", ("nope",), n, 0.5) for i in range(12) for n in (16, 32))
    fig = plot_score_vs_n(LongContextResult(config=LongContextConfig(lengths=(16, 32), inputs=("random",),
                                                                     max_lag=2), rows=rows, wall_time_s=0.0))
    assert len({t.line.color for t in fig.data}) == 12


def test_lag_profile_colours_stay_with_a_model_and_absent_inputs_are_refused():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.long_context import (
        LongContextConfig,
        LongContextResult,
        plot_gap_vs_n,
        plot_lag_profiles,
        plot_score_vs_n,
    )

    rows = tuple(_row(f"m{i}", ("nope",), n, 0.5) for i in range(11) for n in (16, 32))
    result = LongContextResult(config=LongContextConfig(lengths=(16, 32), inputs=("random",), max_lag=2),
                               rows=rows, wall_time_s=0.0)
    fig = plot_lag_profiles(result)
    colours = {}
    for t in fig.data:
        if not t.name.startswith("idealised"):
            assert colours.setdefault(t.name, t.line.color) == t.line.color  # the same colour at both lengths
    assert len(set(colours.values())) == 11
    for call, match in ((lambda: plot_lag_profiles(result, site="blocks.5.attn.hook_z"), "no row has random"),
                        (lambda: plot_lag_profiles(result, kind="task"), "no row has task"),
                        (lambda: plot_score_vs_n(result, "task"), "no row has task inputs"),
                        (lambda: plot_gap_vs_n(result, "text"), "no row has text inputs")):
        with pytest.raises(NopeInterpError, match=match):
            call()


def test_the_grid_heatmap_shows_the_mean_alone_for_one_seed():
    """The spread over seeds of one seed is undefined: its cells read the mean alone (before: ``0.500 ± 0.000``);
    two seeds read mean ± std."""
    from nope_interp.jobs import long_context

    site = "blocks.0.attn.hook_z"

    def row(norm: str, seed: int, score: float) -> "long_context.LongContextRow":
        one = {"mean": score, "std": 0.01, "n": 2}
        return long_context.LongContextRow(
            model=f"{norm}-s{seed}", arch={"normalization": norm, "attention": "causal", "window": None}, seed=seed,
            input="random", n=8, sites=(site,), scores={site: {"row_mean": one, "pooled": one, "recency_gap": one,
                                                                "lag_mean": [0.5]}}, seconds=0.0)

    cfg = long_context.LongContextConfig(lengths=(8,), n_sequences=2, max_lag=1)
    single = long_context.LongContextResult(cfg, (row("LN", 0, 0.5), row("none", 0, 0.25)), 0.0)
    fig = long_context.plot_grid(single)
    assert [list(r) for r in fig.data[0].text] == [["0.500"], ["0.250"]]
    assert "±" not in fig.layout.title.text and "one seed" in fig.layout.title.text
    two = long_context.LongContextResult(cfg, (row("LN", 0, 0.5), row("LN", 1, 0.7), row("none", 0, 0.25)), 0.0)
    fig = long_context.plot_grid(two)
    assert [list(r) for r in fig.data[0].text] == [["0.600 ± 0.141"], ["0.250"]]
    assert "mean ± std over seeds" in fig.layout.title.text


@pytest.mark.parametrize(("types", "expected"), [
    ((), ["blocks.0.attn.hook_z"]),  # types unknown
    (("nope", "nope", "nope"), ["blocks.0.attn.hook_z"]),
    (("rope", "rope", "nope"), ["blocks.0.attn.hook_z", "blocks.2.attn.hook_z"]),
    (("nope", "rope", "rope"), ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]),
    (("learned", "rope", "nope"), ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "blocks.2.attn.hook_z"]),
])
def test_the_console_line_of_a_hybrid_model_shows_its_first_layer_of_each_type(types, expected):
    """Before, the console printed layer 0 alone: a hybrid whose layer 0 is RoPE showed no NoPE layer at all."""
    from nope_interp.jobs.long_context import console_sites

    sites = tuple(f"blocks.{i}.{p}" for i in range(3) for p in ("attn.hook_z", "hook_resid_post"))
    assert console_sites(sites, types) == expected
    assert console_sites(("hook_embed", *sites), types) == ["hook_embed"]  # not a layer's site: alone


def test_long_context_console_names_each_layer_type_of_a_hybrid_run(capsys, tmp_path):
    from nope_interp.cli import main
    from nope_interp.pretrained import PRETRAINED_DIR

    run = PRETRAINED_DIR / "text" / "text-hybrid"
    assert main(["long-context", "--run", str(run), "--lengths", "16", "--inputs", "random", "--n-sequences", "2",
                 "--max-lag", "4", "--out-root", str(tmp_path)]) == 0
    out = capsys.readouterr()
    (line,) = [ln for ln in (out.out + out.err).splitlines() if "text-hybrid" in ln and "n=16" in ln]
    assert "L0 z (RoPE)" in line and "L2 z (NoPE)" in line
