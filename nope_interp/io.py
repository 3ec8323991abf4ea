"""Files on disk: atomic writes, JSON, safetensors weights, the run-directory layout, provenance.

A run directory ``runs/<name>/`` holds ``config.json`` (model, task, training, the command),
``model.safetensors`` (final or latest weights), ``checkpoints/step_NNNNNN.safetensors`` (weights only, at
the log-spaced steps of :func:`nope_interp.train.log_spaced_steps`), ``checkpoint.pt`` (weights + optimizer + step, for
``--resume``), ``metrics.jsonl`` (one JSON object per evaluation) and ``summary.json`` (when finished).
Every write goes to a temporary file in the same directory and is renamed into place, so an
interrupted write never leaves a half-written file; a write that cannot happen (a file where a folder
should be, a read-only folder, a full disk) raises :class:`~nope_interp.errors.NopeInterpError`.
Commands check their output folders first (:func:`check_writable_dir`) and hold an exclusive lock on
the run or output directory they write (:func:`exclusive`); checkpoints are read with
``weights_only=True`` (:func:`load_checkpoint`), so a planted pickle never runs. Every path a function here
takes has a leading ``~`` or ``~user`` expanded (:func:`user_path`), as a shell would: ``"~/out"`` is the home
folder's ``out``, never a folder named ``~`` in the current one.
"""

import contextlib
import contextvars
import csv
import errno
import io as _io
import json
import math
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from nope_interp.checks import in_order, is_int, is_real
from nope_interp.errors import NopeInterpError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
#: Weights kept at log-spaced steps (``step_000250.safetensors``), for the adjacency-through-training job.
TRAJECTORY_DIR = "checkpoints"


def user_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path`` with a leading ``~`` or ``~user`` expanded to that home folder (as a shell does
    for an unquoted path; a quoted ``'~/x'`` reaches Python unexpanded). Any other path is returned unchanged.

    Raises:
        NopeInterpError: the home folder cannot be determined (``~`` with no ``HOME``, an unknown ``~user``).
    """
    try:
        return Path(path).expanduser()
    except RuntimeError as err:  # Path.expanduser: "Could not determine home directory."
        raise NopeInterpError(f"cannot expand '~' in the path {str(path)!r}: {err}"[:300]) from None


#: The files replaced or created by this module's atomic writes inside :func:`recording_writes` (None outside).
_WRITTEN: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("nope_interp_written", default=None)


@contextlib.contextmanager
def recording_writes() -> Iterator[list[Path]]:
    """Record, in order, every file that the atomic writes (:func:`atomic_write_text`, :func:`write_json`,
    :func:`save_weights`, :func:`save_torch`, and so every figure) complete inside the block: a write stopped
    part-way (Ctrl-C, a folder that cannot be written) can then say which files are new and which are as before,
    instead of "nothing was written". Each file is whole, old or new (temporary file + rename); a set of files
    is not replaced as one."""
    written: list[Path] = []
    token = _WRITTEN.set(written)
    try:
        yield written
    finally:
        _WRITTEN.reset(token)


def _atomic(path: Path, write: Callable[[str], None]) -> Path:
    path = user_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the folder as the operating system finds it (links followed before ".."): tempfile reads ".." as text,
        # so `link/../out` put the temporary file in ./out and the rename into the link target's out
        folder = os.path.realpath(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as err:  # a file where a folder should be, a read-only folder, ...
        raise NopeInterpError(f"cannot write {path}: {err.strerror or err}") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(folder, path.name))
        if (written := _WRITTEN.get()) is not None:
            written.append(path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno is not None:  # disk full, quota, ...
            raise NopeInterpError(f"cannot write {path}: {err.strerror or err}") from None
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file + rename). Returns the path (``~`` expanded).

    Raises:
        NopeInterpError: the file cannot be written; ``~`` in ``path`` cannot be expanded.
    """
    return _atomic(Path(path), lambda tmp: Path(tmp).write_text(text))


