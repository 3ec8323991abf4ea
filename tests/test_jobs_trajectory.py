"""Adjacency through training: kept steps, scores equal to analysing each kept checkpoint, files."""

import json

import pytest
from conftest import assert_lists_every_file, assert_strict_json_files


@pytest.fixture(scope="module")
def tiny_addition_run_with_kept_steps(tmp_path_factory):
    from nope_interp.config import TrainConfig, preset
    from nope_interp.train import train

    run_dir = tmp_path_factory.mktemp("traj") / "tiny-addition"
    cfg = TrainConfig(task="addition", task_params={"n_digits": 2}, n_train=200, n_test=40, steps=60,
                      batch_size=16, lr=3e-3, warmup_steps=5, eval_every=20, eval_n=20, checkpoint_every=30)
    train(preset("tiny", n_ctx=16), cfg, run_dir, progress=False, command="x")
    return run_dir


def test_kept_steps_are_log_spaced(tiny_addition_run_with_kept_steps):
    from nope_interp.jobs.trajectory import kept_steps

    assert list(kept_steps(tiny_addition_run_with_kept_steps)) == [0, 25, 50, 60]


def test_scores_equal_analysing_each_kept_checkpoint(tiny_addition_run_with_kept_steps, tmp_path):
    from nope_interp import io
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.model import build_model

    entries = load_models(ModelSource(run=(str(tiny_addition_run_with_kept_steps),)))
    cfg = trajectory.TrajectoryConfig(n_prompts=8, points=("embed", "z"))
    result = trajectory.run(cfg, entries)
    (r,) = result.runs
    assert r.steps == (0, 25, 50, 60) and r.objective == "answer_only" and r.eval_steps == (20, 40, 60)
    model = build_model(entries[0].model_cfg)
    kept = tiny_addition_run_with_kept_steps / "checkpoints"
    model.load_state_dict(io.load_weights(kept / "step_000025.safetensors"))
    ref = analyze_model(model, entries[0].task, 8, seed=1, points=("embed", "z"), exclude=entries[0].train_prompts)
    assert r.scores["blocks.0.attn.hook_z"][1] == ref.scores["row_mean"]["blocks.0.attn.hook_z"]["mean"]
    # the step-0 weights are the init: the same scores as a freshly built model
    ref0 = analyze_model(build_model(entries[0].model_cfg), entries[0].task, 8, seed=1, points=("embed", "z"),
                         exclude=entries[0].train_prompts)
    assert r.scores["hook_embed"][0] == ref0.scores["row_mean"]["hook_embed"]["mean"]
    # the layer-0 mechanisms at every kept step equal the diagnostics of that checkpoint
    from nope_interp.diagnostics import layer0_attention_entropy, layer0_interventions

    task = entries[0].task
    tokens = task.prompt_tokens([task.example(p).prompt for p in task.analysis_prompts(8, 1, entries[0].train_prompts)])
    assert set(r.mechanisms) == set(trajectory.MECHANISMS) and all(len(v) == 4 for v in r.mechanisms.values())
    assert r.mechanisms["l0_attention_entropy"][1] == layer0_attention_entropy(model, tokens)
    from nope_interp.jobs.common import draw_seed

    for kind, value in layer0_interventions(model, tokens, seed=draw_seed(r.label)).items():  # the run's own draws
        assert r.mechanisms[f"l0_z_score_{kind}"][1] == value
    assert r.to_dict()["mechanisms_draw_seed"] == draw_seed("tiny-addition") == r.mechanisms_draw_seed
    # the seed is what the run used, read back as written; a file from before it was recorded reads as None
    assert trajectory.RunTrajectory.from_dict(r.to_dict()) == r
    old = {k: v for k, v in r.to_dict().items() if k != "mechanisms_draw_seed"}
    assert trajectory.RunTrajectory.from_dict(old).mechanisms_draw_seed is None
    from nope_interp.errors import NopeInterpError

    for bad in ("not a seed", -1, True, 2**63, 1.5):
        with pytest.raises(NopeInterpError, match="mechanisms_draw_seed must be null or an integer"):
            trajectory.RunTrajectory.from_dict({**old, "mechanisms_draw_seed": bad})
    # the run it measured, as an absolute path with links resolved (before: no path, so two runs of one folder
    # name wrote the same file and nothing told them apart); files from before it was recorded read as None
    assert r.run == str(tiny_addition_run_with_kept_steps.resolve()) == r.to_dict()["run"]
    assert trajectory.RunTrajectory.from_dict({k: v for k, v in r.to_dict().items() if k != "run"}).run is None
    for bad in (5, "", ["x"]):
        with pytest.raises(NopeInterpError, match="run must be null or a non-empty string"):
            trajectory.RunTrajectory.from_dict({**r.to_dict(), "run": bad})
    assert r.mechanisms["l0_z_score_none"][1] == r.scores["blocks.0.attn.hook_z"][1]  # full protocol: the same
    assert "l0_z_score_both" in r.rows()[1]
    fig = trajectory.plot_trajectory(r)
    assert [t.name for t in fig.data if t.xaxis == "x3"] == ["L0 z as is (full inputs)", "L0 z, uniform attention",
                                                            "L0 z, neutral delimiters", "L0 z, both undone"]
    assert [t.name for t in fig.data if t.xaxis == "x4"] == ["L0 attention entropy"]
    skipped = trajectory.run(trajectory.TrajectoryConfig(n_prompts=8, points=("z",), no_mechanisms=True), entries)
    assert skipped.runs[0].mechanisms == {} and len(trajectory.plot_trajectory(skipped.runs[0]).data) == 3
    assert skipped.runs[0].mechanisms_draw_seed is None   # nothing drawn, no seed claimed
    paths = trajectory.write(result, tmp_path)
    assert trajectory.load_trajectory(tmp_path / "results" / "trajectory" / "tiny-addition.json") == r
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert {p.name for p in paths} == {"tiny-addition.json", "tiny-addition.csv", "tiny-addition.html",
                                       "plotly.min.js"}
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    assert (tmp_path / "results" / "trajectory" / "tiny-addition.csv").read_text().startswith("protocol,step,")
    data = json.loads((tmp_path / "results" / "trajectory" / "tiny-addition.json").read_text())
    assert data["steps"] == [0, 25, 50, 60] and len(data["scores"]["blocks.1.attn.hook_z"]) == 4


