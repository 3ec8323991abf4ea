import json
import math
import re
import subprocess
import sys

import pytest


@pytest.fixture
def main():
    from nope_interp.cli import main

    return main


def _files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_train_without_the_bar_prints_one_line_per_evaluation(main, tmp_path, capsys):
    """--no-progress: a background run still says how it goes, one line per evaluation, with the numbers of
    metrics.jsonl (eval_answer_loss included)."""
    argv = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16",
            "--steps", "6", "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3",
            "--eval-n", "10", "--warmup-steps", "2", "--runs-dir", str(tmp_path), "--name", "p", "--no-progress"]
    assert main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    rows = [json.loads(ln) for ln in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(rows) == 2
    for line, row in zip(lines, rows, strict=True):
        assert line.startswith(f"step {row['step']}/6: loss {row['loss']:.4f}, eval exact match {row['eval_acc']:.3f}")
        assert f"answer loss {row['eval_answer_loss']:.3f} nats" in line


@pytest.mark.parametrize("terminal", [False, True])
def test_train_draws_its_bar_only_on_a_terminal(main, tmp_path, capsys, monkeypatch, terminal):
    """Before: without --no-progress, a training redirected to a log file (``nohup ... > log 2>&1``) wrote the
    bar's carriage-return redraws and no evaluation lines; now off a terminal it prints one line per
    evaluation, as --no-progress does, and on a terminal it draws the bar."""
    from nope_interp.jobs import common

    monkeypatch.setattr(common, "stderr_is_terminal", lambda: terminal)
    argv = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16",
            "--steps", "6", "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3",
            "--eval-n", "10", "--warmup-steps", "2", "--runs-dir", str(tmp_path), "--name", "p"]
    assert main(argv) == 0
    out = capsys.readouterr()
    lines = [ln for ln in out.out.splitlines() if ln.startswith("step ")]
    assert len(lines) == (0 if terminal else 2)
    assert ("train addition" in out.err) is terminal  # the bar's description


def test_train_writes_the_run_and_records_the_command(tiny_run):
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["command"].startswith("nope-interp train --task addition --n-digits 2 --preset tiny")
    assert config["model"]["n_layers"] == 2 and config["train"]["steps"] == 6
    assert (tiny_run / "summary.json").exists() and (tiny_run / "model.safetensors").exists()


def test_analyze_a_run_and_an_initialised_model(main, tiny_run, tmp_path, capsys):
    assert main(["analyze", "--run", str(tiny_run), "--n-prompts", "8", "--out-root", str(tmp_path)]) == 0
    scores = json.loads((tmp_path / "results" / "analyze" / "t" / "scores.json").read_text())
    assert scores["task"] == "addition" and scores["n_prompts"] == 8
    assert set(scores["scores"]["row_mean"]) == set(scores["sites"])
    assert main(["analyze", "--init", "--task", "indexing", "--preset", "tiny", "--n-prompts", "8",
                 "--out-root", str(tmp_path)]) == 0
    figs = tmp_path / "figures" / "analyze" / "init-tiny-indexing"
    assert sorted(p.name for p in figs.iterdir()) == ["adjacency.html", "cosine.html", "lag_profile.html",
                                                      "plotly.min.js"]
    out = capsys.readouterr().out
    assert "blocks.0.attn.hook_z" in out and "outputs:" in out and "cosine.html" in out
    # a hybrid RoPE/NoPE model from the command line: a tuple override makes a safe label
    assert main(["analyze", "--init", "--task", "reversal", "--preset", "tiny", "--model-positional", "rotary",
                 "--model-nope-layers", "1", "--n-prompts", "4", "--out-root", str(tmp_path)]) == 0
    assert (tmp_path / "results" / "analyze" / "init-tiny-reversal-nope_layers1-positionalrotary").is_dir()


def test_demo_on_one_task(main, tmp_path):
    status = main(["demo", "--tasks", "reversal", "--n-prompts", "16", "--eval-n", "50", "--init-preset", "tiny",
                   "--out-root", str(tmp_path)])
    assert status == 0
    summary = json.loads((tmp_path / "results" / "demo" / "summary.json").read_text())
    assert list(summary["tasks"]) == ["reversal"]
    assert 0 <= summary["tasks"]["reversal"]["test_acc_remeasured"] <= 1
    md = (tmp_path / "results" / "demo" / "summary.md").read_text()
    assert "| reversal |" in md and "about 0.5 (chance)" in md
    names = {p.name for p in (tmp_path / "figures" / "demo").iterdir()}
    assert {"adjacency_by_layer.html", "cosine_reversal_initialised.html", "cosine_reversal_trained.html"} <= names


