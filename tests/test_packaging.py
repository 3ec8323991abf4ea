"""The wheel: it carries the four shipped models the demo uses and the package data, not the extra seeds or
the candidates (those stay in the repository)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_the_shipped_models_and_not_the_seeds_or_candidates(tmp_path):
    # built from a copy, so that neither a stale build/ nor the editable install's egg-info can leak files in
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("nope_interp", "tasks"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    pretrained = ROOT / "nope_interp" / "pretrained"
    shipped = {str(p.relative_to(ROOT)) for task in ("addition", "reversal", "indexing", "ordering")
               for p in (pretrained / task).iterdir()}
    assert len(shipped) >= 16 and shipped <= names
    assert not [n for n in names if "/seeds/" in n or "/candidates/" in n]
    assert {n for n in names if n.startswith("nope_interp/pretrained/")} == shipped
    assert "nope_interp/csrc/adjacency_count.c" in names
    assert "nope_interp/sweeps/trained-seeds.toml" in names and "tasks/__init__.py" in names
    # the seeds do exist in the repository, so the test above could fail
    assert list((pretrained / "seeds").glob("*/model.safetensors"))
    assert sum((ROOT / n).stat().st_size for n in shipped) < 30 * 2**20


def test_no_lock_file_is_tracked_and_git_ignores_them(tmp_path):
    """Lock files (``.<name>.lock`` beside every locked output or run directory, also inside the package when
    a maintainer's tool such as ``halve`` locks a candidate) are never content: git ignores them."""
    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not [n for n in tracked.splitlines() if Path(n).name.startswith(".") and n.endswith(".lock")]
    probes = ["nope_interp/pretrained/candidates/.x-s0.lock", "nope_interp/pretrained/seeds/.x-s1.lock",
              ".results.lock", "runs/.t.lock"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *probes], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert ignored == probes
