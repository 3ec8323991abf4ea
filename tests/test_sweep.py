"""Sweeps: spec validation, stable keys, the local pool (killed and resumed), failures, the report, and a real
single-node Ray head on the loopback address."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
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
    assert sizes == {"init-size-grid": 180, "init-std-grid": 90, "trained-seeds": 12, "tiny-init": 4}



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
])
def test_bad_specs_give_one_line_errors(tmp_path, text, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import load_spec

    with pytest.raises(NopeInterpError, match=match) as info:
        load_spec(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_bad_spec_on_the_command_line_is_exit_2_and_one_line(tmp_path):
    from nope_interp.cli import main

    path = _write(tmp_path, "[sweep]\nname='t'\nkind='init'\n[base]\ntask='reversal'\n[axes]\nseed=[]\n")
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "o")]) == 2
    assert main(["sweep", "no-such-spec"]) == 2
    assert main(["sweep", str(path), "--executor", "slurm"]) == 2
    assert not (tmp_path / "o").exists()


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


def test_a_failed_point_is_recorded_and_the_others_finish(tmp_path):
    from nope_interp.sweep import load_spec, read_results, run_sweep

    text = ("[sweep]\nname='f'\nkind='init'\n[base]\npreset='tiny'\ntask='addition'\nn_digits=1\n"
            "[axes]\nn_prompts=[4, 5000]\n")  # only 100 one-digit prompts exist: the second point fails
    spec = load_spec(_write(tmp_path, text))
    status = run_sweep(spec, tmp_path / "o", workers=1, progress=False)
    assert (status.done, status.failed) == (1, 1)
    rows, missing, failed = read_results(spec, tmp_path / "o")
    assert len(rows) == 1 and not missing and len(failed) == 1
    err = json.loads((tmp_path / "o" / "points" / failed[0] / "error.json").read_text())
    assert "TaskError" in err["error"] and "Traceback" in err["traceback"]
    again = run_sweep(spec, tmp_path / "o", workers=1, progress=False)  # failed points are retried
    assert (again.done, again.skipped, again.failed) == (0, 1, 1)


def test_report_aggregates_over_seeds_with_an_independent_mean(tmp_path):
    import statistics

    from conftest import assert_strict_json_files

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
    assert {p.name for p in paths} == {"report.csv", "report.md", "points.csv", "report.json", "model_n_layers.html"}
    assert_strict_json_files(tmp_path / "out" / "results")
    assert "| model_n_layers |" in (tmp_path / "out/results/sweeps/t/report.md").read_text()


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


def test_the_same_sweep_on_a_ray_head_equals_the_local_pool(tmp_path, ray_head):
    spec = _write(tmp_path, SPEC.format(n_prompts=6))
    _in_process(spec, tmp_path / "local")
    on_ray = _cli("sweep", str(spec), "--out-dir", str(tmp_path / "ray"), "--executor", "ray", "--ray-address",
                  ray_head["address"], "--no-progress", env=ray_head["env"])
    assert on_ray.returncode == 0, on_ray.stderr[-2000:]
    assert "4 ran" in on_ray.stdout
    assert _metrics(tmp_path / "ray") == _metrics(tmp_path / "local")
    assert _done_counts(tmp_path / "ray") == {k: 1 for k in _done_counts(tmp_path / "local")}
    hosts = {json.loads(p.read_text())["pid"] for p in (tmp_path / "ray").glob("points/*/result.json")}
    assert os.getpid() not in hosts  # the points ran in Ray workers


def test_ray_executor_with_an_unreachable_address_is_one_line(tmp_path):
    spec = _write(tmp_path, SPEC.format(n_prompts=4))
    got = _cli("sweep", str(spec), "--out-dir", str(tmp_path / "o"), "--executor", "ray", "--ray-address",
               f"127.0.0.1:{_free_port()}", "--no-progress", timeout=300)
    assert got.returncode == 2
    assert got.stderr.strip().count("\n") == 0 and "Ray cluster" in got.stderr


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
    rows, missing, failed = read_results(spec, tmp_path / "out")
    assert rows == [] and spec.points[0].key in missing and failed == []
    if content is None:
        (pdir / "result.json").rmdir()
    (pdir / "result.json").write_text('{"metrics": {"L0_z": 0.9}, "seconds": 1.5, "peak_mib": 100}')
    assert finished_result(pdir)["metrics"] == {"L0_z": 0.9}
