"""Character-level language models on Shakespeare: bits per character, training, resume, twins, bad input."""

import csv
import json
import math

import pytest
import torch
from conftest import assert_strict_json_files

TINY = ["--preset", "tiny", "--steps", "8", "--batch-size", "4", "--window", "24", "--eval-every", "4",
        "--eval-windows", "6", "--checkpoint-every", "4", "--warmup-steps", "2", "--no-progress"]


def _train(root, name, *extra):
    from nope_interp.cli import main

    assert main(["train-text", *TINY, "--runs-dir", str(root), "--name", name, *extra]) == 0
    return root / name


def test_bits_per_char_is_the_mean_cross_entropy_in_bits(gen):
    """Against a per-position loop in float64, and the closed form log2(96) for a model with zero logits."""
    from nope_interp.config import preset
    from nope_interp.model import build_model
    from nope_interp.text_train import bits_per_char, eval_tokens

    model = build_model(preset("tiny", n_ctx=24))
    windows = eval_tokens(5, 20)
    assert windows.shape == (5, 21)
    got = bits_per_char(model, windows, batch_size=2)
    ref, count = 0.0, 0
    with torch.no_grad():
        for row in windows:
            logits = model(row[None, :-1])[0].double()
            for pos in range(20):
                ref -= torch.log_softmax(logits[pos], -1)[row[pos + 1]].item() / math.log(2)
                count += 1
    assert got == pytest.approx(ref / count, rel=1e-6)
    with torch.no_grad():
        model.unembed.W_U.zero_()
        model.unembed.b_U.zero_()
    assert bits_per_char(model, windows) == pytest.approx(math.log2(96), abs=1e-9)


def test_nope_run_writes_a_run_with_bits_per_char_at_1x_and_2x(tmp_path):
    run = _train(tmp_path, "nope")
    assert_strict_json_files(run)
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert summary["positional"] == "none" and summary["steps"] == 8 and summary["window"] == 24
    assert 0 < summary["bpc_1x"] < 7 and 0 < summary["bpc_2x"] < 7
    assert config["model"]["n_ctx"] == 48  # 2x the window by default
    assert config["data"]["held_out"] and config["text_train"]["window"] == 24
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 8]
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[0] == "step_000000.safetensors"
    from nope_interp.text_train import bits_per_char, eval_tokens, load_text_run

    model, model_cfg, cfg = load_text_run(run)
    assert model_cfg.positional == "none" and cfg.steps == 8
    assert bits_per_char(model, eval_tokens(6, 24)) == pytest.approx(summary["bpc_1x"], rel=1e-9)


