"""``length-gen``: accuracy and adjacency by operand size, past the training context, with real files."""

import json

import pytest
from conftest import assert_strict_json_files, build_unhooked


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
    assert {p.name for p in paths} == {"length_gen.json", "length_gen.csv", "length_gen.html"}
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


@pytest.mark.parametrize(("kwargs", "match"), [({"sizes": (0,)}, "size"), ({"sizes": (65,)}, "size"),
                                               ({"n_examples": 0}, "n_examples"), ({"n_prompts": 0}, "n_prompts"),
                                               ({"points": ()}, "points"), ({"points": ("pattern",)}, "point"),
                                               ({"seed": -1}, "seed")])
def test_bad_config(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.length_gen import LengthGenConfig

    with pytest.raises(NopeInterpError, match=match):
        build_unhooked(LengthGenConfig, **kwargs)
