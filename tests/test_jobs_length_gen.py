"""``length-gen``: accuracy and adjacency by operand size, past the training context, with real files."""

import json

import pytest
from conftest import assert_lists_every_file, assert_strict_json_files, build_unhooked


def test_rows_match_an_independent_evaluation_and_run_past_n_ctx(tiny_run, tmp_path):
    import tasks
    from nope_interp.evaluate import predict
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.model import with_context
    from nope_interp.pretrained import load_run

    run = load_run(tiny_run)
    entry = entry_from_run(run, "tiny")
    cfg = length_gen.LengthGenConfig(sizes=(4, 1, 2), n_examples=12, n_prompts=5, points=("z",))
    res = length_gen.run(cfg, [entry])
    assert [r.n_digits for r in res.rows] == [1, 2, 4] and all(r.trained_n_digits == 2 for r in res.rows)
    for row in res.rows:
        task = tasks.get_task("addition", n_digits=row.n_digits)
        prompts = length_gen.full_length_prompts(task, 12, cfg.seed, run.train_prompts)
        assert row.n_examples == len(prompts) and not set(prompts) & run.train_prompts
        assert all(len(p) == task.max_prompt_len for p in prompts)
        model, _ = with_context(run.model, run.model_cfg, 40)
        answers = predict(model, task, prompts)
        expected = sum(a == task.solve(p) for a, p in zip(answers, prompts, strict=True)) / len(prompts)
        assert row.exact_match == pytest.approx(expected)
        assert set(row.scores) == {"blocks.0.attn.hook_z", "blocks.1.attn.hook_z"}
        assert 0 <= row.scores["blocks.0.attn.hook_z"]["row_mean"]["mean"] <= 1
    assert res.rows[-1].prompt_len + 6 > run.model_cfg.n_ctx  # size 4 needs more than the trained n_ctx
    paths = length_gen.write(res, tmp_path)
    assert {p.name for p in paths} == {"length_gen.json", "length_gen.csv", "length_gen.html", "plotly.min.js"}
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    assert_strict_json_files(tmp_path / "results")
    assert len(json.loads(paths[0].read_text())["rows"]) == 3


def test_few_full_length_prompts_give_all_there_are():
    import tasks
    from nope_interp.jobs.length_gen import full_length_prompts

    task = tasks.get_task("addition", n_digits=1)
    got = full_length_prompts(task, 1000, 0, frozenset({"$3+4="}))
    assert len(got) == len(set(got)) and "$3+4=" not in got and 50 <= len(got) <= 99


def test_a_size_with_fewer_prompts_than_asked_is_said_as_it_happens(tiny_run):
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    lines = []
    cfg = length_gen.LengthGenConfig(sizes=(1,), n_examples=500, n_prompts=4, points=("z",))
    (row,) = length_gen.run(cfg, [entry_from_run(load_run(tiny_run), "tiny")], log=lines.append).rows
    assert row.n_examples < 500
    assert any(f"n_digits=1 has only {row.n_examples} full-length prompts outside the training prompts (asked for "
               f"500)" in line for line in lines), lines


def test_an_initialised_model_is_refused(tmp_path):
    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_init

    entry = entry_from_init(preset("tiny"), tasks.get_task("reversal"), "init")
    with pytest.raises(NopeInterpError, match="needs a trained model"):
        length_gen.run(length_gen.LengthGenConfig(sizes=(2,)), [entry])


@pytest.mark.parametrize(("kwargs", "match"), [({"sizes": (0,)}, "^sizes must"), ({"sizes": (65,)}, "^sizes must"),
                                               ({"n_examples": 0}, "n_examples"), ({"n_prompts": 0}, "n_prompts"),
                                               ({"points": ()}, "points"), ({"points": ("pattern",)}, "point"),
                                               ({"seed": -1}, "seed")])
