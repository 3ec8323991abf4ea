"""compare: groups by recipe, statistics over seeds equal to analysing each model, verdicts, files."""

import json
import statistics
from pathlib import Path

import pytest
from conftest import assert_lists_every_file, assert_strict_json_files


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Two seeds of one answer-only recipe and one packed run, tiny addition models."""
    from nope_interp.config import TrainConfig, preset
    from nope_interp.train import train

    root = tmp_path_factory.mktemp("compare")
    base = dict(task="addition", task_params={"n_digits": 2}, n_train=200, n_test=40, steps=20, batch_size=16,
                lr=3e-3, warmup_steps=5, eval_every=20, eval_n=20, checkpoint_every=20)
    runs = []
    for seed in (0, 1):
        runs.append(root / f"a-s{seed}")
        train(preset("tiny", n_ctx=24, seed=seed), TrainConfig(**base, seed=seed), runs[-1], progress=False,
              command="x")
    runs.append(root / "packed")
    train(preset("tiny", n_ctx=24), TrainConfig(**{**base, "objective": "packed", "window": 24}), runs[-1],
          progress=False, command="x")
    return runs


def test_groups_statistics_and_verdicts(tiny_runs, tmp_path):
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.model import build_model

    entries = load_models(ModelSource(run=tuple(str(r) for r in tiny_runs)))
    cfg = compare.CompareConfig(n_prompts=6, protocols=("full", "authors"))
    result = compare.run(cfg, entries)
    recipes = sorted(g.recipe for g in result.groups)
    assert len(recipes) == 2 and recipes[0].startswith("answer_only, 2x32, lr 0.003")
    assert recipes[1].startswith("packed, 2x32")
    group = next(g for g in result.groups if g.recipe.startswith("answer_only"))
    assert [s.seed for s in group.seeds] == [0, 1]
    # independent reference: analyse each seed's trained and step-0 weights, then mean and stdev
    z = "blocks.0.attn.hook_z"
    for protocol in ("full", "authors"):
        trained, init = [], []
        for e in entries[:2]:
            kw = dict(seed=1, exclude=e.train_prompts, protocol=protocol)
            trained.append(analyze_model(e.model, e.task, 6, **kw).scores["row_mean"][z]["mean"])
            init.append(analyze_model(build_model(e.model_cfg), e.task, 6, **kw).scores["row_mean"][z]["mean"])
        st = group.stats[protocol]
        assert st["trained"][z]["mean"] == pytest.approx(statistics.mean(trained), abs=1e-12)
        assert st["trained"][z]["std"] == pytest.approx(statistics.stdev(trained), abs=1e-12)
        assert st["initialised"][z]["mean"] == pytest.approx(statistics.mean(init), abs=1e-12)
        assert st["trained"][z]["n_seeds"] == 2
        # the authors' statistics and the exact match on the analysed inputs, per seed, from the same inputs
        import tasks as tasks_pkg
        from nope_interp.evaluate import exact_match_on_inputs

        for e, rec in zip(entries[:2], group.seeds, strict=True):
            res = analyze_model(e.model, e.task, 6, seed=1, exclude=e.train_prompts, protocol=protocol)
            a = rec.authors[protocol]["trained"][z]
            assert a["pooled_rounded_mean"] == res.scores["pooled_rounded"][z]["mean"]
            assert a["mean_matrix_pooled"] == pytest.approx(res.mean_matrix_score(z, "pooled"), abs=1e-12)
            inputs = tasks_pkg.protocol_inputs(e.task, protocol, 6, 1, e.train_prompts)
            assert rec.exact_match_on_inputs[protocol] == exact_match_on_inputs(e.model, e.task, inputs).to_dict()
    # verdicts: one per (protocol, kind, claimed site); in-range counts agree with the per-seed scores
    vs = [v for v in result.verdicts if v.recipe == group.recipe]
    assert {(v.protocol, v.kind) for v in vs} == {(p, k) for p in ("full", "authors") for k in compare.KINDS}
    for v in vs:
        low, high, _ = compare.CLAIMS["embed" if v.site == "hook_embed" else "first_attn"]
        per_seed = [s.scores[v.protocol][v.kind][v.site] for s in group.seeds]
        assert v.n_in_range == sum(low <= x <= high for x in per_seed)
        assert v.verdict == ("agrees" if low <= statistics.mean(per_seed) <= high else "DISAGREES")
    paths = compare.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert {p.name for p in paths} == {"compare.json", "compare.md", "compare.csv", "compare_full.html",
                                       "compare_authors.html", "compare_l0_z_full.html", "compare_l0_z_authors.html",
                                       "plotly.min.js"}
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    data = json.loads((tmp_path / "results" / "compare" / "compare.json").read_text())
    assert len(data["groups"]) == 2 and data["config"]["protocols"] == ["full", "authors"]
    # the figures, relative to the JSON's folder (before: relative to the folder the command ran in)
    figs = [p for p in paths if p.suffix == ".html"]
    assert data["figures"] == [f"../../figures/compare/{p.name}" for p in figs]
    assert all((tmp_path / "results" / "compare" / f).resolve() == p.resolve()
               for f, p in zip(data["figures"], figs, strict=True))
    # each seed names the run it came from (absolute, links resolved): before, compare.json had no path
    runs = {e.label: str(Path(e.run.path).resolve()) for e in entries}
    assert all(sd["run"] == runs[sd["label"]] for g in data["groups"] for sd in g["seeds"])
    md = (tmp_path / "results" / "compare" / "compare.md").read_text()
    assert "## Verdicts" in md and group.recipe in md and "## The authors' statistics at L0" in md
    seed0 = group.seeds[0].authors["authors"]["trained"][z]
    section = md.split("## The authors' statistics at L0")[1].split("\n## ")[0]
    authors_rows = [line for line in section.splitlines() if line.startswith(f"| addition | {group.recipe} | authors |")
                    and "| trained |" in line]
    assert len(authors_rows) == 1 and "±" in authors_rows[0]
    assert data["groups"][0]["seeds"][0]["authors"]["full"]["trained"][z].keys() == set(compare.AUTHORS_STATISTICS)
    assert 0 <= seed0["mean_matrix_pooled"] <= 1
    # beyond 512 positions no averaged matrix is kept: its scores are NaN, written as null; the report still renders
    for g in data["groups"]:
        for sd in g["seeds"]:
            for by_kind in sd["authors"].values():
                for by_site in by_kind.values():
                    for st in by_site.values():
                        st["mean_matrix_pooled"] = None
    nulls = compare.render_markdown(data).split("## The authors' statistics at L0")[1].split("\n## ")[0]
    assert all(line.split(" | ")[6] == "-" for line in nulls.splitlines() if line.startswith("| addition |"))
    # a seed without a summary (a run stopped before its test set) is "not finished", not "n/a (None)" nor a
    # seed that missed 99%: before, the Models table counted it in "0 of 1"
    g0 = data["groups"][0]
    g0["seeds"][1]["test_acc"], g0["seeds"][1]["steps"] = None, None
    models = compare.render_markdown(data).split("## Models")[1].split("\n## ")[0]
    (row,) = [line for line in models.splitlines() if line.startswith(f"| addition | {g0['recipe']} |")]
    label = g0["seeds"][1]["label"]
    assert f"{label} not finished (no summary)" in row and "None" not in row
    assert row.endswith(f"| {g0['n_at_target']} of 1 (1 not finished) |")
    # a one-seed group (the packed run) shows its mean alone: its spread is undefined, not 0
    # (the authors' statistics give a spread over prompts, also for one seed)
    rest = md.replace(section, "")
    packed_rows = [line for line in rest.splitlines() if line.startswith("| addition | packed") and "| full |" in line]
    assert packed_rows and all("±" not in line for line in packed_rows)
    two_seed_rows = [line for line in rest.splitlines() if line.startswith(f"| addition | {group.recipe} | full |")]
    assert two_seed_rows and all("±" in line for line in two_seed_rows)
    # the causal test: per seed, the diagnostics' own numbers; one row per trained model in the per-seed table
    s0 = group.seeds[0]
    assert s0.diagnostics["trained"]["l0_z_score_none"] == pytest.approx(s0.scores["full"]["trained"][z], abs=1e-12)
    # each seed draws its own resampled delimiters (before: seed 0 for every model), shared by its two models
    from nope_interp.diagnostics import diagnose
    from nope_interp.jobs.common import draw_seed

    assert [s.draw_seed for s in group.seeds] == [draw_seed(s.label) for s in group.seeds]
    assert group.seeds[0].draw_seed != group.seeds[1].draw_seed
    e0 = next(e for e in entries if e.label == s0.label)
    tokens = e0.task.analysis_tokens(6, 1, e0.train_prompts)
    assert s0.diagnostics["trained"] == diagnose(e0.model, e0.task, tokens, seed=draw_seed(s0.label))
    assert s0.diagnostics["initialised"] == diagnose(build_model(e0.model_cfg), e0.task, tokens, seed=s0.draw_seed)
    per_seed_rows = [line for line in md.splitlines() if line.startswith("| ") and f"| {s0.label} |" in line]
    assert len(per_seed_rows) == 1 and f"{s0.diagnostics['trained']['l0_z_score_both']:.3f}" in per_seed_rows[0]


def test_bad_config_and_initialised_models_are_refused():
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import entry_from_init
    from tasks import get_task

    for kw in ({"protocols": ("authors",)}, {"protocols": ("full", "nope")}, {"n_prompts": 1}, {"window": 1}):
        with pytest.raises(NopeInterpError):
            compare.CompareConfig(**kw)
    entry = entry_from_init(preset("tiny"), get_task("addition", n_digits=2), "init")
    with pytest.raises(NopeInterpError, match="trained runs"):
        compare.run(compare.CompareConfig(n_prompts=4), [entry])


def test_a_window_length_applies_to_the_window_protocol_only(tiny_runs):
    """With protocols (full, window) and window 12, the full inputs stay full-length and the window inputs
    are 12 characters: the scores equal analyze_model's under each protocol alone."""
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models

    entries = load_models(ModelSource(run=(str(tiny_runs[0]),)))
    result = compare.run(compare.CompareConfig(n_prompts=4, protocols=("full", "window"), window=12), entries)
    z, e = "blocks.0.attn.hook_z", entries[0]
    for protocol, kw in (("full", {}), ("window", {"window": 12})):
        ref = analyze_model(e.model, e.task, 4, seed=1, exclude=e.train_prompts, protocol=protocol, **kw)
        assert result.groups[0].stats[protocol]["trained"][z]["mean"] == pytest.approx(
            ref.scores["row_mean"][z]["mean"], abs=1e-12)
    assert result.groups[0].seeds[0].exact_match_on_inputs["window"]["n_inputs"] == 4


