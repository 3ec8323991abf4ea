import json
import math

import pytest
import torch


@pytest.fixture
def tiny_train(tmp_path):
    from nope_interp.model import preset
    from nope_interp.train import TrainConfig

    model_cfg = preset("tiny", n_ctx=16)
    cfg = TrainConfig(task="addition", task_params={"n_digits": 2}, n_train=300, n_test=50, steps=12,
                      batch_size=16, lr=3e-3, warmup_steps=3, eval_every=6, eval_n=20, checkpoint_every=4)
    return model_cfg, cfg


class Interrupt(Exception):
    """Raised by :func:`crash_at_step` to simulate a killed training process."""


def crash_at_step(monkeypatch, n: int) -> None:
    """Make the n-th AdamW step (1-based) raise Interrupt, as if the process died there."""
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def flaky_step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise Interrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", flaky_step)


def _weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model.safetensors"))


def test_same_seed_same_weights(tiny_train, tmp_path):
    from nope_interp.train import TrainConfig, train

    model_cfg, cfg = tiny_train
    torch.set_num_threads(1)
    a = train(model_cfg, cfg, tmp_path / "a", progress=False, command="x")
    b = train(model_cfg, cfg, tmp_path / "b", progress=False, command="x")
    wa, wb = _weights(a.run_dir), _weights(b.run_dir)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # a different seed changes the weights
    c = train(model_cfg, TrainConfig(**{**cfg.to_dict(), "seed": 1}), tmp_path / "c", progress=False, command="x")
    assert any(not torch.equal(wa[k], _weights(c.run_dir)[k]) for k in wa)