def test_resume_continues_from_the_checkpoint_exactly(tmp_path):
    """Train 8 steps; rewind the checkpoint to step 4 (as a killed run leaves it); resume; same weights."""
    import nope_interp.text_train as tt
    from nope_interp.cli import main
    from nope_interp.config import ModelConfig, TextTrainConfig, preset
    from nope_interp.io import load_weights

    straight = _train(tmp_path, "straight")
    cfg_json = json.loads((straight / "config.json").read_text())
    model_cfg, cfg = ModelConfig.from_dict(cfg_json["model"]), TextTrainConfig.from_dict(cfg_json["text_train"])
    assert model_cfg == preset("tiny", n_ctx=48)
    half = tmp_path / "half"

    # a 4-step run of the same schedule cannot be made by changing steps (the cosine decay would differ):
    # kill the 8-step run at its step-8 evaluation, before its last checkpoint: step 4's is on disk
    class Stop(Exception):
        pass

    real = tt.io.append_jsonl

    def stop_at_the_last_eval(path, record):
        real(path, record)
        if record["step"] == 8:
            raise Stop

    tt.io.append_jsonl = stop_at_the_last_eval
    try:
        with pytest.raises(Stop):
            tt.train_text(model_cfg, cfg, half, progress=False, device="cpu")
    finally:
        tt.io.append_jsonl = real
    assert not (half / "summary.json").exists() and torch.load(half / "checkpoint.pt")["step"] == 4
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "half", "--resume"]) == 0
    a, b = load_weights(straight / "model.safetensors"), load_weights(half / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_twins_train_and_report_2x(tmp_path, positional):
    run = _train(tmp_path, positional, "--model-positional", positional)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["positional"] == positional and 0 < summary["bpc_1x"] < 7
    assert summary["bpc_2x"] is not None  # n_ctx defaults to 2x the window, so learned positions exist there
    short = _train(tmp_path, positional + "-short", "--model-positional", positional, "--model-n-ctx", "24")
    s2 = json.loads((short / "summary.json").read_text())
    if positional == "learned":
        assert s2["bpc_2x"] is None and "n_ctx 24 < 48" in s2["bpc_2x_missing"]
    else:
        assert s2["bpc_2x"] is not None


@pytest.mark.parametrize("extra,match", [
    (["--window", "100", "--model-n-ctx", "64"], "window 100 exceeds the model's n_ctx 64"),
    (["--window", "1"], "window"),
    (["--eval-windows", "0"], "--eval-windows must be"),
    (["--lr", "nan"], "lr"),
    (["--name", "../x"], "name"),
    (["--name", ""], "--name"),                 # before: trained into the default run name
    (["--model-attention", "bidirectional"], "bidirectional cannot be trained"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, extra, match):
    from nope_interp.cli import main

    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path / "runs"), "--name", "r", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs" / "r").exists()


def test_resume_with_other_settings_or_a_task_run_is_refused(tmp_path, capsys, tiny_run):
    from nope_interp.cli import main

    _train(tmp_path, "r")
    summary = (tmp_path / "r" / "summary.json").read_bytes()
    # finished: refused as finished whatever the settings (before: "settings differ ... rerun its own command
    # --resume", which was then refused as finished)
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "r", "--resume", "--lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a finished run: it trained its whole schedule (8)" in err and "settings differ" not in err, err
    (tmp_path / "r" / "summary.json").unlink()  # stopped at its last step before scoring: it can resume
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "r", "--resume", "--lr", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "settings differ" in err and len(err.strip().splitlines()) == 1
    # the way to resume it: the run's own recorded command, with --resume
    stored = json.loads((tmp_path / "r" / "config.json").read_text())["command"]
    assert err.strip().endswith(f"to resume it, rerun its own command: {stored} --resume"), err
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "r", "--resume", "--model-seed", "7"]) == 2
    assert "model.seed (stored 0, given 7)" in capsys.readouterr().err   # before: hidden behind the training seed
    # --window sets model.n_ctx (2 x the window): before, the message named model.n_ctx, which the user never set
    window_32 = [*TINY[:TINY.index("--window")], "--window", "32", *TINY[TINY.index("--window") + 2:]]
    assert main(["train-text", *window_32, "--runs-dir", str(tmp_path), "--name", "r", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "model.n_ctx (stored 48, given 64: it follows --window, 2 x the window), train.window (stored 24, " \
           "given 32: give --window 24)" in err, err
    assert err.count("model.n_ctx (stored") == 1, err  # listed once, saying that it follows --window
    (tmp_path / "r" / "summary.json").write_bytes(summary)
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "r"]) == 2
    err = capsys.readouterr().err  # finished: before, "use --resume", which then refused it
    assert "holds a finished run: it trained its whole schedule (8) at step 8" in err and "use --resume" not in err
    assert "(--resume refuses it)" in err and "another --name" in err and "--finalize" not in err, err
    before = {f: f.read_bytes() for f in (tmp_path / "r").rglob("*") if f.is_file()}
    assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "r", "--resume"]) == 2  # finished
    err = capsys.readouterr().err.strip()
    assert "holds a finished run: it trained its whole schedule" in err and len(err.splitlines()) == 1, err
    assert {f: f.read_bytes() for f in (tmp_path / "r").rglob("*") if f.is_file()} == before
    from nope_interp.errors import NopeInterpError
    from nope_interp.text_train import load_text_run

    # before: a task run was called corrupt ("the entry 'text_train' is missing"), and a text run likewise
    with pytest.raises(NopeInterpError, match="is a task run \\(nope-interp train\\), not a language model run"):
        load_text_run(tiny_run)
    assert main(["train-text", *TINY, "--runs-dir", str(tiny_run.parent), "--name", tiny_run.name, "--resume"]) == 2
    assert "is a task run (nope-interp train)" in capsys.readouterr().err
    from nope_interp.pretrained import load_run

    with pytest.raises(NopeInterpError, match="is a language model run \\(nope-interp train-text\\), not a task"):
        load_run(tmp_path / "r")


