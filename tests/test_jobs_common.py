"""The shared model sources of the analysis jobs: a trained run analysed on task parameters other than its own.

Exclusion uses the run's own training prompts (never a split rebuilt with the new parameters), and every job
that takes ``--task`` / ``--n-digits`` either works on them or stops with one line that says why.
"""

import dataclasses
import json

import pytest
import torch
from conftest import assert_strict_json_files

#: Small sizes of every job that takes models (the CLI flags after the model source).
JOB_ARGS = {
    "analyze": ["--n-prompts", "8"],
    "probe": ["--quick", "--n-prompts", "24"],
    "ablate": ["--n-eval", "8", "--n-mu", "8", "--n-analysis", "4", "--n-random", "1", "--ranks", "0", "1"],
    "compare": ["--n-prompts", "6"],
    "trajectory": ["--n-prompts", "6"],
}


@pytest.fixture(scope="module")
def tiny_reversal_run(tmp_path_factory):
    """A tiny reversal model trained on 3-digit operands (200 training prompts of 1000), with kept steps."""
    from nope_interp.config import TrainConfig, preset
    from nope_interp.train import train

    run_dir = tmp_path_factory.mktemp("other-params") / "tiny-rev"
    cfg = TrainConfig(task="reversal", task_params={"n_digits": 3}, n_train=200, n_test=40, steps=30,
                      batch_size=16, lr=3e-3, warmup_steps=5, eval_every=15, eval_n=20, checkpoint_every=15)
    train(preset("tiny", n_ctx=16), cfg, run_dir, progress=False, command="x")
    return run_dir


def _entry(run_dir, n_digits):
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(run_dir),), task="reversal", n_digits=n_digits))
    return entry


@pytest.mark.parametrize("n_digits", [2, 3, 4])
def test_exclusion_uses_the_runs_own_training_prompts(tiny_reversal_run, n_digits):
    entry = _entry(tiny_reversal_run, n_digits)
    assert entry.task.params() == {"n_digits": n_digits}
    assert entry.train_prompts == entry.run.train_prompts and len(entry.train_prompts) == 200
    assert {len(p) for p in entry.train_prompts} <= set(range(4, 10))  # the run's 3-digit task
    prompts = entry.task.analysis_prompts(50 if n_digits == 2 else 200, 1, entry.train_prompts)
    assert not set(prompts) & entry.train_prompts
    assert {len(p) for p in prompts} == {entry.task.max_prompt_len}


@pytest.mark.parametrize("n_digits", [1, 2, 3])
def test_eval_examples_are_the_runs_test_split_or_held_out_examples_of_the_new_task(tiny_reversal_run, n_digits):
    from nope_interp.jobs.common import eval_examples

    entry = _entry(tiny_reversal_run, n_digits)
    examples = eval_examples(entry, 30)
    if n_digits == 3:
        assert examples == list(entry.run.splits.test[:30])
    else:
        # the run trained on prompts of every length up to 3 digits: those of the new task are left out too;
        # a task with fewer held-out prompts gives all of them
        held_out = set(entry.task.distinct_prompts(entry.task.n_distinct_prompts(), 0)) - entry.train_prompts
        assert len(examples) == min(30, len(held_out)) and len(held_out) < entry.task.n_distinct_prompts()
        assert len({ex.prompt for ex in examples}) == len(examples)
        assert all(ex == entry.task.example(ex.prompt) for ex in examples)
        assert max(len(ex.prompt) for ex in examples) <= entry.task.max_prompt_len
    assert not {ex.prompt for ex in examples} & entry.train_prompts


@pytest.mark.parametrize("n_digits", [2, 3])
@pytest.mark.parametrize("job", list(JOB_ARGS))
def test_every_job_runs_on_other_task_parameters(tiny_reversal_run, tmp_path, job, n_digits):
    from nope_interp.cli import main

    argv = [job, "--run", str(tiny_reversal_run), "--task", "reversal", "--n-digits", str(n_digits),
            "--out-root", str(tmp_path), *JOB_ARGS[job]]
    assert main(argv) == 0
    assert_strict_json_files(tmp_path)
    if job == "analyze":
        label = "tiny-rev" if n_digits == 3 else f"tiny-rev-on-reversal{n_digits}"  # the run's own size: no suffix
        scores = json.loads((tmp_path / f"results/analyze/{label}/scores.json").read_text())
        assert scores["example_prompt"].startswith("rev(") and len(scores["example_prompt"]) == n_digits + 6
        assert len(scores["lag_profile"]["uniform_causal"]) == n_digits + 5  # lags 1..pos - 1