def json_safe(data: Any) -> Any:
    """A copy of ``data`` (dicts, lists, tuples, numbers, strings, None) in which every float NaN or
    infinity is replaced by None and every numpy scalar by the Python number it holds, so that it
    serialises as strict JSON.

    NaN and infinities are not JSON (RFC 8259); Python writes them as bare ``NaN`` / ``Infinity``, which
    strict parsers (browsers, ``jq``, most languages) refuse. In every result file ``null`` therefore
    means "undefined": a confidence interval from a single seed, a correlation or NRMSE of a constant, a
    cosine with a near-zero vector. Tuples become lists. Numpy scalars (a count from an array's shape, a
    mean from ``np.mean``, an integer argument the checks accept: :func:`~nope_interp.checks.is_int`) would
    make ``json.dumps`` fail: an ``np.integer`` becomes an ``int``, an ``np.floating`` a ``float`` (NaN and
    infinities None, as above), an ``np.bool_`` a ``bool``; numpy scalar dict keys become Python ones too.
    Arrays are left as they are (``json.dumps`` refuses them).
    """
    if isinstance(data, (bool, np.bool_)):
        return bool(data)
    if isinstance(data, np.integer):
        return int(data)
    if isinstance(data, (float, np.floating)):
        data = float(data)
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k.item() if isinstance(k, np.generic) else k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented, strict JSON, atomically.

    NaN and infinities are written as ``null`` and numpy scalars as the Python numbers they hold (see
    :func:`json_safe`): every file this writes parses with any JSON parser, including ones that refuse
    Python's ``NaN``, and a numpy integer or float that reached ``data`` is written as a number.

    Raises:
        TypeError: ``data`` holds a value JSON cannot represent (an object, a tensor, a numpy array).
        NopeInterpError: the file cannot be written.
    """
    return atomic_write_text(path, json.dumps(json_safe(data), indent=2, sort_keys=False, allow_nan=False) + "\n")


def check_readable(path: str | os.PathLike[str], what: str = "file", folder: bool = False) -> Path:
    """``path`` (``~`` expanded) if it exists and this process may read it (a folder: enter and list it),
    else a one-line error that says which: before, an unreadable file read as "not found" or "corrupt: No such
    file", and a name too long or a loop of symbolic links ended in a raw ``OSError`` traceback.

    Raises:
        NopeInterpError: ``{what} not found`` (missing, or a parent is a file); a loop of symbolic links; a name
            too long; permission denied or any other error of the operating system, by its own words.
    """
    path = user_path(path)
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise NopeInterpError(f"{what} not found: {path}"[:600]) from None
    except OSError as err:
        raise NopeInterpError(f"cannot read {what} {path}: {err.strerror or err}"[:600]) from None
    if not os.access(path, os.R_OK | (os.X_OK if folder and os.path.isdir(path) else 0)):  # a file: its own error
        raise NopeInterpError(f"cannot read {what} {path}: permission denied"[:600])
    return path


def read_json(path: str | Path, what: str = "file") -> Any:
    """Read JSON, raising NopeInterpError (naming the path) if it is missing, not a regular file, or corrupt."""
    path = check_readable(path, what)
    _regular_or_missing(path)
    if not path.is_file():
        raise NopeInterpError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise NopeInterpError(f"{what} is corrupt (not valid JSON): {path}: {err}") from None


def save_weights(path: str | Path, state_dict: dict[str, torch.Tensor],
                 metadata: dict[str, str] | None = None) -> Path:
    """Save a state dict as safetensors, atomically, with string ``metadata`` in the file's header (a run
    stores the settings it was trained with: :data:`SETTINGS_KEY`)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    return _atomic(Path(path), lambda tmp: save_file(tensors, tmp, metadata=metadata))


#: The safetensors header key under which a run's weights carry the settings they were trained with (the JSON
#: of :func:`nope_interp.pretrained.run_settings`), checked against ``config.json`` when the run is loaded.
SETTINGS_KEY = "nope_interp_settings"


