"""Benchmark: the same sweep on the local process pool and on a single-node Ray head (wall time per point).

Runs a spec (default: ``init-std-grid`` restricted to ``--points`` points, written to a temporary folder) twice
with the same number of workers: ``nope-interp sweep --executor local --workers W`` and, on a Ray head started
here on 127.0.0.1 with W CPUs (token auth, its own temporary HOME; stopped by ending only the processes it
started), ``--executor ray``. Prints the wall time of each (including the driver's start-up and, for Ray,
the connection; not the head's start), the time per point, the Ray / local ratio, and the peak memory of
the points (from their ``result.json``).

Usage: .venv/bin/python bench/sweep_overhead.py [--points 16] [--workers 2]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """
[sweep]
name = "overhead"
kind = "init"
[base]
preset = "cpu"
task = "reversal"
n_prompts = 64
[axes]
seed = {seeds}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sweep(spec: Path, out: Path, env: dict, *extra: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nope_interp.cli", "sweep", str(spec), "--out-dir", str(out),
                    "--no-progress", *extra], env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def _peak(out: Path) -> float:
    return max(json.loads(p.read_text())["peak_mib"] for p in out.glob("points/*/result.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        spec = tmp / "spec.toml"
        spec.write_text(SPEC.format(seeds=list(range(args.points))))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t_local = _sweep(spec, tmp / "local", env, "--workers", str(args.workers))
        home = tmp / "home"
        home.mkdir()
        ray_env = {**env, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                   "RAY_USAGE_STATS_ENABLED": "0"}
        ray_bin = str(Path(sys.executable).parent / "ray")
        subprocess.run([ray_bin, "get-auth-token", "--generate"], env=ray_env, check=True, capture_output=True)
        port = _free_port()
        head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                                 f"--port={port}", f"--num-cpus={args.workers}", f"--temp-dir=/tmp/rb{port}",
                                 "--include-dashboard=false", "--disable-usage-stats"], env=ray_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            t0 = time.perf_counter()
            while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                time.sleep(0.5)
            t_head = time.perf_counter() - t0
            t_ray = _sweep(spec, tmp / "ray", ray_env, "--executor", "ray", "--ray-address", f"127.0.0.1:{port}")
        finally:
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(timeout=60)
            subprocess.run(["rm", "-rf", f"/tmp/rb{port}"], check=False)
        n = args.points
        print(f"sweep overhead benchmark: {n} init points (cpu preset, 64 prompts), {args.workers} workers")
        print(f"{'executor':>9} {'wall s':>8} {'s/point':>8} {'peak MiB/point':>15}")
        print(f"{'local':>9} {t_local:>8.1f} {t_local / n:>8.2f} {_peak(tmp / 'local'):>15.0f}")
        print(f"{'ray':>9} {t_ray:>8.1f} {t_ray / n:>8.2f} {_peak(tmp / 'ray'):>15.0f}")
        print(f"ray / local wall time: {t_ray / t_local:.2f}x; Ray overhead per point: "
              f"{(t_ray - t_local) / n:+.2f} s (head start-up, not counted: {t_head:.1f} s)")


if __name__ == "__main__":
    main()