def test_demo_on_other_task_parameters_measures_the_new_task(tiny_reversal_run, monkeypatch):
    from nope_interp.jobs import demo

    entry = _entry(tiny_reversal_run, 2)
    seen: list[str] = []
    measure = demo.exact_match_accuracy

    def recording(model, task, examples, **kwargs):
        seen.extend(ex.prompt for ex in examples)
        return measure(model, task, examples, **kwargs)

    monkeypatch.setattr(demo, "exact_match_accuracy", recording)
    cfg = demo.DemoConfig(tasks=("reversal",), n_prompts=6, eval_n=20, init_preset="tiny", protocols=("full",))
    result = demo.run(cfg, [entry])
    (t,) = result.tasks
    assert t.to_dict()["n_test_remeasured"] == 20
    # re-measured on 2-digit prompts (not the run's 3-digit test split), none of them a training prompt
    assert max(len(p) for p in seen) == entry.task.max_prompt_len and not set(seen) & entry.train_prompts
    json.dumps(result.to_dict())


@pytest.mark.parametrize(("argv", "match"), [
    (["ablate", "--n-digits", "6"], "n_ctx=16 is too small"),
    (["analyze", "--n-digits", "2", "--n-prompts", "256"], "could not find 256 distinct full-length reversal"),
    (["analyze", "--n-digits", "11"], "n_ctx=16 is too small"),
])
def test_what_cannot_work_is_one_line_that_says_why(tiny_reversal_run, tmp_path, capsys, argv, match):
    from nope_interp.cli import main

    job, *rest = argv
    assert main([job, "--run", str(tiny_reversal_run), "--task", "reversal", *rest, "--out-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


@pytest.mark.parametrize(("argv", "match"), [
    (["analyze", "--model-n-layers", "7"], "--model-n-layers shapes an --init model"),
    (["long-context", "--model-init-std", "5"], "--model-init-std shapes an --init model"),
    (["probe", "--preset", "tiny"], "--preset shapes an --init model"),
    (["ablate", "--preset", "tiny", "--model-d-model", "8"], "--model-d-model, --preset shape an --init model"),
])
def test_model_shape_flags_with_a_trained_model_are_refused_not_ignored(tiny_reversal_run, tmp_path, capsys, argv,
                                                                        match):
    """Before: ``analyze --run R --model-n-layers 7`` ran on R as it is and said nothing."""
    from nope_interp.cli import main

    job, *rest = argv
    assert main([job, "--run", str(tiny_reversal_run), *rest, "--out-root", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("job", ["analyze", "probe", "ablate"])
def test_task_flags_with_a_text_run_are_refused_where_text_windows_are_read(job, tmp_path, capsys):
    """Before: ``analyze --run <text run> --task addition`` analysed the text windows and said nothing."""
    from nope_interp.cli import main
    from nope_interp.text_train import available_text_models

    text_run = str(next(p for p in available_text_models() if p.name == "text-nope"))
    for extra in (["--task", "addition"], ["--n-digits", "3"]):
        assert main([job, "--run", text_run, *extra, "--out-root", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--task / --n-digits would be ignored" in err[0] and not (tmp_path / "o").exists()


def test_other_silently_ignored_source_settings_are_refused():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.analyze import AnalyzeConfig
    from nope_interp.jobs.common import ModelSource

    for kwargs in ({"hf_path": "x", "task": "addition"}, {"hf_path": "x", "n_digits": 3}):
        with pytest.raises(NopeInterpError, match="a Hugging Face model .* reads random ids"):
            ModelSource(**kwargs)
    with pytest.raises(NopeInterpError, match="^prompt_seed=9 is only used without text_file "):
        AnalyzeConfig(text_file="t.txt", prompt_seed=9)
    ModelSource(init=True, task="reversal", preset="tiny", model_overrides={"n_layers": 1})  # where they apply
    AnalyzeConfig(text_file="t.txt")


@pytest.mark.parametrize("n_digits", [2, 3, 4])
def test_n_digits_alone_is_the_runs_own_task_at_that_size(tiny_reversal_run, n_digits):
    from nope_interp.jobs.common import ModelSource, load_models

    (alone,) = load_models(ModelSource(run=(str(tiny_reversal_run),), n_digits=n_digits))
    named = _entry(tiny_reversal_run, n_digits)
    assert alone.task == named.task and alone.task.params() == {"n_digits": n_digits}
    assert alone.label == named.label == ("tiny-rev" if n_digits == 3 else f"tiny-rev-on-reversal{n_digits}")
    assert alone.train_prompts == named.train_prompts


def test_one_run_on_two_tasks_writes_two_result_folders(tiny_reversal_run, tmp_path):
    from nope_interp.cli import main

    for task in ("reversal", "addition"):
        argv = ["analyze", "--run", str(tiny_reversal_run), "--task", task, "--n-digits", "2", "--n-prompts", "6",
                "--out-root", str(tmp_path)]
        assert main(argv) == 0
    runs = sorted(p.name for p in (tmp_path / "results/analyze").iterdir())
    assert runs == ["tiny-rev-on-addition2", "tiny-rev-on-reversal2"]
    prompts = {r: json.loads((tmp_path / "results/analyze" / r / "scores.json").read_text())["example_prompt"]
               for r in runs}
    assert prompts["tiny-rev-on-addition2"].startswith("$") and prompts["tiny-rev-on-reversal2"].startswith("rev(")


def test_list_options_refuse_repeated_entries(capsys):
    from nope_interp.cli import main
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource
    from nope_interp.jobs.long_context import LongContextConfig

    for argv, message in [
        (["analyze", "--pretrained", "reversal", "reversal"], "pretrained lists 'reversal' more than once"),
        (["long-context", "--lengths", "32", "32"], "lengths lists 32 more than once"),
        (["long-context", "--inputs", "random", "task", "random"], "inputs lists 'random' more than once"),
        (["probe", "--sites", "hook_embed", "hook_embed"], "sites lists 'hook_embed' more than once"),
        (["init-grid", "--stds", "0.02", "0.020"], "stds lists 0.02 more than once"),
        (["analyze", "--with-seeds", "--task", "reversal"], "--with-seeds alone means every shipped task"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (argv, err)
    with pytest.raises(NopeInterpError, match="normalizations lists 'LN' more than once"):
        LongContextConfig(normalizations=("LN", "LN"))
    assert LongContextConfig(normalizations=("LN", "RMS")).normalizations == ("LN", "RMS")
    assert ModelSource(pretrained=("reversal", "addition")).pretrained == ("reversal", "addition")


def test_protocol_tag_tells_every_protocol_and_window_apart():
    from nope_interp.jobs.common import protocol_tag

    tags = [protocol_tag("full"), protocol_tag("authors"), protocol_tag("window", 64), protocol_tag("window", 128)]
    assert tags == ["", "authors", "window64", "window128"] and len(set(tags)) == 4
    assert protocol_tag("full", 32) == "" and protocol_tag("authors", 32) == "authors"  # window unused there


def test_random_tokens_refuse_bad_counts_and_seeds(tiny_model):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import random_tokens

    fn = unhooked(random_tokens)
    for kwargs, match in [({"n": 0}, "n must be an integer"), ({"length": 0}, "length must be an integer"),
                          ({"seed": -1}, "seed must be an integer"), ({"n": 2.0}, "n must be an integer")]:
        args = {"n": 2, "length": 5, "seed": 0, **kwargs}
        with pytest.raises(NopeInterpError, match=match):
            fn(tiny_model, **args)
    toks = random_tokens(tiny_model, 3, 7, 1)
    assert toks.shape == (3, 7) and torch.equal(toks, random_tokens(tiny_model, 3, 7, 1))


#: Each job's config class, its protocol setting for the window protocol, and the shortest window it takes.
WINDOW_JOBS = {
    "analyze": ("nope_interp.jobs.analyze", "AnalyzeConfig", {"protocol": "window"}, 3),
    "compare": ("nope_interp.jobs.compare", "CompareConfig", {"protocols": ("full", "window")}, 3),
    "demo": ("nope_interp.jobs.demo", "DemoConfig", {"protocols": ("full", "window")}, 3),
    "averaging": ("nope_interp.jobs.averaging", "AveragingConfig", {"protocol": "window"}, 3),
    "trajectory": ("nope_interp.jobs.trajectory", "TrajectoryConfig", {"protocol": "window"}, 3),
    "ablate": ("nope_interp.jobs.ablate", "AblateConfig", {"protocol": "window"}, 3),
    "probe": ("nope_interp.jobs.probe", "ProbeConfig", {"protocol": "window"}, 8),  # its cosine profile: 7 positions
}


@pytest.mark.parametrize("job", sorted(WINDOW_JOBS))
def test_every_job_takes_windows_down_to_the_least_its_measurement_needs(job):
    """One bound per measurement: 3 positions for an adjacency score (every job but probe), 8 for the probe's
    features; below it a one-line error naming --window and the range, at it and above no error."""
    import importlib

    from nope_interp.errors import NopeInterpError

    module, name, protocol, least = WINDOW_JOBS[job]
    config = getattr(importlib.import_module(module), name)
    for window in (least, least + 1, 64, 1_000_000):
        assert config(window=window, **protocol).window == window
    for window in (least - 1, 0, -3, 1_000_001):
        with pytest.raises(NopeInterpError, match=rf"window must be an integer in \[{least}, 1000000\], got {window}"):
            config(window=window, **protocol)


def test_progress_bars_are_drawn_on_a_terminal_only(monkeypatch, capsys):
    """Before: a CLI job redirected to a log file filled it with the bar's carriage-return redraws between the
    result lines (``ablate ... 2> log``); the bar is drawn only when stderr is a terminal (or a Jupyter kernel)."""
    import io
    import sys

    from nope_interp.jobs import common

    class Tty(io.StringIO):
        def isatty(self):
            return True

    for stream, drawn in ((io.StringIO(), False), (Tty(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
        assert list(common.progress(range(3), "job", log=lambda line: None)) == [0, 1, 2]
        assert ("job" in stream.getvalue()) is drawn
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(common.progress(range(3), "job", log=None)) == [0, 1, 2]  # no log (called from Python): silent
        assert stream.getvalue() == ""


@pytest.mark.parametrize("module", ["analyze", "ablate", "averaging", "compare", "demo", "length_gen", "long_context",
                                    "probe", "trajectory"])
def test_every_job_refuses_an_empty_single_or_foreign_models_argument_before_any_work(module, monkeypatch):
    """``probe.run(config, models=[])`` (and analyze, compare, demo, trajectory, long-context, averaging) ran every
    default model as if no list had been given; a LoadedRun in the list failed with an AttributeError and one
    entry alone with a TypeError."""
    import importlib

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_pretrained

    job = importlib.import_module(f"nope_interp.jobs.{module}")

    def no_defaults(*a, **k):
        raise AssertionError("the default models were loaded")

    monkeypatch.setattr(job, "default_models", no_defaults, raising=False)
    if hasattr(job, "task_models"):
        monkeypatch.setattr(job, "task_models", no_defaults)
    from conftest import unhooked

    cfg = job.CONFIG()
    name = job.NAME
    run_job = unhooked(job.run)  # as users run it, without the suite's type checker
    with pytest.raises(NopeInterpError, match=rf"^{name}: models is an empty list; give models, or None"):
        job.run(cfg, [])
    run = load_pretrained("reversal")
    with pytest.raises(NopeInterpError, match=rf"^{name}: models must hold ModelEntry objects, got a LoadedRun "
                                              r"\(wrap a loaded run: nope_interp.jobs.common.entry_from_run"):
        run_job(cfg, [run])
    with pytest.raises(NopeInterpError, match=rf"^{name}: models must be a list of ModelEntry .* got ModelEntry; "
                                              r"for one model write \[entry\]"):
        run_job(cfg, entry_from_run(run, "pretrained-reversal"))


@pytest.mark.parametrize("job", ["compare", "analyze", "ablate", "trajectory"])
def test_one_model_given_twice_under_two_labels_is_refused(tiny_reversal_run, tmp_path, capsys, job):
    """Before: ``compare --run runs/base baselink`` (a link to it) or a ``cp -r`` copy counted one model as two
    seeds (0.959 ± 0.000 over "2 seeds"): duplicates were caught by the folder name alone. Now the resolved
    directory and the weights' bytes are compared; the CLI answers in one line, exit 2, nothing written."""
    import shutil

    from nope_interp.cli import main

    link = tmp_path / "link"
    link.symlink_to(tiny_reversal_run)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_reversal_run, copy)
    for other, why in ((link, "one directory"), (copy, "byte-identical weights")):
        out = tmp_path / f"out-{other.name}"
        assert main([job, "--run", str(tiny_reversal_run), str(other), "--out-root", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "tiny-rev and " in err[0] and why in err[0], err
        assert not out.exists()


def test_same_model_check_leaves_other_tasks_and_other_weights_alone(tiny_reversal_run, tmp_path):
    import dataclasses
    import shutil

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import refuse_same_model_twice

    entry = _entry(tiny_reversal_run, 3)
    on_two = dataclasses.replace(entry, label="tiny-rev-on-reversal4", task=tasks.get_task("reversal", n_digits=4))
    refuse_same_model_twice("x", [entry, on_two])  # one run on two task sizes: two analyses, not two seeds
    changed = tmp_path / "changed"
    shutil.copytree(tiny_reversal_run, changed)
    weights = changed / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # another last bit of one weight: another model
    weights.write_bytes(bytes(data))
    refuse_same_model_twice("x", [entry, _entry(changed, 3)])
    with pytest.raises(NopeInterpError, match="x: tiny-rev and same are the same model"):
        refuse_same_model_twice("x", [entry, dataclasses.replace(entry, label="same")])


@pytest.mark.parametrize("job", ["analyze", "probe"])
def test_inputs_that_do_not_fit_every_model_are_refused_before_any_work_naming_each_model(job):
    """Two task models of n_ctx 64 and 40 under --window 48: one message, before any output, names the model
    that cannot read the inputs and the window that fits both (before: the n_ctx-40 model failed alone, after
    the other had been analysed, and its suggestion fitted that model only)."""
    import importlib

    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import check_inputs_fit, entry_from_init

    task = tasks.get_task("reversal")
    wide = entry_from_init(preset("tiny", n_ctx=64), task, "wide")
    narrow = entry_from_init(preset("tiny", n_ctx=40, seed=1), task, "narrow")
    mod = importlib.import_module(f"nope_interp.jobs.{job}")
    cfg_cls = {"analyze": "AnalyzeConfig", "probe": "ProbeConfig"}[job]
    lines = []
    with pytest.raises(NopeInterpError, match=rf"^{job}: the window inputs do not fit 1 of 2 models: narrow "
                                              r"\(n_ctx=40 is too small for reversal inputs of 48 tokens\); "
                                              r"window 40 or less fits every model given$"):
        mod.run(getattr(mod, cfg_cls)(protocol="window", window=48), [wide, narrow], log=lines.append)
    assert lines == []
    check_inputs_fit(job, [wide, narrow], ["window"], 40)  # fits both: no error
    check_inputs_fit(job, [wide, narrow], ["full", "authors"], 64)  # the window matters to the window protocol only
    with pytest.raises(NopeInterpError, match=r"do not fit 2 of 2 models: wide .*, narrow .*; window 40 or less"):
        check_inputs_fit(job, [wide, narrow], ["full", "window"], 80)


@pytest.mark.parametrize("job", ["analyze", "compare", "trajectory", "probe"])
def test_one_model_whose_n_ctx_is_too_small_is_refused_before_the_jobs_first_line(job, tiny_run):
    """Before: with one model, the check was left to the analysis, so compare printed its start line (``compare:
    1 trained models, ...``) and then the error. Now every job refuses it before its first line, with the
    analysis's own message and the window that fits."""
    import importlib

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, load_models

    mod = importlib.import_module(f"nope_interp.jobs.{job}")
    cfg_cls = {"analyze": "AnalyzeConfig", "probe": "ProbeConfig", "compare": "CompareConfig",
               "trajectory": "TrajectoryConfig"}[job]
    kwargs = {"protocols": ("full", "window")} if job == "compare" else {"protocol": "window"}
    lines = []
    with pytest.raises(NopeInterpError, match=r"^n_ctx=16 is too small for 'addition' window inputs of 20 "
                                              r"tokens: window 16 or less fits$"):
        mod.run(getattr(mod, cfg_cls)(window=20, **kwargs), load_models(ModelSource(run=(str(tiny_run),))),
                log=lines.append)
    assert lines == []


def test_two_models_with_one_label_are_refused_by_every_job():
    """Before: two ModelEntry objects with one label passed job_models; analyze's result kept one of them (the
    other, scoring 0.973, was dropped) and write() overwrote one scores file with the other."""
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init, job_models
    from nope_interp.model import preset

    task = tasks.get_task("reversal")
    a = entry_from_init(preset("tiny", seed=0), task, "init-tiny")
    b = entry_from_init(preset("tiny", seed=1, init_std=0.5), task, "init-tiny")
    c = entry_from_init(preset("tiny", seed=2), task, "other")
    for models in ([a, b], [a, c, b], [a, a]):
        with pytest.raises(NopeInterpError, match=r"analyze: models must have distinct labels .* 'init-tiny' more "
                                                  "than once"):
            job_models("analyze", models, list)
    assert job_models("analyze", [a, c], list) == [a, c]


def test_prepare_outputs_checks_the_result_and_creates_both_folders_before_any_file(tmp_path):
    """Before: a file named `figures` in out_root failed after the results were written (8 of 10 jobs), and
    init_grid.write wrote another job's result as its own files before failing."""
    from nope_interp import io
    from nope_interp.errors import NopeInterpError

    class R:
        pass

    res, fig = io.prepare_outputs("probe", R(), R, tmp_path / "a")
    assert res.is_dir() and fig.is_dir() and (res, fig) == io.job_dirs(tmp_path / "a", "probe")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "figures").write_text("a file where the figures folder goes")
    with pytest.raises(NopeInterpError, match=r"cannot create the output folder .*figures.*nothing was written"):
        io.prepare_outputs("probe", R(), R, tmp_path / "b")
    with pytest.raises(NopeInterpError, match="probe write needs the R that probe's run returns, got int"):
        io.prepare_outputs("probe", 3, R, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("job", ["analyze", "compare", "ablate", "averaging", "probe", "trajectory", "long_context",
                                 "length_gen", "init_grid", "demo"])
def test_every_job_write_refuses_another_jobs_result_before_writing(tmp_path, job):
    import importlib

    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.trajectory import TrajectoryConfig, TrajectoryResult

    mod = importlib.import_module(f"nope_interp.jobs.{job}")
    other = TrajectoryResult(config=TrajectoryConfig(), runs=(), wall_time_s=0.0)
    if job == "trajectory":
        other = object()
    with pytest.raises(NopeInterpError, match=r"write needs the \w+Result that .* returns, got .*nothing was written"):
        unhooked(mod.write)(other, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("module", "settings"), [
    ("long_context", {"text_task": "addition"}),
    ("long_context", {"grid_preset": "tiny", "seeds": 1, "normalizations": ("none",)}),
    ("long_context", {"attentions": ("causal",), "window": 8}),
    ("long_context", {"seeds": 2}),  # quick's number, given without quick
    ("probe", {"tasks": ("addition",)}), ("probe", {"default_preset": "tiny", "tasks": ("reversal", "addition")}),
    ("averaging", {"tasks": ("addition",)}), ("averaging", {"tasks": ("reversal", "indexing")}),
    ("demo", {"tasks": ("addition",)}), ("demo", {"retrain": True, "runs_dir": "elsewhere"}),
    ("demo", {"from_sweep": "some-spec"})])
def test_settings_of_the_default_models_are_refused_with_given_models(module, settings, monkeypatch):
    """Before: ``long_context.run(LongContextConfig(text_task="addition", grid_preset="tiny", seeds=1, ...),
    [pretrained reversal])`` ran on reversal's text and recorded text_task addition, grid_preset tiny and seeds 1
    (probe's ``tasks`` / ``default_preset``, averaging's and demo's ``tasks`` alike); the CLI refused them."""
    import importlib

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_pretrained

    job = importlib.import_module(f"nope_interp.jobs.{module}")

    def no_work(*a, **k):
        raise AssertionError("work started before the config was checked")

    monkeypatch.setattr(job, "check_inputs_fit", no_work, raising=False)
    monkeypatch.setattr(job, "progress", no_work, raising=False)
    entry = entry_from_run(load_pretrained("reversal"), "pretrained-reversal", "pretrained")
    with pytest.raises(NopeInterpError, match=rf"^{job.NAME}: ") as err:
        job.run(job.CONFIG(**settings), [entry])
    message = str(err.value)
    assert "\n" not in message and all(name in message for name in settings), message


@pytest.mark.parametrize(("module", "settings"), [
    ("long_context", {}), ("long_context", {"quick": True}), ("long_context", {"text_task": "reversal"}),
    ("long_context", {"quick": True, "lengths": (64,), "n_sequences": 1}), ("probe", {"quick": True}),
    ("probe", {"n_prompts": 8}), ("probe", {"tasks": ("reversal",)}), ("averaging", {"n_prompts": 5}),
    ("averaging", {"tasks": ("reversal",)}), ("demo", {"init_preset": "tiny"}), ("demo", {"tasks": ("reversal",)})])
def test_settings_that_apply_to_given_models_are_not_refused(module, settings):
    """Settings that shape the given models' run, or that name exactly the given models' tasks, are kept."""
    import importlib

    from nope_interp.jobs.common import entry_from_run, refuse_default_only
    from nope_interp.pretrained import load_pretrained

    job = importlib.import_module(f"nope_interp.jobs.{module}")
    entry = entry_from_run(load_pretrained("reversal"), "pretrained-reversal", "pretrained")
    refuse_default_only(job.NAME, job.CONFIG(**settings), job.DEFAULT_ONLY, job.DEFAULT_MODELS, [entry])
    refuse_default_only(job.NAME, dataclasses.replace(job.CONFIG(**settings), n_prompts=9) if module != "long_context"
                        else dataclasses.replace(job.CONFIG(**settings), max_lag=5), job.DEFAULT_ONLY,
                        job.DEFAULT_MODELS, [entry])  # a copy made by dataclasses.replace, too


def _good_entry_fields():
    import tasks
    from nope_interp.config import preset
    from nope_interp.model import build_model

    cfg = preset("tiny")
    return {"label": "m", "kind": "init", "model": build_model(cfg), "model_cfg": cfg,
            "task": tasks.get_task("reversal")}


@pytest.mark.parametrize(("changes", "match"), [
    ({"task": "reversal"}, r"task must be a tasks\.Task .*tasks\.get_task\('reversal'\)"),
    ({"task": None}, "task must be a tasks.Task"),
    ({"model": "x"}, "model must be a HookedTransformer or a TransformerBridge, got str"),
    ({"model": None}, "model must be"),
    ({"kind": "bogus"}, "kind must be one of init, run, pretrained, hf, text, got str 'bogus'"),
    ({"kind": 3}, "kind must be one of"),
    ({"model_cfg": {"n_layers": 2}}, "model_cfg must be a ModelConfig"),
    ({"model_cfg": None}, "model_cfg must be a ModelConfig"),  # only a Hugging Face model has none
    ({"run": "runs/x"}, "run must be a LoadedRun or None"),
    ({"source": ["x"]}, "source must be a dict"),
    ({"train_prompts": "rev(1)="}, "train_prompts must be a set of prompt strings")])
def test_model_entry_refuses_what_a_job_cannot_use(changes, match):
    """Before: ``ModelEntry(task="reversal")`` or ``model="x"`` was accepted and ``analyze.run`` failed with an
    AttributeError; ``kind="bogus"`` ran as a task model."""
    from conftest import build_unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelEntry

    with pytest.raises(NopeInterpError, match=match) as err:
        build_unhooked(ModelEntry, **{**_good_entry_fields(), **changes})
    assert "\n" not in str(err.value) and str(err.value).startswith("ModelEntry m: ")


def test_model_entry_accepts_a_hugging_face_model_without_config_and_a_set_of_prompts():
    from conftest import build_unhooked

    from nope_interp.jobs.common import ModelEntry

    fields = _good_entry_fields()
    assert ModelEntry(**{**fields, "kind": "hf", "model_cfg": None}).model_cfg is None
    entry = build_unhooked(ModelEntry, **fields, train_prompts={"rev(1)="})
    assert entry.train_prompts == frozenset({"rev(1)="})


@pytest.mark.parametrize("paths", [("/tmp",), ("a", "b/c")])
@pytest.mark.parametrize("as_type", [str, "path"])
def test_model_source_takes_run_paths_as_str_or_path(paths, as_type):
    """Before: ``ModelSource(run=(Path("/tmp"),))`` said "run must be a list of strings" while the check of each
    path said "(a str or pathlib.Path)"."""
    from pathlib import Path

    from conftest import build_unhooked

    from nope_interp.jobs.common import ModelSource

    given = tuple(Path(p) for p in paths) if as_type == "path" else paths
    source = build_unhooked(ModelSource, run=given)
    assert source.run == paths and source.to_dict()["run"] == list(paths)


@pytest.mark.parametrize("value", [0, b"x", ""])
def test_model_source_refuses_a_run_or_hf_path_that_is_no_path_in_one_consistent_message(value):
    from conftest import build_unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    for field, given in (("run", (value,)), ("hf_path", value)):
        with pytest.raises(NopeInterpError, match=r"must be a non-empty path \(a str or pathlib.Path\)"):
            build_unhooked(ModelSource, **{field: given})


@pytest.mark.parametrize("n_digits", [0, -3, 10**6, 65])
@pytest.mark.parametrize("source", [{"pretrained": ("reversal",)}, {"task": "addition"},
                                    {"init": True, "task": "indexing"}, {"pretrained": ("reversal", "ordering")}])
def test_n_digits_outside_the_tasks_range_is_refused_up_front(source, n_digits):
    """Before: ``ModelSource(pretrained=("reversal",), n_digits=0)`` (also -3, 10**6) was accepted and
    ``load_models`` raised a TaskError, not a NopeInterpError."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    expected = rf"^n_digits={n_digits} does not fit .*n_digits must be an integer in \[1, "
    with pytest.raises(NopeInterpError, match=expected):
        ModelSource(**source, n_digits=n_digits)


@pytest.mark.parametrize("n_digits", [True, 2.0, "3"])
def test_n_digits_that_is_no_integer_is_refused(n_digits):
    from conftest import build_unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    with pytest.raises(NopeInterpError, match="n_digits must be an integer"):
        build_unhooked(ModelSource, pretrained=("reversal",), n_digits=n_digits)


@pytest.mark.parametrize("n_digits", [0, 19, 10**6])
def test_a_run_at_an_n_digits_its_task_cannot_take_is_a_nope_interp_error(tiny_run, n_digits):
    """``--run`` names no task before it is loaded: the run's own task (addition, at most 18 digits) checks it,
    and its TaskError comes out as a NopeInterpError."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, load_models

    expected = r"^n_digits=\S+ does not fit .*n_digits must be an integer in \[1, 18\]"
    with pytest.raises(NopeInterpError, match=expected) as err:
        load_models(ModelSource(run=(str(tiny_run),), n_digits=n_digits))
    assert type(err.value) is NopeInterpError