def test_the_window_protocol_scores_windows_of_the_given_length(tiny_addition_run_with_kept_steps, tmp_path):
    from nope_interp import io
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.model import build_model

    entries = load_models(ModelSource(run=(str(tiny_addition_run_with_kept_steps),)))
    cfg = trajectory.TrajectoryConfig(n_prompts=4, points=("z",), protocol="window", window=12, no_mechanisms=True)
    result = trajectory.run(cfg, entries)
    model = build_model(entries[0].model_cfg)
    kept = tiny_addition_run_with_kept_steps / "checkpoints"
    model.load_state_dict(io.load_weights(kept / "step_000050.safetensors"))
    ref = analyze_model(model, entries[0].task, 4, seed=1, points=("z",), exclude=entries[0].train_prompts,
                        protocol="window", window=12)
    assert result.runs[0].scores["blocks.0.attn.hook_z"][2] == ref.scores["row_mean"]["blocks.0.attn.hook_z"]["mean"]
    assert {p.name for p in trajectory.write(result, tmp_path)} == {
        "tiny-addition_window12.json", "tiny-addition_window12.csv", "tiny-addition_window12.html", "plotly.min.js"}
    rows = (tmp_path / "results" / "trajectory" / "tiny-addition_window12.csv").read_text().splitlines()
    assert rows[0].startswith("protocol,window,step,") and rows[1].startswith("window,12,0,")