def test_a_resume_with_another_context_lists_the_settings_in_python(tmp_path):
    """Python's train_text never sets n_ctx from the window (only the CLI does, to 2 x --window): the message lists
    the differing settings and names no flag and no 2 x rule (before: "give --window 24; model.n_ctx follows it, 2 x
    the window"). The CLI's notes: tests/test_error_names.py."""
    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import preset
    from nope_interp.text_train import check_same_text_settings

    cfg = TextTrainConfig(window=24)
    stored = preset("tiny", n_ctx=60)
    for old_model, old_cfg, model_cfg, new_cfg, words in (
            (stored, cfg, preset("tiny", n_ctx=48), cfg, "model.n_ctx (stored 60, given 48)"),
            (stored, cfg, preset("tiny", n_ctx=50), cfg, "model.n_ctx (stored 60, given 50)"),
            (preset("tiny", n_ctx=48), cfg, preset("tiny", n_ctx=64), cfg.replace(window=32),
             "model.n_ctx (stored 48, given 64), train.window (stored 24, given 32)")):
        with pytest.raises(NopeInterpError) as info:
            check_same_text_settings(old_model, old_cfg, model_cfg, new_cfg, tmp_path)
        message = str(info.value)
        assert message.endswith(words) and "--" not in message and "2 x" not in message, message
    check_same_text_settings(stored, cfg, stored, cfg, tmp_path)  # the same settings pass


