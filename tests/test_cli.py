import json
import subprocess
import sys

import pytest


@pytest.fixture
def main():
    from nope_interp.cli import main

    return main


def _files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


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
    assert sorted(p.name for p in figs.iterdir()) == ["adjacency.html", "cosine.html", "plotly.min.js"]
    out = capsys.readouterr().out
    assert "blocks.0.attn.hook_z" in out and "outputs:" in out and "cosine.html" in out


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
     "n_ctx=20 is too small for task 'reversal': its examples need n_ctx >= 39"),
    (["train", "--task", "addition", "--model-d-model", "-5"], "d_model must be an integer in [1, 1000000], got -5"),
    (["train", "--task", "addition", "--steps", "0"], "steps must be an integer in [1, 1000000000], got 0"),
    (["train", "--task", "addition", "--n-digits", "0"], "n_digits must be an integer in [1, 18]"),
    (["analyze", "--init", "--task", "addition", "--preset", "tiny", "--points", "resid_final"],
     "unknown activation point 'resid_final'; allowed: embed, resid_pre, z, resid_mid, resid_post"),
    (["analyze", "--run", "{tmp}/missing"], "run directory not found"),
    (["analyze", "--pretrained", "sorting"], "unknown task 'sorting'; allowed: addition, reversal, indexing, ordering"),
    (["analyze", "--init", "--task", "reversal", "--preset", "tiny", "--model-n-ctx", "10"],
     "n_ctx=10 is too small for 'reversal' full inputs of 22 tokens"),
    (["demo", "--tasks", "sorting"], "unknown task 'sorting'"),
    (["demo", "--init-preset", "huge"], "init_preset must be one of paper, paper-recipe, cpu, tiny, got 'huge'"),
    (["train", "--task", "addition", "--objective", "every_token"], "objective must be one of answer_only, packed"),
    (["train", "--task", "addition", "--lr", "nan"], "lr must be a finite number"),
    (["train", "--task", "addition", "--model-dropout", "1.0"], "dropout must be in [0, 1)"),
    (["train", "--task", "addition", "--preset", "tiny", "--objective", "packed", "--window", "100"],
     "window=100 is longer than the model's n_ctx=48"),
    (["analyze", "--init", "--task", "addition", "--protocol", "padded"],
     "protocol must be one of full, authors, window"),
    (["trajectory", "--pretrained", "reversal"], "kept no weights"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a[:3]) + "|" + m[:20] for a, m in BAD])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(main, tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train":
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


def test_resume_without_checkpoint_and_nonempty_run_dir(main, tiny_run, capsys):
    base = ["train", "--task", "addition", "--runs-dir", str(tiny_run.parent), "--no-progress"]
    assert main(base + ["--name", "fresh", "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(base + ["--name", "t"]) == 2
    assert "not empty; use --resume" in capsys.readouterr().err


def test_console_script_is_installed_and_reports_errors_with_status_2():
    exe = [sys.executable, "-m", "nope_interp.cli"]
    out = subprocess.run(exe + ["train", "--task", "nope"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown task 'nope'" in out.stderr


def test_averaging_and_init_grid_commands(main, tmp_path):
    assert main(["averaging", "--tasks", "reversal", "--n-prompts", "6", "--eval-n", "10",
                 "--out-root", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results" / "averaging" / "averaging.json").read_text())
    entry = res["tasks"]["reversal"]
    assert {"initialised", "bidirectional_control", "trained"} <= set(entry)
    assert set(entry["trained"]["counterfactual"]["conditions"]) == {"clean", "uniform", "identity", "random_matched"}
    assert (tmp_path / "results" / "averaging" / "averaging.csv").read_text().startswith("task,model,layer")
    assert (tmp_path / "figures" / "averaging" / "counterfactual_attention.html").exists()
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
    # one run: no seed figure; the same run twice counts as two seeds (zero spread) and gets one
    assert not (tmp_path / "figures" / "ablate" / "ablations_seeds.html").exists()
    assert main(argv[:2] + [str(tiny_run)] + argv[2:]) == 0
    summary = json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())["seed_summary"]["addition"]
    assert summary["clean_exact_match"]["n_seeds"] == 2 and summary["clean_exact_match"]["std"] == 0.0
    assert set(summary["decomposition"]["blocks.1.hook_resid_pre"]) == {
        "positional_variance_fraction", "adjacency_full", "adjacency_positional", "adjacency_content"}
    assert (tmp_path / "figures" / "ablate" / "ablations_seeds.html").exists()
    md = (tmp_path / "results" / "ablate" / "ablate_seeds.md").read_text()
    assert "## addition (2 runs" in md and "| blocks.1.hook_resid_pre | " in md and "± 0.000" in md
    clean = f"{res['clean']['exact_match']:.3f}"
    assert md.count(f"| {tiny_run.name} | blocks.1.hook_resid_pre | {clean} | ") == 2  # one row per run
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