def test_figure_has_a_panel_per_recipe_and_one_legend_for_all(tiny_runs):
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models

    result = compare.run(compare.CompareConfig(n_prompts=4, protocols=("full",)),
                         load_models(ModelSource(run=tuple(str(r) for r in tiny_runs))))
    fig = compare.plot_compare(result)
    titles = [a.text for a in fig.layout.annotations if a.text != "chance"]
    assert sorted(titles) == sorted(f"addition: {g.recipe} ({len(g.seeds)} seed{'s' if len(g.seeds) != 1 else ''})"
                                    for g in result.groups)
    assert {t.name for t in fig.data} == {"initialised (step 0)", "trained"}
    # each panel's trained line is its own group's mean, in site order
    for g, trace in zip(result.groups, [t for t in fig.data if t.name == "trained"], strict=True):
        stats = g.stats["full"]["trained"]
        assert list(trace.y) == [st["mean"] for st in stats.values()]
        assert [c.split("<br>")[0] for c in trace.customdata] == list(stats)
        # a one-seed group's spread is undefined: no error bars (before: bars of 0 over "one seed")
        want = [None] * len(stats) if len(g.seeds) == 1 else [st["std"] for st in stats.values()]
        assert list(trace.error_y.array) == want
    assert {len(g.seeds) for g in result.groups} == {1, 2}   # both kinds of panel checked


