"""The ``averaging`` job (nope_interp.jobs.averaging); its measurements are tested in test_averaging_checks.py."""

import json
import math

import numpy as np
import pytest
from conftest import assert_lists_every_file, assert_strict_json_files


@pytest.fixture
def job():
    from nope_interp.jobs import averaging

    return averaging


@pytest.fixture
def tiny_entries(tiny_cfg, addition_task):
    """Three tiny models on addition: causal init, bidirectional init, and one labelled as a trained run."""
    from nope_interp.jobs.common import ModelEntry, entry_from_init
    from nope_interp.model import build_model

    bidir = tiny_cfg.replace(attention="bidirectional")
    trained_cfg = tiny_cfg.replace(seed=3)
    return [entry_from_init(tiny_cfg, addition_task, "initialised"),
            entry_from_init(bidir, addition_task, "bidirectional_control"),
            ModelEntry(label="trained", kind="run", model=build_model(trained_cfg), model_cfg=trained_cfg,
                       task=addition_task)]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("n_prompts", 2, "n_prompts must be an integer in \\[3, 100000\\]"),
    ("eval_n", 0, "eval_n must be an integer"),
    ("tasks", ("sorting",), "unknown task 'sorting'"),
    ("tasks", (), "must not be empty"),
    ("protocol", "padded", "protocol must be one of full, authors, window"),
    ("window", 2, "window must be an integer in \\[3, 1000000\\]"),
    ("window", 32, "window=32 is only used with protocol window"),
])
def test_config_rejects_bad_values(job, field, value, message):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=message):
        job.AveragingConfig(**{field: value})


def test_config_defaults_and_json_round_trip(job):
    cfg = job.AveragingConfig()
    assert cfg.tasks == ("addition", "reversal", "indexing", "ordering") and cfg.n_prompts == 64
    assert cfg.eval_n == 500 and job.TAKES_MODELS is False and job.CONFIG is job.AveragingConfig
    other = cfg.replace(tasks=("reversal",), n_prompts=5)
    assert job.AveragingConfig.from_json(other.to_json()) == other


def test_run_and_write_on_tiny_models(job, tiny_entries, tmp_path):
    lines = []
    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5)
    result = job.run(cfg, tiny_entries, log=lines.append)
    assert len(lines) == 4 and lines[0].startswith("addition initialised: L0 entropy")
    # no causal replacement pattern on the control that exists to have no causal averaging: said once, not run
    assert lines[1] == ("addition bidirectional_control: bidirectional attention, so the uniform and random_matched "
                        "counterfactuals are skipped (causal replacement patterns; expected, not an error)")
    t = result.task("addition")
    assert [c.kind for c in t.model("bidirectional_control").counterfactual.conditions] == ["clean", "identity"]
    assert [c.kind for c in t.model("initialised").counterfactual.conditions] == [
        "clean", "uniform", "identity", "random_matched"]
    assert [m.label for m in t.models] == ["initialised", "bidirectional_control", "trained"]
    assert [m.causal for m in t.models] == [True, False, True]
    assert t.model("trained").counterfactual.condition("clean").exact_match is None  # no run: no test split
    d = json.loads(json.dumps(result.to_dict()))
    assert list(d) == ["n_prompts", "eval_n", "protocol", "tasks", "nope_interp_version", "git_commit",
                       "wall_time_s"]
    assert d["protocol"] == "full" and d["tasks"]["addition"]["trained"]["averaging"]["protocol"] == "full"
    assert set(d["tasks"]["addition"]["trained"]) == {"averaging", "counterfactual"}
    # the bidirectional control attends to every key: relative entropy against log(pos) for all rows
    assert t.model("bidirectional_control").averaging.layers[0].relative_entropy > 0.9

    paths = job.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert all(p.exists() for p in paths)
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    res_dir, fig_dir = tmp_path / "results" / "averaging", tmp_path / "figures" / "averaging"
    assert sorted(p.name for p in res_dir.iterdir()) == ["averaging.csv", "averaging.json"]
    assert sorted(p.name for p in fig_dir.glob("*.html")) == [
        "counterfactual_attention.html", "counterfactual_attention_initialised.html",
        "predicted_vs_observed_addition_initialised.html", "predicted_vs_observed_addition_trained.html"]
    assert json.loads((res_dir / "averaging.json").read_text())["tasks"] == d["tasks"]
    import csv

    rows = list(csv.DictReader((res_dir / "averaging.csv").open()))
    assert len(rows) == 3 * (2 + 4) - 2  # per model: one row per layer, one per condition (the control: 2)
    assert {r["protocol"] for r in rows} == {"full"} and "window" not in rows[0]  # the CSV alone says its inputs
    first = t.model("initialised").averaging.layers[0]
    assert rows[0]["layer"] == "0" and float(rows[0]["closed_form_mae"]) == pytest.approx(first.closed_form_mae)
    assert rows[2]["condition"] == "clean" and rows[2]["adjacency@blocks.0.attn.hook_z"]
    # condition rows name the seed of the random replacement patterns: the model's own, empty for the control,
    # which runs no random kind (before: only the JSON said)
    by_model = {r["model"]: r["pattern_seed"] for r in rows if r.get("condition")}
    assert by_model == {m.label: ("" if m.counterfactual.pattern_seed is None else str(m.counterfactual.pattern_seed))
                        for m in t.models}
    assert by_model["bidirectional_control"] == "" and by_model["initialised"] != by_model["trained"]


