"""The analyze job: config, run on tiny models, files written, scores equal to the core pipeline."""

import json

import pytest
from conftest import assert_lists_every_file, assert_strict_json_files


@pytest.fixture
def tiny_init_reversal_entry():
    import tasks
    from nope_interp.config import preset
    from nope_interp.jobs.common import entry_from_init

    return entry_from_init(preset("tiny", seed=2), tasks.get_task("reversal"), "tiny-reversal")


def test_run_equals_analyze_model_and_writes_files(tiny_init_reversal_entry, tmp_path):
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import analyze

    cfg = analyze.AnalyzeConfig(n_prompts=12, points=("embed", "z"), prompt_seed=4)
    result = analyze.run(cfg, [tiny_init_reversal_entry])
    entry = tiny_init_reversal_entry
    ref = analyze_model(entry.model, entry.task, 12, seed=4, points=("embed", "z"))
    assert result.models[0].analysis.scores == ref.scores
    paths = analyze.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "figures/analyze/tiny-reversal/adjacency.html", "figures/analyze/tiny-reversal/cosine.html",
        "figures/analyze/tiny-reversal/lag_profile.html", "figures/analyze/tiny-reversal/plotly.min.js",
        "results/analyze/tiny-reversal/scores.json"]
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    scores = json.loads((tmp_path / "results/analyze/tiny-reversal/scores.json").read_text())
    assert scores["sites"] == ["hook_embed", "blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    assert scores["init"]["seed"] == 2 and "git_commit" in scores
    # the lag profile of every site: c(d) for d = 1..pos - 1, the same numbers as analyze_model's
    n_pos = entry.task.max_prompt_len
    lag = scores["lag_profile"]
    assert len(lag["uniform_causal"]) == n_pos - 1 and list(lag["sites"]) == scores["sites"]
    z = lag["sites"]["blocks.0.attn.hook_z"]
    assert z["lags"] == list(range(1, n_pos)) and z["n"] == 12 and len(z["std"]) == n_pos - 1
    assert z == ref.lag_profile["blocks.0.attn.hook_z"]
    assert z["recency_gap"]["mean"] == pytest.approx(z["mean"][0] - z["mean"][-1])
    json.dumps(result.to_dict())
    # rewritten for inputs too long to keep a cosine matrix, the model's cosine.html of the shorter inputs is
    # removed (before: left beside scores that no longer held its inputs); another model's files stay
    import dataclasses

    m = result.models[0]
    other = dataclasses.replace(m, label="other-model")
    analyze.write(dataclasses.replace(result, models=(other,)), tmp_path)
    long = dataclasses.replace(m, analysis=dataclasses.replace(m.analysis, example_sim=None))
    analyze.write(dataclasses.replace(result, models=(long,)), tmp_path)
    assert not (tmp_path / "figures/analyze/tiny-reversal/cosine.html").exists()
    assert (tmp_path / "figures/analyze/tiny-reversal/adjacency.html").exists()
    assert (tmp_path / "figures/analyze/other-model/cosine.html").exists()


def test_label_applies_to_a_single_model(tiny_init_reversal_entry):
    from nope_interp.jobs import analyze

    result = analyze.run(analyze.AnalyzeConfig(n_prompts=4, label="mine"), [tiny_init_reversal_entry])
    assert result.models[0].label == "mine"


@pytest.mark.parametrize("kwargs,match", [
    ({"n_prompts": 0}, "n_prompts"), ({"points": ("resid_final",)}, "unknown activation point 'resid_final'"),
    ({"prompt_seed": -1}, "prompt_seed"),
    # before: --text-length without --text-file was silently ignored (exit 0, windows of the default length)
    ({"text_length": 10}, "^text_length=10 is only used with text_file; here"),  # the CLI names the flags
])
def test_bad_config(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.analyze import AnalyzeConfig

    with pytest.raises(NopeInterpError, match=match):
        AnalyzeConfig(**kwargs)


def test_no_models_is_an_error():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import analyze

    with pytest.raises(NopeInterpError, match="^analyze needs models: give one of run, pretrained, init, hf_path$"):
        analyze.run(analyze.AnalyzeConfig())


@pytest.mark.parametrize("kwargs,match", [
    ({"run": ("a",), "init": True}, "^give at most one of run, pretrained, init, hf_path; got run and init$"),
    ({"init": True}, "^init needs task"),
    ({"pretrained": ("sorting",)}, "unknown task 'sorting'"), ({"run": ("a",), "with_seeds": True}, "^with_seeds adds"),
    ({"init": True, "task": "addition", "preset": "huge"}, "unknown preset"),
])
def test_bad_model_source(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    with pytest.raises(NopeInterpError, match=match):
        ModelSource(**kwargs)


def test_model_sources_resolve_to_entries():
    from nope_interp.jobs.common import ModelSource, load_models

    (init,) = load_models(ModelSource(init=True, task="addition", preset="tiny", model_overrides={"init_std": 0.2}))
    assert init.label == "init-tiny-addition-init_std0.2" and init.kind == "init" and not init.train_prompts
    # the task's size is in the label when given (before: --n-digits 5 and 7 gave one label, one output folder)
    labels = [load_models(ModelSource(init=True, task="addition", preset="tiny", n_digits=n))[0].label for n in (5, 7)]
    assert labels == ["init-tiny-addition-n_digits5", "init-tiny-addition-n_digits7"]
    (shipped,) = load_models(ModelSource(pretrained=("reversal",)))
    assert shipped.label == "pretrained-reversal" and len(shipped.train_prompts) == 20_000
    assert shipped.run is not None and shipped.run.name == "shipped"
    (other_task,) = load_models(ModelSource(pretrained=("reversal",), task="addition"))
    assert other_task.task.name == "addition" and not other_task.train_prompts


def test_another_protocol_gets_its_own_label(tiny_init_reversal_entry):
    from nope_interp.jobs import analyze

    result = analyze.run(analyze.AnalyzeConfig(n_prompts=4, protocol="authors"), [tiny_init_reversal_entry])
    assert result.models[0].label == "tiny-reversal-authors" and result.models[0].analysis.protocol == "authors"
    for w in (16, 24):  # and so does each window length
        cfg = analyze.AnalyzeConfig(n_prompts=4, protocol="window", window=w)
        result = analyze.run(cfg, [tiny_init_reversal_entry])
        assert result.models[0].label == f"tiny-reversal-window{w}"


def test_shipped_entries_refuses_a_single_string():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import shipped_entries

    for bad in ("reversal", "addition"):
        with pytest.raises(NopeInterpError, match="single string"):
            shipped_entries(bad)
    assert [e.task.name for e in shipped_entries(["reversal"])] == ["reversal"]


@pytest.mark.parametrize("n_prompts", [1, 3])
def test_the_log_shows_a_spread_over_prompts_only_where_there_is_one(tiny_init_reversal_entry, n_prompts):
    """One prompt has no spread: the log shows the score alone (before: ``0.981 ± 0.000``, a certainty nobody
    measured); three prompts show mean ± std, the std the result holds."""
    from nope_interp.jobs import analyze

    lines: list[str] = []
    result = analyze.run(analyze.AnalyzeConfig(n_prompts=n_prompts, points=("embed", "z")), [tiny_init_reversal_entry],
                         log=lines.append)
    row = result.models[0].analysis.scores["row_mean"]
    assert f"{n_prompts} input{'s' if n_prompts > 1 else ''} (" in lines[0]  # "1 input", not "1 inputs"
    site_lines = [line for line in lines if "recency gap" in line]
    assert len(site_lines) == len(row) >= 2
    for line, (site, st) in zip(site_lines, row.items(), strict=True):
        assert site in line and f"{st['mean']:.3f}" in line and st["n"] == n_prompts
        assert ("±" in line) == (n_prompts > 1)
        if n_prompts > 1:
            assert f"{st['mean']:.3f} ± {st['std']:.3f}" in line


def test_every_entry_records_its_model_directory_absolute_and_resolved(tiny_run, tmp_path, monkeypatch):
    """Before: ``model_source`` (in every result's meta and the demo summary) was the path as given, relative
    for ``--run runs/x`` and the link itself for a symlink, while ``run`` was already absolute and resolved."""
    import os

    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import ModelSource, load_models, resolved_dir

    monkeypatch.chdir(tmp_path)
    os.symlink(tiny_run, tmp_path / "link")
    want = str(tiny_run.resolve())
    for given in ("link", str(tmp_path / "link"), os.path.relpath(tiny_run, tmp_path)):
        (entry,) = load_models(ModelSource(run=(given,)))
        assert entry.source["model_source"] == want, given
        res = analyze.run(analyze.AnalyzeConfig(n_prompts=3, points=("z",)), [entry])
        assert res.models[0].analysis.meta["model_source"] == want, given
    assert resolved_dir("~") == str(__import__("pathlib").Path.home().resolve())


def test_long_context_and_length_gen_rows_name_the_models_directory(tiny_run, tmp_path, monkeypatch):
    """From a review: long-context and length-gen results named a model only by its label (a link's name),
    with no directory, where every other job writes ``run``."""
    import os

    from nope_interp.jobs import length_gen, long_context
    from nope_interp.jobs.common import ModelSource, load_models

    monkeypatch.chdir(tmp_path)
    os.symlink(tiny_run, tmp_path / "link")
    (entry,) = load_models(ModelSource(run=("link",)))
    want = str(tiny_run.resolve())
    lc = long_context.run(long_context.LongContextConfig(lengths=(8,), n_sequences=1, max_lag=4, inputs=("task",)),
                          [entry])
    assert {r.run for r in lc.rows} == {want} and lc.rows[0].to_dict()["run"] == want
    lg = length_gen.run(length_gen.LengthGenConfig(sizes=(1,), n_examples=4, n_prompts=2, points=("z",)), [entry])
    assert {r.run for r in lg.rows} == {want} and lg.rows[0].to_dict()["run"] == want


def test_analyze_warns_when_it_overwrites_another_run_of_the_same_folder_name(tiny_run, tmp_path, capsys):
    """Before: ``analyze --run a/t`` then ``--run b/t`` replaced the first's scores without a word; on the command
    line the warning names --out-root."""
    import shutil

    from nope_interp.cli import main

    twin = tmp_path / "elsewhere" / tiny_run.name
    shutil.copytree(tiny_run, twin)
    argv = ["--n-prompts", "2", "--points", "z", "--out-root", str(tmp_path / "out")]
    assert main(["analyze", "--run", str(tiny_run), *argv]) == 0
    assert main(["analyze", "--run", str(tiny_run), *argv]) == 0  # the same run again: no warning
    assert "warning" not in capsys.readouterr().err
    assert main(["analyze", "--run", str(twin), *argv]) == 0
    err = capsys.readouterr().err
    assert "nope-interp: warning: analyze: overwriting" in err and "elsewhere" in err, err
    assert "give another --label or --out-root to keep both" in err, err  # analyze has --label: offered first


def test_diagnostics_and_the_exact_match_on_the_analysed_inputs_are_recorded_beside_the_scores(tiny_run, tmp_path,
                                                                                                tiny_init_reversal_entry):
    """The issue asked for diagnostics beside every score (analyze gave none): scores.json records the layer-0
    diagnostics (equal to diagnose on the same prompts) and, for a trained model, its exact match on the very
    inputs analysed (equal to exact_match_on_inputs on them) with the test exact match and the off-distribution
    flag; the log prints both. An initialised model gets the diagnostics alone (its exact match means nothing)."""
    from nope_interp.analysis import protocol_prompts
    from nope_interp.diagnostics import diagnose
    from nope_interp.evaluate import exact_match_on_inputs, off_distribution
    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import ModelSource, draw_seed, load_models

    entry = load_models(ModelSource(run=(str(tiny_run),)))[0]
    log = []
    result = analyze.run(analyze.AnalyzeConfig(n_prompts=6, protocol="authors"), [entry], log=log.append)
    meta = result.models[0].analysis.meta
    tokens = entry.task.analysis_tokens(6, 1, entry.train_prompts)  # the default prompt seed, 1
    assert meta["diagnostics"] == diagnose(entry.model, entry.task, tokens, seed=draw_seed(entry.label))
    inputs = protocol_prompts(entry.model, entry.task, 6, 1, entry.train_prompts, "authors")
    em = exact_match_on_inputs(entry.model, entry.task, inputs).to_dict()
    test_acc = entry.run.summary["test_acc"]
    assert meta["exact_match_on_inputs"] == {**em, "test_acc": test_acc,
                                             "off_distribution": off_distribution(em["exact_match"], test_acc)}
    assert any(line.startswith("  layer 0 (on full prompts): attention entropy ") for line in log)
    assert any(line.startswith("  exact match on these inputs ") for line in log)
    analyze.write(result, tmp_path)
    saved = json.loads(next((tmp_path / "results" / "analyze").glob("*/scores.json")).read_text())
    assert saved["exact_match_on_inputs"]["n_inputs"] == 6 and "l0_attention_entropy" in saved["diagnostics"]
    init = analyze.run(analyze.AnalyzeConfig(n_prompts=4), [tiny_init_reversal_entry]).models[0].analysis.meta
    assert "l0_attention_entropy" in init["diagnostics"] and "exact_match_on_inputs" not in init


def test_a_model_analysed_on_another_task_size_is_not_compared_with_its_own_test_set(tiny_run):
    """A review: `--n-digits` / `--task` on a trained model compared the exact match on the other task's inputs
    with the model's own task's test exact match (and printed it as "test set"), flagging or not by accident."""
    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import ModelSource, load_models

    entry = load_models(ModelSource(run=(str(tiny_run),), n_digits=3))[0]
    log = []
    em = analyze.run(analyze.AnalyzeConfig(n_prompts=4), [entry], log=log.append).models[0].analysis.meta[
        "exact_match_on_inputs"]
    assert em["test_acc"] is None and em["off_distribution"] is False and em["trained_task"] == "addition (n_digits 2)"
    line = next(x for x in log if x.startswith("  exact match on these inputs "))
    assert "(trained on addition (n_digits 2): no test exact match to compare)" in line and "test set" not in line