def test_reading_names_the_interventions_that_lift_the_score():
    from nope_interp.jobs.compare import READING_LIFT, reading

    def d(none, uniform, neutral, both):
        return {"l0_z_score_none": none, "l0_z_score_uniform_attention": uniform,
                "l0_z_score_neutral_delimiters": neutral, "l0_z_score_both": both}

    assert READING_LIFT == 0.05
    assert reading(d(0.6, 0.9, 0.62, 0.93)) == "attention +0.30"
    assert reading(d(0.6, 0.68, 0.7, 0.9)) == "delimiter values +0.10, attention +0.08"
    assert reading(d(0.6, 0.63, 0.62, 0.7)) == "only both together +0.10"
    assert reading(d(0.97, 0.96, 0.95, 0.95)) == "neither"
    assert reading(d(0.5, 0.55, 0.5, 0.5)) == "attention +0.05"   # the threshold counts


def test_summary_figure_has_every_seed_at_its_score_and_each_group_mean(tiny_runs):
    """The overview: one marker per seed and kind at the seed's own score, the group mean as a tick, a row per
    group; trained markers split by whether the seed reached 99% (unknown when its test accuracy is)."""
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.stats import fmt_fraction

    result = compare.run(compare.CompareConfig(n_prompts=4, protocols=("full",)),
                         load_models(ModelSource(run=tuple(str(r) for r in tiny_runs))))
    # one seed marked as at 99% and one with an unknown test accuracy, so that all three marker sets appear
    group = next(g for g in result.groups if len(g.seeds) == 2)
    seeds = (dataclasses.replace(group.seeds[0], test_acc=0.995), dataclasses.replace(group.seeds[1], test_acc=None))
    groups = tuple(dataclasses.replace(g, seeds=seeds) if g is group else g for g in result.groups)
    result = dataclasses.replace(result, groups=groups)
    z = compare.SUMMARY_SITE
    fig = compare.plot_site_summary(result)
    # the legend hangs below the two-line title, so that wrapped rows grow downwards, never over the title
    assert (fig.layout.legend.yref, fig.layout.legend.yanchor) == ("container", "top")
    assert 60 <= (1 - fig.layout.legend.y) * fig.layout.height <= fig.layout.margin.t - 60
    rows = [f"{g.task}: {g.recipe} ({len(g.seeds)})" for g in result.groups]
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["trained: mean over seeds"].y) == rows
    assert list(by_name["trained: mean over seeds"].x) == [g.stats["full"]["trained"][z]["mean"] for g in groups]
    init = by_name["initialised (step 0)"]
    assert len(init.x) == sum(len(g.seeds) for g in groups)
    expected = {(row, s.label): s for row, g in zip(rows, groups, strict=True) for s in g.seeds}
    for trace in fig.data:
        if trace.name.endswith("mean over seeds"):
            continue
        kind = "initialised" if trace.name.startswith("initialised") else "trained"
        for row, x, (label, acc) in zip(trace.y, trace.x, trace.customdata, strict=True):
            seed = expected[(row, label)]
            assert x == seed.scores["full"][kind][z]
            assert acc == ("n/a" if seed.test_acc is None else fmt_fraction(seed.test_acc))
            if kind == "trained":
                reached = None if seed.test_acc is None else seed.test_acc >= 0.99
                assert trace.name == {True: "trained, at 99% test exact match", False: "trained, below 99%",
                                      None: "trained, test exact match unknown"}[reached]
    assert {"trained, at 99% test exact match", "trained, test exact match unknown"} <= set(by_name)
    # a step-0 marker's hover quotes the trained model's accuracy and says so (before: "test exact match 0.9962"
    # under "initialised (step 0)", read as the step-0 weights' accuracy); a mean tick says which mean it is
    assert "(step 0)" in init.hovertemplate and "its trained model's test exact match" in init.hovertemplate
    assert "(trained)" in by_name["trained, at 99% test exact match"].hovertemplate
    assert "step-0 mean over seeds" in by_name["initialised (step 0): mean over seeds"].hovertemplate
    assert "trained mean over seeds" in by_name["trained: mean over seeds"].hovertemplate
    # the page's width, not a fixed 1300 pixels (which scrolled in a smaller window, hiding the step-0 markers
    # near 1.0); a left margin that holds the longest row label; the title's first line without the subtitle
    assert fig.layout.width is None and fig.layout.margin.l >= 6 * max(map(len, rows))
    assert "<br>" in fig.layout.title.text and len(fig.layout.title.text.split("<br>")[0]) < 80
    # chance is labelled, as in every other figure (before: an unlabelled dotted line)
    (chance,) = [s for s in fig.layout.shapes if s.x0 == s.x1 == 0.5]
    assert chance.line.dash == "dot" and [a.text for a in fig.layout.annotations if a.x == 0.5] == ["chance"]
    with pytest.raises(NopeInterpError, match="protocol 'authors' was not measured"):
        compare.plot_site_summary(result, "authors")
    with pytest.raises(NopeInterpError, match="blocks.9.attn.hook_z was not analysed"):
        compare.plot_site_summary(result, site="blocks.9.attn.hook_z")