def test_a_model_without_kept_steps_is_refused():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models

    with pytest.raises(NopeInterpError, match="has no kept weights .* ship their final weights alone"):
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=4), load_models(ModelSource(pretrained=("reversal",))))
    from nope_interp.pretrained import CANDIDATES_DIR  # a candidate too (its kept weights are not shipped)

    with pytest.raises(NopeInterpError, match="retrain it with the command in its config.json"):
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=4),
                       load_models(ModelSource(run=(str(CANDIDATES_DIR / "reversal-packed-s1"),))))
    with pytest.raises(NopeInterpError, match="has no kept weights"):  # before a window it cannot read either
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=4, protocol="window", window=100),
                       load_models(ModelSource(run=(str(CANDIDATES_DIR / "reversal-packed-s1"),))))
    with pytest.raises(NopeInterpError, match="^trajectory needs run with one or more run directories$"):
        trajectory.run(trajectory.TrajectoryConfig())


def test_kept_steps_read_only_ascii_step_numbers(tmp_path):
    from nope_interp.jobs.trajectory import kept_steps

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("step_000010.safetensors", "step_000250.safetensors", "step_\u0661\u0662.safetensors",
                 "step_\uff13.safetensors", "step_\u00b2.safetensors", "step_1x.safetensors"):
        (folder / name).write_bytes(b"")
    assert list(kept_steps(tmp_path)) == [10, 250]


def _traj(label, task, objective, steps, l0):
    from nope_interp.jobs.trajectory import RunTrajectory

    return RunTrajectory(label=label, task=task, objective=objective, steps=tuple(steps),
                         sites=("hook_embed", "blocks.0.attn.hook_z"),
                         scores={"hook_embed": tuple(0.5 for _ in steps), "blocks.0.attn.hook_z": tuple(l0)},
                         eval_steps=tuple(steps[1:]), eval_acc=tuple(0.1 * i for i in range(len(steps) - 1)))


