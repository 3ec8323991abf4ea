"""Sweeps: spec validation, stable keys, the local pool (killed and resumed), failures, the report, and a real
single-node Ray head on the loopback address."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

SPEC = """
[sweep]
name = "t"
kind = "init"
[base]
preset = "tiny"
task = "reversal"
n_prompts = {n_prompts}
[axes]
model_n_layers = [1, 2]
seed = [0, 1]
"""


def _write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nope_interp.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, **kw)


def _metrics(out: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / "result.json").read_text())["metrics"] for p in (out / "points").iterdir()
            if p.is_dir()}


def _done_counts(out: Path) -> dict[str, int]:
    return {p.name: (p / "attempts.log").read_text().count("done ") for p in (out / "points").iterdir() if p.is_dir()}


def _children(pid: int) -> list[int]:
    """PIDs of the processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _in_process(spec_file: Path, out: Path) -> Path:
    """The uninterrupted reference: every point run by :func:`run_point` in this process, one after another."""
    from nope_interp.sweep import load_spec, run_point

    spec = load_spec(spec_file)
    for p in spec.points:
        assert run_point(spec.kind, p.fields, str(out))["status"] == "done"
    assert set(_done_counts(out).values()) == {1}
    return out


def test_spec_expands_to_the_product_with_stable_distinct_keys(tmp_path):
    from nope_interp.sweep import load_spec, resolve

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    assert len(spec.points) == 4 and spec.varied == ["model_n_layers", "seed"]
    assert len({p.key for p in spec.points}) == 4
    again = load_spec(_write(tmp_path, SPEC.format(n_prompts=4), "again.toml"))
    assert [p.key for p in again.points] == [p.key for p in spec.points]  # stable across loads
    a = resolve("init", {"preset": "tiny", "task": "reversal", "model_n_layers": 1, "seed": 0})
    b = resolve("init", {"seed": 0, "model_n_layers": 1, "task": "reversal", "preset": "tiny"})
    c = resolve("init", {"preset": "tiny", "task": "reversal", "model_n_layers": 1, "seed": 0, "n_prompts": 5})
    assert a.key == b.key != c.key  # order of fields does not matter; any setting does
    d = resolve("init", {"preset": "paper", "task": "reversal", "model_d_model": 192})
    assert (d.model.d_head, d.model.d_mlp) == (32, 768)  # d_head = d_model / n_heads, d_mlp = 4 d_model


def test_point_keys_are_stable_across_versions():
    """A key names a finished point on disk: adding a ModelConfig field must not rename (and so rerun) every
    point. Keys pinned when they were first written (2026-11-30)."""
    from nope_interp.sweep import resolve

    assert resolve("train", {"task": "reversal", "preset": "cpu", "steps": 100}).key == "8f3e4a50c72a34bb"
    assert resolve("init", {"task": "addition", "preset": "tiny"}).key == "8cbd291f406688b5"
    hybrid = resolve("init", {"task": "addition", "preset": "tiny", "model_positional": "rotary",
                              "model_nope_layers": [1]})
    assert hybrid.key != resolve("init", {"task": "addition", "preset": "tiny", "model_positional": "rotary"}).key


def test_shipped_specs_load():
    from nope_interp.sweep import available_specs, load_spec

    sizes = {name: len(load_spec(name).points) for name in available_specs()}
    assert sizes == {"init-size-grid": 180, "init-std-grid": 90, "trained-seeds": 12, "tiny-init": 4,
                     "faithful-arms": 18}



def test_trained_seeds_spec_is_the_shipped_recipes():
    """`make reproduce` retrains what ships: each task's seed-0 point has the shipped model's model and
    training configs (eval and checkpoint cadence aside, which do not change the weights)."""
    from nope_interp import pretrained
    from nope_interp.sweep import load_spec

    cadence = ("eval_every", "eval_n", "checkpoint_every")
    points = {p.task: p for p in load_spec("trained-seeds").points if p.model.seed == 0}
    assert sorted(points) == sorted(pretrained.available_pretrained())
    for task, point in points.items():
        path = pretrained.PRETRAINED_DIR / task / "config.json"
        model, train = pretrained.parse_run_config(json.loads(path.read_text()), path)
        assert point.model.to_dict() == model.to_dict(), task
        swept = {k: v for k, v in point.settings["train"].items() if k not in cadence}
        assert swept == {k: v for k, v in train.to_dict().items() if k not in cadence}, task

@pytest.mark.parametrize("candidate", ["addition-packed-s1", "reversal-packed-s0", "reversal-packed-s1",
                                       "ordering-packed-s0", "addition-paperlr40k-s0", "reversal-paperlr-s0",
                                       "ordering-paperlr-s0"])
def test_faithful_arms_spec_retrains_the_candidates(candidate):
    """Each faithful-training candidate is one point of the faithful-arms spec: same model and training
    configs (eval and checkpoint cadence aside), found by task, objective, lr and seed."""
    from nope_interp import pretrained
    from nope_interp.sweep import load_spec

    cadence = ("eval_every", "eval_n", "checkpoint_every")
    path = pretrained.CANDIDATES_DIR / candidate / "config.json"
    model, train = pretrained.parse_run_config(json.loads(path.read_text()), path)
    (point,) = [p for p in load_spec("faithful-arms").points
                if p.task == train.task and p.settings["train"]["objective"] == train.objective
                and p.settings["train"]["lr"] == train.lr and p.model.seed == model.seed]
    assert point.model.to_dict() == model.to_dict()
    swept = {k: v for k, v in point.settings["train"].items() if k not in cadence}
    assert swept == {k: v for k, v in train.to_dict().items() if k not in cadence}