BAD = [
    (["train", "--task", "sorting"], "unknown task 'sorting'; available tasks: addition, reversal, indexing, ordering"),
    (["train", "--task", "addition", "--preset", "huge"],
     "unknown preset 'huge'; available presets: paper, paper-recipe, cpu, tiny"),
    (["train", "--task", "reversal", "--preset", "tiny", "--model-n-ctx", "20"],
     "--model-n-ctx=20 is too small for task 'reversal': its examples need 39 positions"),
    (["train", "--task", "addition", "--model-d-model", "-5"],
     "--model-d-model must be an integer in [1, 1000000], got -5"),
    (["train", "--task", "addition", "--steps", "0"], "steps must be an integer in [1, 1000000000], got 0"),
    (["train", "--task", "addition", "--n-digits", "0"], "--n-digits must be an integer in [1, 18]"),
    (["analyze", "--init", "--task", "addition", "--preset", "tiny", "--points", "resid_final"],
     "error: --points: unknown activation point 'resid_final'; allowed: embed, resid_pre, z, resid_mid, resid_post"),
    (["analyze", "--run", "{tmp}/missing"], "/missing: no such folder"),
    (["analyze", "--run", "{tmp}"], "is not a run folder: it has no config.json"),
    (["analyze", "--run", "{tmp}/afile"], "/afile is a file, not a run folder"),
    (["analyze", "--run", "a" * 300], "cannot be read: File name too long"),  # was "no such folder"
    (["compare", "--label", "mine_l0_z"], "--label must not end in _l0_z"),
    (["analyze", "--pretrained", "sorting"],
     "error: --pretrained: unknown task 'sorting'; allowed: addition, reversal, indexing, ordering"),
    (["analyze", "--init", "--task", "sortng"], "error: --task: unknown task 'sortng'; allowed: addition,"),
    (["ablate", "--pretrained", "reversal", "--kinds", "shuffle_positionl"],
     "error: --kinds: unknown ablation 'shuffle_positionl'; allowed: shuffle_positional,"),
    (["ablate", "--pretrained", "reversal", "--layers", "9"], "error: --layers lists 9, outside a model of n_layers=3"),
    (["probe", "--pretrained", "reversal", "--sites", "blocks.9.hook_resid_post"],
     "error: --sites: unknown site(s) ['blocks.9.hook_resid_post']; allowed: hook_embed,"),
    (["compare", "--protocols", "full", "padded"], "error: --protocols: unknown protocol 'padded'; allowed: full,"),
    (["analyze", "--init", "--task", "reversal", "--preset", "tiny", "--model-n-ctx", "10"],
     "--model-n-ctx=10 is too small for 'reversal' full inputs of 22 tokens"),
    (["demo", "--tasks", "sorting"], "error: --tasks: unknown task 'sorting'"),
    (["demo", "--init-preset", "huge"], "--init-preset must be one of paper, paper-recipe, cpu, tiny, got 'huge'"),
    (["train", "--task", "addition", "--objective", "every_token"], "objective must be one of answer_only, packed"),
    (["train", "--task", "addition", "--lr", "nan"], "lr must be a finite number"),
    (["train", "--task", "addition", "--model-dropout", "1.0"], "dropout must be a finite number in [0.0, 1.0)"),
    (["train", "--task", "addition", "--model-nope-layers", "1"],
     "--model-nope-layers needs --model-positional=rotary (a hybrid of RoPE and NoPE layers), got "
     "--model-positional=none"),
    # a config's message names the flags of every setting it quotes (before: --model-window 8 said "window must be
    # None (null) unless attention='sliding'", and --model-attention sliding alone named no flag at all)
    (["train", "--task", "addition", "--model-window", "8"],
     "error: --model-window needs --model-attention=sliding (it is the sliding window's width), got --model-window=8 "
     "with --model-attention=causal"),
    (["train", "--task", "addition", "--model-attention", "sliding"],
     "error: --model-window must be an integer >= 1 (keys per query, itself included) with --model-attention=sliding, "
     "got None"),
    (["analyze", "--init", "--task", "reversal", "--preset", "tiny", "--model-attention", "sliding"],
     "error: --model-window must be an integer >= 1"),
    (["train", "--task", "addition", "--model-n-heads", "3"],
     "error: --model-d-model=128 must equal --model-n-heads=3 times --model-d-head=32 (96)"),
    (["analyze", "--init", "--task", "reversal", "--preset", "tiny", "--model-positional", "rotary",
      "--model-nope-layers", "1", "0"], "--model-nope-layers must be strictly increasing, got [1, 0]"),
    (["train", "--task", "addition", "--model-positional", "rotary", "--model-nope-layers", "3"],
     "--model-nope-layers must be an integer in [0, 2], got 3"),
    (["train", "--task", "addition", "--preset", "tiny", "--objective", "packed", "--window", "100"],
     "--window=100 is longer than the model's n_ctx=48"),
    (["train", "--task", "addition", "--preset", "tiny", "--window", "64"],
     "--window=64 is only used with --objective packed; here it would be ignored"),
    (["trajectory", "--run", "runs/x", "--window", "32"], "--window=32 is only used with --protocol window"),
    (["analyze", "--init", "--task", "addition", "--protocol", "padded"],
     "protocol must be one of full, authors, window"),
    (["trajectory", "--pretrained", "reversal"], "unrecognized arguments: --pretrained reversal"),
    # usage errors: one line (no usage block), the flag named, exit status 2
    (["train", "--task", "addition", "--steps", "abc"],
     "argument --steps: must be an integer written with the digits 0-9, got 'abc'"),
    (["train", "--task", "addition", "--lr", "fast"], "argument --lr: must be a number written with the digits 0-9"),
    (["analyze", "--init", "--task", "addition", "--n-prompts", "2.5"], "argument --n-prompts: must be an integer"),
    (["train", "--task", "addition", "--bogus"], "unrecognized arguments: --bogus"),
    (["train", "--task"], "argument --task: expected one argument"),
    (["analyze", "--points"], "argument --points: expected at least one argument"),
    # digits that Python's int() and float() read but the vocabulary does not hold
    (["train", "--task", "addition", "--steps", "\u0661\u0660\u0660"],
     "argument --steps: must be an integer written with the digits 0-9, got '\u0661\u0660\u0660'"),
    (["train", "--task", "addition", "--n-digits", "\uff13"], "argument --n-digits: must be an integer"),
    (["train", "--task", "addition", "--batch-size", "1_0"], "argument --batch-size: must be an integer"),
    (["train", "--task", "addition", "--lr", "1e-\u0663"], "argument --lr: must be a number"),
    (["train", "--task", "addition", "--model-init-std", "0.0\u0968"], "argument --model-init-std: must be a number"),
    (["analyze", "--init", "--task", "addition", "--n-prompts", "\u0968"], "argument --n-prompts: must be an integer"),
    (["init-grid", "--means", "0", "\u0664"], "argument --means: must be a number"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a[:3]) + "|" + m[:20] for a, m in BAD])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, argv, message):
    if any("{tmp}/afile" in a for a in argv):
        (tmp_path / "afile").write_text("not a run")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] in ("train", "train-text"):
        argv += ["--runs-dir", str(tmp_path / "runs"), "--no-progress"]
    else:
        argv += ["--out-root", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("nope-interp: error: ") and message in err
    assert _files(tmp_path / "runs") == [] and _files(tmp_path / "out") == []


def test_corrupt_run_directories(main, tiny_run, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(tiny_run, bad)
    (bad / "config.json").write_text("{not json")
    assert main(["analyze", "--run", str(bad), "--out-root", str(tmp_path / "o")]) == 2
    assert "run config is corrupt" in capsys.readouterr().err
    shutil.copy(tiny_run / "config.json", bad / "config.json")
    (bad / "model.safetensors").write_bytes(b"\x00garbage")
    assert main(["analyze", "--run", str(bad), "--out-root", str(tmp_path / "o")]) == 2
    assert "weights are corrupt" in capsys.readouterr().err
    (bad / "model.safetensors").unlink()
    assert main(["analyze", "--run", str(bad), "--out-root", str(tmp_path / "o")]) == 2
    assert "weights not found" in capsys.readouterr().err
    assert _files(tmp_path / "o") == []


def test_resume_without_checkpoint_and_nonempty_run_dir(main, tiny_run, tmp_path, capsys):
    base = ["train", "--task", "addition", "--runs-dir", str(tiny_run.parent), "--no-progress"]
    assert main(base + ["--name", "fresh", "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(base + ["--name", "t"]) == 2  # finished: before, "use --resume", which then refused it
    err = capsys.readouterr().err
    assert f"run directory {tiny_run} holds a finished run: it " in err and "use --resume" not in err, err
    assert "another --name" in err and f"rm -r {tiny_run}" in err and len(err.strip().splitlines()) == 1, err
    import shutil

    unfinished = tmp_path / "unfinished"  # stopped while scoring the test set: --resume writes its summary
    shutil.copytree(tiny_run, unfinished)
    (unfinished / "summary.json").unlink()
    assert main([*base[:base.index("--runs-dir")], "--runs-dir", str(tmp_path), "--no-progress", "--name",
                 "unfinished"]) == 2
    assert "not empty; use --resume" in capsys.readouterr().err
    # a run killed before its first checkpoint: a config and nothing to resume; both messages say to remove it
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    (killed / "config.json").write_text((tiny_run / "config.json").read_text())
    base[base.index("--runs-dir") + 1] = str(tmp_path)
    assert main(base + ["--name", "killed", "--resume"]) == 2
    assert f"nothing to resume; remove the folder (rm -r {killed})" in capsys.readouterr().err
    assert main(base + ["--name", "killed"]) == 2
    assert f"holds no checkpoint (a run stopped before its first one): remove it (rm -r {killed})" in \
        capsys.readouterr().err
    # a finished run copied without its checkpoint (candidates and seeds keep weights only): --resume says it is
    # finished and what to do, as without --resume (before: "no checkpoint", as if something were missing)
    copied = tmp_path / "copied"
    shutil.copytree(tiny_run, copied)
    (copied / "checkpoint.pt").unlink()
    for extra in ([], ["--resume"]):
        assert main(base + ["--name", "copied", *extra]) == 2
        err = capsys.readouterr().err
        assert f"run directory {copied} holds a finished run: it " in err and "no checkpoint" not in err, (extra, err)
        assert "another --name" in err and len(err.strip().splitlines()) == 1


def test_empty_folder_paths_and_a_finalize_on_another_task_are_refused(main, tiny_run, tmp_path, capsys,
                                                                      monkeypatch):
    """Before: an empty --out-root or --runs-dir wrote into the current folder; --finalize --task reversal on an
    addition run scored it as addition."""
    monkeypatch.chdir(tmp_path)
    for argv in (["analyze", "--init", "--task", "addition", "--out-root", ""],
                 ["train", "--task", "addition", "--runs-dir", " ", "--steps", "3"],
                 ["sweep", "tiny-init", "--out-dir", ""],
                 ["sweep-report", "tiny-init", "--out-root", ""]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "must be a folder path, got the empty path" in err and err.count("\n") == 0, err
    assert main(["sweep", "tiny-init", "--threads", "1000", "--out-dir", str(tmp_path / "sw")]) == 2
    assert "threads must be an integer in [1, " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main(["train", "--task", "reversal", "--finalize", "--name", tiny_run.name, "--runs-dir",
                 str(tiny_run.parent)]) == 2
    assert "--task reversal but run t was trained on addition" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["analyze", "--init", "--task", "addition", "--text-file", ""], "--text-file"),
    (["analyze", "--run", ""], "--run"),
    (["compare", "--run", "runs/a", " "], "--run"),
    (["ablate", "--run", ""], "--run"),
    (["analyze", "--hf-path", ""], "--hf-path"),
])
def test_an_empty_input_path_is_refused_by_its_flag_not_read_as_the_current_folder(main, tmp_path, capsys,
                                                                                   monkeypatch, argv, flag):
    """Before: --text-file '' opened the current folder ("not a readable UTF-8 text file (IsADirectoryError)"),
    --run '' was refused as "path must be ..." without its flag, and --hf-path '' read as not given ("analyze
    needs one of --run, ...")."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"{flag} must be a non-empty path" in err and err.count("\n") == 0, err
    assert list(tmp_path.iterdir()) == []


def test_console_script_is_installed_and_reports_errors_with_status_2():
    exe = [sys.executable, "-m", "nope_interp.cli"]
    out = subprocess.run(exe + ["train", "--task", "nope"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown task 'nope'" in out.stderr


@pytest.mark.slow  # about 70 s (paper-shape default models); tests/test_jobs_averaging.py and
# tests/test_jobs_init_grid.py run and write both jobs on tiny models in the default run
def test_averaging_and_init_grid_commands(main, tmp_path):
    assert main(["averaging", "--tasks", "reversal", "--n-prompts", "6", "--eval-n", "10",
                 "--out-root", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results" / "averaging" / "averaging.json").read_text())
    entry = res["tasks"]["reversal"]
    assert {"initialised", "bidirectional_control", "trained"} <= set(entry)
    assert set(entry["trained"]["counterfactual"]["conditions"]) == {"clean", "uniform", "identity", "random_matched"}
    assert (tmp_path / "results" / "averaging" / "averaging.csv").read_text().startswith("protocol,task,model,layer")
    assert (tmp_path / "figures" / "averaging" / "counterfactual_attention.html").exists()
    init_fig = (tmp_path / "figures" / "averaging" / "counterfactual_attention_initialised.html").read_text()
    assert "reversal (initialised)" in init_fig and "reversal (bidirectional_control)" in init_fig
    assert main(["init-grid", "--quick", "--seeds", "1", "--n-prompts", "4", "--tasks", "addition",
                 "--out-root", str(tmp_path)]) == 0
    assert (tmp_path / "results" / "init_grid" / "init_grid_summary.csv").exists()
    assert (tmp_path / "figures" / "init_grid" / "entropy_vs_score.html").exists()
    assert main(["init-grid", "--tasks", "sorting", "--out-root", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_probe_command(main, tiny_run, tmp_path):
    assert main(["probe", "--run", str(tiny_run), "--quick", "--n-prompts", "16", "--out-root", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results" / "probe" / "probe.json").read_text())["rows"]
    assert {r["feature"] for r in rows} == {"cos_last", "cos_profile", "variance", "norm", "raw", "variance+norm"}
    assert all(r["probe"] == "ridge" and "shuffled_baseline_nrmse" in r for r in rows)
    assert (tmp_path / "figures" / "probe" / "nrmse_by_site_ridge.html").exists()
    assert main(["probe", "--init", "--task", "addition", "--probes", "forest", "--out-root", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_ablate_command(main, tiny_run, tmp_path):
    argv = ["ablate", "--run", str(tiny_run), "--n-eval", "6", "--n-mu", "16", "--ranks", "0", "2", "--n-random", "2",
            "--kinds", "shuffle_positional", "project_out", "swap_prompts", "--out-root", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())["results"][0]
    assert res["task"] == "addition" and list(res["sites"]) == ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    assert [p["rank"] for p in res["rank_curve"]["points"]] == [0, 2]
    # rank 0 removes nothing: the same accuracy as the clean model
    assert res["rank_curve"]["points"][0]["positional"] == res["clean"]["exact_match"]
    assert (tmp_path / "figures" / "ablate" / "ablations.html").exists()
    dec = res["decomposition"]["blocks.1.hook_resid_pre"]
    assert 0.0 <= dec["positional_variance_fraction"] <= 1.0 and 0.0 <= dec["adjacency_content"] <= 1.0
    assert "adjacency_content" in (tmp_path / "results" / "ablate" / "ablate_decomposition.csv").read_text()
    # one run: no seed figure; a copy of the run beside it counts as two seeds (zero spread) and gets one
    # (the same folder twice is refused: its label would name two result rows)
    assert not (tmp_path / "figures" / "ablate" / "ablations_seeds.html").exists()
    assert main(argv[:2] + [str(tiny_run)] + argv[2:]) == 2
    from conftest import distinct_copy

    # a byte-identical copy is one model twice (refused); a copy with other weights is a second seed
    twin = distinct_copy(tiny_run, tmp_path / f"{tiny_run.name}-copy")
    assert main(argv[:2] + [str(twin)] + argv[2:]) == 0
    summary = json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())["seed_summary"]["addition"]
    assert summary["clean_exact_match"]["n_seeds"] == 2 and summary["clean_exact_match"]["std"] == 0.0
    assert set(summary["decomposition"]["blocks.1.hook_resid_pre"]) == {
        "positional_variance_fraction", "adjacency_full", "adjacency_positional", "adjacency_content"}
    assert (tmp_path / "figures" / "ablate" / "ablations_seeds.html").exists()
    md = (tmp_path / "results" / "ablate" / "ablate_seeds.md").read_text()
    assert "## addition (2 runs" in md and "| blocks.1.hook_resid_pre | " in md and "± 0.000" in md
    clean = f"{res['clean']['exact_match']:.3f}"
    assert md.count(f" | blocks.1.hook_resid_pre | {clean} | ") == 2  # one row per run
    assert f"| {tiny_run.name} | blocks.1.hook_resid_pre" in md and f"| {twin.name} | blocks.1.hook_resid_pre" in md
    assert main(["ablate", "--run", str(tiny_run), "--with-seeds", "--out-root", str(tmp_path / "x")]) == 2
    assert main(["ablate", "--run", str(tiny_run), "--kinds", "zero", "--out-root", str(tmp_path / "x")]) == 2
    assert main(["ablate", "--run", str(tiny_run), "--layers", "7", "--out-root", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_demo_retrain_reruns_the_shipped_recipe(tiny_run, tmp_path, monkeypatch):
    """--retrain trains again with the shipped model's configs (here a tiny model standing in as shipped)."""
    import shutil

    import nope_interp.jobs.demo as demo
    import nope_interp.pretrained as pretrained

    fake = tmp_path / "pretrained" / "addition"
    shutil.copytree(tiny_run, fake)
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path / "pretrained")
    cfg = demo.DemoConfig(tasks=("addition",), n_prompts=8, eval_n=10, retrain=True, runs_dir=str(tmp_path / "runs"),
                          init_preset="tiny", device="cpu")
    result = demo.run(cfg)
    demo.write(result, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "results" / "demo" / "summary.json").read_text())
    retrained = json.loads((tmp_path / "runs" / "addition-retrain" / "config.json").read_text())
    shipped = json.loads((fake / "config.json").read_text())
    assert retrained["model"] == shipped["model"] and retrained["train"] == shipped["train"]
    assert summary["tasks"]["addition"]["model_source"].endswith("addition-retrain")