def weights_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a safetensors file's header ({} when it has none).

    Raises:
        NopeInterpError: the file is missing or not safetensors.
    """
    path = user_path(path)
    _regular_or_missing(path)
    check_readable(path, "weights")
    if not path.is_file():
        raise NopeInterpError(f"weights not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as err:  # safetensors raises several types for a damaged file
        raise NopeInterpError(f"weights are corrupt: {path}: {err}") from None


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Load safetensors weights.

    Raises:
        NopeInterpError: the file is missing, not a regular file, or not safetensors (non-finite parameters
            are refused by :func:`nope_interp.model.load_state`, which knows which tensors are parameters:
            TransformerLens's attention buffers hold -inf on purpose).
    """
    path = user_path(path)
    check_readable(path, "weights")
    if not path.is_file():
        raise NopeInterpError(f"weights not found: {path}")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises several types for a damaged file
        raise NopeInterpError(f"weights are corrupt: {path}: {err}") from None


def save_torch(path: str | Path, obj: Any) -> Path:
    """``torch.save`` atomically."""
    return _atomic(Path(path), lambda tmp: torch.save(obj, tmp))


#: The entries of ``checkpoint.pt`` and their types (written by :func:`nope_interp.train.train`).
CHECKPOINT_KEYS: dict[str, tuple[type, ...]] = {"model": (dict,), "optimizer": (dict,), "step": (int,),
                                                "wall_time_s": (int, float)}


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a training checkpoint (``checkpoint.pt``) safely: ``torch.load(..., weights_only=True)``, so
    only tensors, numbers, strings and plain containers are read and no code stored in the file runs.

    Args:
        path: the checkpoint file. device: where its tensors go (``map_location``).

    Returns:
        ``{"model": state dict, "optimizer": AdamW state dict, "step": int >= 0, "wall_time_s": float >= 0}``.

    Raises:
        NopeInterpError: the file is missing, truncated, not a torch file, holds anything but plain data
            (e.g. a pickled object that would run code), or lacks an entry of :data:`CHECKPOINT_KEYS`
            or has one of the wrong type. One line; the cause is named.
    """
    path = user_path(path)
    check_readable(path, "checkpoint")
    if not path.is_file():
        raise NopeInterpError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for a bad file
        # torch's own message is several paragraphs and suggests weights_only=False, which is exactly what
        # must not be done with a file of unknown origin: name the kind of failure only
        raise NopeInterpError(f"checkpoint is corrupt, truncated or unsafe: {path} cannot be read as plain tensors "
                              f"and numbers ({type(err).__name__}); resume from another run or retrain") from None
    if not isinstance(ckpt, dict):
        raise NopeInterpError(f"checkpoint is corrupt: {path} holds a {type(ckpt).__name__}, not a dict with "
                              f"{', '.join(CHECKPOINT_KEYS)}")
    for key, types in CHECKPOINT_KEYS.items():
        value = ckpt.get(key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise NopeInterpError(f"checkpoint is corrupt: {path}: entry {key!r} is missing or a "
                                  f"{type(value).__name__}; expected {' or '.join(t.__name__ for t in types)}")
    if ckpt["step"] < 0 or not (0 <= ckpt["wall_time_s"] < float("inf")):
        raise NopeInterpError(f"checkpoint is corrupt: {path}: step {ckpt['step']!r} or wall_time_s "
                              f"{ckpt['wall_time_s']!r} is negative or not finite")
    return ckpt


def check_writable_dir(path: str | Path, what: str = "output directory") -> Path:
    """Check, before any work, that ``path`` is a directory this process can write, or can be created.

    Walks up to the first existing ancestor: that must be a directory (not a file) in which a file can be
    created (tried with a temporary file that is removed at once: this also catches read-only file
    systems and permissions). Nothing is left behind.

    Args:
        path: the directory. what: how the error names it (e.g. ``"--out-root"``).

    Returns:
        ``path`` as a ``Path``, ``~`` expanded (:func:`user_path`).

    Raises:
        NopeInterpError: ``path`` or an ancestor is an existing non-directory, or the deepest existing
            ancestor is not writable; ``~`` in ``path`` cannot be expanded.
    """
    path = user_path(path)
    try:
        return _check_writable_dir(path, what)
    except OSError as err:  # a name too long, a folder that may not be entered, ...: before, a raw traceback
        raise NopeInterpError(f"{what} {path} cannot be used: {err.strerror or err}"[:600]) from None


def _check_writable_dir(path: Path, what: str) -> Path:
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            try:
                os.stat(probe)
                kind = "a dangling symbolic link"
            except OSError as err:
                kind = "a loop of symbolic links" if err.errno == errno.ELOOP else "a dangling symbolic link"
            raise NopeInterpError(f"{what} {path} cannot be created: {probe} is {kind}")
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "is" if probe == path else f"cannot be created: {probe} is"
        raise NopeInterpError(f"{what} {path} {where} an existing file, not a directory; give a directory")
    try:
        # the folder the system finds (links before ".."), as _atomic writes there: tempfile reads ".." as text
        fd, tmp = tempfile.mkstemp(prefix=".nope-interp-probe.", dir=os.path.realpath(probe))
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        where = "is not writable" if probe == path else f"cannot be created in {probe}"
        raise NopeInterpError(f"{what} {path} {where}: {err.strerror or err}") from None
    return path


#: Locks this process holds: "lock-file path|thread id" -> [lock, depth] (so a writer may lock again inside).
_HELD: dict[str, list[Any]] = {}


def lock_path(directory: str | Path) -> Path:
    """The lock file of an output directory: the hidden file ``.<name>.lock`` beside it
    (``runs/.<name>.lock`` for ``runs/<name>/``), so that the directory itself holds only outputs. Symlinks
    are resolved first (and ``~`` expanded): two spellings of one directory (a symlinked run folder) take the
    same lock.

    Raises:
        NopeInterpError: ``directory`` has no name (``/``, ``.``-only paths that resolve to the root); ``~`` in
            it cannot be expanded.
    """
    d = Path(os.path.realpath(user_path(directory)))  # a symlinked run folder and its target share one lock
    if not d.name:
        raise NopeInterpError(f"cannot lock {directory}: an output directory needs a name")
    return d.parent / f".{d.name}.lock"



class LockHeldError(NopeInterpError):
    """:func:`exclusive` found the lock held by another process (a sweep waits and retries on it)."""


@contextlib.contextmanager
def exclusive(directory: str | Path, what: str = "output directory") -> Iterator[Path]:
    """Hold an exclusive lock on an output directory while writing it; refuse a second writer at once.

    The lock is an OS file lock (``filelock``: ``flock`` on Unix) on :func:`lock_path`, so the kernel
    releases it when the holder dies (a stale lock file never blocks) and only one process at a time,
    on this machine or another that shares the file system with working locks, can hold it. The holder's
    PID is written into the lock file for the error message. Re-entrant within a thread (a job that
    trains a run locks both); another thread or process is refused. When the block ends and
    ``directory`` does not exist (the writer failed before writing anything), the lock file and the
    folders made for it are removed again; otherwise the lock file stays (harmless: the kernel, not the
    file, holds the lock; a lock file is never removed while its directory exists, since a second writer
    may have opened it).

    Args:
        directory: the run or output directory. what: how the error names it.

    Yields:
        The lock file's path.

    Raises:
        NopeInterpError: another process holds the lock (the message gives its PID when known), or the
            lock file cannot be created.
    """
    import threading

    import filelock

    lock_file = lock_path(directory)
    key = f"{lock_file}|{threading.get_ident()}"  # re-entrant in this thread; another thread is refused
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield lock_file
        finally:
            _HELD[key][1] -= 1
        return
    # os.path's checks answer False where Path.exists raises (a name too long, a folder that may not be entered)
    made = [p for p in (lock_file.parent, *lock_file.parent.parents) if not os.path.lexists(p)]
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocking = next((p for p in (lock_file.parent, *lock_file.parent.parents)
                         if os.path.lexists(p) and not os.path.isdir(p)), None)  # a file where a folder goes
        reason = f"{blocking} is a file, not a folder" if blocking is not None else err.strerror or err
        raise NopeInterpError(f"cannot create {lock_file.parent} for {what} {directory}: {reason}; nothing was "
                              "written") from None
    lock = filelock.FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        try:
            pid = lock_file.read_text().strip()
        except OSError:
            pid = ""
        holder = f" (pid {pid})" if pid.isascii() and pid.isdigit() else ""
        by = "another thread of this process" if pid == str(os.getpid()) else f"another nope-interp process{holder}"
        raise LockHeldError(f"{what} {directory} is being written by {by}; "
                            f"wait for it to finish, or choose another name or folder") from None
    except OSError as err:
        raise NopeInterpError(f"cannot lock {what} {directory} ({lock_file}): {err.strerror or err}") from None
    _HELD[key] = [lock, 1]
    try:
        with contextlib.suppress(OSError):
            lock_file.write_text(f"{os.getpid()}\n")
        yield lock_file
    finally:
        del _HELD[key]
        try:
            if not os.path.lexists(user_path(directory)):  # nothing was written: leave no trace
                lock_file.unlink(missing_ok=True)
                for p in made:
                    with contextlib.suppress(OSError):
                        p.rmdir()
        finally:
            lock.release()


@contextlib.contextmanager
def exclusive_folders(folders: Iterable[str | Path], what: str = "output folder") -> Iterator[None]:
    """Hold :func:`exclusive` on each of ``folders`` (a job's results and figures folders) for the whole block,
    taken in the order given and released in reverse; two folders that are one (a link) are locked once.

    Every job's ``write`` holds it (:func:`nope_interp.jobs.common.locked_write`), as the CLI does around the
    whole job, so two writers of one ``--out-root`` never mix their files, whether they are two commands, two
    Python processes calling ``write`` or a command and a notebook; two out-roots that share a ``figures``
    folder through a link share its lock. Before, only the CLI locked, and only the results folder.

    Raises:
        NopeInterpError: a folder is being written by another process or thread (:class:`LockHeldError`), or
            its lock file cannot be created; nothing is locked then.
    """
    seen: set[Path] = set()
    with contextlib.ExitStack() as stack:
        for folder in folders:
            lock = lock_path(folder)
            if lock not in seen:
                seen.add(lock)
                stack.enter_context(exclusive(folder, what))
        yield


def jsonl_line(record: dict[str, Any]) -> str:
    """One line of a JSONL file: strict JSON (NaN and infinities as ``null``, as :func:`write_json`) and "\\n"."""
    return json.dumps(json_safe(record), allow_nan=False) + "\n"


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON record to a JSONL file (rewritten atomically; the files stay small). Strict JSON:
    NaN and infinities become ``null``.

    Raises:
        NopeInterpError: ``path`` exists but is not a regular file (a folder, a FIFO, a device).
    """
    path = user_path(path)
    _regular_or_missing(path)
    old = path.read_text() if path.exists() else ""
    atomic_write_text(path, old + jsonl_line(record))


def _regular_or_missing(path: Path) -> None:
    """Refuse a path that exists but is not a regular file (a folder, a FIFO that would block the read, a
    device that would read without end)."""
    if os.path.exists(path) and not path.is_file():  # os.path: an unreadable or too long name is False
        raise NopeInterpError(f"{path} exists but is not a regular file: move it away (a run's metrics, config and "
                              "summary are plain files)")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file ([] if it does not exist).

    Raises:
        NopeInterpError: a line that is not JSON, or not a JSON object (the message names the file's line);
            ``path`` exists but is not a regular file (a FIFO would block the read).
    """
    path = user_path(path)
    if not os.path.lexists(path):  # os.path: a name too long is False, not an OSError
        return []
    check_readable(path, "metrics")
    _regular_or_missing(path)
    records = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            last = ("; it is the last line, cut short as an interrupted write leaves it: delete that line to keep "
                    "the rest" if number == len(lines) else "")
            raise NopeInterpError(f"metrics file is corrupt: {path}, line {number}, column {err.colno}: "
                                  f"{err.msg}{last}") from None
        if not isinstance(record, dict):
            raise NopeInterpError(f"metrics file is corrupt: {path}, line {number}: a JSON "
                                  f"{type(record).__name__}, not an object")
        records.append(record)
    return records


def read_metrics(path: str | Path, numbers: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` ([] if it does not exist), checked: every record has an
    integer ``step`` >= 0, steps strictly increase, and each field of ``numbers`` (e.g. ``"eval_acc"``) is
    present and a finite number or null (strict JSON writes NaN as null); accuracies
    (:data:`FRACTION_FIELDS`) lie in [0, 1] wherever present.

    Raises:
        NopeInterpError: one line naming the file's line and the field that is wrong; ``numbers`` a single string
            (``"eval_acc"``: give ``("eval_acc",)``; :func:`~nope_interp.checks.in_order`).
    """
    numbers = tuple(in_order("numbers", numbers, "field names", "read_metrics", key=str))
    path = user_path(path)
    records = read_jsonl(path)
    previous = -1
    lines = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if line.strip()] if records else []
    for number, record in zip(lines, records, strict=True):
        def bad(what: str, n: int = number) -> NopeInterpError:
            return NopeInterpError(f"metrics file is corrupt: {path}, line {n}: {what}")

        step = record.get("step")
        if not is_int(step) or step < 0:
            raise bad(f"step must be an integer >= 0, got {step!r}")
        if step <= previous:
            raise bad(f"steps must increase, got {step} after {previous}")
        previous = step
        for key in numbers:
            if key not in record:
                raise bad(f"no {key!r}")
            value = record[key]
            if value is not None and (not is_real(value) or not math.isfinite(value)):
                raise bad(f"{key} must be a number or null, got {value!r}")
        for key in FRACTION_FIELDS:  # accuracies, whichever fields the caller asked for
            value = record.get(key)
            if value is not None and is_real(value) and not 0.0 <= value <= 1.0:
                raise bad(f"{key} must be a fraction in [0, 1], got {value!r}")
    return records


#: Fields of ``metrics.jsonl`` that are fractions (exact match), checked to lie in [0, 1] by :func:`read_metrics`.
FRACTION_FIELDS = ("eval_acc", "test_acc")


def job_dirs(out_root: object, job: str) -> tuple[Path, Path]:  # object: a bad one is refused in one line
    """``(out_root/results/<job>, out_root/figures/<job>)``: where every analysis job writes (not created here);
    ``~`` in ``out_root`` is expanded (:func:`user_path`: ``--out-root '~/x'`` is the home folder's ``x``).

    Raises:
        NopeInterpError: ``out_root`` not a ``str`` or ``os.PathLike``, or empty or blank (it would be the current
            folder; every job's ``write`` checks it here, before anything else); ``~`` in ``out_root`` cannot be
            expanded.
    """
    root = as_path(out_root, "out_root")
    return root / "results" / job, root / "figures" / job


def prepare_outputs(job: str, result: object, result_type: type, out_root: object) -> tuple[Path, Path]:
    """The start of every job's ``write``: ``result`` checked to be the job's own result (``result_type``, what its
    ``run`` returns), then both output folders of :func:`job_dirs` created, before any file is written. Before,
    a folder that could not be created (a file named ``figures`` in ``out_root``) failed after the results were
    written, and another job's result was written as this job's files before failing.

    Returns:
        ``(results folder, figures folder)``, both existing.

    Raises:
        NopeInterpError: ``out_root`` not a path (:func:`job_dirs`); ``result`` not a ``result_type``; a folder
            cannot be created (the message says nothing was written); ``~`` in ``out_root`` cannot be expanded.
    """
    folders = job_dirs(out_root, job)   # out_root checked first (it creates nothing)
    if not isinstance(result, result_type):
        raise NopeInterpError(f"{job} write needs the {result_type.__name__} that {job}'s run returns, got "
                              f"{type(result).__name__}; nothing was written")
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise NopeInterpError(f"cannot create the output folder {folder}: {err.strerror or err}; nothing was "
                                  "written") from None
    return folders


def drop_stale(result_file: Path, written: list[Path], folders: tuple[Path, ...]) -> list[Path]:
    """Remove the files that the last write of ``result_file`` wrote and this one did not (a figure of a probe
    kind, protocol, input kind or task that this call did not measure), then record ``written`` as this write's
    files; returns ``written``. ``folders`` are the job's results and figures folders: only files inside them are
    ever removed. The record lies beside the results folder, as a lock file does, so that the folder holds only
    outputs: ``results/.<job>.outputs/<result file's path in the results folder, "/" as "__">.files``, one path per
    line relative to the record's folder, a tab, and a hash of the file's contents as written; the
    ``plotly.min.js`` the figures load is never recorded. A recorded file whose contents have changed since
    (another writer replaced it: an out-root sharing this ``figures`` folder through a link, or a user) is not
    this write's to remove and stays; a copied or moved out-root keeps its record valid (contents, not inodes or
    times, are compared). Before, a rerun left such figures beside results that no longer held their numbers.

    Raises:
        NopeInterpError: the record or a stale file cannot be written or removed (:func:`atomic_write_text`).
    """
    results = Path(folders[0])
    key = os.path.relpath(os.path.abspath(result_file), os.path.abspath(results)).replace(os.sep, "__")
    record = results.parent / f".{results.name}.outputs" / f"{key}.files"
    # real paths (links resolved) on both sides: the operating system follows a link before "..", so text paths
    # could name a file of another folder (a review: `link/../out` deleted a figure of `./out`)
    here = {os.path.realpath(p) for p in written}
    roots = [os.path.realpath(f) + os.sep for f in folders]
    try:
        old = record.read_text().splitlines() if record.is_file() else []
    except (OSError, UnicodeDecodeError):
        old = []  # an unreadable record: nothing is removed
    for line in old:
        name, tab, stamp = line.rpartition("\t")
        if not tab:  # a record written before stamps: the path alone
            name, stamp = line, None
        stale = os.path.realpath(record.parent / name)
        if name and stale not in here and any(stale.startswith(r) for r in roots) and os.path.isfile(stale) \
                and (stamp is None or stamp == _stamp(stale)):  # rewritten since by another writer: not ours
            try:
                os.unlink(stale)
            except OSError as err:
                raise NopeInterpError(f"cannot remove the stale output {stale}: {err.strerror or err}") from None
    try:
        names = relative_to_folder(written, record.parent)
        atomic_write_text(record, "".join(f"{n}\t{_stamp(w)}\n" for n, w in zip(names, written, strict=True)))
    except NopeInterpError as err:  # the outputs are complete: only the bookkeeping failed, said as such
        import warnings

        from nope_interp.errors import NopeInterpWarning, user_stacklevel

        warnings.warn(NopeInterpWarning(f"every output was written, but not the record of them ({err}): a later "
                                        "rerun will not remove the figures of this one that it does not redraw"),
                      stacklevel=user_stacklevel())
    return written


def _stamp(path: str | Path) -> str:
    """A hash of the contents of the file at ``path`` (BLAKE2b, 16 bytes as hex; "" when it cannot be read): what
    :func:`drop_stale` records of each file written, so that a file another writer replaced since is not
    removed, while a copy (``cp -r``, another disk) of the out-root still matches."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def relative_to_folder(paths: list[Path], folder: Path) -> list[str]:
    """``paths`` as the relative paths that lead to them from ``folder`` (``../../figures/demo/x.html`` from
    ``results/demo/``): what a result file records of the figures written beside it, so that the record holds
    wherever the output folder is moved and whatever folder the command ran in (before: the paths as given,
    relative to the folder the command ran in, which is neither the result's nor ``--out-root``). Paths are
    compared as text after ``os.path.abspath``; raises nothing."""
    return [os.path.relpath(os.path.abspath(p), os.path.abspath(folder)) for p in paths]


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
    """CSV text with the union of the rows' keys as columns (missing cells empty), rows in the order given.

    Raises:
        NopeInterpError: ``rows`` a single string or a single dict (rows must be dicts: before, the generic list
            message's "write ['ab']"), a set or frozenset (:func:`~nope_interp.checks.in_order`; a
            generator is read once: before, the columns used it up and the CSV had a header only); a row that is
            not a dict (a list, a tuple, a number: before, a raw AttributeError), the message naming its index.
    """
    if isinstance(rows, str | bytes | bytearray | Mapping):  # in_order's "write ['ab']" fits no CSV row
        what = "one dict (a CSV of one row is [row])" if isinstance(rows, Mapping) else "a single string"
        raise NopeInterpError(f"to_csv: rows must be a list of dicts (column name -> value), one per row, not {what}; "
                              f"got {type(rows).__name__} {rows!r}"[:300])
    rows = in_order("rows", rows, "dicts", "to_csv")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise NopeInterpError(f"to_csv: rows must be dicts (column name -> value), one per row; row {bad} is "
                              f"{type(rows[bad]).__name__} {rows[bad]!r}"[:300])
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = _io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def no_checkpoint_message(run_dir: Path, ckpt_path: Path) -> NopeInterpError:
    """The error of ``resume=True`` (``--resume``) on a run directory without a checkpoint: one line that says what to
    do, also for a run killed before its first checkpoint (its folder holds a config and nothing to resume). Made by
    :meth:`~nope_interp.errors.NopeInterpError.naming`: the argument in Python, the flag on the command line."""
    if run_dir.is_dir() and (run_dir / CONFIG_FILE).is_file() and all(c.name in RUN_FILES for c in run_dir.iterdir()):
        return NopeInterpError.naming(
            "{resume} given but {run_dir} has no checkpoint ({ckpt}): the run stopped before its first one, so there "
            "is nothing to resume; remove the folder (rm -r {run_dir}) and rerun without {resume}", RUN_ARG_NAMES,
            run_dir=run_dir, ckpt=ckpt_path.name)
    return NopeInterpError.naming("{resume} given but no checkpoint in {run_dir} (expected {ckpt})", RUN_ARG_NAMES,
                                  run_dir=run_dir, ckpt=ckpt_path.name)


#: What a run writes before its first checkpoint: a folder holding only these is a run that stopped early.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, TRAJECTORY_DIR, SUMMARY_FILE)

#: The Python spelling of the training options that the run-directory errors name (on the command line: the flags).
RUN_ARG_NAMES = {"resume": "resume=True", "finalize": "finalize()", "name": "run_dir", "runs_dir": "parent folder"}


def not_empty_message(run_dir: Path, ckpt_path: Path) -> NopeInterpError:
    """The error of a new run into a non-empty run directory: resume it; when it holds only a run's own files
    and no checkpoint (a run killed before its first one), remove it; when it holds anything else (not a run:
    a user's folder), choose another name, never a removal. Made by
    :meth:`~nope_interp.errors.NopeInterpError.naming`: in Python ``resume=True`` and another ``run_dir``, on the
    command line ``--resume`` and another ``--name`` (or ``--runs-dir``)."""
    if ckpt_path.is_file() or (run_dir / WEIGHTS_FILE).is_file():
        return NopeInterpError.naming("run directory {run_dir} is not empty; use {resume} or choose another {name}",
                                      RUN_ARG_NAMES, run_dir=run_dir)
    if all(child.name in RUN_FILES for child in run_dir.iterdir()) and (run_dir / CONFIG_FILE).is_file():
        return NopeInterpError.naming(
            "run directory {run_dir} is not empty but holds no checkpoint (a run stopped before its first one): "
            "remove it (rm -r {run_dir}) and rerun, or choose another {name}", RUN_ARG_NAMES, run_dir=run_dir)
    return NopeInterpError.naming(
        "run directory {run_dir} is not empty and is not a run (it holds files a run does not write): choose another "
        "{name} (or {runs_dir})", RUN_ARG_NAMES, run_dir=run_dir)


def as_path(value: object, name: str = "path") -> Path:
    """``value`` as a ``Path``: a ``str`` or ``os.PathLike`` that is not empty or blank (an empty string would
    mean the current folder), with a leading ``~`` expanded (:func:`user_path`).

    Raises:
        NopeInterpError: anything else (a number, None, bytes, an empty string), naming ``name``; ``~`` that
            cannot be expanded.
    """
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise NopeInterpError(f"{name} must be a non-empty path (a str or pathlib.Path), got "
                              f"{type(value).__name__} {value!r}"[:300])
    return user_path(value)
