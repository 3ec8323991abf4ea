"""Adjacency through training: kept steps, scores equal to analysing each kept checkpoint, files."""

import json

import pytest
from conftest import assert_strict_json_files


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
    paths = trajectory.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert {p.name for p in paths} == {"tiny-addition.json", "tiny-addition.csv", "tiny-addition.html"}
    data = json.loads((tmp_path / "results" / "trajectory" / "tiny-addition.json").read_text())
    assert data["steps"] == [0, 25, 50, 60] and len(data["scores"]["blocks.1.attn.hook_z"]) == 4


def test_a_model_without_kept_steps_is_refused():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.common import ModelSource, load_models

    with pytest.raises(NopeInterpError, match="kept no weights"):
        trajectory.run(trajectory.TrajectoryConfig(n_prompts=4), load_models(ModelSource(pretrained=("reversal",))))
    with pytest.raises(NopeInterpError, match="needs --run"):
        trajectory.run(trajectory.TrajectoryConfig())


def test_kept_steps_read_only_ascii_step_numbers(tmp_path):
    from nope_interp.jobs.trajectory import kept_steps

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("step_000010.safetensors", "step_000250.safetensors", "step_\u0661\u0662.safetensors",
                 "step_\uff13.safetensors", "step_\u00b2.safetensors", "step_1x.safetensors"):
        (folder / name).write_bytes(b"")
    assert list(kept_steps(tmp_path)) == [10, 250]