def test_only_runs_of_one_recipe_are_pooled_as_seeds(tiny_runs, monkeypatch, tmp_path):
    """Runs that differ in architecture (rotary) or task size (n_digits) are other recipes even when their
    short labels agree: they get groups of their own, whose labels name the difference; runs saved alike
    but for their seeds share one group."""
    import dataclasses

    import tasks
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models

    a0, a1, _ = load_models(ModelSource(run=tuple(str(r) for r in tiny_runs)))
    # stand-ins for runs of other recipes, each in a directory of its own (one directory twice is refused)
    rotary = dataclasses.replace(a1, label="rotary", model_cfg=dataclasses.replace(a1.model_cfg, positional="rotary"),
                                 run=dataclasses.replace(a1.run, path=tmp_path / "rotary"))
    bigger = dataclasses.replace(a1, label="three-digit", task=tasks.get_task("addition", n_digits=3))
    # trained on 3 digits, analysed on 2 like a0 and a1 (compare --n-digits 2): another recipe all the same
    other = dataclasses.replace(a1, label="trained-on-3", run=dataclasses.replace(
        a1.run, task=tasks.get_task("addition", n_digits=3), path=tmp_path / "trained-on-3"))
    monkeypatch.setattr(compare, "_seed_record", lambda e, cfg: compare.SeedRecord(
        label=e.label, seed=e.model_cfg.seed, test_acc=1.0, steps=20,
        scores={"full": {k: {"hook_embed": 0.5} for k in compare.KINDS}}, diagnostics={k: {} for k in compare.KINDS}))
    result = compare.run(compare.CompareConfig(n_prompts=6, protocols=("full",)), [a0, a1, rotary, bigger, other])
    groups = {g.recipe: [s.label for s in g.seeds] for g in result.groups}
    assert len(groups) == 4 and sorted(map(len, groups.values())) == [1, 1, 1, 2]
    base = compare.recipe_of(a0)
    differ = "model.positional={}, task.n_digits={}, trained_on.n_digits={}"
    assert groups[f"{base}, " + differ.format("none", 2, 2)] == [a0.label, a1.label]
    assert groups[f"{base}, " + differ.format("rotary", 2, 2)] == ["rotary"]
    assert groups[f"{base}, " + differ.format("none", 3, 2)] == ["three-digit"]
    assert groups[f"{base}, " + differ.format("none", 2, 3)] == ["trained-on-3"]
    alone = compare.run(compare.CompareConfig(n_prompts=6, protocols=("full",)), [a0, a1])
    assert [g.recipe for g in alone.groups] == [base]  # no twin: the short label