@pytest.mark.parametrize(("text", "match"), [
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\nmodel_n_layerz=2\n", "unknown field"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=[]\n", "axis 'seed' is empty"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=3\n", "must be a list"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nmodel_n_layers=['two']\n", "n_layers"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\nmodel_init_std=-1.0\n", "init_std"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=[1, 1]\n", "duplicates point 0"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='sorting'\n", "task must be one of"),
    ("[sweep]\nname='t'\nkind='grid'\n", "kind must be one of"),
    ("[sweep]\nkind='init'\n", "needs name"),
    ("[sweep]\nname='../x'\nkind='init'\n", "sweep name"),
    ("[sweep]\nname='t'\nkind='init'\n[extra]\na=1\n", "unknown section"),
    ("[sweep]\nname='t'\nkind='train'\n[base]\ntask='reversal'\nn_prompts=3\n", "unknown field"),
    ("[sweep]\nname='t'\nkind='train'\n[base]\ntask='reversal'\nlr='fast'\n", "lr"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[resources]\nnum_cpus=-1\n", "num_cpus"),
    ("this is = = not toml", "not a valid TOML"),
    # int and float are the same value of a float field: the same point
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nmodel_init_std=[1, 1.0]\n",
     "point 1 .*duplicates point 0"),
    ("[sweep]\nname='t'\nkind='train'\n[base]\ntask='reversal'\npreset='tiny'\n[axes]\nlr=[1, 1.0]\n",
     "point 1 .*duplicates point 0"),
    # a point whose task does not fit its model is refused at load time, not when it runs
    ("[sweep]\nname='t'\nkind='init'\n[base]\npreset='tiny'\ntask='reversal'\nmodel_n_ctx=4\n",
     "n_ctx=4 is too small for task 'reversal'"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\npreset='tiny'\ntask='reversal'\n[axes]\nn_digits=[4, 64]\n",
     "point 1 .*n_ctx=48 is too small"),
    ("[sweep]\nname='t'\nkind='train'\n[base]\npreset='tiny'\ntask='reversal'\nn_digits=64\n",
     "n_ctx=48 is too small for task 'reversal'"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\npreset='tiny'\ntask='reversal'\nmodel_d_vocab=5\n", "d_vocab"),
    # the analysis reads the sites in forward order: the order of points makes no other point, and a point
    # listed twice is refused (before: read as once, as every analysis did)
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='addition'\n[axes]\npoints=[['z', 'resid_post'], "
     "['resid_post', 'z']]\n", "point 1 .*duplicates point 0"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='addition'\n[axes]\npoints=[['z', 'resid_post', 'z']]\n",
     r"point 0 \(points=\['z', 'resid_post', 'z'\]\): points names 'z' more than once; give each point once"),
    # the task's default size spelled out is the same point as leaving it out
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='addition'\n[[points]]\n[[points]]\nn_digits=3\n",
     "point 1 .*duplicates point 0"),
    # a bad task size names the file and the point (it was a TaskError without either)
    *[(f"[sweep]\nname='t'\nkind='init'\n[base]\ntask='addition'\nn_digits={v}\n", r"spec\.toml: point 0.*n_digits")
      for v in ("'3'", "true", "3.0", "100000000000", "0")],
    # a value an axis would silently override
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=[0, 1]\n[[points]]\nseed=0\n"
     "[[points]]\nmodel_n_layers=1\n", "'seed' set both in \\[axes\\] and in \\[\\[points\\]\\] 0"),
    ("[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\nseed=3\n[axes]\nseed=[0, 1]\n",
     "'seed' set both in \\[axes\\] and in \\[base\\]"),
])
def test_bad_specs_give_one_line_errors(tmp_path, text, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec

    with pytest.raises(NopeInterpError, match=match) as info:
        load_spec(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_int_and_float_of_a_float_field_give_the_same_key():
    """A key must not depend on how a number was written: rewriting 1 as 1.0 must not rerun a finished point."""
    from nope_interp.sweep import resolve

    base = {"preset": "tiny", "task": "reversal"}
    a, b = resolve("init", {**base, "model_init_std": 1}), resolve("init", {**base, "model_init_std": 1.0})
    assert a.key == b.key and a.fields["model_init_std"] == 1.0 and isinstance(a.fields["model_init_std"], float)
    assert a.model.init_std == 1.0 and isinstance(a.model.init_std, float)
    t1 = resolve("train", {**base, "lr": 1, "grad_clip": 2})
    t2 = resolve("train", {**base, "lr": 1.0, "grad_clip": 2.0})
    assert t1.key == t2.key and t1.settings["train"]["lr"] == 1.0
    # an int field keeps its ints, and a float is still refused there
    assert resolve("init", {**base, "model_n_layers": 1}).fields["model_n_layers"] == 1
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="n_layers"):
        resolve("init", {**base, "model_n_layers": 1.0})


def test_bad_spec_on_the_command_line_is_exit_2_and_one_line(tmp_path, capsys):
    from nope_interp.cli import main

    path = _write(tmp_path, "[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=[]\n")
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "o")]) == 2
    assert main(["sweep", "no-such-spec"]) == 2
    assert main(["sweep", str(path), "--executor", "slurm"]) == 2
    assert not (tmp_path / "o").exists()
    good = _write(tmp_path, SPEC.format(n_prompts=4), "good.toml")
    capsys.readouterr()
    # an option the chosen executor would ignore
    assert main(["sweep", str(good), "--ray-address", "127.0.0.1:6379", "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray-address needs --executor=ray (got --executor=local, " in err
    assert not (tmp_path / "o").exists()


def _fake_results(spec, out: Path, metrics: dict[str, dict]) -> None:
    """Write a result.json per point of ``spec`` (``metrics``: key -> its metrics), as :func:`run_point` does."""
    for p in spec.points:
        pdir = out / "points" / p.key
        pdir.mkdir(parents=True, exist_ok=True)
        (pdir / "result.json").write_text(json.dumps({"key": p.key, "fields": p.fields, "metrics": metrics[p.key],
                                                      "seconds": 1.0, "peak_mib": 100.0}))


@pytest.mark.parametrize(("address", "hint"), [("nonsense", "host:port"), ("127.0.0.1:0", "host:port"),
                                               ("127.0.0.1:99999", "host:port"), ("a b:1", "host:port"),
                                               ("127.0.0.1:{port}", "cannot reach")])
def test_a_sweep_that_fails_on_its_options_writes_nothing(tmp_path, address, hint):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec, run_sweep

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    out = tmp_path / "fresh" / "o"
    with pytest.raises(NopeInterpError, match=hint) as info:
        run_sweep(spec, out, executor="ray", ray_address=address.format(port=_free_port()), progress=False)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(NopeInterpError, match=r"^ray_address needs executor='ray' \(got executor='local', "):
        run_sweep(spec, out, executor="local", ray_address="127.0.0.1:6379", progress=False)
    assert not (tmp_path / "fresh").exists()


def test_an_out_dir_holding_another_sweeps_spec_is_refused(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec, report, run_sweep

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    out = tmp_path / "o"
    _fake_results(spec, out, {p.key: {"L0_z": 0.5} for p in spec.points})  # all finished: nothing to run
    lines: list[str] = []
    run_sweep(spec, out, progress=False, log=lines.append)
    original = (out / "spec.toml").read_text()
    assert original == Path(spec.path).read_text() and not any("updated" in line for line in lines)
    other = load_spec(_write(tmp_path, SPEC.format(n_prompts=4).replace('name = "t"', 'name = "u"'), "u.toml"))
    with pytest.raises(NopeInterpError, match="holds another sweep's spec .*give another out_dir$") as info:
        run_sweep(other, out, progress=False)
    assert "\n" not in str(info.value)
    assert (out / "spec.toml").read_text() == original  # not overwritten
    # before: sweep-report of "u" on "t"'s folder reported t's results (the same point keys) as u's
    with pytest.raises(NopeInterpError, match="holds another sweep's spec .*give the out_dir that 'u' was run"):
        report(other, out)
    assert len(report(spec, out).points) == len(spec.points)
    # the same sweep, edited (here: only the first seed): accepted, and its record updated, saying so
    edited = load_spec(_write(tmp_path, SPEC.format(n_prompts=4).replace("seed = [0, 1]", "seed = [0]"), "e.toml"))
    run_sweep(edited, out, progress=False, log=lines.append)
    assert (out / "spec.toml").read_text() == Path(edited.path).read_text()
    assert any("spec.toml updated" in line for line in lines)


@pytest.mark.slow  # 48 s on 2 free cores: the default run stays under about 10 minutes (README, "Test timing")
def test_killed_driver_resumes_without_running_a_point_twice_and_matches_an_uninterrupted_sweep(tmp_path):
    spec = _write(tmp_path, SPEC.format(n_prompts=48).replace('preset = "tiny"', 'preset = "cpu"'))
    whole = _in_process(spec, tmp_path / "whole")
    part = tmp_path / "part"
    driver = subprocess.Popen([sys.executable, "-m", "nope_interp.cli", "sweep", str(spec), "--out-dir", str(part),
                               "--no-progress"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and not list(part.glob("points/*/result.json")):
        time.sleep(0.05)
    workers = [p for p in _children(driver.pid) if "spawn_main" in _cmdline(p)]
    assert workers  # the pool's processes (not the resource tracker, which ends once they have)
    driver.send_signal(signal.SIGKILL)  # the driver only: its workers notice and end within a second
    driver.wait()
    deadline = time.time() + 60
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers), "workers of a killed driver must not linger"
    finished_before = len(list(part.glob("points/*/result.json")))
    assert 1 <= finished_before
    again = _cli("sweep", str(spec), "--out-dir", str(part), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert f"{finished_before} already finished" in again.stdout or "skipped" in again.stdout
    assert _done_counts(part) == _done_counts(whole)  # every point finished exactly once
    assert _metrics(part) == _metrics(whole)  # identical results


@pytest.mark.slow  # 37 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_a_train_point_killed_after_training_is_not_trained_again(tmp_path):
    """A driver stopped between a point's training (summary.json written) and its result.json: the next
    driver reads the finished run (a finished run is not resumed) and writes the same result."""
    from nope_interp.sweep import load_spec, run_sweep

    text = ("[sweep]\nname='t'\nkind='train'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\nsteps=4\n"
            "batch_size=4\nn_train=60\nn_test=20\neval_every=2\neval_n=5\ncheckpoint_every=2\nwarmup_steps=1\n"
            "analyze_n_prompts=4\n")
    spec = load_spec(_write(tmp_path, text))
    assert run_sweep(spec, tmp_path / "o", workers=1, progress=False).done == 1
    (point,) = [p for p in (tmp_path / "o" / "points").iterdir() if p.is_dir()]
    first = json.loads((point / "result.json").read_text())
    (point / "result.json").unlink()
    ckpt = point / "run" / "checkpoint.pt"
    before = ckpt.read_bytes()
    status = run_sweep(spec, tmp_path / "o", workers=1, progress=False)
    assert (status.done, status.failed) == (1, 0)
    again = json.loads((point / "result.json").read_text())
    assert ckpt.read_bytes() == before  # not trained again
    wall = again["metrics"].pop("wall_time_s")
    assert wall == pytest.approx(first["metrics"].pop("wall_time_s"), abs=0.05)  # summary.json keeps 0.1 s
    assert again["metrics"] == first["metrics"]
    # a summary that says nothing finished (here: empty) is not taken as the result: the run is resumed from
    # its checkpoint at the last step, which only scores the test set again and rewrites the summary
    (point / "result.json").unlink()
    (point / "run" / "summary.json").write_text("{}")
    assert run_sweep(spec, tmp_path / "o", workers=1, progress=False).done == 1
    third = json.loads((point / "result.json").read_text())
    assert third["metrics"]["test_acc"] == first["metrics"]["test_acc"]
    assert json.loads((point / "run" / "summary.json").read_text())["steps"] == 4


@pytest.mark.slow  # 23 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_a_failed_point_is_recorded_and_the_others_finish(tmp_path):
    from nope_interp.sweep import load_spec, read_results, run_sweep

    text = ("[sweep]\nname='f'\nkind='init'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\n"
            "[axes]\nn_prompts=[4, 5000]\n")  # only 100 one-digit prompts exist: the second point fails
    spec = load_spec(_write(tmp_path, text))
    status = run_sweep(spec, tmp_path / "o", workers=1, progress=False)
    assert (status.done, status.failed) == (1, 1)
    rows, missing, failed, unreadable = read_results(spec, tmp_path / "o")
    assert len(rows) == 1 and not missing and len(failed) == 1 and not unreadable
    err = json.loads((tmp_path / "o" / "points" / failed[0] / "error.json").read_text())
    assert "NopeInterpError" in err["error"] and "5000" in err["error"] and "Traceback" in err["traceback"]
    again = run_sweep(spec, tmp_path / "o", workers=1, progress=False)  # failed points are retried
    assert (again.done, again.skipped, again.failed) == (0, 1, 1)


@pytest.mark.slow  # 12 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_report_aggregates_over_seeds_with_an_independent_mean(tmp_path):
    import statistics

    from conftest import assert_lists_every_file, assert_strict_json_files

    from nope_interp.sweep import load_spec, report, run_sweep, write_report

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    with pytest.raises(Exception, match="no finished point"):
        report(spec, tmp_path / "o")
    run_sweep(spec, tmp_path / "o", workers=2, progress=False)
    rep = report(spec, tmp_path / "o")
    assert rep.group_by == ("model_n_layers",) and len(rep.rows) == 2
    for row in rep.rows:
        vals = [json.loads((tmp_path / "o" / "points" / p.key / "result.json").read_text())["metrics"]["L0_z"]
                for p in spec.points if p.fields["model_n_layers"] == row["model_n_layers"]]
        assert row["n_seeds"] == 2
        assert row["L0_z_mean"] == pytest.approx(statistics.mean(vals))
        assert row["L0_z_std"] == pytest.approx(statistics.stdev(vals))
    paths = write_report(rep, tmp_path / "out")
    assert {p.name for p in paths} == {"report.csv", "report.md", "points.csv", "report.json", "model_n_layers.html",
                                       "plotly.min.js"}
    assert_lists_every_file(paths, tmp_path / "out")  # before: the plotly.min.js the figures load was left out
    assert_strict_json_files(tmp_path / "out" / "results")
    assert "| model_n_layers |" in (tmp_path / "out/results/sweeps/t/report.md").read_text()


def test_report_counts_the_values_it_aggregates_and_names_the_gaps(tmp_path):
    """A null or a string where a metric should be is left out of that metric's mean, its (n) says so, a
    warning names the point, and the columns keep their order."""
    import statistics

    from nope_interp.errors import NopeInterpWarning
    from nope_interp.sweep import load_spec, report

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    k = [p.key for p in spec.points]  # (layers 1, seed 0), (1, 1), (2, 0), (2, 1)
    metrics = {k[0]: {"L0_z": None, "last_z": 0.5, "scores": {"a": 1.0}}, k[1]: {"L0_z": 0.75, "last_z": 0.25},
               k[2]: {"L0_z": 0.25, "last_z": "oops"}, k[3]: {"L0_z": 0.75, "last_z": 0.5}}
    _fake_results(spec, tmp_path / "o", metrics)
    with pytest.warns(NopeInterpWarning, match="missing or non-finite") as caught:
        rep = report(spec, tmp_path / "o")
    message = " ".join(str(w.message) for w in caught)
    assert f"{k[0]} (L0_z)" in message and f"{k[2]} (last_z)" in message and k[1] not in message
    assert rep.metrics == ("L0_z", "last_z", "seconds", "peak_mib")  # stable, though the first point's L0_z is null
    assert rep.gaps == {k[0]: ("L0_z",), k[2]: ("last_z",)}
    one, two = rep.rows
    assert (one["n_seeds"], one["L0_z_n"], one["last_z_n"]) == (2, 1, 2)
    assert (two["n_seeds"], two["L0_z_n"], two["last_z_n"]) == (2, 2, 1)
    assert one["L0_z_mean"] == 0.75 and two["L0_z_mean"] == pytest.approx(statistics.mean([0.25, 0.75]))
    md = rep.markdown()
    # one value: the mean alone, its spread undefined (before: "0.750 ± 0.000 (1)")
    assert "| 1 | 0.750 (1) | 0.375 ± 0.177 (2) |" in md
    assert "| 2 | 0.500 ± 0.354 (2) | 0.500 (1) |" in md
    assert "not clipped" in md  # the CI is a t-interval on few seeds: said in the table's header


def test_a_one_seed_report_shows_the_mean_alone_and_lists_every_file_it_wrote(tmp_path):
    """One seed per configuration: each cell reads ``mean (1)`` (before: ``mean ± 0.000 (1)``, a spread one value
    does not have); the paths returned are every file written, the figures' plotly.min.js too (before: left out)."""
    from conftest import assert_lists_every_file

    from nope_interp.sweep import load_spec, report, write_report

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4).replace("seed = [0, 1]", "seed = [0]")))
    k = [p.key for p in spec.points]  # layers 1, layers 2
    _fake_results(spec, tmp_path / "o", {k[0]: {"L0_z": 0.75}, k[1]: {"L0_z": 0.5}})
    paths = write_report(report(spec, tmp_path / "o"), tmp_path / "out")
    assert_lists_every_file(paths, tmp_path / "out")
    assert paths[-1] == tmp_path / "out" / "figures" / "sweeps" / "t" / "plotly.min.js"
    md = (tmp_path / "out" / "results" / "sweeps" / "t" / "report.md").read_text()
    assert "| 1 | 0.750 (1) | 1.000 (1) | 100.000 (1) |" in md and "| 2 | 0.500 (1) |" in md
    assert "± 0.000" not in md


def test_a_point_whose_folder_cannot_be_made_fails_alone_and_a_blocked_points_folder_stops_first(tmp_path):
    """A file where a point's folder goes: that point is a failed outcome naming the folder (no traceback, the
    other points are not stopped); a file where the points folder goes: one line before anything is written."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec, run_point, run_sweep

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    blocked = spec.points[0]
    (tmp_path / "o" / "points").mkdir(parents=True)
    (tmp_path / "o" / "points" / blocked.key).write_text("not a folder")
    out = run_point(spec.kind, blocked.fields, str(tmp_path / "o"))
    assert out["status"] == "failed" and f"points/{blocked.key}" in out["error"] and "\n" not in out["error"]
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "points").write_text("not a folder")
    with pytest.raises(NopeInterpError, match="sweep points folder"):
        run_sweep(spec, tmp_path / "p", workers=1, progress=False)
    assert sorted(x.name for x in (tmp_path / "p").iterdir()) == ["points"]  # no spec.toml, no lock


@pytest.mark.slow  # 23 s with both cores training (2026-12-03), like the other train-point tests
def test_a_train_point_cut_short_before_its_first_checkpoint_starts_again(tmp_path):
    """A worker killed before the first checkpoint leaves run/ with its config and kept step-0 weights but no
    checkpoint: the next attempt starts that run afresh (it failed on every rerun before) and says so."""
    from nope_interp.sweep import load_spec, run_point

    text = ("[sweep]\nname='t'\nkind='train'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\nsteps=4\n"
            "batch_size=4\nn_train=60\nn_test=20\neval_every=2\neval_n=5\ncheckpoint_every=2\nwarmup_steps=1\n"
            "analyze_n_prompts=0\n")
    (point,) = load_spec(_write(tmp_path, text)).points
    run = tmp_path / "o" / "points" / point.key / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "checkpoints" / "step_000000.safetensors").write_bytes(b"cut short")
    out = run_point("train", point.fields, str(tmp_path / "o"))
    assert out["status"] == "done", out
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert "stopped before its first checkpoint" in (run.parent / "attempts.log").read_text()


@pytest.mark.parametrize("blocked", ["figures/sweeps/t", "results/sweeps/t", "figures/sweeps/t/model_n_layers.html",
                                     "results/sweeps/t/report.json", "figures/sweeps/t/plotly.min.js"])
def test_a_report_that_cannot_be_written_writes_nothing(tmp_path, blocked):
    """A file where a report folder goes, or a folder where a report file goes: refused before the first file
    (the results were written before the figures' folder failed)."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec, report, write_report

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    _fake_results(spec, tmp_path / "o", {p.key: {"L0_z": 0.5} for p in spec.points})
    rep = report(spec, tmp_path / "o")
    target = tmp_path / "out" / blocked
    if blocked.endswith((".html", ".json", ".js")):
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True)
        target.write_text("not a folder")
    before = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*"))
    with pytest.raises(NopeInterpError, match="sweep report"):
        write_report(rep, tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*")) == before


def test_a_metric_never_overwrites_the_configured_field_it_shares_a_name_with(tmp_path):
    """A train sweep over ``steps`` whose points stopped early: the steps taken (``steps`` in results written
    before it was ``steps_taken``) must not replace the configured steps, or the report would merge the
    configurations; any other metric named like a varied field is kept as ``<name>_measured``."""
    from nope_interp.sweep import load_spec, read_results, report

    text = ("[sweep]\nname='s'\nkind='train'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\n"
            "n_train=60\nn_test=20\neval_n=5\n[axes]\nsteps=[4, 8]\nlr=[0.001, 0.002]\nseed=[0, 1]\n")
    spec = load_spec(_write(tmp_path, text))
    metrics = {}
    for n, p in enumerate(spec.points):  # every point stopped early at step 2; half wrote the old name
        taken = {"steps": 2} if n % 2 else {"steps_taken": 2}
        metrics[p.key] = {"test_acc": 0.5 + n / 100, **taken, "lr": 0.123}
    _fake_results(spec, tmp_path / "o", metrics)
    rows = read_results(spec, tmp_path / "o").rows
    for row, p in zip(rows, spec.points, strict=True):
        assert (row["steps"], row["lr"], row["steps_taken"], row["lr_measured"]) == (
            p.fields["steps"], p.fields["lr"], 2, 0.123)
    rep = report(spec, tmp_path / "o")
    assert sorted((r["steps"], r["lr"]) for r in rep.rows) == [(4, 0.001), (4, 0.002), (8, 0.001), (8, 0.002)]
    assert all(r["n_seeds"] == 2 and r["steps_taken_mean"] == 2 for r in rep.rows)


@pytest.mark.slow  # 14 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
@pytest.mark.parametrize(("content", "why"), [("{trunc", "not readable JSON"), ("[1, 2]", "not a JSON object"),
                                              ('{"key": "0000000000000000", "metrics": {}, "seconds": 1, '
                                               '"peak_mib": 1}', "does not match its point"),
                                              ('{"metrics": {}, "seconds": 1, "peak_mib": 1}', "does not match"),
                                              ("KEY", "missing or malformed metrics"), (None, "a folder")])
def test_an_unreadable_result_is_reported_as_such_not_as_not_run(tmp_path, content, why):
    from nope_interp.errors import NopeInterpWarning
    from nope_interp.sweep import load_spec, read_results, report

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    out = tmp_path / "o"
    _fake_results(spec, out, {p.key: {"L0_z": 0.5} for p in spec.points})
    bad = out / "points" / spec.points[0].key / "result.json"
    bad.unlink()
    if content is None:
        bad.mkdir()
    else:
        bad.write_text(content.replace("KEY", json.dumps({"key": spec.points[0].key, "metrics": 1, "seconds": 1,
                                                          "peak_mib": 1})))
    got = read_results(spec, out)
    assert got.missing == [] and got.failed == [] and len(got.rows) == 3
    assert list(got.unreadable) == [spec.points[0].key] and why in got.unreadable[spec.points[0].key]
    assert str(bad) in got.unreadable[spec.points[0].key] and "\n" not in got.unreadable[spec.points[0].key]
    with pytest.warns(NopeInterpWarning, match="unreadable") as caught:
        rep = report(spec, out)
    assert any(str(bad) in str(w.message) for w in caught)
    assert rep.missing == () and rep.unreadable == got.unreadable
    if content == "{trunc":  # the CLI's summary line counts it too
        cli = _cli("sweep-report", str(_write(tmp_path, SPEC.format(n_prompts=4))), "--out-dir", str(out),
                   "--out-root", str(tmp_path / "r"))
        assert cli.returncode == 0, cli.stderr[-2000:]
        assert "3 of 4 points finished (0 failed, 0 not run, 1 with an unreadable result.json)" in cli.stdout


@pytest.mark.slow  # 11 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_peak_memory_is_each_points_own(tmp_path):
    """With one worker, a small point after a large one reports its own peak, not the large one's. Run in a
    fresh process, as a sweep worker is: in this test process the memory freed by earlier tests stays resident
    and a point's allocations can fit inside it, so no point would raise the peak above the reset level."""
    from nope_interp.sweep import reset_peak_memory

    if not reset_peak_memory():
        pytest.skip("this system cannot reset a process's peak memory (/proc/self/clear_refs)")
    script = f"""
import json
from pathlib import Path
from nope_interp.sweep import peak_memory_mib, reset_peak_memory, run_point

block = b"\\x01" * (200 << 20)  # 200 MiB, touched
high = peak_memory_mib(True)
del block
assert reset_peak_memory()
assert peak_memory_mib(True) < high - 150  # the helper itself
peaks = {{}}
for d_model in (1024, 32):
    out = run_point("init", {{"preset": "tiny", "task": "reversal", "n_prompts": 4, "model_d_model": d_model,
                             "model_n_layers": 2}}, {str(tmp_path)!r})
    result = json.loads((Path({str(tmp_path)!r}) / "points" / out["key"] / "result.json").read_text())
    assert result["peak_scope"] == "point"
    peaks[d_model] = result["peak_mib"]
print(json.dumps(peaks))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    peaks = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    assert peaks[32] < peaks[1024] - 40, peaks  # ~100 MiB of weights at d_model 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A real single-node Ray head on 127.0.0.1 with token auth, its own temp dir and HOME; stopped by ending
    only the processes it started (its process group), never with a machine-wide ``ray stop``."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray_bin, "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    port = _free_port()
    temp = Path("/tmp") / f"rt{os.getpid()}{port}"  # Ray's socket paths must stay short
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=false",
                             "--disable-usage-stats"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if head.poll() is not None:
                pytest.fail(f"ray start exited with {head.returncode}")
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "env": env}
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # ray start --block stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


@pytest.mark.slow  # 50 s on 2 free cores, 32 s of them stopping the Ray head (README, "Test timing")
def test_the_same_sweep_on_a_ray_head_equals_the_local_pool(tmp_path, ray_head):
    spec = _write(tmp_path, SPEC.format(n_prompts=6))
    _in_process(spec, tmp_path / "local")
    on_ray = _cli("sweep", str(spec), "--out-dir", str(tmp_path / "ray"), "--executor", "ray", "--ray-address",
                  ray_head["address"], "--no-progress", "--workers", "1", env=ray_head["env"])
    assert on_ray.returncode == 0, on_ray.stderr[-2000:]
    assert "4 ran" in on_ray.stdout and "(ray, 1 at a time)" in on_ray.stdout
    spans = []  # --workers 1 caps the head's 2 CPUs at one point at a time: no two points overlap
    for log in (tmp_path / "ray").glob("points/*/attempts.log"):
        times = {line.split()[0]: float(line.split()[1]) for line in log.read_text().splitlines()}
        spans.append((times["start"], times["done"]))
    spans.sort()
    assert len(spans) == 4 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert _metrics(tmp_path / "ray") == _metrics(tmp_path / "local")
    assert _done_counts(tmp_path / "ray") == {k: 1 for k in _done_counts(tmp_path / "local")}
    hosts = {json.loads(p.read_text())["pid"] for p in (tmp_path / "ray").glob("points/*/result.json")}
    assert os.getpid() not in hosts  # the points ran in Ray workers


@pytest.mark.slow  # 12 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_a_gpu_spec_runs_its_points_on_cuda_and_fails_them_loudly_without_one(tmp_path):
    import torch

    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec, point_device, run_point

    cpu = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    gpu = load_spec(_write(tmp_path, SPEC.format(n_prompts=4) + "\n[resources]\nnum_gpus = 1\n", "gpu.toml"))
    assert (point_device(cpu), point_device(gpu)) == ("cpu", "cuda")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal needs one without")
    point = gpu.points[0]
    out = run_point(gpu.kind, point.fields, str(tmp_path / "o"), device=point_device(gpu))
    assert out["status"] == "failed" and "sees no CUDA device" in out["error"]
    assert "num_gpus" in json.loads((tmp_path / "o" / "points" / point.key / "error.json").read_text())["error"]
    assert not (tmp_path / "o" / "points" / point.key / "result.json").exists()
    assert run_point(cpu.kind, point.fields, str(tmp_path / "c"))["status"] == "done"
    assert json.loads((tmp_path / "c" / "points" / point.key / "result.json").read_text())["device"] == "cpu"
    for bad in ("gpu", "cuda:0", "CUDA", ""):  # a caller's error, not the point's
        with pytest.raises(NopeInterpError, match="device must be one of cpu, cuda"):
            run_point(cpu.kind, point.fields, str(tmp_path / "d"), device=bad)
    assert not (tmp_path / "d").exists()
    # the local pool refuses a GPU spec on a machine without CUDA before anything starts or is written
    got = _cli("sweep", str(gpu.path), "--out-dir", str(tmp_path / "g"), "--no-progress")
    assert got.returncode == 2 and got.stderr.strip().count("\n") == 0, got.stderr
    assert "num_gpus = 1 runs its points on cuda, but this machine sees no CUDA device" in got.stderr
    assert not (tmp_path / "g").exists()


@pytest.mark.slow  # 12 s on 2 free cores (2026-12-02): keeps the default run near 10 minutes (README, "Test timing")
def test_ray_executor_with_an_unreachable_address_is_one_line(tmp_path):
    spec = _write(tmp_path, SPEC.format(n_prompts=4))
    got = _cli("sweep", str(spec), "--out-dir", str(tmp_path / "o"), "--executor", "ray", "--ray-address",
               f"127.0.0.1:{_free_port()}", "--no-progress", timeout=300)
    assert got.returncode == 2
    assert got.stderr.strip().count("\n") == 0 and "Ray cluster" in got.stderr
    assert not (tmp_path / "o").exists()  # nothing written before the check


@pytest.mark.parametrize("content", ["{trunc", "[1, 2]", '{"metrics": {}}',
                                     '{"metrics": 1, "seconds": 1, "peak_mib": 1}', None])
def test_a_corrupt_result_file_is_not_a_finished_point(tmp_path, content):
    """A truncated or foreign result.json (or a folder of that name) means the point runs again; it is never
    read as a result (sweep-report) nor taken as finished (resume, demo --from-sweep)."""
    from nope_interp.sweep import finished_result, load_spec, read_results

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    pdir = tmp_path / "out" / "points" / spec.points[0].key
    pdir.mkdir(parents=True)
    if content is None:
        (pdir / "result.json").mkdir()
    else:
        (pdir / "result.json").write_text(content)
    assert finished_result(pdir) is None
    rows, missing, failed, unreadable = read_results(spec, tmp_path / "out")
    assert rows == [] and spec.points[0].key in unreadable and spec.points[0].key not in missing and failed == []
    if content is None:
        (pdir / "result.json").rmdir()
    (pdir / "result.json").write_text('{"metrics": {"L0_z": 0.9}, "seconds": 1.5, "peak_mib": 100}')
    assert finished_result(pdir) is None  # no key: not this point's result
    (pdir / "result.json").write_text(json.dumps({"key": pdir.name, "metrics": {"L0_z": 0.9}, "seconds": 1.5,
                                                  "peak_mib": 100}))
    assert finished_result(pdir)["metrics"] == {"L0_z": 0.9}


def test_a_rewritten_report_drops_stale_axis_figures_and_warns_about_another_sweep_folder(tmp_path):
    """Before: an axis removed from the spec left its figure beside the new report, and a sweep of the same name
    in another --out-dir overwrote the report without a word."""
    import warnings

    from nope_interp.errors import NopeInterpWarning
    from nope_interp.sweep import load_spec, report, write_report

    two_axes = SPEC.format(n_prompts=4).replace("seed = [0, 1]", "model_d_model = [16, 32]\nseed = [0, 1]")
    spec = load_spec(_write(tmp_path, two_axes))
    _fake_results(spec, tmp_path / "o", {p.key: {"L0_z": 0.5} for p in spec.points})
    write_report(report(spec, tmp_path / "o"), tmp_path / "out")
    figs = tmp_path / "out/figures/sweeps/t"
    assert {p.name for p in figs.iterdir()} >= {"model_n_layers.html", "model_d_model.html"}
    (tmp_path / "b").mkdir()
    one_axis = load_spec(_write(tmp_path / "b", SPEC.format(n_prompts=4)))
    _fake_results(one_axis, tmp_path / "o2", {p.key: {"L0_z": 0.5} for p in one_axis.points})
    with pytest.warns(NopeInterpWarning, match=r"overwriting .*the report of the points in .*o, with the one of .*o2"):
        write_report(report(one_axis, tmp_path / "o2"), tmp_path / "out")
    assert "model_d_model.html" not in {p.name for p in figs.iterdir()} and (figs / "model_n_layers.html").is_file()
    data = json.loads((tmp_path / "out/results/sweeps/t/report.json").read_text())
    assert data["points_dir"] == str((tmp_path / "o2").resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same sweep folder again: no warning
        write_report(report(one_axis, tmp_path / "o2"), tmp_path / "out")


def test_a_point_whose_result_cannot_be_written_leaves_an_error_json(tmp_path, monkeypatch):
    """Before: the point ran, then the failed write of result.json gave a failed outcome with no error.json
    (or, for metrics JSON cannot hold, a traceback out of the worker)."""
    import nope_interp.sweep as sweep_mod
    from nope_interp.sweep import load_spec, run_point

    spec = load_spec(_write(tmp_path, SPEC.format(n_prompts=4)))
    point = spec.points[0]
    monkeypatch.setattr(sweep_mod, "_run_init", lambda point, device: {"L0_z": object()})  # not JSON
    out = run_point(spec.kind, point.fields, str(tmp_path / "o"))
    assert out["status"] == "failed" and "result.json could not be written" in out["error"]
    err = json.loads((tmp_path / "o" / "points" / point.key / "error.json").read_text())
    assert "result.json could not be written" in err["error"] and "Traceback" in err["traceback"]
    assert not (tmp_path / "o" / "points" / point.key / "result.json").exists()


@pytest.mark.slow  # about 30 s: two spawned interpreters import torch
def test_a_sweep_stopped_by_sigterm_stops_its_points_and_says_what_was_kept(tmp_path):
    """Before: SIGTERM ended the driver silently and its workers only noticed its death (os._exit, no cleanup);
    now the driver stops its points (a training keeps its last checkpoint), does not wait for them to finish,
    and says in one line what was kept."""
    text = ("[sweep]\nname='t'\nkind='train'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\nsteps=1000000\n"
            "batch_size=4\nn_train=60\nn_test=20\neval_every=1000000\neval_n=5\ncheckpoint_every=5\n"
            "warmup_steps=1\nanalyze_n_prompts=4\n")
    spec = _write(tmp_path, text)
    out = tmp_path / "o"
    driver = subprocess.Popen([sys.executable, "-m", "nope_interp.cli", "sweep", str(spec), "--out-dir", str(out),
                               "--no-progress", "--workers", "1"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list(out.glob("points/*/run/checkpoint.pt")) and driver.poll() is None:
        time.sleep(0.1)
    assert driver.poll() is None, driver.stderr.read()
    workers = [p for p in _children(driver.pid) if "spawn_main" in _cmdline(p)]
    assert workers
    t0 = time.time()
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 128 + signal.SIGTERM
    assert time.time() - t0 < 60  # it did not wait for the million steps
    err = driver.stderr.read().strip().splitlines()
    assert err[-1].startswith("nope-interp: terminated (SIGTERM) (sweep); what finished is kept"), err
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers)
    (point,) = [p for p in (out / "points").iterdir() if p.is_dir()]
    assert (point / "run" / "checkpoint.pt").is_file() and not (point / "result.json").exists()


def _sleep_long() -> None:
    time.sleep(120)


@pytest.mark.slow  # about 8 s (a spawned worker imports torch); the default run stays near 10 minutes
def test_an_interrupted_local_sweep_stops_its_workers_but_not_the_callers_own_children(tmp_path, monkeypatch):
    """From a review: on Ctrl-C or SIGTERM the driver terminated every multiprocessing child of its process, so a
    notebook's own child processes were killed with the sweep's workers; now only the pool's."""
    import concurrent.futures
    import multiprocessing

    from nope_interp.sweep import _run_local, load_spec

    mine = multiprocessing.get_context("spawn").Process(target=_sleep_long, name="callers-own-child")
    mine.start()
    try:
        def interrupted(*args, **kwargs):  # Ctrl-C in the driver once the pool's worker is up
            time.sleep(5)
            raise KeyboardInterrupt

        monkeypatch.setattr(concurrent.futures, "wait", interrupted)
        spec = load_spec(Path(__file__).parents[1] / "nope_interp" / "sweeps" / "tiny-init.toml")
        before = set(multiprocessing.active_children())
        with pytest.raises(KeyboardInterrupt):
            _run_local(spec, list(spec.points[:1]), tmp_path / "o", 1, 1, False)
        time.sleep(1)
        assert mine.is_alive(), "the caller's own child was stopped with the sweep"
        assert set(multiprocessing.active_children()) <= before  # the pool's worker is gone
    finally:
        mine.terminate()
        mine.join(10)


def test_a_second_stop_during_the_stopping_of_a_local_sweep_does_not_cut_it_short(tmp_path, monkeypatch):
    """Before: a second Ctrl-C (or SIGTERM) while the driver terminated the pool's workers raised in the middle
    of that loop, and the workers after it kept training. Now the stopping holds further signals to its end."""
    import concurrent.futures
    import multiprocessing
    import os
    import signal

    from nope_interp.sweep import _run_local, load_spec

    class Worker:  # stands for a pool worker; the first one's terminate() meets a second Ctrl-C
        def __init__(self, second_stop):
            self.second_stop, self.terminated = second_stop, False

        def terminate(self):
            self.terminated = True
            if self.second_stop:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the signal is delivered here

        def join(self, timeout=None):
            pass

        def is_alive(self):
            return False

    fakes = [Worker(True), Worker(False), Worker(False)]
    real = multiprocessing.active_children
    calls = []

    def children():
        calls.append(1)
        return real() + (fakes if len(calls) > 1 else [])  # the fakes appear once the pool is up

    def interrupted(*args, **kwargs):
        time.sleep(2)
        raise KeyboardInterrupt

    monkeypatch.setattr(multiprocessing, "active_children", children)
    monkeypatch.setattr(concurrent.futures, "wait", interrupted)
    spec = load_spec(Path(__file__).parents[1] / "nope_interp" / "sweeps" / "tiny-init.toml")
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_IGN under nohup or a CI runner
    try:
        with pytest.raises(KeyboardInterrupt):
            _run_local(spec, list(spec.points[:1]), tmp_path / "o", 1, 1, False)
        assert [w.terminated for w in fakes] == [True, True, True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored after the stopping
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_signals_held_records_ctrl_c_and_sigterm_and_restores_the_handlers():
    import os
    import signal

    from nope_interp.errors import signals_held

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with signals_held() as got:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    assert sorted(got) == sorted([signal.SIGINT, signal.SIGTERM])
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_worker_that_does_not_end_after_sigterm_is_killed():
    """From a review: SIGTERM can end an idle pool worker while it holds the pool's queue lock; a training
    worker that then returns to the queue blocked on it forever, and the stopped sweep never exited. Workers
    still alive after the grace period are killed."""
    from nope_interp.sweep import _stop_workers

    class Worker:
        def __init__(self, ends_on_term):
            self.ends_on_term, self.alive, self.calls = ends_on_term, True, []

        def terminate(self):
            self.calls.append("terminate")
            self.alive = not self.ends_on_term

        def join(self, timeout=None):
            self.calls.append("join")

        def is_alive(self):
            return self.alive

        def kill(self):
            self.calls.append("kill")
            self.alive = False

    ends, stuck = Worker(True), Worker(False)
    t0 = time.monotonic()
    _stop_workers({ends, stuck}, grace_s=0.1)
    assert time.monotonic() - t0 < 5
    assert ends.calls == ["terminate", "join"] and "kill" in stuck.calls and not stuck.alive


_WARNING_POINT = ("[sweep]\nname='w'\nkind='train'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\nsteps=4\n"
                  "batch_size=4\nn_train=60\nn_test=20\neval_every=2\neval_n=5\ncheckpoint_every=2\nwarmup_steps=4\n"
                  "analyze_n_prompts=4\n[axes]\nseed=[0, 1]\n")  # warmup_steps >= steps: a ScheduleWarning


def test_a_points_warnings_are_recorded_not_printed(tmp_path, capfd):
    """Before: a point's warnings (here a schedule whose warmup is the whole run) came out of the worker in
    Python's two-line format, once per point, between the bar's lines. Now run_point records each distinct one
    once in result.json and in its outcome, and prints nothing."""
    from nope_interp.sweep import load_spec, run_point

    spec = load_spec(_write(tmp_path, _WARNING_POINT))
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always")
        outcome = run_point(spec.kind, spec.points[0].fields, str(tmp_path / "o"))
    assert outcome["status"] == "done" and outside == []  # nothing leaves the point as a warning
    assert "ScheduleWarning" not in capfd.readouterr().err
    (said,) = outcome["warnings"]
    assert said["category"] == "ScheduleWarning" and "warmup_steps=4 >= steps=4" in said["message"]
    result = json.loads((tmp_path / "o" / "points" / outcome["key"] / "result.json").read_text())
    assert result["warnings"] == outcome["warnings"]


def test_point_warnings_are_distinct_and_reported_once_with_their_category():
    import warnings as w

    from nope_interp.errors import DegenerateInputWarning, ScheduleWarning
    from nope_interp.sweep import point_warnings, report_point_warnings

    def msg(category, text):
        return w.WarningMessage(category(text), category, "f.py", 1)

    caught = [msg(ScheduleWarning, "short\nschedule"), msg(ScheduleWarning, "short  schedule"),
              msg(ScheduleWarning, "short\nschedule"), msg(FutureWarning, "old")]
    assert point_warnings(caught) == [{"category": "ScheduleWarning", "message": "short schedule"},
                                      {"category": "ScheduleWarning", "message": "short  schedule"},
                                      {"category": "FutureWarning", "message": "old"}]
    outcomes = [{"key": f"k{i}", "status": "done", "warnings": [{"category": "DegenerateInputWarning",
                                                                   "message": "flat"}]} for i in range(5)]
    outcomes += [{"key": "k9", "status": "failed", "warnings": [{"category": "FutureWarning", "message": "old"},
                                                               {"category": "SomeLibWarning", "message": "x"}]},
                 {"key": "k8", "status": "skipped", "seconds": 0.0}]
    with w.catch_warnings(record=True) as got:
        w.simplefilter("always")
        report_point_warnings(outcomes)
    assert [(g.category, str(g.message)) for g in got] == [
        (DegenerateInputWarning, "5 point(s) (k0, k1, k2, ...) warned: flat"),
        (FutureWarning, "1 point(s) (k9) warned: old"),
        (UserWarning, "1 point(s) (k9) warned: x")]


@pytest.mark.slow  # two points in a pool of 2: about 15 s
def test_a_sweeps_point_warnings_come_out_once_in_one_line(tmp_path):
    spec = _write(tmp_path, _WARNING_POINT)
    proc = _cli("sweep", str(spec), "--out-dir", str(tmp_path / "o"), "--workers", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nope-interp: warning: 2 point(s) ("), proc.stderr
    assert "warmup_steps=4 >= steps=4" in lines[0]


def test_a_local_sweeps_workers_ignore_ctrl_c_from_their_start():
    """Before: a Ctrl-C at a terminal (SIGINT to the whole foreground group) while the pool's workers were still
    importing printed their KeyboardInterrupt tracebacks under the driver's one line (reproduced: 2 of 8 stops
    at 7 and 9 s). A worker is now started with SIGINT blocked and ignores it once initialised (the driver
    stops its workers itself). Checked in a real spawn worker; and a Ctrl-C meant for the driver during the
    submit is delivered right after it, the driver's mask restored."""
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor

    from nope_interp.sweep import _submit_shielded, _warm_worker

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_warm_worker,
                             initargs=(1, os.getpid())) as pool:
        handler = _submit_shielded(pool, signal.getsignal, signal.SIGINT).result(timeout=300)
        mask = _submit_shielded(pool, signal.pthread_sigmask, signal.SIG_BLOCK, []).result(timeout=60)
    assert handler == signal.SIG_IGN and signal.SIGINT not in mask
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before

    class Pool:  # a Ctrl-C while submit runs
        def submit(self, fn, *args):
            os.kill(os.getpid(), signal.SIGINT)
            return "submitted"

    # Python's own Ctrl-C handler for the check: a test run started in the background (nohup ... &) inherits
    # SIGINT ignored, and then no KeyboardInterrupt could come
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _submit_shielded(Pool(), print)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_an_error_filter_fails_the_point_as_before_and_the_report_never_raises(tmp_path):
    """Under warnings-as-errors a point's warning fails the point (one recorded failure, as before the
    warnings were recorded); and a report warning that a filter turns into an error after the work is done goes
    to the log as one line, not a traceback."""
    from nope_interp.sweep import load_spec, report_point_warnings, run_point

    spec = load_spec(_write(tmp_path, _WARNING_POINT))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = run_point(spec.kind, spec.points[0].fields, str(tmp_path / "o"))
        assert outcome["status"] == "failed" and "ScheduleWarning" in outcome["error"]
        lines = []
        report_point_warnings([{"key": "k", "status": "done",
                                "warnings": [{"category": "ScheduleWarning", "message": "short"}]}], log=lines.append)
    assert lines == ["warning: 1 point(s) (k) warned: short"]