def test_plots_take_results(job, tiny_entries):
    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5)
    result = job.run(cfg, tiny_entries[:1] + tiny_entries[2:])
    ex = result.task("addition").model("initialised").example
    fig = job.plot_predicted_vs_observed(ex)
    np.testing.assert_allclose(fig.data[0].z, ex.predicted.numpy())
    np.testing.assert_allclose(fig.data[1].z, ex.observed.numpy())
    cf = job.plot_counterfactuals(result)
    assert len(cf.data) == 4 and cf.data[0].name == "clean"  # the trained model's four conditions
    # a first panel without some conditions (a non-causal trained model) still leaves one legend entry each
    import dataclasses

    t = result.task("addition")
    trained = t.model("trained")
    fewer = dataclasses.replace(trained, label="bidirectional run", counterfactual=dataclasses.replace(
        trained.counterfactual, conditions=trained.counterfactual.conditions[::2]))
    two = dataclasses.replace(result, tasks=(dataclasses.replace(t, models=(fewer, trained)),))
    legend = [d.name for d in job.plot_counterfactuals(two).data if d.showlegend]
    assert sorted(legend) == sorted(c.kind for c in trained.counterfactual.conditions)
    assert cf.data[0].x[0] == "embed" and not math.isnan(cf.data[0].y[0])
    assert cf.layout.annotations[0].text == "addition (trained)"  # no exact match without a test split
    # the initialised models (and the bidirectional control), where the paper's explanation is tested, get their
    # own figure with their own numbers (before: only the trained models were drawn, the claim's numbers were in
    # the CSV alone)
    init = job.plot_counterfactuals(result, "initialised")
    panels = [a.text for a in init.layout.annotations if a.text != "chance"]
    assert panels == ["addition (initialised)"]  # this result has no bidirectional control (the CLI test has)
    expected = [(c.kind, [c.scores[s] for s in c.scores]) for c in t.model("initialised").counterfactual.conditions]
    assert [(d.name, list(d.y)) for d in init.data] == expected and len(expected) == 4
    assert "initialised models" in init.layout.title.text and "trained models" in cf.layout.title.text
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="models must be one of trained, initialised"):
        job.plot_counterfactuals(result, "init")