@pytest.mark.parametrize("objective", ["answer_only", "packed"])
def test_resume_continues_from_checkpoint_to_identical_weights(tiny_train, tmp_path, monkeypatch, objective):
    import nope_interp.train as T

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(objective=objective, **({"window": 16} if objective == "packed" else {}))
    torch.set_num_threads(1)
    full = T.train(model_cfg, cfg, tmp_path / "full", progress=False, command="x")

    real_step = torch.optim.AdamW.step
    crash_at_step(monkeypatch, 9)  # crash during step 9, after the step-8 checkpoint
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "part", progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    assert torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)["step"] == 8
    assert not (tmp_path / "part" / "summary.json").exists()
    resumed = T.train(model_cfg, cfg, tmp_path / "part", resume=True, progress=False)
    wf, wr = _weights(full.run_dir), _weights(resumed.run_dir)
    assert all(torch.equal(wf[k], wr[k]) for k in wf)
    steps = [json.loads(line)["step"] for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [6, 12]


def test_run_directory_contents(tiny_train, tmp_path):
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    r = train(model_cfg, cfg, tmp_path / "run", progress=False, command="nope-interp train --task addition")
    files = sorted(p.name for p in r.run_dir.iterdir())
    assert files == ["checkpoint.pt", "checkpoints", "config.json", "metrics.jsonl", "model.safetensors",
                     "summary.json"]
    kept = sorted(p.name for p in (r.run_dir / "checkpoints").iterdir())
    assert kept == ["step_000000.safetensors", "step_000012.safetensors"]  # log-spaced: 0, then the last step
    config = json.loads((r.run_dir / "config.json").read_text())
    assert config["command"] == "nope-interp train --task addition"
    assert config["model"] == model_cfg.to_dict() and config["train"] == cfg.to_dict()
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert 0 <= summary["test_acc"] <= 1 and summary["n_test"] == 50 and summary["steps"] == 12


def test_lr_schedule_warmup_and_cosine(tiny_train):
    from nope_interp.train import TrainConfig, lr_at

    cfg = TrainConfig(lr=1e-3, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)
    assert lr_at(110, cfg) == pytest.approx(1e-4) and lr_at(500, cfg) == pytest.approx(1e-4)


def test_weight_decay_only_on_matrices(tiny_model):
    from nope_interp.train import TrainConfig, make_optimizer

    opt = make_optimizer(tiny_model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim < 2 for p in no_decay["params"])
    trainable = [p for p in tiny_model.parameters() if p.requires_grad]
    assert len(decay["params"]) + len(no_decay["params"]) == len(trainable)
    assert all(p is not tiny_model.pos_embed.W_pos for p in decay["params"])


def test_bad_training_input(tiny_train, tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import preset
    from nope_interp.train import TrainConfig, train

    model_cfg, cfg = tiny_train
    with pytest.raises(NopeInterpError, match="n_ctx=8 is too small for task 'addition'"):
        train(preset("tiny", n_ctx=8), cfg, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()
    with pytest.raises(NopeInterpError, match="no checkpoint"):
        train(model_cfg, cfg, tmp_path / "y", resume=True, progress=False)
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "other.txt").write_text("x")
    with pytest.raises(NopeInterpError, match="not empty"):
        train(model_cfg, cfg, tmp_path / "z", progress=False)
    with pytest.raises(NopeInterpError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(NopeInterpError, match="device"):
        train(model_cfg, cfg, tmp_path / "w", device="tpu", progress=False)


def test_finalize_a_stopped_run(tiny_train, tmp_path, monkeypatch):
    import nope_interp.train as T

    model_cfg, cfg = tiny_train

    real = torch.optim.AdamW.step
    crash_at_step(monkeypatch, 10)
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "r", progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    summary = T.finalize(tmp_path / "r")
    assert summary["steps"] == 8 and summary["finished_schedule"] is False and summary["n_test"] == 50
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["test_acc"] == summary["test_acc"]
    # resuming after finalize: the stopped-by-hand summary goes (it kept describing step 8 while the weights
    # moved on, and compare read it as the run's accuracy); the finished run writes its own
    crash_at_step(monkeypatch, 2)
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "r", resume=True, progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert not (tmp_path / "r" / "summary.json").exists()
    T.train(model_cfg, cfg, tmp_path / "r", resume=True, progress=False, command="x")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 12


def test_finalize_drops_evaluations_logged_after_the_checkpoint(tiny_train, tmp_path, monkeypatch):
    """A stop between an evaluation and the next checkpoint left metrics past the finalized weights."""
    import nope_interp.train as T
    from nope_interp import io
    from nope_interp.pretrained import load_run

    model_cfg, cfg = tiny_train
    real = torch.optim.AdamW.step
    crash_at_step(monkeypatch, 8)  # checkpoint at 4, evaluation at 6, dies in step 8 before its checkpoint
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "r", progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert [r["step"] for r in io.read_metrics(tmp_path / "r" / "metrics.jsonl")] == [6]
    kept = tmp_path / "r" / "checkpoints"
    (kept / "step_000006.safetensors").write_bytes((kept / "step_000000.safetensors").read_bytes())
    assert T.finalize(tmp_path / "r")["steps"] == 4
    assert sorted(p.name for p in kept.glob("*.safetensors")) == ["step_000000.safetensors"]  # 6 was past it
    assert io.read_metrics(tmp_path / "r" / "metrics.jsonl") == []
    assert load_run(tmp_path / "r").summary["steps"] == 4


def test_packed_stream_holds_every_training_line_once_in_a_seeded_order():
    import tasks

    task = tasks.get_task("addition", n_digits=2)
    examples = task.splits(40, 5, 0).train
    stream = tasks.decode(tasks.packed_stream(examples, seed=3))
    lines = stream.split("\n")
    assert lines[-1] == "" and sorted(lines[:-1]) == sorted(ex.line for ex in examples)
    assert lines[:-1] != [ex.line for ex in examples]  # shuffled
    assert tasks.decode(tasks.packed_stream(examples, seed=3)) == stream


def test_packed_batch_windows_are_substrings_with_shifted_targets_and_full_loss():
    import tasks

    stream = torch.arange(50) % 96
    b = tasks.packed_batch(stream, 7, 5, torch.Generator().manual_seed(0))
    assert b.tokens.shape == (5, 7) and b.loss_mask.all()
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
    for row, tgt in zip(b.tokens, b.targets, strict=True):
        start = int(row[0])
        assert torch.equal(row, stream[start : start + 7]) and int(tgt[-1]) == int(stream[start + 7])
    again = tasks.packed_batch(stream, 7, 5, torch.Generator().manual_seed(0))
    assert torch.equal(again.tokens, b.tokens)
    with pytest.raises(tasks.TaskError, match="window"):
        tasks.packed_batch(stream, 50, 2, torch.Generator())


def test_packed_training_records_its_objective_and_refuses_a_window_longer_than_n_ctx(tiny_train, tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    with pytest.raises(NopeInterpError, match="window=32 is longer than the model's n_ctx=16"):
        train(model_cfg, cfg.replace(objective="packed", window=32), tmp_path / "x", progress=False)
    # a window too short to hold one whole example (before: 1- and 2-token windows trained silently)
    for short in (1, 2, 12):
        with pytest.raises(NopeInterpError, match=rf"window={short} cannot hold one whole addition example .*"
                                                  r"use window >= 13$"):  # the CLI: --window
            train(model_cfg, cfg.replace(objective="packed", window=short), tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
    assert not (tmp_path / "x").exists()
    r = train(model_cfg, cfg.replace(objective="packed", window=16, steps=4), tmp_path / "p", progress=False)
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert summary["objective"] == "packed" and summary["eval_prefix"] == "\n" and summary["cpu"]
    # every eval line has the answer-token loss, measured with the run's eval prefix
    from nope_interp.evaluate import answer_token_loss
    from nope_interp.pretrained import load_run

    rows = [json.loads(line) for line in (r.run_dir / "metrics.jsonl").read_text().splitlines()]
    run = load_run(r.run_dir)
    assert rows and rows[-1]["step"] == 4 and rows[-1]["eval_answer_loss"] == pytest.approx(
        answer_token_loss(run.model, run.task, run.splits.test[: cfg.eval_n], prefix="\n"), rel=1e-5)
    with pytest.raises(NopeInterpError, match="objective must be one of answer_only, packed"):
        cfg.replace(objective="every_token")


def _rewind_checkpoint(run, step):
    """Relabel a finished run's checkpoint as taken at ``step`` (a run stopped there; the weights are the last)."""
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    ckpt["step"] = step
    torch.save(ckpt, run / "checkpoint.pt")


def test_a_run_written_before_new_config_fields_still_resumes(tiny_train, tmp_path):
    """config.json from before objective/window/tied_embeddings/dropout existed: --resume still works."""
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    train(model_cfg, cfg.replace(steps=4), tmp_path / "old", progress=False)
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    for key in ("objective", "window"):
        config["train"].pop(key)
    for key in ("tied_embeddings", "dropout"):
        config["model"].pop(key)
    path.write_text(json.dumps(config))
    (tmp_path / "old" / "summary.json").unlink()
    _rewind_checkpoint(tmp_path / "old", 2)  # stopped before its end (a finished run is not resumed)
    r = train(model_cfg, cfg.replace(steps=4), tmp_path / "old", resume=True, progress=False)
    assert r.steps == 4


def test_log_spaced_steps():
    from nope_interp.train import log_spaced_steps

    assert log_spaced_steps(12) == [0, 12]
    assert log_spaced_steps(100) == [0, 25, 50, 100]
    assert log_spaced_steps(1000) == [0, 25, 50, 100, 200, 400, 800, 1000]
    assert len(log_spaced_steps(40_000)) == 13


def test_the_gpu_paper_recipe_script_runs_at_a_tiny_size_and_resumes(tmp_path):
    """bench/paper_recipe_gpu.py --tiny: the GPU script's code path on a CPU, packed objective, tied + dropout."""
    import runpy

    script = runpy.run_path(str(__import__("pathlib").Path(__file__).parent.parent / "bench" / "paper_recipe_gpu.py"))
    assert script["main"](["--out", str(tmp_path), "--tiny", "--tasks", "addition", "--device", "cpu"]) == 0
    summary = json.loads((tmp_path / "addition" / "summary.json").read_text())
    config = json.loads((tmp_path / "addition" / "config.json").read_text())
    assert summary["objective"] == "packed" and config["model"]["tied_embeddings"] and config["model"]["dropout"] == 0.2
    assert script["main"](["--out", str(tmp_path), "--tiny", "--tasks", "addition", "--device", "cpu"]) == 0
    paper_model, paper_train = script["configs"](False, "ordering")
    assert (paper_model.n_layers, paper_model.d_model, paper_train.window, paper_train.batch_size) == (6, 384, 256, 256)


def _gpu_script():
    import runpy

    return runpy.run_path(str(__import__("pathlib").Path(__file__).parent.parent / "bench" / "paper_recipe_gpu.py"))


def test_the_gpu_script_stops_at_its_time_budget_at_a_checkpoint_and_each_rerun_goes_further(tmp_path, capsys):
    """--budget-s: the run stops at the first checkpoint past the budget (steps 2, then 4: every rerun goes
    further and no step is lost), is scored and summarised as stopped by the budget; the rerun that reaches
    the end of the schedule finishes it (a new summary, no budget note). Before: the stop went back to the
    checkpoint before the evaluation past the budget, so a short budget never got further, and a budget
    spent at the last evaluation threw the finished schedule away."""
    script = _gpu_script()
    args = ["--out", str(tmp_path), "--tiny", "--tasks", "reversal", "--device", "cpu", "--budget-s", "1e-9"]
    for steps in (2, 4):
        assert script["main"](args) == 0
        summary = json.loads((tmp_path / "reversal" / "summary.json").read_text())
        assert summary["steps"] == steps and summary["time_budget_s"] == 1e-9 and not summary["finished_schedule"]
        assert "time budget" in summary["note"] and summary["matmul_precision"] == "fp32"
        assert "time budget spent" in capsys.readouterr().out
    metrics = [json.loads(line) for line in (tmp_path / "reversal" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [3]  # the evaluation at step 3 is kept: its step was not undone
    assert script["main"](args) == 0
    summary = json.loads((tmp_path / "reversal" / "summary.json").read_text())
    assert summary["steps"] == 6 and "time_budget_s" not in summary and "note" not in summary
    assert script["main"](["--out", str(tmp_path / "inf"), "--tiny", "--tasks", "reversal", "--device", "cpu",
                           "--budget-s", "inf"]) == 0  # inf: no limit
    assert json.loads((tmp_path / "inf" / "reversal" / "summary.json").read_text())["steps"] == 6
    capsys.readouterr()
    for bad in (["--budget-s", "0"], ["--budget-s", "-1"], ["--budget-s", "nan"], ["--precision", "nope"],
                ["--bogus", "1"]):  # an unknown flag too (before: "nope-interp: error: unrecognized arguments")
        with pytest.raises(SystemExit) as exc:
            script["main"]([*args[:-2], *bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err  # one line naming the flag (before: argparse's usage, then the error)
        assert err.count("\n") == 1 and err.startswith("paper_recipe_gpu.py: error: ") and bad[0] in err, err


def test_train_time_limit_stops_at_a_checkpoint_without_a_summary_and_resumes(tiny_train, tmp_path):
    """train(time_limit_s=...): stops right after a checkpoint (nothing lost), no summary, NaN test_acc;
    --resume continues; a limit that is not a finite number > 0 is refused before anything is written."""
    import math

    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(steps=8, checkpoint_every=2, eval_every=4)
    res = train(model_cfg, cfg, tmp_path / "r", progress=False, time_limit_s=1e-9)
    assert res.time_limited and res.steps == 2 and math.isnan(res.test_acc)
    assert not (tmp_path / "r" / "summary.json").exists()
    res = train(model_cfg, cfg, tmp_path / "r", resume=True, progress=False)
    assert not res.time_limited and res.steps == 8 and (tmp_path / "r" / "summary.json").exists()
    for bad in (0, -1.0, math.nan, math.inf, "5"):  # as users call it: without the tests' type checker
        with pytest.raises(NopeInterpError, match="time_limit_s must be a finite number"):
            unhooked(train)(model_cfg, cfg, tmp_path / "bad", progress=False, time_limit_s=bad)
        assert not (tmp_path / "bad").exists()


def test_the_gpu_script_trains_under_bfloat16_autocast_and_resumes_only_at_its_own_precision(tmp_path, capsys):
    """--precision bf16: the tiny run trains and is scored under bfloat16 autocast (here on the CPU), its
    weights stay float32, the summary records it; resuming it at another precision is refused in one line
    (exit 2), naming the flag, from the command its config.json records (no side file another call could
    overwrite); a TF32 run (CUDA only) resumed on a CPU is told to resume on CUDA."""
    from safetensors.torch import load_file

    script = _gpu_script()
    args = ["--out", str(tmp_path), "--tiny", "--tasks", "ordering", "--device", "cpu"]
    assert script["main"]([*args, "--precision", "bf16", "--budget-s", "1e-9"]) == 0
    summary = json.loads((tmp_path / "ordering" / "summary.json").read_text())
    assert summary["matmul_precision"] == "bf16-autocast" and summary["steps"] == 2
    weights = load_file(tmp_path / "ordering" / "model.safetensors").values()
    assert {t.dtype for t in weights if t.is_floating_point()} == {torch.float32}
    capsys.readouterr()
    assert script["main"](args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained at precision bf16, not fp32: resume it with --precision bf16" in err
    config = json.loads((tmp_path / "ordering" / "config.json").read_text())
    (tmp_path / "ordering" / "config.json").write_text(json.dumps(
        {**config, "command": config["command"].replace("--precision bf16", "--precision tf32")}))
    assert script["main"](args) == 2
    assert "resume it on a CUDA device (--device cuda)" in capsys.readouterr().err
    (tmp_path / "ordering" / "config.json").write_text(json.dumps(config))
    assert script["main"]([*args, "--precision", "bf16"]) == 0
    assert json.loads((tmp_path / "ordering" / "summary.json").read_text())["steps"] == 6
    (tmp_path / "file").write_text("")
    assert script["main"](["--out", str(tmp_path / "file"), "--tiny", "--tasks", "ordering", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paper_recipe_gpu: error: ") and err.count("\n") == 1


def test_resume_with_other_settings_names_every_differing_field(tiny_train, tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    train(model_cfg, cfg.replace(steps=4), tmp_path / "r", progress=False)
    (tmp_path / "r" / "summary.json").unlink()  # stopped before scoring (a finished run is refused as finished)
    with pytest.raises(NopeInterpError, match=r"train.steps \(stored 4, given 8\), train.lr \(stored 0.003, given "
                                              r"0.001\)"):
        train(model_cfg, cfg.replace(steps=8, lr=1e-3), tmp_path / "r", resume=True, progress=False)
    # before: the model's seed and window were hidden behind the training config's fields of the same name
    for changed, words in ((model_cfg.replace(seed=7), r"model.seed \(stored 0, given 7\)"),
                           (model_cfg.replace(attention="sliding", window=3),
                            r"model.window \(stored None, given 3\)")):
        with pytest.raises(NopeInterpError, match=words):
            train(changed, cfg.replace(steps=4), tmp_path / "r", resume=True, progress=False)


def test_training_refuses_bidirectional_attention_and_user_folders_get_no_removal_advice(tiny_train, tmp_path):
    """Before: a bidirectional model trained on its own next tokens (a text run's bits per character read 3.10
    against 3.78 causal), and a user's non-empty folder was called a stopped run to remove with rm -r."""
    from conftest import unhooked

    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.text_train import train_text
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    bidirectional = model_cfg.replace(attention="bidirectional")
    for call in (lambda: train(bidirectional, cfg, tmp_path / "b", progress=False),
                 lambda: train_text(bidirectional, TextTrainConfig(window=24, steps=2), tmp_path / "b",
                                    progress=False)):
        with pytest.raises(NopeInterpError, match=r"^attention='bidirectional' cannot be trained"):
            call()
        assert not (tmp_path / "b").exists()
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("important")
    with pytest.raises(NopeInterpError, match="is not empty and is not a run") as info:
        train(model_cfg, cfg, user, progress=False)
    assert "rm -r" not in str(info.value) and (user / "notes.txt").read_text() == "important"
    (user / "config.json").write_text("{}")   # a config beside the user's file: still not only a run's files
    with pytest.raises(NopeInterpError, match="is not empty and is not a run"):
        train(model_cfg, cfg, user, progress=False)
    for bad in ("", 3):
        with pytest.raises(NopeInterpError, match="run_dir must be a non-empty path"):
            unhooked(train)(model_cfg, cfg, bad, progress=False)


def test_resume_and_finalize_name_a_corrupt_run_config_and_bad_devices(tiny_train, tmp_path):
    import json

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import finalize, resolve_device, train

    model_cfg, cfg = tiny_train
    train(model_cfg, cfg.replace(steps=4), tmp_path / "r", progress=False)
    path = tmp_path / "r" / "config.json"
    good = json.loads(path.read_text())
    for bad, match in (({**good, "train": None}, "'train' must be a JSON object"),
                       ({**good, "model": [1, 2]}, "'model' must be a JSON object"),
                       ({k: v for k, v in good.items() if k != "train"}, "'train' is missing"),
                       ([good], "expected a JSON object")):
        path.write_text(json.dumps(bad))
        with pytest.raises(NopeInterpError, match=match):
            train(model_cfg, cfg.replace(steps=4), tmp_path / "r", resume=True, progress=False)
        with pytest.raises(NopeInterpError, match=match):
            finalize(tmp_path / "r")
    for device in ("tpu", "cuda:x", "gpu", "cpu:0 "):
        with pytest.raises(NopeInterpError, match="device"):
            resolve_device(device)
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") in ("cpu", "cuda")


def test_resume_of_a_finished_run_is_refused_and_writes_nothing(tiny_train, tmp_path):
    """A run at its last step, or stopped early at its target, rewrote its summary on --resume (and after an
    early stop trained on past the target): refused, every file left as it was. One stopped by hand and
    finalised (summary written, not early) still resumes."""
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import finalize, train

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(steps=12, eval_every=4)
    train(model_cfg, cfg, tmp_path / "done", progress=False)
    early = tmp_path / "early"  # an early stop: the target reached at the step-8 checkpoint
    shutil.copytree(tmp_path / "done", early)
    _rewind_checkpoint(early, 8)
    summary = json.loads((early / "summary.json").read_text())
    (early / "summary.json").write_text(json.dumps({**summary, "steps": 8, "stopped_early": True}))
    for run, match in ((tmp_path / "done", "has finished: it trained its whole schedule \\(12\\) at step 12"),
                       (early, "has finished: it stopped early at its target at step 8")):
        before = {f.name: f.read_bytes() for f in run.rglob("*") if f.is_file()}
        # --resume, also with other settings (before: "settings differ ... rerun its own command --resume",
        # which was then refused as finished)
        for given in (cfg, cfg.replace(lr=0.5), cfg.replace(steps=20)):
            with pytest.raises(NopeInterpError, match=match.replace("has finished: it", "holds a finished run: it")):
                train(model_cfg, given, run, resume=True, progress=False)
        # a new run under its name (before: "use --resume", which then refused it), also with another schedule
        for given in (cfg, cfg.replace(steps=20)):
            with pytest.raises(NopeInterpError, match=match.replace("has finished: it", "holds a finished run: it")) \
                    as info:
                train(model_cfg, given, run, progress=False)
            msg = str(info.value)
            assert "use resume" not in msg and "(resume=True and finalize() refuse it)" in msg, msg  # Python names
            assert "another run_dir" in msg and f"rm -r {run}" in msg and "--" not in msg, msg
        assert {f.name: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    # finalised by hand at step 8 (stopped_early false): resumes to the end, and a new run is told so
    hand = tmp_path / "hand"
    shutil.copytree(early, hand)
    (hand / "summary.json").unlink()
    assert finalize(hand)["stopped_early"] is False
    with pytest.raises(NopeInterpError, match=r"is not empty; use resume=True or choose another run_dir$"):
        train(model_cfg, cfg, hand, progress=False)
    assert train(model_cfg, cfg, hand, resume=True, progress=False).steps == 12
    # finalize cannot turn a finished run into one "stopped by hand" that --resume would train on
    with pytest.raises(NopeInterpError, match=r"^finalize\(\): .*early has finished \(step 8, .*stopped early: True"):
        finalize(early)
    # stopped while scoring the test set (checkpoint at the last step, no summary): resuming writes the summary
    scoring = tmp_path / "scoring"
    shutil.copytree(tmp_path / "done", scoring)
    (scoring / "summary.json").unlink()
    r = train(model_cfg, cfg, scoring, resume=True, progress=False)
    done = json.loads((tmp_path / "done" / "summary.json").read_text())
    assert r.steps == 12 and r.test_acc == done["test_acc"]
    assert json.loads((scoring / "summary.json").read_text())["test_acc"] == done["test_acc"]
    # a summary that is no object, or a finished one without its numbers: one-line errors, not tracebacks
    for text, match in (("[1, 2]", "holds a JSON list, not an object"), ('"x"', "holds a JSON str"),
                        ('{"steps": 12, "stopped_early": false}', "'test_acc' is None"),
                        ('{"steps": 12, "stopped_early": 1, "test_acc": 0.5, "train_wall_time_s": 1}',
                         "'stopped_early' is 1")):
        (scoring / "summary.json").write_text(text)
        for call in (lambda: train(model_cfg, cfg, scoring, resume=True, progress=False), lambda: finalize(scoring)):
            with pytest.raises(NopeInterpError, match=match):
                call()
        with pytest.raises(NopeInterpError, match="is not empty; use resume=True"):  # which then names the fault
            train(model_cfg, cfg, scoring, progress=False)


def test_resume_refuses_a_lost_or_hollow_training_history(tiny_train, tmp_path):
    """A checkpoint past step 0 beside no metrics.jsonl (or lines without loss/lr) would have resumed into a
    history that starts at the checkpoint: refused, and the files are left as they were."""
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(steps=12, eval_every=4)
    train(model_cfg, cfg, tmp_path / "done", progress=False)
    for case, match in (("missing", "metrics.jsonl is missing, but the checkpoint is at step 8"),
                        ("no loss", "line 1: no 'loss'"), ("no lr", "line 1: no 'lr'")):
        run = tmp_path / case.replace(" ", "_")
        shutil.copytree(tmp_path / "done", run)
        _rewind_checkpoint(run, 8)  # as if stopped at step 8: not finished
        (run / "summary.json").unlink()
        metrics = run / "metrics.jsonl"
        if case == "missing":
            metrics.unlink()
        else:
            metrics.write_text('{"step": 4, ' + ('"lr": 0.001}' if case == "no loss" else '"loss": 1.0}') + "\n")
        before = {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()}
        with pytest.raises(NopeInterpError, match=match):
            train(model_cfg, cfg, run, resume=True, progress=False)
        assert {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()} == before


def test_a_window_without_the_packed_objective_is_refused():
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import TrainConfig

    with pytest.raises(NopeInterpError, match="window=64 is only used with objective packed"):
        TrainConfig(task="addition", window=64)
    assert TrainConfig(task="addition", objective="packed", window=64).window == 64
    assert TrainConfig(task="addition", window=256).objective == "answer_only"  # the default is not "given"


def test_metrics_lines_are_strict_json_with_null_for_non_finite_values(tmp_path):
    import json
    import math

    from nope_interp import io

    path = tmp_path / "m.jsonl"
    for rec in ({"step": 1, "loss": math.nan}, {"step": 2, "loss": math.inf, "x": [-math.inf, 1.0]}, {"step": 3}):
        io.append_jsonl(path, rec)

    def refuse(name):
        raise ValueError(name)

    rows = [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
    assert rows == [{"step": 1, "loss": None}, {"step": 2, "loss": None, "x": [None, 1.0]}, {"step": 3}]
    assert io.read_jsonl(path) == rows


def _diverging(cfg, **changes):
    """Settings that pass validation but blow up within a few steps (Adam at lr 10 with beta2 = 0 and a huge
    init: every step moves every weight by about 10)."""
    from nope_interp.model import preset

    return (preset("tiny", n_ctx=16, init_std=1000.0),
            cfg.replace(lr=10.0, beta2=0.0, grad_clip=1e9, warmup_steps=0, steps=40, eval_every=40, **changes))


def test_training_stops_at_the_first_non_finite_step_and_keeps_the_last_good_checkpoint(tiny_train, tmp_path):
    import re

    from safetensors.torch import load_file

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import load_checkpoint
    from nope_interp.train import train

    model_cfg, cfg = _diverging(tiny_train[1], checkpoint_every=2)
    torch.set_num_threads(1)
    with pytest.raises(NopeInterpError, match=r"training diverged at step \d+: .*not finite") as err:
        train(model_cfg, cfg, tmp_path / "r", progress=False, command="x")
    msg = str(err.value)
    assert "\n" not in msg and "Lower lr, raise warmup_steps or lower grad_clip" in msg and "--" not in msg
    bad_step = int(re.search(r"step (\d+)", msg).group(1))
    ckpt = load_checkpoint(tmp_path / "r" / "checkpoint.pt")
    assert 0 < ckpt["step"] < bad_step and f"keeps step {ckpt['step']}" in msg
    for state in (ckpt["model"], load_file(str(tmp_path / "r" / "model.safetensors"))):  # the last good weights
        # (TransformerLens's attention buffer IGNORE is -inf by design)
        assert all(bool(torch.isfinite(v).all()) for k, v in state.items() if not k.endswith("IGNORE"))
    assert not (tmp_path / "r" / "summary.json").exists()


def test_a_new_run_that_stops_before_its_first_checkpoint_leaves_nothing_behind(tiny_train, tmp_path, monkeypatch):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = _diverging(tiny_train[1], checkpoint_every=1000)
    with pytest.raises(NopeInterpError, match="no checkpoint had been written yet"):
        train(model_cfg, cfg, tmp_path / "r", progress=False, command="x")
    assert list(tmp_path.iterdir()) == []  # neither the run directory nor its lock file
    (tmp_path / "empty").mkdir()  # an empty directory given by the user is kept, and stays empty
    real = torch.optim.AdamW.step
    crash_at_step(monkeypatch, 2)
    with pytest.raises(Interrupt):
        train(*tiny_train, tmp_path / "empty", progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert list((tmp_path / "empty").iterdir()) == []
    assert train(*tiny_train, tmp_path / "empty", progress=False, command="x").steps == 12  # a rerun is not blocked


def test_the_memory_estimate_tracks_the_sizes_and_refuses_what_cannot_fit(tiny_train, tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import model_memory_bytes, preset
    from nope_interp.train import check_train_memory, estimate_train_memory, train

    model_cfg, cfg = tiny_train
    task = cfg.make_task()
    base = estimate_train_memory(model_cfg, cfg, task)
    assert base["model and optimizer"] == 5 * model_memory_bytes(model_cfg)
    assert estimate_train_memory(model_cfg, cfg.replace(batch_size=32), task)["activations"] > base["activations"]
    assert estimate_train_memory(model_cfg, cfg.replace(n_train=3000), task)["data"] > base["data"]
    check_train_memory(model_cfg, cfg, task, "cpu")  # a tiny run fits
    huge = [(model_cfg, cfg.replace(batch_size=10**9)),
            (preset("tiny", n_ctx=16, d_model=1_000_000, n_heads=1, d_head=1_000_000), cfg),
            (preset("tiny"), cfg.replace(task="reversal", task_params={}, n_train=10**9)),
            (preset("tiny", n_ctx=1_000_000), cfg.replace(objective="packed", window=1_000_000, batch_size=64))]
    for i, (m, c) in enumerate(huge):
        with pytest.raises(NopeInterpError, match=r"needs about [0-9.]+ [GT]iB \(.*\) but only .* is free on cpu"):
            train(m, c, tmp_path / f"r{i}", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_more_examples_than_the_task_has_are_refused_before_any_work(tiny_train, tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train  # addition with 2 digits: 10,000 distinct prompts
    with pytest.raises(NopeInterpError, match="n_train \\+ n_test = 10050 but task 'addition'.* only 10000"):
        train(model_cfg, cfg.replace(n_train=10_000), tmp_path / "r", progress=False)
    assert list(tmp_path.iterdir()) == []


def _train_argv(runs, name, seed, steps):
    return ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16", "--steps",
            str(steps), "--batch-size", "4", "--n-train", "100", "--n-test", "20", "--eval-n", "10", "--eval-every",
            "1000", "--checkpoint-every", "1000", "--runs-dir", str(runs), "--name", name, "--model-seed", str(seed),
            "--no-progress"]


def test_two_training_processes_with_one_name_the_second_is_refused_and_a_killed_one_never_blocks(tmp_path, capsys):
    import signal
    import subprocess
    import sys
    import time

    from nope_interp.cli import main

    first = subprocess.Popen([sys.executable, "-m", "nope_interp.cli", *_train_argv(tmp_path, "same", 0, 10**6),
                              "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "same" / "config.json").exists():  # written under the lock
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        assert main(_train_argv(tmp_path, "same", 1, 5)) == 2  # this test's process is the second writer
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0
        assert f"run directory {tmp_path / 'same'} is being written by another nope-interp process " \
               f"(pid {first.pid})" in err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    # the killed writer's lock file is still there but blocks nobody: the next writer gets past the lock
    assert (tmp_path / ".same.lock").exists()
    assert main(_train_argv(tmp_path, "same", 1, 5)) == 2
    # "use --resume" when the killed writer had written its first checkpoint, "remove it" when it had not (a
    # loaded machine can be that slow): either way refused as not empty, not as locked
    err = capsys.readouterr().err
    assert "is not empty" in err and "being written" not in err, err
    assert main(_train_argv(tmp_path, "other", 1, 2)) == 0


@pytest.mark.slow  # 14 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_a_warmup_as_long_as_the_schedule_is_warned(tmp_path):
    import subprocess
    import sys
    import warnings

    from nope_interp.config import TrainConfig, preset
    from nope_interp.errors import ScheduleWarning
    from nope_interp.train import train

    cfg = TrainConfig(task="addition", task_params={"n_digits": 1}, n_train=40, n_test=10, steps=4, batch_size=4,
                      warmup_steps=400, eval_every=4, eval_n=4, checkpoint_every=4)
    warned = r"warmup_steps=400 >= steps=4: the learning rate never reaches lr=0\.000264.*ends at 2\.64e-06"
    with pytest.warns(ScheduleWarning, match=warned):
        train(preset("tiny", n_ctx=16), cfg, tmp_path / "r", progress=False, command="x")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)   # a warmup shorter than the schedule: no warning
        train(preset("tiny", n_ctx=16), TrainConfig(**{**cfg.to_dict(), "warmup_steps": 2}), tmp_path / "s",
              progress=False, command="x")
    # the CLI shows it as one line
    cmd = [sys.executable, "-m", "nope_interp.cli", "train", "--task", "addition", "--preset", "tiny", "--steps", "4",
           "--batch-size", "4", "--eval-every", "4", "--eval-n", "4", "--n-train", "40", "--n-test", "10",
           "--name", "w", "--runs-dir", str(tmp_path / "cli"), "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "nope-interp: warning: warmup_steps=400 >= steps=4" in out.stderr and "cli.py" not in out.stderr


@pytest.mark.parametrize("objective", ["answer_only", "packed"])
def test_runs_with_dropout_are_reproducible_and_resume_exactly(tiny_train, tmp_path, monkeypatch, objective):
    """Before: dropout drew its masks from torch's global generator, which the trainer never seeded (torch seeds
    it at random in each process) nor checkpointed: two runs of one seed differed (loss 4.4320 vs 4.4309 at
    step 20) and a resumed run did not continue the interrupted one. Each process here starts its global
    generator elsewhere, as separate processes would."""
    import nope_interp.train as T

    model_cfg, cfg = tiny_train
    model_cfg = model_cfg.replace(dropout=0.2)
    cfg = cfg.replace(objective=objective, **({"window": 16} if objective == "packed" else {}))
    torch.set_num_threads(1)
    torch.manual_seed(123)
    a = T.train(model_cfg, cfg, tmp_path / "a", progress=False, command="x")
    torch.manual_seed(456)
    b = T.train(model_cfg, cfg, tmp_path / "b", progress=False, command="x")
    wa, wb = _weights(a.run_dir), _weights(b.run_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    real_step = torch.optim.AdamW.step
    crash_at_step(monkeypatch, 9)  # crash during step 9, after the step-8 checkpoint
    torch.manual_seed(789)
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "part", progress=False, command="x")
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    torch.manual_seed(1011)
    resumed = T.train(model_cfg, cfg, tmp_path / "part", resume=True, progress=False)
    wr = _weights(resumed.run_dir)
    assert all(torch.equal(wa[k], wr[k]) for k in wa)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert losses == [json.loads(x)["loss"] for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    # and dropout did act: without it the weights differ
    c = T.train(model_cfg.replace(dropout=0.0), cfg, tmp_path / "c", progress=False, command="x")
    assert any(not torch.equal(wa[k], _weights(c.run_dir)[k]) for k in wa)


def test_a_run_killed_between_its_early_stop_and_its_summary_resumes_into_the_summary(tiny_train, tmp_path,
                                                                                     monkeypatch):
    """Before: the checkpoint at the early stop did not say the run had stopped, so --resume trained on past the
    target (and --finalize wrote stopped_early false)."""
    import nope_interp.io as io_mod
    import nope_interp.train as T

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(target_acc=0.0)  # reached at the first evaluation (step 6)
    real_write = io_mod.write_json

    def dies_at_summary(path, *a, **k):
        if str(path).endswith("summary.json"):
            raise Interrupt
        return real_write(path, *a, **k)

    monkeypatch.setattr(io_mod, "write_json", dies_at_summary)
    with pytest.raises(Interrupt):
        T.train(model_cfg, cfg, tmp_path / "r", progress=False, command="x")
    monkeypatch.setattr(io_mod, "write_json", real_write)
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)["step"] == 6
    import shutil

    shutil.copytree(tmp_path / "r", tmp_path / "f")
    res = T.train(model_cfg, cfg, tmp_path / "r", resume=True, progress=False)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert res.steps == 6 and summary["steps"] == 6 and summary["stopped_early"] is True
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)["step"] == 6
    fin = T.finalize(tmp_path / "f")
    assert fin["stopped_early"] is True and fin["steps"] == 6 and "stopped early at its target" in fin["note"]


@pytest.mark.parametrize("stored_command,shown", [
    ("nope-interp train --task reversal --preset tiny --name r", "nope-interp train --task reversal --preset tiny "
                                                                 "--name r --resume"),
    ("nope-interp train --preset tiny --name r --resume", "nope-interp train --preset tiny --name r --resume"),
    ("nope-interp train --name 'unbalanced", "nope-interp train --name 'unbalanced --resume"),
])
def test_resume_with_another_preset_names_the_runs_own_command(tiny_train, tmp_path, stored_command, shown):
    """``--resume`` with another ``--preset`` differs in half a dozen derived fields the user never typed: the
    message ends with the run's recorded command, the way to resume it (before: the fields alone)."""
    import json

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    train(model_cfg, cfg.replace(steps=4), tmp_path / "r", progress=False, command=stored_command)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["command"] == stored_command
    (tmp_path / "r" / "summary.json").unlink()  # stopped before scoring (a finished run is refused as finished)
    wider = model_cfg.replace(d_model=2 * model_cfg.d_model, d_head=2 * model_cfg.d_head)
    with pytest.raises(NopeInterpError) as info:
        train(wider, cfg.replace(steps=8), tmp_path / "r", resume=True, progress=False)
    msg = str(info.value)
    assert "model.d_model (stored" in msg and msg.endswith(f"; to resume it, rerun its own command: {shown}")


def test_resume_refuses_a_config_edited_under_its_checkpoint(tiny_train, tmp_path):
    """Before: a hand-edited config.json (steps 12 -> 6, with the checkpoint at step 8; or another lr) resumed
    with --steps and --lr to match it, trained on, and wrote a summary of a 6-step run finished at step 8. Now
    the weights' settings stamp and the checkpoint's step are checked against the config; nothing is written."""
    import json
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(steps=12, eval_every=4)
    train(model_cfg, cfg, tmp_path / "done", progress=False)
    for field, value, match in (("steps", 6, "train.steps \\(12 in the weights, 6 in the config\\)"),
                                ("lr", 0.5, "train.lr \\(0.003 in the weights, 0.5 in the config\\)")):
        run = tmp_path / field
        shutil.copytree(tmp_path / "done", run)
        _rewind_checkpoint(run, 8)
        (run / "summary.json").unlink()
        config = json.loads((run / "config.json").read_text())
        config["train"][field] = value
        (run / "config.json").write_text(json.dumps(config))
        before = {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()}
        with pytest.raises(NopeInterpError, match=match):
            train(model_cfg, cfg.replace(**{field: value}), run, resume=True, progress=False)
        assert {f.name: f.read_bytes() for f in run.iterdir() if f.is_file()} == before
    # without a stamp to tell (weights written before stamps), the step past the schedule still is refused
    run = tmp_path / "unstamped"
    shutil.copytree(tmp_path / "steps", run)
    (run / "model.safetensors").unlink()
    with pytest.raises(NopeInterpError, match="checkpoint of .* is at step 8, past the 6-step schedule"):
        train(model_cfg, cfg.replace(steps=6), run, resume=True, progress=False)


def test_resume_of_a_run_with_a_corrupt_summary_names_the_summary_whatever_the_settings(tiny_train, tmp_path):
    """From a review: a finished run whose summary.json is corrupt, resumed with other settings, was told
    'settings differ ... rerun its own command', which then failed on the corrupt summary."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = tiny_train
    cfg = cfg.replace(steps=4)
    train(model_cfg, cfg, tmp_path / "r", progress=False)
    (tmp_path / "r" / "summary.json").write_text("{bad")
    for given in (cfg, cfg.replace(steps=9), cfg.replace(lr=0.5)):
        with pytest.raises(NopeInterpError, match="summary.json"):
            train(model_cfg, given, tmp_path / "r", resume=True, progress=False)