def test_saved_trajectories_load_back_and_plot_side_by_side(tmp_path):
    """A written result loads back equal; the comparison figure has a column per task, a score and an accuracy
    trace per run (dash = objective), step 0 drawn at 1, and it is written when several runs are given."""
    from nope_interp.jobs import trajectory

    runs = (_traj("add-ao", "addition", "answer_only", [0, 25, 400], [0.99, 0.7, 0.6]),
            _traj("add-packed", "addition", "packed", [0, 25, 400, 800], [0.99, 0.9, 0.8, 0.82]),
            _traj("rev-ao", "reversal", "answer_only", [0, 50], [0.98, 0.97]))
    result = trajectory.TrajectoryResult(config=trajectory.TrajectoryConfig(), runs=runs, wall_time_s=0.0)
    paths = trajectory.write(result, tmp_path)
    assert tmp_path / "figures" / "trajectory" / "compare_blocks.0.attn.hook_z.html" in paths
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    for r in runs:
        assert trajectory.load_trajectory(tmp_path / "results" / "trajectory" / f"{r.label}.json") == r
    fig = trajectory.plot_site_by_objective(runs)
    titles = [a.text for a in fig.layout.annotations if "z adjacency" in a.text or "exact match" in a.text]
    assert titles == ["addition: L0 z adjacency score", "reversal: L0 z adjacency score",
                      "addition: eval exact match", "reversal: eval exact match"]
    score_traces = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in score_traces] == ["add-ao (answer_only)", "add-packed (packed)", "rev-ao (answer_only)"]
    assert [t.line.dash for t in score_traces] == ["solid", "dash", "solid"]
    assert list(score_traces[1].x) == [1, 25, 400, 800] and list(score_traces[1].y) == [0.99, 0.9, 0.8, 0.82]
    assert score_traces[2].xaxis == "x2"  # reversal in the second column
    # colours are distinct within a column and restart in each (before: one palette over all runs, so a task's
    # lines shared a narrow slice of hues)
    assert score_traces[0].line.color != score_traces[1].line.color
    assert score_traces[2].line.color == score_traces[0].line.color
    mixed = tuple(_traj(f"r{i}", ("addition", "reversal")[i % 2], "packed", [0, 25], [0.99, 0.9]) for i in range(60))
    drawn = [t for t in trajectory.plot_site_by_objective(mixed).data if t.mode == "lines+markers"]
    for xaxis in ("x", "x2"):
        colours = [t.line.color for t in drawn if t.xaxis == xaxis]
        assert len(colours) == 30 and len(set(colours)) == 30
    # the panels keep their height however many runs the legend lists (before: a fixed 720 pixels, so 45 runs'
    # legend squeezed the panels to a third of the figure)
    many = tuple(_traj(f"run-{i}", "addition", "packed", [0, 25], [0.99, 0.9]) for i in range(45))
    for rs in (runs, many):
        f = trajectory.plot_site_by_objective(rs)
        assert f.layout.height - f.layout.margin.t - f.layout.margin.b >= 470
        assert f.layout.margin.b >= 80 + 26 * -(-len(rs) // 4)
    # another protocol writes beside, never over, the full-protocol files
    authors = trajectory.TrajectoryResult(config=trajectory.TrajectoryConfig(protocol="authors"), runs=runs[:2],
                                          wall_time_s=0.0)
    new = trajectory.write(authors, tmp_path)
    assert sorted(p.name for p in new) == sorted(
        [f"{r.label}_authors.{ext}" for r in runs[:2] for ext in ("json", "csv", "html")]
        + ["compare_blocks.0.attn.hook_z_authors.html", "plotly.min.js"])
    assert all((tmp_path / "results" / "trajectory" / f"{r.label}.json").exists() for r in runs)
    # one run rewritten alone: the combined figure of the earlier call's runs is removed, not left stale
    combined = tmp_path / "figures" / "trajectory" / "compare_blocks.0.attn.hook_z.html"
    assert combined.exists()
    trajectory.write(trajectory.TrajectoryResult(config=trajectory.TrajectoryConfig(), runs=runs[:1],
                                                 wall_time_s=0.0), tmp_path)
    assert not combined.exists()


def test_bad_trajectory_files_and_missing_sites_are_one_clear_error(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory

    good = _traj("a", "addition", "packed", [0, 25], [0.9, 0.8]).to_dict()
    bad = {"missing key": {k: v for k, v in good.items() if k != "steps"},
           "short scores": {**good, "scores": {**good["scores"], "hook_embed": [0.5]}},
           "score above 1": {**good, "scores": {**good["scores"], "hook_embed": [0.5, 1.5]}},
           "not a list": {**good, "eval_acc": 3},
           "nan accuracy": {**good, "eval_acc": [float("nan")]},
           "accuracy above 1": {**good, "eval_acc": [7.5]},
           "string steps": {**good, "eval_steps": "2"},
           "float step": {**good, "steps": [0, 2.7]},
           "unsorted steps": {**good, "steps": [25, 0]},
           "negative step": {**good, "steps": [-1, 25]},
           "bool score": {**good, "scores": {**good["scores"], "hook_embed": [True, 0.5]}},
           "null label": {**good, "label": None},
           "duplicate site": {**good, "sites": ["hook_embed", "hook_embed"]},
           "extra score key": {**good, "scores": {**good["scores"], "blocks.9.attn.hook_z": [0.5, 0.5]}},
           "unknown mechanism": {**good, "mechanisms": {"l0_magic": [0.5, 0.5]}},
           "short mechanism": {**good, "mechanisms": {"l0_z_score_both": [0.5]}},
           "mechanism above 1": {**good, "mechanisms": {"l0_attention_entropy": [0.5, 1.5]}},
           "mechanisms a list": {**good, "mechanisms": [0.5]},
           "a list": [good]}
    for what, data in bad.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(NopeInterpError, match="trajectory"):
            trajectory.load_trajectory(path)
            pytest.fail(f"accepted: {what}")
    with pytest.raises(NopeInterpError, match="not found"):
        trajectory.load_trajectory(tmp_path / "nope.json")
    with pytest.raises(NopeInterpError, match="was not analysed in a"):
        trajectory.plot_site_by_objective([trajectory.RunTrajectory.from_dict(good)], "blocks.3.attn.hook_z")
    with pytest.raises(NopeInterpError, match="at least one"):
        trajectory.plot_site_by_objective([])


@pytest.mark.parametrize(("line", "message"), [
    ('{"step": "x", "eval_acc": 0.5}', "line 4: step must be an integer >= 0, got 'x'"),
    ('{"step": 70}', "line 4: no 'eval_acc'"),
    ('{"step": 70, "eval_acc": "high"}', "line 4: eval_acc must be a number or null, got 'high'"),
    ('{"step": 70, "eval_acc": true}', "line 4: eval_acc must be a number or null"),
    ('{"step": 10, "eval_acc": 0.5}', "line 4: steps must increase, got 10 after 60"),
    ('not json', "line 4, column 1: Expecting value"),
    ('[1, 2]', "line 4: a JSON list, not an object"),
])
def test_a_corrupt_metrics_line_is_one_error_naming_the_files_line(tiny_addition_run_with_kept_steps, tmp_path,
                                                                   capsys, line, message):
    import shutil

    from nope_interp.cli import main

    run = tmp_path / "r6"
    shutil.copytree(tiny_addition_run_with_kept_steps, run)
    metrics = run / "metrics.jsonl"
    assert len(metrics.read_text().splitlines()) == 3  # evaluations at steps 20, 40, 60: the bad line is line 4
    metrics.write_text(metrics.read_text() + line + "\n")
    (run / "summary.json").unlink()  # an unfinished run: a summary of step 60 beside step 70 would be stale
    assert main(["trajectory", "--run", str(run), "--n-prompts", "4", "--no-mechanisms",
                 "--out-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(metrics) in err
    assert not (tmp_path / "out" / "results" / "trajectory" / "r6.json").exists()


def test_kept_weights_past_the_runs_steps_are_refused(tiny_addition_run_with_kept_steps, tmp_path):
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models

    run = tmp_path / "r7"
    shutil.copytree(tiny_addition_run_with_kept_steps, run)
    shutil.copy(run / "checkpoints" / "step_000025.safetensors", run / "checkpoints" / "step_999999.safetensors")
    with pytest.raises(NopeInterpError, match="step_999999.safetensors is past the run's 60 training steps"):
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=4, no_mechanisms=True),
                       load_models(ModelSource(run=(str(run),))))


def test_a_corrupt_file_of_any_run_fails_before_the_first_step_is_scored(tiny_addition_run_with_kept_steps,
                                                                         tmp_path):
    """Before: a truncated last checkpoint, or a bad metrics.jsonl of a second run, failed only after every
    earlier step (and run) had been scored."""
    import shutil

    from conftest import distinct_copy

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models

    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(tiny_addition_run_with_kept_steps, good)
    shutil.copytree(tiny_addition_run_with_kept_steps, bad)
    last = sorted((bad / "checkpoints").glob("step_*.safetensors"))[-1]
    for damage, words in ((lambda: last.write_bytes(last.read_bytes()[:100]), last.name),
                          (lambda: (bad / "metrics.jsonl").write_text("not json\n"), "metrics.jsonl")):
        shutil.rmtree(bad)
        distinct_copy(tiny_addition_run_with_kept_steps, bad)  # a byte-identical copy is one model twice
        damage()
        lines: list[str] = []
        with pytest.raises(NopeInterpError, match=words):
            trajectory.run(trajectory.TrajectoryConfig(n_prompts=4, no_mechanisms=True),
                           load_models(ModelSource(run=(str(good), str(bad)))), log=lines.append)
        assert not any(" step " in line for line in lines), lines   # nothing was scored


def test_two_files_of_one_step_and_a_null_accuracy_are_refused(tiny_addition_run_with_kept_steps, tmp_path):
    """step_25 beside step_000025 dropped one file by glob order; a null eval_acc was written into the result,
    which load_trajectory then refused."""
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.jobs.trajectory import kept_steps

    run = tmp_path / "copy"
    shutil.copytree(tiny_addition_run_with_kept_steps, run, ignore=shutil.ignore_patterns("checkpoint.pt"))
    shutil.copy(run / "checkpoints" / "step_000025.safetensors", run / "checkpoints" / "step_25.safetensors")
    with pytest.raises(NopeInterpError, match="two weights files for step 25: step_000025.safetensors and "
                                              "step_25.safetensors"):
        kept_steps(run)
    (run / "checkpoints" / "step_25.safetensors").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"eval_acc": ', '"eval_acc": null, "was": ')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    entries = load_models(ModelSource(run=(str(run),)))
    with pytest.raises(NopeInterpError, match="eval_acc is null at step 40"):
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=8, points=("z",)), entries)