def test_the_counterfactual_figure_has_one_legend_entry_per_condition(job):
    """Two panels: each condition once in the legend (same colour in both), exact matches in the panel titles."""
    import torch

    from nope_interp.averaging_checks import AveragingReport, Condition, CosineExample, CounterfactualReport

    def model(task, accs):
        conds = tuple(Condition(kind=k, scores={"hook_embed": 0.5, "blocks.0.attn.hook_z": 0.9}, exact_match=a)
                      for k, a in zip(("clean", "uniform", "identity", "random_matched"), accs, strict=True))
        eye = torch.eye(2, dtype=torch.float64)
        return job.ModelAveraging(label="trained", kind="pretrained", causal=True,
                                  averaging=AveragingReport(task=task, n_prompts=3, n_pos=2, layers=()),
                                  counterfactual=CounterfactualReport(task=task, layer=0, n_prompts=3,
                                                                      conditions=conds),
                                  example=CosineExample(task=task, prompt="ab", layer=0, predicted=eye, observed=eye))

    tasks_ = (job.TaskAveraging("addition", (model("addition", (0.99, 0.0, 0.0, 0.01)),)),
              job.TaskAveraging("reversal", (model("reversal", (1.0, 0.958, 0.0, 0.94)),)))
    result = job.AveragingResult(config=job.AveragingConfig(), tasks=tasks_, provenance={}, wall_time_s=0.0)
    fig = job.plot_counterfactuals(result)
    assert [t.name for t in fig.data if t.showlegend] == ["clean", "uniform", "identity", "random_matched"]
    assert len(fig.data) == 8 and [t.line.color for t in fig.data[:4]] == [t.line.color for t in fig.data[4:]]
    assert [a.text for a in fig.layout.annotations if a.text != "chance"] == [
        "addition (trained): exact match clean 0.990, uniform 0.000, identity 0.000, random_matched 0.010",
        "reversal (trained): exact match clean 1.000, uniform 0.958, identity 0.000, random_matched 0.940"]
    # before: one solid style for all four, so conditions that agree hid each other, and no chance line
    assert len({(t.line.dash, t.marker.symbol) for t in fig.data[:4]}) == 4
    assert [a.text for a in fig.layout.annotations].count("chance") == 2
    assert [(s.y0, s.y1) for s in fig.layout.shapes] == [(0.5, 0.5)] * 2
    assert fig.layout.yaxis.title.text == "adjacency score (row mean)"


def test_default_models_of_a_task(job):
    entries = job.task_models("reversal")
    assert [e.label for e in entries] == ["initialised", "bidirectional_control", "trained"]
    assert [e.model_cfg.attention for e in entries[:2]] == ["causal", "bidirectional"]
    assert entries[0].model_cfg.n_layers == 6 and entries[0].model_cfg.d_model == 384
    assert entries[2].kind == "pretrained" and entries[2].run is not None


@pytest.mark.parametrize(("protocol", "window", "n_pos"), [("authors", 64, 9), ("window", 24, 24)])
def test_run_under_another_protocol_measures_its_inputs_and_suffixes_every_file(job, tiny_entries, tmp_path,
                                                                                 protocol, window, n_pos):
    from nope_interp.analysis import analyze_model

    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5, protocol=protocol, window=window)
    result = job.run(cfg, tiny_entries)
    t = result.task("addition")
    for m in t.models:
        assert m.averaging.n_pos == n_pos and len(m.example.prompt) == n_pos
        assert m.averaging.protocol == m.counterfactual.protocol == m.example.protocol == protocol
    # the clean scores are analyze_model's on the same protocol (an independent path to the inputs)
    entry = tiny_entries[0]
    ref = analyze_model(entry.model, entry.task, 4, 1, protocol=protocol, window=window)
    clean = t.model("initialised").counterfactual.condition("clean").scores
    assert clean == pytest.approx({s: v["mean"] for s, v in ref.scores["row_mean"].items()})
    import tasks

    assert t.model("initialised").example.prompt == tasks.protocol_inputs(entry.task, protocol, 1, 1, window=window)[0]
    d = result.to_dict()
    assert d["protocol"] == protocol and ("window" in d) == (protocol == "window")
    job.write(result, tmp_path)
    res_dir, fig_dir = tmp_path / "results" / "averaging", tmp_path / "figures" / "averaging"
    tag = f"window{window}" if protocol == "window" else protocol
    assert sorted(p.name for p in res_dir.iterdir()) == [f"averaging_{tag}.csv", f"averaging_{tag}.json"]
    import csv

    rows = list(csv.DictReader((res_dir / f"averaging_{tag}.csv").open()))
    assert {(r["protocol"], r.get("window")) for r in rows} == {(protocol, str(window) if protocol == "window"
                                                                 else None)}
    figs = sorted(p.name for p in fig_dir.glob("*.html"))
    assert figs == sorted([f"counterfactual_attention_{tag}.html", f"counterfactual_attention_initialised_{tag}.html",
                           f"predicted_vs_observed_addition_initialised_{tag}.html",
                           f"predicted_vs_observed_addition_trained_{tag}.html"])
    assert all(f"{protocol} inputs" in (fig_dir / f).read_text() for f in figs)