def test_a_model_with_positional_embeddings_is_refused_before_any_work(tiny_runs):
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models

    a0, a1, _ = load_models(ModelSource(run=tuple(str(r) for r in tiny_runs)))
    from nope_interp.model import build_model

    cfg = dataclasses.replace(a1.model_cfg, positional="learned")
    learned = dataclasses.replace(a1, label="learned-s1", model_cfg=cfg, model=build_model(cfg))
    lines = []
    with pytest.raises(NopeInterpError, match="learned-s1: compare takes models without positional embeddings "
                                              r"\(NoPE or rotary\), got standard positional embeddings"):
        compare.run(compare.CompareConfig(n_prompts=6, protocols=("full",)), [a0, learned], log=lines.append)
    assert not any("a-s0" in line for line in lines)  # refused before the first model was analysed


@pytest.mark.parametrize(("site", "value", "n"), [("hook_embed", 0.35, 3), ("hook_embed", 0.35, 6),
                                                  ("hook_embed", 0.65, 13), ("blocks.0.attn.hook_z", 0.8, 3)])
def test_seeds_all_on_the_claims_boundary_agree(site, value, n):
    """A mean of seeds that are all in range is in range: the rounding of the mean (3 x 0.35 averages to
    0.34999999999999998) does not turn a boundary into a disagreement."""
    from nope_interp.jobs import compare

    scores = {"full": {k: {"hook_embed": 0.5, "blocks.0.attn.hook_z": 0.9, site: value} for k in compare.KINDS}}
    seeds = [compare.SeedRecord(label=f"s{i}", seed=i, test_acc=1.0, steps=1, scores=scores,
                                diagnostics={k: {} for k in compare.KINDS}) for i in range(n)]
    group = compare._group("addition", "r", seeds, ("full",))
    (v,) = [v for v in compare.verdicts(group) if v.site == site and v.kind == "trained"]
    assert v.n_in_range == n and v.verdict == "agrees"