def test_train_finalize_writes_a_summary(main, tiny_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "stopped"
    shutil.copytree(tiny_run, run)
    (run / "summary.json").unlink()
    assert main(["train", "--task", "addition", "--finalize", "--runs-dir", str(tmp_path), "--name", "stopped"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    assert "test exact match" in capsys.readouterr().out


def test_every_command_prints_its_help_with_percent_signs_as_text(main, capsys):
    """argparse %-formats help texts: a field help such as "missed 99%" must print, not crash --help."""
    from nope_interp.cli import _build_parser

    commands = [a for a in _build_parser()._subparsers._group_actions[0].choices]
    assert {"train", "compare", "length-gen", "ablate"} <= set(commands)
    for command in commands:
        assert main([command, "--help"]) == 0, command
        out = capsys.readouterr().out
        assert "usage" in out and "%%" not in out, command
    assert main(["compare", "--help"]) == 0
    assert "seeds that missed 99%" in " ".join(capsys.readouterr().out.split())


def test_help_and_usage_errors_return_a_status_instead_of_raising(main, capsys):
    assert main(["train", "--help"]) == 0
    assert "--steps" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'no-such-command'" in err and "usage" not in err


def test_ascii_number_parsers():
    import argparse

    from nope_interp.cli import ascii_float, ascii_int

    assert [ascii_int(t) for t in ("0", "12", "-3", "+4", "007")] == [0, 12, -3, 4, 7]
    assert [ascii_float(t) for t in ("0.5", "-2", "1e-4", "3.", ".5", "2E+3")] == [0.5, -2.0, 1e-4, 3.0, 0.5, 2000.0]
    assert math.isnan(ascii_float("nan")) and ascii_float("-inf") == -math.inf  # refused later, by the config
    for bad in ("", " 1", "1 ", "1_0", "\u0661", "\uff11", "\u00b2", "1.0", "0x10", "\U0001d7cf"):
        with pytest.raises(argparse.ArgumentTypeError, match="digits 0-9"):
            ascii_int(bad)
    for bad in ("", "1_0.5", "\u0661.5", "0.\uff15", "one", "1e", "\u0665e3", "--1"):
        with pytest.raises(argparse.ArgumentTypeError, match="digits 0-9"):
            ascii_float(bad)


BAD_VALUES = [
    # non-finite or out-of-range floats
    (["train", "--task", "addition", "--model-init-std", "1e39"], "--model-init-std must be a finite number in (0.0,"),
    (["train", "--task", "addition", "--model-init-mean", "1e300"], "--model-init-mean must be a finite number in [-1"),
    (["train", "--task", "addition", "--model-init-mean=-inf"], "--model-init-mean must be a finite number"),
    (["train", "--task", "addition", "--weight-decay", "nan"], "--weight-decay must be a finite number"),
    (["train", "--task", "addition", "--grad-clip", "nan"], "--grad-clip must be a finite number"),
    (["train", "--task", "addition", "--lr", "1e30"], "lr must be a finite number in (0.0, 10.0], got 1e+30"),
    (["train", "--task", "addition", "--beta2", "1"], "beta2 must be in [0, 1), got 1.0"),
    (["train", "--task", "addition", "--lr", "0.5", "--weight-decay", "3"],
     "--lr=0.5 times --weight-decay=3.0 must be at most 1"),
    (["train", "--task", "addition", "--model-dropout", "nan"], "dropout must be a finite number"),
    (["init-grid", "--stds", "0.02", "1e39"], "stds must be a finite number in (0.0, 1000.0]"),
    (["init-grid", "--means", "nan"], "means must be a finite number"),
    (["analyze", "--init", "--task", "addition", "--model-init-std", "inf"], "--model-init-std must be a finite"),
    # sizes that pass the range checks but cannot fit in memory
    (["train", "--task", "addition", "--model-d-model", "1000000", "--model-n-heads", "1", "--model-d-head", "1000000"],
     "needs about"),
    (["train", "--task", "addition", "--batch-size", "1000000000"], "needs about"),
    (["train", "--task", "reversal", "--n-train", "1000000000"], "needs about"),
    (["train", "--task", "addition", "--n-train", "1000000000"], "only 1000000 distinct prompts"),
    (["analyze", "--init", "--task", "addition", "--model-d-model", "1000000", "--model-n-heads", "1",
      "--model-d-head", "1000000"], "needs about"),
    (["init-grid", "--widths", "240000", "--depths", "6"], "needs about"),
    # names and labels are one safe path component
    (["train", "--task", "addition", "--name", "../../x"], "--name must be one folder name"),
    (["train", "--task", "addition", "--name", "a/b"], "--name must be one folder name"),
    (["train", "--task", "addition", "--name", ".hidden"], "--name must be one folder name"),
    (["train", "--task", "addition", "--finalize", "--name", ".."], "--name must be one folder name"),
    (["train", "--task", "../x", "--finalize"], "run name must be one folder name"),
    (["analyze", "--init", "--task", "addition", "--label", "../../x"], "label must be one folder name"),
    (["analyze", "--init", "--task", "addition", "--label", "a b"], "label must be one folder name"),
    # more threads than cores (100,000 crashed OpenMP with a traceback)
    (["train", "--task", "addition", "--threads", "100000"], "--threads must be an integer in [1, "),
    (["train-text", "--threads", "100000"], "--threads must be an integer in [1, "),
    # settings that would be silently ignored
    (["analyze", "--init", "--task", "addition", "--window", "10"],
     "error: --window=10 is only used with --protocol window"),
    (["demo", "--device", "cpu"], "--device=cpu is only used with --retrain"),
    (["train", "--task", "addition", "--n-test", "5", "--eval-n", "10"], "--eval-n=10 is more than --n-test=5"),
    (["demo", "--runs-dir", "elsewhere"], "--runs-dir=elsewhere is only used with --retrain"),
]


@pytest.mark.parametrize("argv,message", BAD_VALUES, ids=[" ".join(a[:3]) + "|" + m[:20] for a, m in BAD_VALUES])
def test_bad_values_sizes_and_names_exit_2_with_one_line_and_write_nothing(main, tmp_path, capsys, argv, message):
    test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, argv, message)
    assert list(tmp_path.iterdir()) == []  # not even a lock file


def test_output_locations_are_checked_before_any_work(main, tmp_path, capsys):
    import sys

    (tmp_path / "file").write_text("x")
    analyze = ["analyze", "--init", "--task", "addition", "--preset", "tiny", "--n-prompts", "4"]
    cases = [(analyze + ["--out-root", str(tmp_path / "file")], "is an existing file"),
             (analyze + ["--out-root", str(tmp_path / "file" / "sub")], "is an existing file"),
             (["probe", "--init", "--task", "addition", "--out-root", str(tmp_path / "file")], "is an existing file"),
             (["train", "--task", "addition", "--preset", "tiny", "--runs-dir", str(tmp_path / "file")],
              "run directory .* cannot be created: .*file is an existing file"),
             (["train", "--task", "addition", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "file"],
              "run directory .*file is an existing file"),
             (["demo", "--retrain", "--runs-dir", str(tmp_path / "file"), "--out-root", str(tmp_path / "o")],
              "--runs-dir .*file is an existing file")]
    if sys.platform == "linux":  # not writable even for root
        cases += [(analyze + ["--out-root", "/proc/self/out"], "cannot be created in /proc/self"),
                  (["train", "--task", "addition", "--preset", "tiny", "--runs-dir", "/proc/self/runs"],
                   "cannot be created in /proc/self")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and __import__("re").search(message, err), err
        assert "analysing" not in out  # refused before the analysis started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


_HOLD = """
import sys, time
from nope_interp import io
with io.exclusive(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_job_writing_the_same_output_folder_is_refused(main, tmp_path, capsys):
    import signal

    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path / "results" / "analyze")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = ["analyze", "--init", "--task", "addition", "--preset", "tiny", "--n-prompts", "4", "--points", "embed"]
        assert main(argv + ["--out-root", str(tmp_path)]) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and f"is being written by another nope-interp process (pid {holder.pid})" in err
        assert "analysing" not in out
        assert main(argv + ["--out-root", str(tmp_path / "elsewhere")]) == 0  # another --out-root is free
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert main(argv + ["--out-root", str(tmp_path)]) == 0  # the killed holder's lock blocks nobody
    assert (tmp_path / "results" / "analyze" / "init-tiny-addition" / "scores.json").exists()


def _planted_checkpoint(path, marker):
    import torch

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"model": Planted(), "optimizer": {}, "step": 1, "wall_time_s": 0.0}, path)


def test_resume_and_finalize_turn_every_bad_checkpoint_into_one_line(main, tiny_run, tmp_path, capsys):
    import shutil

    import torch

    run = tmp_path / "r"
    shutil.copytree(tiny_run, run)
    (run / "summary.json").unlink()
    good = (run / "checkpoint.pt").read_bytes()
    marker = tmp_path / "pwned"
    other = torch.load(run / "checkpoint.pt", weights_only=True)
    other["model"] = {k: v for k, v in other["model"].items() if k != "embed.W_E"}
    bad = {"truncated": lambda p: p.write_bytes(good[: len(good) // 3]),
           "random": lambda p: p.write_bytes(bytes(range(256)) * 64),
           "planted": lambda p: _planted_checkpoint(p, marker),
           "mismatched": lambda p: torch.save(other, p)}
    resume = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16", "--steps",
              "6", "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3", "--eval-n", "10",
              "--warmup-steps", "2", "--runs-dir", str(tmp_path), "--name", "r", "--no-progress", "--resume"]
    finalize = ["train", "--task", "addition", "--finalize", "--runs-dir", str(tmp_path), "--name", "r"]
    for name, write in bad.items():
        write(run / "checkpoint.pt")
        for argv in (resume, finalize):
            assert main(argv) == 2, (name, argv[-1])
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "checkpoint" in err and str(run / "checkpoint.pt") in err, err
            assert ("do not match the model config" if name == "mismatched" else "corrupt, truncated or unsafe") in err
    assert not marker.exists() and not (run / "summary.json").exists()
    (run / "checkpoint.pt").write_bytes(good)  # today's format loads with weights_only=True
    assert main(finalize) == 0 and (run / "summary.json").exists()


def test_a_run_directory_named_dot_dot_or_with_a_space_never_becomes_a_path(main, tiny_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "runs" / "mine"
    shutil.copytree(tiny_run, run)
    (run / "sub").mkdir()
    argv = ["analyze", "--n-prompts", "4", "--points", "embed", "--out-root", str(tmp_path / "out")]
    assert main(argv[:1] + ["--run", str(run / "sub" / "..")] + argv[1:]) == 0  # its label was ".."
    assert (tmp_path / "out" / "results" / "analyze" / "mine" / "scores.json").exists()
    assert not (tmp_path / "out" / "results" / "scores.json").exists()
    shutil.copytree(tiny_run, tmp_path / "runs" / "a b")
    assert main(argv[:1] + ["--run", str(tmp_path / "runs" / "a b")] + argv[1:]) == 2
    assert "the run folder" in (err := capsys.readouterr().err) and "rename the folder" in err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import nope_interp.cli as cli

    def interrupted(args, argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_train", interrupted)
    assert cli.main(["train", "--task", "addition"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("nope-interp: interrupted (train)") and len(err.splitlines()) == 1


def test_a_stopped_command_closes_its_own_progress_bars_not_its_callers(monkeypatch, capsys):
    """Before: Ctrl-C in a command run with ``main([...])`` from a notebook closed every open tqdm bar,
    the notebook's own too."""
    import io

    from tqdm import tqdm

    import nope_interp.cli as cli

    callers = tqdm(total=10, file=io.StringIO())
    made = []

    def interrupted(args, argv):
        made.append(tqdm(total=5, file=io.StringIO()))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_train", interrupted)
    try:
        assert cli.main(["train", "--task", "addition"]) == 130
        assert made[0].disable is True or made[0] not in tqdm._instances  # closed: gone from tqdm's registry
        assert callers in tqdm._instances  # still open
    finally:
        callers.close()
    capsys.readouterr()


@pytest.mark.parametrize("job_name, absent, present", [
    ("trajectory", ["--pretrained", "--init", "--with-seeds", "--with-candidates", "--hf-path", "--model-n-layers",
                    "--preset"],
     ["--run", "--task"]),
    ("length-gen", ["--init", "--hf-path", "--model-n-layers", "--task", "--n-digits"],
     ["--run", "--pretrained", "--with-seeds", "--with-candidates"]),
    ("compare", ["--hf-path"], ["--run", "--pretrained", "--init", "--model-n-layers", "--with-seeds",
                                "--with-candidates"]),
    ("ablate", ["--hf-path", "--with-candidates"], ["--run", "--init", "--model-n-layers", "--with-seeds"]),
    ("analyze", [], ["--hf-path", "--init", "--model-n-layers"]),
    ("probe", [], ["--hf-path", "--pretrained"]),
    ("long-context", [], ["--hf-path", "--run"]),
])
def test_a_job_offers_only_the_model_sources_it_accepts(main, capsys, job_name, absent, present):
    assert main([job_name, "--help"]) == 0
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", capsys.readouterr().out, re.M))  # defined flags, not mentions
    assert not flags & set(absent) and set(present) <= flags
    for flag in absent:  # refused before any work, as an unknown argument
        argv = [job_name, flag] + ([] if flag in ("--init", "--with-seeds", "--with-candidates") else ["x"])
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"unrecognized arguments: {flag}" in err
        assert f"(see nope-interp {job_name} --help)" in err  # where the accepted flags are listed
        # the commands that take it are named, and are exactly those whose --help lists it
        takers = err.split(f"; {flag} is taken by ")[1].split(" (")[0].split(", ")
        assert job_name not in takers and takers
        for other in takers:
            assert main([other, "--help"]) == 0
            assert flag in re.findall(r"^  (--[a-z0-9-]+)", capsys.readouterr().out, re.M)
    assert main([job_name, "--bogus-flag"]) == 2  # a flag no command takes: the plain message
    assert "is taken by" not in capsys.readouterr().err


def test_every_job_declares_known_sources():
    import dataclasses

    from nope_interp.cli import _jobs, source_flags
    from nope_interp.jobs.common import ModelSource

    fields = {f.name for f in dataclasses.fields(ModelSource)}
    for job in _jobs():
        assert set(getattr(job, "SOURCES", ())) <= fields, job.NAME
        if job.TAKES_MODELS:
            assert ("hf_path" in source_flags(job)) == getattr(job, "TAKES_HF", False), job.NAME


@pytest.mark.parametrize(("argv", "message"), [
    (["long-context", "--init", "--task", "reversal", "--preset", "tiny", "--seeds", "2"],
     "--seeds shapes long-context's default models"),
    (["long-context", "--pretrained", "reversal", "--normalizations", "LN", "--window", "8"],
     "--normalizations, --window shape long-context's default models"),
    (["probe", "--pretrained", "reversal", "--tasks", "addition"], "--tasks shapes probe's default models"),
    (["length-gen", "--n-prompts", "30", "--n-examples", "20"], "--n-prompts=30 exceeds --n-examples=20"),
])
def test_options_that_would_be_ignored_are_refused(main, tmp_path, capsys, argv, message):
    assert main([*argv, "--out-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_config_fields_name_in_an_error_becomes_the_flag_that_set_it():
    """Before: ``train --model-dropout 2`` said ``dropout must be ...``, naming a field no flag is called."""
    from argparse import Namespace

    from nope_interp.cli import flag_named

    args = Namespace(model_dropout=2.0, seed=3, model_seed=-1, batch_size=None, run=["x"], tied=False)
    cases = {
        "dropout must be a finite number in [0.0, 1.0), got 2.0": "--model-dropout must be",
        "seed must be an integer in [0, 9], got -1": "--model-seed must be",       # both set seed: the quoted one
        "seed must be an integer in [0, 9], got 7": "seed must be",                # neither quoted: left alone
        "batch_size must be an integer": "batch_size must be",                     # not given on the command line
        "run directory not found: x": "run directory not found",                   # not a field's check
        "tied must be": "tied must be",                                            # a flag left off
        "--window 5 is longer": "--window 5 is longer",
    }
    for message, start in cases.items():
        assert flag_named(message, args).startswith(start), message
    assert flag_named("window=99 is longer", Namespace(window=99)) == "--window=99 is longer"
    # a sliding window left unset while the training --window is given: the flag to give is --model-window
    both = Namespace(window=4, model_window=None)
    assert flag_named("window must be an integer >= 1 with attention='sliding', got None", both).startswith(
        "--model-window must be")
    assert flag_named("window must be an integer >= 1, got 4", both).startswith("--window must be")


def test_the_settings_a_config_error_quotes_become_flags():
    """Before: only a leading field became a flag, so ``--model-window 8`` printed the Python API's ``... unless
    attention='sliding'`` and ``--model-attention sliding`` alone (both window flags unset) named no flag."""
    from argparse import Namespace

    from nope_interp.cli import flag_named
    from nope_interp.config import ModelConfig, TrainConfig
    from nope_interp.errors import NopeInterpError

    unset = Namespace(window=None, model_window=None, model_attention="sliding", n_test=None, eval_n=10)
    message = "window must be an integer >= 1 with attention='sliding', got None"
    assert flag_named(message, unset, ModelConfig) == ("--model-window must be an integer >= 1 with "
                                                       "--model-attention=sliding, got None")
    assert flag_named(message, unset, TrainConfig).startswith("--window must be")  # the config that refused it
    assert flag_named(message, unset) == ("window must be an integer >= 1 with --model-attention=sliding, "
                                          "got None")  # two window flags, neither given: which one is not known
    # a config's own check: each setting it quotes is a flag or the flag's default (quotes dropped)
    assert flag_named("eval_n=10 is more than n_test=5", unset, TrainConfig) == "--eval-n=10 is more than --n-test=5"
    # elsewhere only a value a flag gave: a --pretrained model's n_layers=3 is no flag's; flags, quoted texts stay
    assert flag_named("eval_n=10 is more than n_test=5", unset) == "--eval-n=10 is more than n_test=5"
    for message in ("b (n_ctx=48 is too small)", "--window=4 is long", "unknown task 'eval_n=10'"):
        assert flag_named(message, unset) == message
    # the configs mark what they raise with themselves, the innermost config first
    from nope_interp.jobs.common import ModelSource

    for build, cls in ((lambda: ModelConfig(window=8), ModelConfig), (lambda: TrainConfig(eval_n=30_000), TrainConfig),
                       (lambda: ModelSource(init=True, task="reversal", model_overrides={"window": 8}), ModelConfig)):
        with pytest.raises(NopeInterpError) as err:
            build()
        assert err.value.config is cls


def test_finalize_finds_the_run_its_flags_name_and_refuses_flags_it_would_ignore(main, tiny_run, tmp_path, capsys):
    """Before: the default name ignored --model-seed (a run trained with --model-seed 3 is <task>-<preset>-s3,
    --finalize looked for -s0), and --steps, --model-*, --resume or --device were silently ignored."""
    import shutil

    run = tmp_path / "addition-tiny-s3"
    shutil.copytree(tiny_run, run)
    (run / "summary.json").unlink()
    base = ["train", "--task", "addition", "--preset", "tiny", "--finalize", "--runs-dir", str(tmp_path)]
    for extra, words in ((["--steps", "99"], "--steps"), (["--model-d-model", "7"], "--model-d-model"),
                         (["--resume"], "--resume"), (["--n-digits", "3"], "--n-digits")):
        assert main([*base, "--model-seed", "3", *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and "would be ignored" in err and err.count("\n") == 1
    assert main([*base, "--device", "cuda:7"]) == 2  # a device that is not there, not "a corrupt checkpoint"
    assert "corrupt" not in capsys.readouterr().err
    assert main([*base, "--model-seed", "3"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    assert str(run / "summary.json") in capsys.readouterr().out


def test_an_analysis_job_stopped_by_sigterm_says_so_in_one_line(tmp_path):
    """Before: SIGTERM (a scheduler, ``timeout``) ended every command but the trainings silently (exit 143, no
    word); now every command says what was kept. An analysis job writes its files when it ends: nothing."""
    import os
    import signal
    import time

    cmd = [sys.executable, "-m", "nope_interp.cli", "long-context", "--lengths", "8192", "--n-sequences", "64",
           "--seeds", "1", "--out-root", str(tmp_path)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the job's first line: it is running
    assert first.startswith("long-context:"), (first, proc.stderr.read() if proc.poll() is not None else "")
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    err = proc.stderr.read().strip().splitlines()
    assert err[-1] == ("nope-interp: terminated (SIGTERM) (long-context); nothing was written (a job writes its "
                       "files when it ends): rerun the same command"), err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*.json"))


def test_the_top_level_help_imports_no_job_and_a_command_builds_only_its_own_flags():
    """Before: every ``nope-interp`` call, ``--help`` too, imported all ten job modules and TransformerLens
    (10-19 s of silence on a loaded 2-core machine); now only the job named on the command line is imported."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom nope_interp import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n    rc = cli.main(['--help'])\n"
            "assert rc == 0 and 'length-gen' in out.getvalue(), out.getvalue()\n"
            "print(sorted(m for m in sys.modules if m == 'transformer_lens' or m.startswith('nope_interp.jobs.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

    from nope_interp.cli import _build_parser
    from nope_interp.jobs import JOB_HELP

    choices = _build_parser(["analyze", "--pretrained", "reversal"])._subparsers._group_actions[0].choices
    assert list(choices)[-len(JOB_HELP):] == list(JOB_HELP)
    flags = {name: {o for a in p._actions for o in a.option_strings} for name, p in choices.items()}
    assert "--n-prompts" in flags["analyze"] and "--pretrained" in flags["analyze"]
    assert flags["ablate"] == {"-h", "--help"}  # listed with its help line only
    assert "--kinds" in {o for a in _build_parser()._subparsers._group_actions[0].choices["ablate"]._actions
                         for o in a.option_strings}  # without argv: every job's flags


@pytest.mark.parametrize(("stop", "status", "how"), [
    (KeyboardInterrupt(), 130, "interrupted"), ("term", 143, "terminated (SIGTERM)")])
def test_a_stop_while_the_parser_is_built_is_one_line(monkeypatch, capsys, stop, status, how):
    """Before: Ctrl-C in the first seconds (the parser imports torch and TransformerLens for the job) printed a
    traceback, and SIGTERM then ended the process with no output at all: the handler was installed later."""
    import signal

    import nope_interp.cli as cli
    from nope_interp.errors import Terminated

    def stopping(argv):
        if stop == "term":
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # the CLI's handler is in place
            raise Terminated(143)
        raise stop

    monkeypatch.setattr(cli, "_build_parser", stopping)
    assert cli.main(["trajectory", "--run", "runs/x"]) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nope-interp: {how} while starting (trajectory); nothing was written: rerun the same command"]


def test_importing_the_cli_imports_no_torch():
    """The console script imports ``nope_interp.cli`` before ``main`` installs its Ctrl-C/SIGTERM handling: a
    torch import there (through the tasks package, 3 s on a loaded machine) was a window where SIGTERM ended
    the command with no output at all."""
    import subprocess
    import sys

    code = ("import sys, nope_interp.cli; "
            "print(sorted(m for m in ('torch', 'tasks', 'transformer_lens') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text, expected", [
    ("plain", "plain"),
    ("got 'x  y'", "got 'x  y'"),                     # interior runs of spaces are the user's: kept
    ("first\nsecond", "first second"),
    ("  first  \n\n\t second\r\nthird  ", "first second third"),
    ("a\x0bb\x0cc\x1cd\x85e\u2028f\u2029g", "a b c d e f g"),  # every line boundary str.splitlines knows
    ("\n\n", ""),
])
def test_one_line_joins_lines_and_keeps_the_rest(text, expected):
    """One line of a message: line breaks (with the blanks around them) become one space, anything else as it
    was. Checked against a naive character loop over the same boundaries, and idempotent."""
    from nope_interp.errors import one_line

    breaks = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    pieces, cur = [], ""
    for ch in text:  # the reference: split at each boundary character, strip spaces and tabs, drop empties
        if ch in breaks:
            pieces.append(cur)
            cur = ""
        else:
            cur += ch
    pieces.append(cur)
    naive = " ".join(p.strip(" \t") for p in pieces if p.strip(" \t")).strip()
    assert one_line(text) == expected == naive
    assert one_line(one_line(text)) == one_line(text)


def test_a_bad_flag_value_is_quoted_as_typed(main, tmp_path, capsys, monkeypatch):
    """Before: argparse's error was passed through ``" ".join(message.split())``, so ``--n-prompts 'x  y'`` was
    quoted back as 'x y', not what the user typed. Line breaks still go."""
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "--n-prompts", "x  y"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "got 'x  y'" in err, err
    assert _files(tmp_path) == []


def test_an_error_message_with_a_line_break_is_one_line(main, tmp_path, capsys, monkeypatch):
    """A toolkit error whose message holds a raw line break (a job's, monkeypatched) is printed on one line, its
    spacing otherwise kept."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import analyze

    monkeypatch.chdir(tmp_path)

    def boom(*args, **kwargs):
        raise NopeInterpError("first line\n  second  part")

    monkeypatch.setattr(analyze, "run", boom)
    assert main(["analyze", "--init", "--task", "addition"]) == 2
    err = capsys.readouterr().err
    assert err == "nope-interp: error: first line second  part\n", err


def test_a_toolkit_warning_with_a_line_break_is_one_line(capsys):
    """The CLI's warning line, like its error line: a raw line break in a toolkit warning becomes a space."""
    from nope_interp.cli import _show_warning
    from nope_interp.errors import NopeInterpWarning

    _show_warning(NopeInterpWarning("odd\n  input  here"), NopeInterpWarning, "f.py", 1)
    assert capsys.readouterr().err == "nope-interp: warning: odd input  here\n"
    _show_warning(UserWarning("other\nlibrary"), UserWarning, "f.py", 1)  # not ours: Python's own format
    assert "other\nlibrary" in capsys.readouterr().err


@pytest.mark.parametrize("message, values, expected", [
    ("unknown task 'x'; allowed: a, b", {"pretrained": ["x"], "task": None},
     "--pretrained: unknown task 'x'; allowed: a, b"),
    ("kinds: unknown ablation 'x'; allowed: a", {"kinds": ["x"]}, "--kinds: unknown ablation 'x'; allowed: a"),
    ("unknown task 'x'", {"pretrained": ["x"], "task": "x"}, "unknown task 'x'"),  # two flags hold it: left alone
    ("unknown task 'x'", {"pretrained": ["y"]}, "unknown task 'x'"),                # none holds it
    ("run 'x' is unknown", {"run": ["x"]}, "run 'x' is unknown"),                  # not a refused name
])
def test_an_unknown_name_is_prefixed_with_the_one_flag_that_holds_it(message, values, expected):
    import argparse

    from nope_interp.cli import flag_named

    assert flag_named(message, argparse.Namespace(**values)) == expected


#: (argv, the config and its fields that refuse the same, what the CLI says, what Python says): a config's
#: message that names fields elsewhere than at its start (NopeInterpError.naming).
NAMED_ANYWHERE = [
    (["init-grid", "--widths", "100", "--n-heads", "3"], "init_grid", {"widths": (100,), "n_heads": 3},
     "--widths (and 384, the init grid's width) must be multiples of --n-heads=3, got [100]",
     "widths (and 384, the init grid's width) must be multiples of n_heads=3, got [100]"),
    (["demo", "--from-sweep", "spec", "--retrain"], "demo", {"from_sweep": "spec", "retrain": True},
     "--from-sweep and --retrain exclude each other", "from_sweep and retrain exclude each other"),
    (["demo", "--sweep-dir", "d"], "demo", {"sweep_dir": "d"},
     "--sweep-dir needs --from-sweep (the spec", "sweep_dir needs from_sweep (the spec"),
    (["demo", "--runs-dir", "r"], "demo", {"runs_dir": "r"},
     "--runs-dir=r is only used with --retrain;", "runs_dir='r' is only used with retrain;"),
    (["demo", "--from-sweep", ""], "demo", {"from_sweep": ""},
     "--from-sweep must be a non-empty path", "from_sweep must be a non-empty path"),
    (["train", "--task", "addition", "--window", "8"], "train", {"window": 8},
     "--window=8 is only used with --objective packed;", "window=8 is only used with objective packed;"),
    (["analyze", "--init", "--task", "addition", "--window", "10"], "analyze", {"window": 10},
     "--window=10 is only used with --protocol window;", "window=10 is only used with protocol window;"),
    (["analyze", "--init", "--task", "addition", "--text-length", "10"], "analyze", {"text_length": 10},
     "--text-length=10 is only used with --text-file;", "text_length=10 is only used with text_file;"),
    (["analyze", "--init", "--task", "addition", "--text-file", "t.txt", "--protocol", "window"], "analyze",
     {"text_file": "t.txt", "protocol": "window"},
     "--text-file and --protocol window exclude each other", "text_file and protocol window exclude each other"),
    (["compare", "--run", "a", "--window", "32"], "compare", {"window": 32},
     "--window=32 is only used when --protocols include window;", "window=32 is only used when protocols include "
                                                                   "window;"),
    (["ablate", "--kinds", "swap_prompts", "--n-analysis", "1"], "ablate", {"kinds": ("swap_prompts",),
                                                                            "n_analysis": 1},
     "it needs --n-eval and --n-analysis >= 2, got 200 and 1; raise them or leave swap_prompts out of --kinds",
     "it needs n_eval and n_analysis >= 2, got 200 and 1; raise them or leave swap_prompts out of kinds"),
    (["ablate", "--kinds", "shuffle_positional", "--rank", "3"], "ablate", {"kinds": ("shuffle_positional",),
                                                                           "rank": 3},
     "--rank=3 is only used with a project_out* ablation among the --kinds", "rank=3 is only used with a "
                                                                               "project_out* ablation among the kinds"),
    (["length-gen", "--n-prompts", "100", "--n-examples", "50"], "length_gen", {"n_prompts": 100, "n_examples": 50},
     "--n-prompts=100 exceeds --n-examples=50: the prompts analysed are drawn from the prompts scored; lower "
     "--n-prompts or raise --n-examples", "n_prompts=100 exceeds n_examples=50: the prompts analysed are drawn from "
                                          "the prompts scored; lower n_prompts or raise n_examples"),
    (["analyze", "--run", "a", "--init", "--task", "addition"], "source", {"run": ("a",), "init": True,
                                                                          "task": "addition"},
     "give at most one of --run, --pretrained, --init, --hf-path; got --run and --init",
     "give at most one of run, pretrained, init, hf_path; got run and init"),
    (["analyze", "--init"], "source", {"init": True}, "--init needs --task (one of:", "init needs task (one of:"),
    (["probe", "--preset", "tiny", "--model-n-layers", "1"], "source", {"preset": "tiny",
                                                                        "model_overrides": {"n_layers": 1}},
     "--model-n-layers, --preset shape an --init model", "model_overrides['n_layers'], preset shape an init model"),
    (["analyze", "--hf-path", "x", "--task", "addition"], "source", {"hf_path": "x", "task": "addition"},
     "--task names task inputs; a Hugging Face model (--hf-path) reads random ids of its own vocabulary (or "
     "--text-file): drop it", "task names task inputs; a Hugging Face model (hf_path) reads random ids of its own "
                              "vocabulary (or text_file): drop it"),
    (["analyze", "--run", "a", "--with-seeds"], "source", {"run": ("a",), "with_seeds": True},
     "--with-seeds adds repository models to --pretrained (or the default); with --run, list",
     "with_seeds adds repository models to pretrained (or the default); with run, list"),
    (["analyze", "--with-candidates", "--task", "reversal"], "source", {"with_candidates": True, "task": "reversal"},
     "--with-candidates alone means every shipped task's models; with --task or --n-digits name them: --pretrained "
     "TASK [TASK ...] --with-candidates", "with_candidates alone means every shipped task's models; with task or "
                                          "n_digits name them: pretrained TASK [TASK ...] with_candidates"),
]


@pytest.mark.parametrize("argv,config,kwargs,cli_words,python_words", NAMED_ANYWHERE,
                         ids=[" ".join(case[0][:3]) for case in NAMED_ANYWHERE])
def test_fields_named_anywhere_in_a_message_are_flags_on_the_command_line_and_names_in_python(
        main, tmp_path, capsys, argv, config, kwargs, cli_words, python_words):
    """Before: a config's message that did not start with a field name kept the Python names on the command line
    (``from_sweep and retrain exclude each other``, ``--window=8 is only used with objective packed``, ``widths
    ... multiples of n_heads=3``), and some were written with the flags, which Python users then saw
    (``--sweep-dir needs --from-sweep``, ``--init needs --task``). Now the CLI says the flags, Python the fields."""
    import importlib

    from nope_interp.config import TrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, argv, cli_words)
    cls = {"train": TrainConfig, "source": ModelSource}.get(config) or importlib.import_module(
        f"nope_interp.jobs.{config}").CONFIG
    with pytest.raises(NopeInterpError) as err:
        cls(**kwargs)
    assert python_words in str(err.value) and "--" not in str(err.value).split(" got ")[0], str(err.value)


def test_check_train_fits_names_training_flags_on_the_command_line(main, tmp_path, capsys):
    """Before: ``use --window >= 13`` and ``lower --n-train/--n-test`` were flags in Python too."""
    from nope_interp.config import ModelConfig, TrainConfig, check_train_fits, preset
    from nope_interp.errors import NopeInterpError
    from tasks import get_task

    short = ["train", "--task", "addition", "--preset", "tiny", "--objective", "packed", "--window", "5"]
    test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, short, "use --window >= 16")
    many = ["train", "--task", "addition", "--n-digits", "1", "--n-train", "90", "--n-test", "20", "--eval-n", "10"]
    test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, many,
                                                            "--n-train + --n-test = 110 but task 'addition'")
    task = get_task("addition")
    with pytest.raises(NopeInterpError, match=r"^window=5 cannot hold .*: use window >= 16$"):
        check_train_fits(preset("tiny"), task, TrainConfig(objective="packed", window=5))
    with pytest.raises(NopeInterpError, match=r"^n_train \+ n_test = 110 but .* lower n_train or n_test$"):
        check_train_fits(ModelConfig(), get_task("addition", n_digits=1), TrainConfig(n_train=90, n_test=20, eval_n=10))


@pytest.mark.parametrize("template,values,python,cli", [
    ("{a} and {b_c} exclude each other", {}, "a and b_c exclude each other", "--a and --b-c exclude each other"),
    ("{a}={v!r} is only used with {b_c}", {"v": "x{y}"}, "a='x{y}' is only used with b_c",
     "--a='x{y}' is only used with --b-c"),
    ("{a!r} got {d}", {"d": {"k": [1]}}, "a got {'k': [1]}", "--a got {'k': [1]}"),
])
def test_naming_fills_fields_and_values(template, values, python, cli):
    from nope_interp.errors import NopeInterpError

    err = NopeInterpError.naming(template, **values)
    assert str(err) == python and err.spelt(lambda f: "--" + f.replace("_", "-")) == cli
    assert err.spelt(lambda f: None) == python and NopeInterpError("plain").spelt(lambda f: "--x") == "plain"
    assert str(NopeInterpError.naming("{a} x", {"a": "model_overrides['a']"})) == "model_overrides['a'] x"


@pytest.mark.parametrize("stop", ["interrupt", "unwritable"])
def test_a_job_stopped_while_writing_its_files_says_which_were_written(main, tmp_path, capsys, monkeypatch, stop):
    """Before: Ctrl-C after a job's first file was replaced said "nothing was written", and a figure folder that
    could not be written stopped the job after its results file had been replaced without saying so; the
    reader then trusted a mix of new and old files. Now the line names the files that are new."""
    import nope_interp.jobs.analyze as analyze_job
    from nope_interp.errors import NopeInterpError

    argv = ["analyze", "--init", "--task", "addition", "--preset", "tiny", "--n-prompts", "4", "--points", "z",
            "--out-root", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    scores = tmp_path / "results" / "analyze" / "init-tiny-addition" / "scores.json"
    assert scores.exists(), sorted(p.name for p in (tmp_path / "results" / "analyze").iterdir())
    before = scores.read_text()

    def fail(*_args, **_kwargs):
        if stop == "interrupt":
            raise KeyboardInterrupt
        raise NopeInterpError("cannot write x.html: Permission denied")

    monkeypatch.setattr(analyze_job, "save_figure", fail)
    assert main([*argv[:-2], "--n-prompts", "5", "--out-root", str(tmp_path)]) == (130 if stop == "interrupt" else 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and scores.read_text() != before  # the results file is the new one ...
    assert f"1 of its files was written before ({scores}), its other files are as before" in err[0]  # ... and said
    assert "nothing was written" not in err[0]
    if stop == "interrupt":
        assert err[0].startswith("nope-interp: interrupted (analyze); stopped while writing its files; 1 of")
    else:
        assert err[0].startswith("nope-interp: error: cannot write x.html: Permission denied; 1 of its files")
    # stopped before any file: the usual advice, unchanged
    monkeypatch.setattr(analyze_job.io, "write_json", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(argv) == 130
    assert "nothing was written (a job writes its files when it ends)" in capsys.readouterr().err


def test_paths_the_operating_system_refuses_are_one_line_errors(main, tmp_path, capsys, monkeypatch):
    """Before: a name too long (--out-root, --run, --hf-path) or a loop of links ended in a raw OSError
    traceback with exit status 1, and an OSError from a job's write did too."""
    long = str(tmp_path / ("x" * 300))
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    init = ["analyze", "--init", "--task", "addition", "--preset", "tiny", "--n-prompts", "4", "--points", "z"]
    for argv, words in [([*init, "--out-root", long], "cannot be used: File name too long"),
                        (["analyze", "--run", long], "cannot be read: File name too long"),
                        (["analyze", "--run", str(tmp_path / "a")], "cannot be read: Too many levels of symbolic"),
                        (["analyze", "--hf-path", long], "File name too long"),
                        (["long-context", "--hf-path", str(tmp_path / "a")], "Too many levels of symbolic links")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("nope-interp: error: ") and words in err, (argv, err)
    import nope_interp.jobs.analyze as analyze_job

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied", "/somewhere/adjacency.html")

    monkeypatch.setattr(analyze_job, "save_figure", refuse)
    assert main([*init, "--out-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nope-interp: error: Permission denied: /somewhere/adjacency.html")
    assert "1 of its files was written before" in err  # the scores.json written before the figure failed


@pytest.mark.parametrize("where", ["starting", "running"])
def test_ctrl_c_during_a_lazy_import_is_an_interrupt_not_a_broken_install(main, capsys, monkeypatch, where):
    """``transformers`` imports lazily and turns a Ctrl-C during its import into an ImportError ("Could not
    import module 'BertForPreTraining'"): before, about 90 lines of traceback, read as a broken install."""
    from nope_interp import cli

    def interrupted_import(*_args, **_kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as stop:
            raise ModuleNotFoundError("Could not import module 'BertForPreTraining'") from stop

    if where == "starting":
        monkeypatch.setattr(cli, "_build_parser", interrupted_import)
    else:
        monkeypatch.setattr(cli, "_cmd_job", interrupted_import)
    assert main(["analyze", "--init", "--task", "addition"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nope-interp: interrupted") and "BertForPreTraining" not in err

    def broken(*_args, **_kwargs):  # an ImportError of its own is not hidden
        raise ModuleNotFoundError("No module named 'nothing_here'")

    monkeypatch.setattr(cli, "_build_parser" if where == "starting" else "_cmd_job", broken)
    with pytest.raises(ModuleNotFoundError, match="nothing_here"):
        main(["analyze", "--init", "--task", "addition"])