def test_a_trained_models_training_prompts_are_never_measured(job, tiny_entries, addition_task):
    """Every input (the report's, the counterfactual's and the figure's example) excludes the training prompts."""
    import dataclasses

    first = addition_task.analysis_prompts(4, seed=1)
    trained = dataclasses.replace(tiny_entries[2], train_prompts=frozenset(first))
    result = job.run(job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5), [tiny_entries[0], trained])
    t = result.task("addition")
    assert t.model("initialised").example.prompt == first[0]  # nothing excluded for an initialised model
    assert t.model("trained").example.prompt not in first
    # scores on other prompts than the initialised model's: compare with the analysis that excludes them
    from nope_interp.analysis import analyze_model

    ref = analyze_model(trained.model, addition_task, 4, 1, exclude=frozenset(first))
    clean = t.model("trained").counterfactual.condition("clean").scores
    assert clean == pytest.approx({s: v["mean"] for s, v in ref.scores["row_mean"].items()})


def test_a_packed_run_is_scored_after_its_evaluation_newline(job, packed_run, tiny_entries, monkeypatch):
    """The counterfactual exact match of a run trained on packed windows reads its prompts after the newline
    it was evaluated with in training; an initialised model reads them bare."""
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    seen = {}
    real = job.counterfactual_report

    def spy(model, task, *args, **kwargs):
        seen[id(model)] = kwargs["prefix"]
        return real(model, task, *args, **kwargs)

    monkeypatch.setattr(job, "counterfactual_report", spy)
    job.run(job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5), [entry, tiny_entries[0]])
    assert seen == {id(entry.model): "\n", id(tiny_entries[0].model): ""}


def test_two_window_lengths_never_share_a_file(job, tiny_entries, tmp_path):
    import json

    for w in (12, 16):
        cfg = job.AveragingConfig(tasks=("addition",), n_prompts=3, eval_n=2, protocol="window", window=w)
        job.write(job.run(cfg, tiny_entries[:1]), tmp_path)
    res_dir = tmp_path / "results" / "averaging"
    assert sorted(p.name for p in res_dir.glob("*.json")) == ["averaging_window12.json", "averaging_window16.json"]
    assert [json.loads((res_dir / f"averaging_window{w}.json").read_text())["window"] for w in (12, 16)] == [12, 16]


def test_inputs_longer_than_a_models_n_ctx_name_the_model(job, tiny_entries):
    from nope_interp.errors import NopeInterpError

    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=3, eval_n=2, protocol="window", window=100)
    want = (r"^averaging: the window inputs do not fit 3 of 3 models: initialised \(n_ctx=48 is too small for "
            r"addition inputs of 100 tokens\), bidirectional_control .*, trained .*; window 48 or less fits every "
            "model given$")
    with pytest.raises(NopeInterpError, match=want):
        job.run(cfg, tiny_entries)


def test_exact_match_counts_the_examples_it_read_not_the_ones_asked_for(job, tiny_run):
    """--eval-n above a run's test split: all of it is read, the log says so and the report records it."""
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    entry = entry_from_run(load_run(tiny_run), "tiny-run")
    lines = []
    examples = job._eval_examples(entry, 10**9, lines.append)
    assert len(examples) == len(entry.run.splits.test) < 10**9
    assert lines == [f"{entry.task.name} tiny-run: exact match on all {len(examples)} test examples (eval_n "
                     f"1000000000 asked for more)"]
    assert job._eval_examples(entry, 3, lines.append) == list(entry.run.splits.test[:3]) and len(lines) == 1