def test_a_label_names_the_outputs_so_a_second_comparison_keeps_the_first(tiny_runs, tmp_path, capsys):
    """Before: every comparison wrote results/compare/compare.* and figures/compare/compare_*.html, so a second
    call replaced the first one's files. --label names them; the default stays compare; a label that is not
    one safe file name is refused before any work (one line, exit 2, nothing written)."""
    from nope_interp.cli import main

    out = tmp_path / "out"
    common = ["compare", "--run", str(tiny_runs[0]), str(tiny_runs[1]), "--n-prompts", "4", "--protocols", "full",
              "--out-root", str(out)]
    assert main(common) == 0
    assert main([*common[:3], str(tiny_runs[2]), *common[4:], "--label", "packed-only"]) == 0
    capsys.readouterr()
    names = {p.name for p in (out / "results" / "compare").iterdir()}
    assert names == {f"{stem}.{ext}" for stem in ("compare", "packed-only") for ext in ("json", "md", "csv")}
    assert {p.name for p in (out / "figures" / "compare").glob("*.html")} == {
        "compare_full.html", "compare_l0_z_full.html", "packed-only_full.html", "packed-only_l0_z_full.html"}
    first = json.loads((out / "results" / "compare" / "compare.json").read_text())
    second = json.loads((out / "results" / "compare" / "packed-only.json").read_text())
    assert len(first["groups"][0]["seeds"]) == 2 and second["config"]["label"] == "packed-only"
    assert {sd["label"] for g in second["groups"] for sd in g["seeds"]} == {tiny_runs[0].name, tiny_runs[2].name}
    for bad in ("../x", "a/b", ".hidden", ""):
        assert main([*common[:-1], str(tmp_path / "bad"), "--label", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--label must be one folder name" in err, err
        assert not (tmp_path / "bad").exists()


def test_a_label_that_would_collide_with_an_overview_figure_is_refused_and_no_groups_still_plot():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import compare

    with pytest.raises(NopeInterpError, match="label must not end in _l0_z"):
        compare.CompareConfig(label="a_l0_z")
    compare.CompareConfig(label="a_l0_z_full")  # its files never meet another label's
    empty = compare.CompareResult(config=compare.CompareConfig(protocols=("full",)), groups=(), verdicts=(),
                                  wall_time_s=0.0, provenance={})
    assert compare.plot_site_summary(empty).layout.margin.l == 40


def test_a_written_comparison_loads_back_and_redraws_the_same_figures(tiny_runs, tmp_path):
    import math

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import json_safe
    from nope_interp.jobs import compare
    from nope_interp.jobs.common import ModelSource, load_models

    entries = load_models(ModelSource(run=tuple(str(r) for r in tiny_runs)))
    result = compare.run(compare.CompareConfig(n_prompts=4, protocols=("full", "authors"), label="rt"), entries)
    compare.write(result, tmp_path)
    path = tmp_path / "results" / "compare" / "rt.json"
    loaded = compare.load_compare(path)
    assert json_safe(loaded.to_dict()) == json_safe(result.to_dict())  # every number, NaN written as null included
    # a rerun of the same label under fewer protocols removes the figures of the protocol it did not rerun, and
    # leaves another label's alone (before: rt_authors.html stayed beside results without its numbers)
    import dataclasses

    figs = tmp_path / "figures" / "compare"
    other = compare.write(dataclasses.replace(result, config=dataclasses.replace(result.config, label="kept")),
                          tmp_path)
    fewer = compare.write(dataclasses.replace(result, config=dataclasses.replace(result.config, protocols=("full",))),
                          tmp_path)
    assert not (figs / "rt_authors.html").exists() and not (figs / "rt_l0_z_authors.html").exists()
    assert (figs / "rt_full.html") in fewer and all(p.exists() for p in other)
    compare.write(result, tmp_path)  # as it was, for what follows
    for protocol in ("full", "authors"):
        summary = compare.plot_site_summary
        assert summary(loaded, protocol).to_json() == summary(result, protocol).to_json()
        assert compare.plot_compare(loaded, protocol).to_json() == compare.plot_compare(result, protocol).to_json()
    # a null (an undefined number) reads back as NaN, as the run held it; an unknown test_acc stays None
    data = json.loads(path.read_text())
    data["groups"][0]["stats"]["full"]["trained"]["hook_embed"]["ci_low"] = None
    data["groups"][0]["seeds"][0]["test_acc"] = None
    path.write_text(json.dumps(data))
    again = compare.load_compare(path)
    assert math.isnan(again.groups[0].stats["full"]["trained"]["hook_embed"]["ci_low"])
    assert again.groups[0].seeds[0].test_acc is None
    # what is not a comparison is refused in one line naming the file and what is wrong
    site = "blocks.0.attn.hook_z"
    bad_cases = [
        ([], "not an object"),
        ({k: v for k, v in data.items() if k != "groups"}, "missing groups"),
        ({**data, "groups": {}}, "must be lists"),
        ({**data, "groups": [{**data["groups"][0], "seeds": []}]}, "at least one seed"),
        ({**data, "groups": [{k: v for k, v in data["groups"][0].items() if k != "stats"}]}, "KeyError"),
    ]
    g = json.loads(json.dumps(data["groups"][0]))
    g["seeds"][0]["scores"]["authors"]["initialised"][site] = 1.5
    bad_cases.append(({**data, "groups": [g]}, "number in [0, 1]"))
    g = json.loads(json.dumps(data["groups"][0]))
    g["seeds"][0]["unknown_field"] = 1
    bad_cases.append(({**data, "groups": [g]}, "TypeError"))
    for i, (bad, words) in enumerate(bad_cases):
        p = tmp_path / f"bad{i}.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(NopeInterpError, match="not a compare result") as err:
            compare.load_compare(p)
        assert words in str(err.value) and str(p) in str(err.value)
    with pytest.raises(NopeInterpError, match="not found"):
        compare.load_compare(tmp_path / "missing.json")


def test_the_report_marks_scores_measured_off_the_models_distribution():
    """The issue asked for scores measured off-distribution to be flagged, not only explained in prose: on the
    measured files, the 256-character reversal model's window inputs (exact match 0.004 against 0.590 on the test
    set) are marked, its full and authors' inputs (0.594, 0.504) and the indexing model at 99% (1.000) are not."""
    from pathlib import Path

    from nope_interp.jobs.compare import load_compare, render_markdown

    here = Path(__file__).resolve().parents[1] / "docs" / "measured" / "compare"
    rows = {}
    for name in ("reversal-packed-w256-drop02-s0", "indexing-packed-paperlr-tied-dropout-s0"):
        md = render_markdown(load_compare(here / f"{name}.json").to_dict())
        rows[name] = {line.split(" | ")[2]: line for line in md.splitlines()
                      if line.startswith("| ") and " | trained | " in line and line.count(" | ") == 7}
    w256 = rows["reversal-packed-w256-drop02-s0"]
    assert w256["window"].endswith("| 0.004 (256), off-distribution |"), w256["window"]
    assert "off-distribution" not in w256["full"] + w256["authors"]
    assert not any("off-distribution" in line for line in rows["indexing-packed-paperlr-tied-dropout-s0"].values())