def test_bad_config(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.length_gen import LengthGenConfig

    with pytest.raises(NopeInterpError, match=match):
        build_unhooked(LengthGenConfig, **kwargs)


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    """A tiny 2-digit addition run (2 steps) with learned positional embeddings and n_ctx 16."""
    from nope_interp.config import TrainConfig, preset
    from nope_interp.train import train

    path = tmp_path_factory.mktemp("learned") / "l"
    cfg = TrainConfig(task="addition", task_params={"n_digits": 2}, n_train=100, n_test=20, steps=2, batch_size=4,
                      warmup_steps=1, eval_every=2, eval_n=5, checkpoint_every=2)
    train(preset("tiny", n_ctx=16, positional="learned"), cfg, path, progress=False, command="x")
    return path


def test_scores_are_on_the_tokens_the_accuracy_reads_after_the_eval_prefix(packed_run, tmp_path):
    """Before: exact match was read after the packed run's "\\n" but the adjacency score was computed on the
    prompts without it (reversal-packed-s0, size 16: L0 hook_z 0.987 reported, 0.887 on the prompts read)."""
    import csv

    import tasks
    from nope_interp.analysis import analyze_tokens
    from nope_interp.evaluate import exact_match_accuracy
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.model import with_context
    from nope_interp.pretrained import load_run

    run = load_run(packed_run)
    assert run.train_cfg.eval_prefix == "\n"
    cfg = length_gen.LengthGenConfig(sizes=(2,), n_examples=12, n_prompts=5, points=("z",))
    (row,) = length_gen.run(cfg, [entry_from_run(run, "p")]).rows
    task = tasks.get_task("addition", n_digits=2)
    prompts = length_gen.full_length_prompts(task, 12, cfg.seed, run.train_prompts)
    model, _ = with_context(run.model, run.model_cfg, 40)
    read = ["\n" + p for p in prompts[:5]]
    want = analyze_tokens(model, task.prompt_tokens(read), ("z",), forward="hooked").scores["row_mean"]
    for site, s in row.scores.items():
        assert s["row_mean"]["mean"] == pytest.approx(want[site]["mean"], abs=1e-9), site
        assert s["row_mean"]["n"] == 5
    assert row.exact_match == pytest.approx(
        exact_match_accuracy(model, task, [task.example(p) for p in prompts], prefix="\n"))
    assert row.eval_prefix == "\n"
    paths = length_gen.write(length_gen.LengthGenResult(cfg, (row,), 0.0), tmp_path)
    assert "eval_prefix" in json.loads(paths[0].read_text())["scored_inputs"]
    with paths[1].open() as f:
        assert {r["eval_prefix"] for r in csv.DictReader(f)} == {"\\n"}


def test_an_answer_only_models_scores_are_those_of_its_bare_prompts(tiny_run):
    """An answer-only run reads no prefix: its scores are analyze_model's on the same prompts (unchanged by
    scoring after the prefix)."""
    from nope_interp.analysis import analyze_model
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    run = load_run(tiny_run)
    cfg = length_gen.LengthGenConfig(sizes=(2,), n_examples=12, n_prompts=5, points=("z",))
    (row,) = length_gen.run(cfg, [entry_from_run(run, "tiny")]).rows
    want = analyze_model(run.model, run.task, 5, seed=cfg.seed, points=("z",), exclude=run.train_prompts)
    assert row.eval_prefix == ""
    assert {s: v["row_mean"] for s, v in row.scores.items()} == want.scores["row_mean"]


def test_an_empty_model_list_is_refused_and_none_means_the_defaults(monkeypatch):
    """Before: ``run(cfg, models=[])`` ran the default (shipped) models, as if no list had been given."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import length_gen

    def defaults(config):
        raise AssertionError("the default models were run")

    monkeypatch.setattr(length_gen, "default_models", defaults)
    with pytest.raises(NopeInterpError, match=r"^length-gen: models is an empty list"):
        length_gen.run(length_gen.LengthGenConfig(sizes=(2,)), [])
    monkeypatch.setattr(length_gen, "default_models", lambda config: [])
    with pytest.raises(NopeInterpError, match="no models: none of the shipped reversal and addition models"):
        length_gen.run(length_gen.LengthGenConfig(sizes=(2,)), None)


def test_a_size_past_a_learned_position_models_n_ctx_is_refused_before_any_work(learned_run, tiny_run):
    """Before: sizes 2 and 3 were scored, then size 4 failed inside with_context with a message naming
    neither the model nor the size (and nothing was written)."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    lines = []
    cfg = length_gen.LengthGenConfig(sizes=(2, 3, 4), n_examples=8, n_prompts=4, points=("z",))
    nope = entry_from_run(load_run(tiny_run), "tiny")  # first: a NoPE model is not refused, and not run either
    learned = entry_from_run(load_run(learned_run), "l")
    with pytest.raises(NopeInterpError, match=r"^l: size 4 of sizes needs 18 positions \(0 prefix \+ 11 prompt "
                                              r"\+ 6 answer \+ 1 end of line\), past the model's n_ctx=16: .*"
                                              r"\(sizes up to 3 fit it\)$"):
        length_gen.run(cfg, [nope, learned], log=lines.append)
    assert not any("exact match" in line for line in lines), lines  # nothing scored
    res = length_gen.run(cfg.replace(sizes=(2, 3)), [learned])  # the sizes that fit run
    assert [r.n_digits for r in res.rows] == [2, 3]


def test_a_size_the_task_does_not_allow_names_sizes_and_the_tasks_range(tiny_run, capsys, tmp_path):
    """Before: ``--sizes 20`` for addition said "n_digits must be an integer in [1, 18]" (a TaskError, after
    the smaller sizes were scored) and ``--sizes 0`` said "size must be ...": neither named --sizes."""
    from nope_interp.cli import main
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import length_gen
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    entry = entry_from_run(load_run(tiny_run), "tiny")
    with pytest.raises(NopeInterpError, match=r"^sizes must be integers in \[1, 18\] for addition \(model tiny\), "
                                              r"got 20$"):
        length_gen.run(length_gen.LengthGenConfig(sizes=(2, 20), n_examples=8, n_prompts=4, points=("z",)), [entry])
    assert main(["length-gen", "--run", str(tiny_run), "--sizes", "2", "20",
                 "--out-root", str(tmp_path)]) == 2
    assert "error: --sizes must be integers in [1, 18] for addition" in capsys.readouterr().err
    assert main(["length-gen", "--run", str(tiny_run), "--sizes", "0",
                 "--out-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: --sizes must be integers in [1, 64]" in err and "addition 18" in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_figures_range_ignores_an_undefined_score_and_shows_every_low_one():
    """Found by a review: min() over scores whose first one is NaN (every prompt degenerate) is NaN, so the
    adjacency axis fell back to [0.4, 1.02] and hid the scores of 0.2 and 0.25."""
    from nope_interp.jobs import length_gen

    cfg = length_gen.LengthGenConfig(sizes=(2, 3, 4), n_examples=4, n_prompts=2, points=("z",))
    rows = tuple(length_gen.LengthRow(model="m", task="addition", n_digits=n, trained_n_digits=2, prompt_len=9,
                                      n_examples=4, exact_match=0.5,
                                      scores={"blocks.0.attn.hook_z": {"row_mean": {"mean": v, "std": 0.0, "n": 2}}})
                 for n, v in ((2, float("nan")), (3, 0.2), (4, 0.25)))
    fig = length_gen.plot_length_gen(length_gen.LengthGenResult(cfg, rows, 0.0))
    low, high = fig.layout.yaxis2.range
    assert low <= 0.2 - 0.05 + 1e-12 and high == 1.02