def test_long_context_takes_text_runs_and_other_jobs_refuse_them(tmp_path, capsys):
    from nope_interp.cli import main

    nope = _train(tmp_path, "nope")
    rotary = _train(tmp_path, "rot", "--model-positional", "rotary")
    out = tmp_path / "out"
    argv = ["long-context", "--run", str(nope), str(rotary), "--lengths", "16", "60", "--inputs", "text", "task",
            "--n-sequences", "2", "--max-lag", "4", "--out-root", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "nope: no task inputs (nope is a train-text language model, with no task" in printed.out + printed.err
    rows = json.loads((out / "results" / "long_context" / "long_context.json").read_text())["rows"]
    assert {(r["model"], r["n"]) for r in rows} == {(m, n) for m in ("nope", "rot") for n in (16, 60)}
    assert all(r["input"] == "text" for r in rows)  # task inputs skipped; 60 > the window (24): past the context
    capsys.readouterr()
    # task inputs that no model reads: the flag on the command line (the argument's name in Python)
    assert main(["long-context", "--run", str(nope), "--inputs", "task", "--lengths", "16", "--n-sequences", "2",
                 "--max-lag", "4", "--out-root", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith("--inputs task: no model here reads them (nope is a train-text "
                                                    "language model, with no task; it reads text and random); inputs "
                                                    "the models read: random, text")
    assert main(["trajectory", "--run", str(nope), "--out-root", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "train-text language model works with long-context, analyze, ablate and probe" in err
    assert len(err.splitlines()) == 1
    # analyze reads held-out text windows of the training length (24 here), task text-nope
    assert main(["analyze", "--run", str(nope), "--n-prompts", "3", "--out-root", str(out)]) == 0
    scores = json.loads((out / "results" / "analyze" / "nope" / "scores.json").read_text())
    assert scores["task"] == "text-nope" and scores["protocol"] == "text" and len(scores["example_prompt"]) == 24
    assert scores["layer_types"] == ["nope", "nope"]


def test_sizes_that_cannot_fit_are_refused_before_any_work(tmp_path, capsys):
    from nope_interp.cli import main

    for extra in (["--batch-size", "10000000"], ["--eval-windows", "100000000"]):
        assert main(["train-text", *TINY, "--runs-dir", str(tmp_path), "--name", "big", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "needs about" in err and "is free" in err, err
        assert len(err.splitlines()) == 1 and not (tmp_path / "big").exists()


@pytest.mark.slow  # 14 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_sigterm_before_the_first_checkpoint_leaves_no_half_made_run(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "nope_interp.cli", "train-text", "--preset", "tiny", "--steps", "100000",
           "--batch-size", "2", "--window", "16", "--checkpoint-every", "100000", "--eval-every", "100000",
           "--no-progress", "--runs-dir", str(tmp_path), "--name", "killed"]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "killed"
    deadline = time.time() + 300
    while not (run / "config.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(2)  # training, before any checkpoint
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert not run.exists() or not any(run.iterdir())  # a rerun is not refused as "not empty"
    err = proc.stderr.read().strip().splitlines()  # one line says so (it exited silently)
    assert err[-1].startswith("nope-interp: terminated (SIGTERM) (train-text); what finished is kept"), err


def test_ablate_and_probe_take_text_runs_with_next_character_accuracy(tmp_path, capsys):
    """ablate on a text model measures next-character accuracy and loss on held-out windows of its training
    length: checked against a naive per-position loop and bits_per_char; the twins are summarised apart;
    probe runs on the same windows with its noise control at that length."""
    from nope_interp.cli import main
    from nope_interp.text_train import bits_per_char, eval_tokens, load_text_run

    nope = _train(tmp_path, "nope")
    learned = _train(tmp_path, "learned", "--model-positional", "learned")
    out = tmp_path / "out"
    assert main(["ablate", "--run", str(nope), str(learned), "--n-eval", "6", "--n-mu", "12", "--n-analysis", "4",
                 "--ranks", "0", "1", "--n-random", "1", "--layers", "1", "--out-root", str(out)]) == 0
    data = json.loads((out / "results" / "ablate" / "ablate.json").read_text())
    assert [r["task"] for r in data["results"]] == ["text-nope", "text-learned"]
    assert sorted(data["seed_summary"]) == ["text-learned", "text-nope"]  # twins are not seeds of each other
    md = (out / "results" / "ablate" / "ablate_seeds.md").read_text()
    assert "clean next-character accuracy" in md
    with (out / "results" / "ablate" / "ablate.csv").open() as f:
        csv_runs = {row["task"]: row["run"] for row in csv.DictReader(f)}
    assert csv_runs == {"text-nope": str(nope), "text-learned": str(learned)}
    for r, run in zip(data["results"], (nope, learned), strict=True):
        assert r["metric"] == "next_char_accuracy" and r["n_eval"] == 6 and r["n_mu"] == 12
        assert r["run"] == str(run)  # the text run's directory, as for a task run
        model, _, cfg = load_text_run(run)
        windows = eval_tokens(6, cfg.window)
        correct = 0
        with torch.no_grad():
            for row in windows:
                logits = model(row[None, :-1])[0]
                correct += sum(int(logits[p].argmax()) == int(row[p + 1]) for p in range(cfg.window))
        assert r["clean"]["exact_match"] == pytest.approx(correct / (6 * cfg.window), abs=1e-12)
        assert r["clean"]["answer_loss"] / math.log(2) == pytest.approx(bits_per_char(model, windows), rel=1e-9)
        curve = {p["rank"]: p for p in r["rank_curve"]["points"]}
        assert curve[0]["positional"] == r["clean"]["exact_match"]  # removing nothing changes nothing
        ablated = r["sites"]["blocks.1.hook_resid_pre"]
        assert ablated["mean_positional"]["answer_loss"] != pytest.approx(r["clean"]["answer_loss"], rel=1e-6)
        assert set(r["sites"]["blocks.1.hook_resid_pre"]) == {"shuffle_positional", "mean_positional", "project_out",
                                                                "project_out_random", "shuffle_vectors", "swap_prompts",
                                                                "mean_positional_random", "project_out_content"}
    capsys.readouterr()
    assert main(["probe", "--run", str(nope), "--n-prompts", "8", "--quick", "--features", "cos_profile", "norm",
                 "--out-root", str(out)]) == 0
    probe = json.loads((out / "results" / "probe" / "probe.json").read_text())
    assert {r["task"] for r in probe["rows"]} == {"text-nope"}
    assert {r["inputs"] for r in probe["rows"]} == {"text"}  # held-out text windows, not the config's 'full'
    assert [(m["inputs"], m["task_params"], m["source"]["model_source"]) for m in probe["models"]] == [
        ("text", {}, str(nope))]
    assert {r["task"] for r in probe["noise_control"]["rows"]} == {"text-nope"}


def test_ship_text_copies_a_finished_run_and_shipped_text_models_reproduce_their_summary(tmp_path, monkeypatch,
                                                                                          tiny_run):
    import nope_interp.text_train as tt
    from nope_interp import io
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import stored_dtype

    shipped = tt.available_text_models()  # the real ones, checked below
    run = _train(tmp_path, "nope")
    monkeypatch.setattr(tt, "TEXT_DIR", tmp_path / "text")
    dest = tt.ship_text(run)
    assert dest == tmp_path / "text" / "nope" and tt.available_text_models() == [dest]
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "metrics.jsonl", "model.safetensors",
                                                      "summary.json"]
    # shipping again replaces the folder whole (before: copied over it file by file, so an old file stayed
    # and a missing one failed part-way with a raw FileNotFoundError after the others were replaced)
    (dest / "stale.txt").write_text("from an older model")
    before = (dest / "model.safetensors").read_bytes()
    assert tt.ship_text(run) == dest and not (dest / "stale.txt").exists()
    (run / "metrics.jsonl").rename(run / "metrics.moved")
    (dest / "stale.txt").write_text("kept: the refused ship changes nothing")
    with pytest.raises(NopeInterpError, match=r"lacks metrics\.jsonl: a shipped model needs all of"):
        tt.ship_text(run)
    assert (dest / "stale.txt").exists() and (dest / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["nope"]  # no staging folder left beside it
    (run / "metrics.moved").rename(run / "metrics.jsonl")
    (run / "summary.json").unlink()
    with pytest.raises(NopeInterpError, match="has not finished"):
        tt.ship_text(run, "other")
    with pytest.raises(NopeInterpError, match="name"):
        tt.ship_text(dest, "../x")
    with pytest.raises(NopeInterpError, match="is a task run"):
        tt.ship_text(tiny_run)
    for path in shipped:  # each shipped text model: its weights give its recorded held-out bits per character
        model, model_cfg, cfg = tt.load_text_run(path)
        summary = json.loads((path / "summary.json").read_text())
        assert (path / "model.safetensors").stat().st_size <= 10 * 2**20
        got = tt.bits_per_char(model, tt.eval_tokens(cfg.eval_windows, cfg.window))
        if stored_dtype(io.load_weights(path / "model.safetensors")) == "float16":
            # summary.json was written from the float32 weights; rounding them to float16 moved bits per
            # character by less than 1e-4 (docs/measured/half_precision/text.md)
            assert got == pytest.approx(summary["bpc_1x"], abs=2e-4)
        else:
            assert got == pytest.approx(summary["bpc_1x"], rel=1e-6)
        assert json.loads((path / "config.json").read_text())["command"].startswith("nope-interp train-text")


@pytest.mark.parametrize(("kw", "label"), [
    ({}, "nope"), ({"positional": "learned"}, "learned"), ({"positional": "rotary"}, "rotary"),
    ({"positional": "rotary", "nope_layers": (1,)}, "rotary-nope1"),
    ({"positional": "rotary", "nope_layers": (0, 1)}, "rotary-nope0-1")])
def test_a_hybrid_is_never_filed_as_its_rotary_twin(kw, label):
    """The task name of a text model's result rows (so ablate's seed summaries), from the positional scheme,
    hybrid layers included; different schemes never share a name."""
    import tasks
    from nope_interp.config import preset
    from nope_interp.jobs.common import ModelEntry, text_task_name
    from nope_interp.model import build_model

    cfg = preset("tiny", **kw)
    assert cfg.positional_label == label
    entry = ModelEntry(label="m", kind="text", model=build_model(cfg), model_cfg=cfg, task=tasks.get_task("reversal"))
    assert text_task_name(entry) == f"text-{label}"


def test_train_text_default_names_keep_a_hybrid_apart_from_its_rotary_twin(tmp_path):
    from nope_interp.cli import main

    for extra in (["--model-positional", "rotary"], ["--model-positional", "rotary", "--model-nope-layers", "1"]):
        assert main(["train-text", *TINY, "--steps", "2", "--runs-dir", str(tmp_path), *extra]) == 0
    runs = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))  # not the lock files
    assert runs == ["text-rotary-nope1-tiny-s0", "text-rotary-tiny-s0"]
    summary = json.loads((tmp_path / "text-rotary-nope1-tiny-s0" / "summary.json").read_text())
    assert summary["nope_layers"] == [1]


def test_a_run_stopped_before_its_first_evaluation_resumes(tmp_path):
    """A checkpoint written before the first evaluation (checkpoint every 2 steps, evaluation every 4), then a
    stop: the run resumes to the end (before: refused, "metrics.jsonl is missing", since the history file was
    first written at the first evaluation)."""
    import nope_interp.text_train as tt
    from nope_interp.config import ModelConfig, TextTrainConfig

    cfg_json = json.loads((_train(tmp_path, "ref") / "config.json").read_text())
    model_cfg = ModelConfig.from_dict(cfg_json["model"])
    cfg = TextTrainConfig.from_dict(cfg_json["text_train"]).replace(steps=8, checkpoint_every=2, eval_every=4)

    class Stop(Exception):
        pass

    real = tt.bits_per_char

    def stop(*args, **kwargs):
        raise Stop

    tt.bits_per_char = stop
    try:
        with pytest.raises(Stop):
            tt.train_text(model_cfg, cfg, tmp_path / "r", progress=False, device="cpu")
    finally:
        tt.bits_per_char = real
    assert torch.load(tmp_path / "r" / "checkpoint.pt")["step"] == 2
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == ""
    tt.train_text(model_cfg, cfg, tmp_path / "r", resume=True, progress=False, device="cpu")
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 8] and (tmp_path / "r" / "summary.json").exists()


def test_halve_stores_a_text_run_at_float16_and_its_bits_per_char_barely_move(tmp_path):
    """Before: halve refused every train-text run ("a language model run, not a task run")."""
    import nope_interp.text_train as tt
    from nope_interp import io
    from nope_interp.pretrained import halve, stored_dtype

    run = _train(tmp_path, "nope")
    weights = run / "model.safetensors"
    model, _, cfg = tt.load_text_run(run)
    windows = tt.eval_tokens(cfg.eval_windows, cfg.window)
    before, size = tt.bits_per_char(model, windows), weights.stat().st_size
    state32 = io.load_weights(weights)
    assert halve(run) == weights
    state16 = io.load_weights(weights)
    assert stored_dtype(state32) == "float32" and stored_dtype(state16) == "float16"
    assert weights.stat().st_size < 0.6 * size
    for name, value in state32.items():  # each weight is its float32 value rounded to float16
        assert torch.equal(state16[name], value.to(torch.float16)), name
    model16, _, _ = tt.load_text_run(run)  # the stamp survives; the model computes in float32
    assert next(model16.parameters()).dtype == torch.float32
    assert tt.bits_per_char(model16, windows) == pytest.approx(before, abs=1e-3)
    assert tt.bits_per_char(model16, windows) != before  # the rounding is real
    bytes16 = weights.read_bytes()
    halve(run)  # already half: left as it is
    assert weights.read_bytes() == bytes16


def test_halve_names_a_missing_run_directory(tmp_path):
    """Before the check: halve of a missing folder said 'run config not found: .../config.json'."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import halve

    (tmp_path / "a_file").write_text("x")
    for missing in (tmp_path / "nonexistent", tmp_path / "a_file"):
        with pytest.raises(NopeInterpError, match=f"^run directory not found: {missing}$"):
            halve(missing)