def test_a_single_evaluation_is_drawn_not_an_empty_line():
    """A run stopped at its first evaluation (one eval point) or with one kept step after step 0: a plotly line
    of one point draws nothing, so both figures draw it with a marker (before: an empty accuracy panel)."""
    from nope_interp.jobs import trajectory
    from nope_interp.plotting import line_mode

    assert (line_mode(1), line_mode(0), line_mode(2), line_mode(40)) == ("markers", "markers", "lines", "lines")
    one = _traj("rev", "reversal", "packed", [0, 250], [0.99, 0.97])  # one evaluation, at step 250
    for fig in (trajectory.plot_trajectory(one), trajectory.plot_site_by_objective([one], "blocks.0.attn.hook_z")):
        acc = [t for t in fig.data if list(t.x) == [250] and list(t.y) == [0.0]]
        assert acc and all("markers" in t.mode for t in acc), [(t.name, t.mode) for t in fig.data]


def test_write_refuses_an_inconsistent_run_and_a_file_where_a_folder_goes(tmp_path):
    """Before: a run whose steps were shorter than its scores was written (the CSV dropped steps, the JSON could not
    be read back), and a file named `figures` failed after the results were written."""
    import dataclasses

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory

    good = _traj("a", "addition", "packed", [0, 25, 40], [0.99, 0.9, 0.8])
    bad = dataclasses.replace(good, steps=(0, 25))
    result = trajectory.TrajectoryResult(config=trajectory.TrajectoryConfig(), runs=(good, bad), wall_time_s=0.0)
    with pytest.raises(NopeInterpError, match=r"trajectory write: the run 'a' is not a consistent trajectory .*"
                                              r"differ in length.*nothing was written"):
        trajectory.write(result, tmp_path / "x")
    assert not [p for p in (tmp_path / "x").rglob("*.*") if not p.name.endswith(".lock")]  # lock files: harmless
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "figures").write_text("")
    with pytest.raises(NopeInterpError, match=r"output folder .*y/figures/trajectory cannot be created: .*y/figures "
                                              r"is an existing file, not a directory"):
        trajectory.write(dataclasses.replace(result, runs=(good,)), tmp_path / "y")
    assert not (tmp_path / "y" / "results").exists() or not list((tmp_path / "y" / "results").rglob("*.*"))