def test_each_model_draws_its_own_random_patterns_the_same_in_any_company(job, tiny_entries):
    """Before: every model drew its random_matched patterns with the prompts' seed, so models measured
    together (seeds of one recipe) shared one draw. Now the seed is draw_seed("<task>/<label>")."""
    import dataclasses

    from nope_interp.jobs.common import draw_seed

    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=4, eval_n=5)
    trained = tiny_entries[2]
    twin = dataclasses.replace(trained, label="trained-2")   # the same weights under another label
    together = job.run(cfg, [trained, twin]).task("addition")
    seeds = [m.counterfactual.pattern_seed for m in together.models]
    assert seeds == [draw_seed("addition/trained"), draw_seed("addition/trained-2")] and seeds[0] != seeds[1]
    a, b = (m.counterfactual for m in together.models)
    assert a.condition("clean") == b.condition("clean")   # same model, same prompts
    assert a.condition("random_matched").scores != b.condition("random_matched").scores   # other draws
    alone = job.run(cfg, [twin]).task("addition").models[0].counterfactual
    assert alone == b


def test_draw_seed():
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import draw_seed

    labels = ["pretrained-addition", "addition-s1", "addition-s2", "a", ""]
    seeds = [draw_seed(label) for label in labels]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**32 for s in seeds)
    assert draw_seed("addition-s1") == seeds[1]
    for bad in (1, None, b"addition"):
        with pytest.raises(NopeInterpError, match="label must be a string"):
            unhooked(draw_seed)(bad)
    import os
    import zlib

    odd = os.fsdecode(b"run-\xff")   # an undecodable file name: a lone surrogate, which strict UTF-8 refuses
    assert draw_seed(odd) == zlib.crc32(b"run-\xed\xb3\xbf") and draw_seed("\ud800") != draw_seed("\ud801")


@pytest.mark.parametrize(("window", "n_bad"), [(300, 6), (70, 2)])
def test_inputs_too_long_for_a_default_model_are_refused_before_any_work(job, monkeypatch, window, n_bad):
    """Before: ``averaging --protocol window --window 70`` measured the initialised and bidirectional models of
    addition (about 13 s) before refusing the shipped trained model (n_ctx 64); and the window it advised was the
    first refused model's n_ctx (256 at --window 300), which the next model refused again."""
    from nope_interp.errors import NopeInterpError

    monkeypatch.setattr(job, "task_models", lambda name: pytest.fail("a model was built before the check"))
    cfg = job.AveragingConfig(tasks=("reversal", "addition"), n_prompts=3, eval_n=2, protocol="window", window=window)
    with pytest.raises(NopeInterpError, match=f"^averaging: the window inputs do not fit {n_bad} of 6 models: .*"
                                              r"reversal trained \(n_ctx=64 is too small for reversal inputs of "
                                              f"{window} tokens.*; window 64 or less fits every model given$"):
        job.run(cfg)


def test_inputs_too_long_for_a_later_given_model_are_refused_before_any_work(job, tiny_cfg, addition_task,
                                                                            monkeypatch):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    monkeypatch.setattr(job, "averaging_report", lambda *a, **k: pytest.fail("measured before the check"))
    entries = [entry_from_init(tiny_cfg, addition_task, "initialised"),
               entry_from_init(tiny_cfg.replace(n_ctx=16), addition_task, "short")]
    cfg = job.AveragingConfig(tasks=("addition",), n_prompts=3, eval_n=2, protocol="window", window=40)
    want = (r"^averaging: the window inputs do not fit 1 of 2 models: short \(n_ctx=16 is too small for addition "
            r"inputs of 40 tokens\); window 16 or less fits every model given$")
    with pytest.raises(NopeInterpError, match=want):
        job.run(cfg, entries)
