"""Files on disk: atomic writes, JSON, safetensors weights, the run-directory layout, provenance.

A run directory ``runs/<name>/`` holds ``config.json`` (model, task, training, the command),
``model.safetensors`` (final or latest weights), ``checkpoints/step_NNNNNN.safetensors`` (weights only, at
the log-spaced steps of :func:`nope_interp.train.log_spaced_steps`), ``checkpoint.pt`` (weights + optimizer + step, for
``--resume``), ``metrics.jsonl`` (one JSON object per evaluation) and ``summary.json`` (when finished).
Every write goes to a temporary file in the same directory and is renamed into place, so an
interrupted write never leaves a half-written file.
"""

import csv
import io as _io
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from nope_interp.errors import NopeInterpError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
#: Weights kept at log-spaced steps (``step_000250.safetensors``), for the adjacency-through-training job.
TRAJECTORY_DIR = "checkpoints"


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file + rename). Returns the path."""
    return _atomic(Path(path), lambda tmp: Path(tmp).write_text(text))


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path, what: str = "file") -> Any:
    """Read JSON, raising NopeInterpError (naming the path) if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise NopeInterpError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise NopeInterpError(f"{what} is corrupt (not valid JSON): {path}: {err}") from None


def save_weights(path: str | Path, state_dict: dict[str, torch.Tensor]) -> Path:
    """Save a state dict as safetensors, atomically."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    return _atomic(Path(path), lambda tmp: save_file(tensors, tmp))


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Load safetensors weights; NopeInterpError if missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise NopeInterpError(f"weights not found: {path}")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises several types for a damaged file
        raise NopeInterpError(f"weights are corrupt: {path}: {err}") from None


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save`` atomically."""
    return _atomic(Path(path), lambda tmp: torch.save(obj, tmp))


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON record to a JSONL file (rewritten atomically; the files stay small)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    atomic_write_text(path, old + json.dumps(record) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file ([] if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise NopeInterpError(f"metrics file is corrupt: {path}: {err}") from None


def job_dirs(out_root: str | Path, job: str) -> tuple[Path, Path]:
    """``(out_root/results/<job>, out_root/figures/<job>)``: where every analysis job writes (not created here)."""
    root = Path(out_root)
    return root / "results" / job, root / "figures" / job


def provenance() -> dict[str, str | None]:
    """The package version and the git commit of the working tree (None outside a checkout)."""
    from nope_interp import __version__

    commit = None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        if out.returncode == 0:
            commit = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"nope_interp_version": __version__, "git_commit": commit}


def to_csv(rows: list[dict[str, Any]]) -> str:
    """CSV text with the union of the rows' keys as columns (missing cells empty)."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = _io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