def test_a_second_run_of_the_same_folder_name_is_warned_about(tiny_addition_run_with_kept_steps, tmp_path):
    """Before: ``trajectory --run a/s0`` then ``--run b/s0`` overwrote the first's results without a word."""
    import shutil
    import warnings

    from nope_interp.errors import NopeInterpWarning
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models

    twin = tmp_path / "elsewhere" / tiny_addition_run_with_kept_steps.name
    shutil.copytree(tiny_addition_run_with_kept_steps, twin)
    cfg = trajectory.TrajectoryConfig(n_prompts=4, points=("z",), no_mechanisms=True)
    first = trajectory.run(cfg, load_models(ModelSource(run=(str(tiny_addition_run_with_kept_steps),))))
    second = trajectory.run(cfg, load_models(ModelSource(run=(str(twin),))))
    out = tmp_path / "out"
    trajectory.write(first, out)
    with warnings.catch_warnings():  # the same run again: no warning
        warnings.simplefilter("error", NopeInterpWarning)
        trajectory.write(first, out)
    want = (r"trajectory: overwriting .*tiny-addition\.json, the results of .*tiny-addition, with those of "
            r".*elsewhere.*give another out_root")
    with pytest.warns(NopeInterpWarning, match=want):
        trajectory.write(second, out)
