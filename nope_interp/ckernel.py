"""The compiled adjacency counter: merge-sort pair counting in C, built at first use, called through ctypes.

:func:`nope_interp.similarity.adjacency_counts` uses it for CPU tensors when it is available and falls back
to the vectorised torch counters otherwise (same integers: both are exact; ``tests/test_similarity.py``
checks every path against the all-pairs loop). The source is ``nope_interp/csrc/adjacency_count.c``.

Build: the C compiler named by ``$CC`` (else Python's configured one, else ``cc``) compiles it once per
source version into ``$NOPE_INTERP_CACHE_DIR`` (default ``$XDG_CACHE_HOME/nope_interp`` or
``~/.cache/nope_interp``), written atomically so concurrent processes are safe. No compiler, a failed
build or ``NOPE_INTERP_C_KERNEL=0`` (or ``off``, ``false``, ``no``) means the torch counters are used,
with one warning naming the reason
(none when it was switched off on purpose).

Threads: rows are counted in ``torch.get_num_threads()`` Python threads (ctypes releases the GIL).
"""

import ctypes
import hashlib
import os
import subprocess
import sysconfig
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from nope_interp.errors import user_stacklevel

_SOURCE = Path(__file__).resolve().parent / "csrc" / "adjacency_count.c"
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # "lib": ctypes.CDLL | None once tried, "reason": why it is not available


def _cache_dir() -> Path:
    if os.environ.get("NOPE_INTERP_CACHE_DIR"):
        return Path(os.environ["NOPE_INTERP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nope_interp"


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return cc.split()


def _build(source: bytes) -> Path:
    """Compile the source into the cache (once per source and compiler); return the shared library's path."""
    cc = _compiler()
    key = hashlib.sha256(source + " ".join(cc).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    target = out_dir / f"adjacency_count-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = Path(tmp) / "adjacency_count.c"
        src.write_bytes(source)
        lib = Path(tmp) / target.name
        cmd = [*cc, "-O3", "-std=c99", "-shared", "-fPIC", str(src), "-o", str(lib)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["(no message)"])[0]
            raise OSError(f"{' '.join(cc)} exited with {done.returncode}: {first}")
        os.replace(lib, target)  # atomic: a concurrent build of the same source writes the same bytes
    return target


def _load() -> ctypes.CDLL | None:
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]  # type: ignore[return-value]
        lib = None
        switch = os.environ.get("NOPE_INTERP_C_KERNEL", "1").strip().lower()
        if switch in ("0", "off", "false", "no"):
            _STATE["reason"] = f"switched off by NOPE_INTERP_C_KERNEL={switch}"
        else:
            try:
                lib = ctypes.CDLL(str(_build(_SOURCE.read_bytes())))
                fn = lib.adjacency_count_rows
                fn.restype = None
                fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_void_p]
            except (OSError, subprocess.SubprocessError) as e:
                lib = None
                _STATE["reason"] = f"could not build the C adjacency counter ({e})"
                warnings.warn(f"nope_interp: {_STATE['reason']}; using the slower torch counter",
                              stacklevel=user_stacklevel())
        _STATE["lib"] = lib
        return lib


def available() -> bool:
    """Whether the compiled counter can be used in this process (builds it on the first call).

    Returns:
        True when the shared library is built (or cached) and loaded; False when no compiler is found,
        the build fails (one warning, naming why) or ``NOPE_INTERP_C_KERNEL=0``. Never raises.
    """
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why the compiled counter is not used (``None`` when it is)."""
    return None if available() else str(_STATE.get("reason"))


def adjacency_counts_c(sim: Float[Tensor, "*batch pos pos"]) -> Int[Tensor, "*batch pos"] | None:
    """Successes per row, #{i < j < k : sim[k, i] < sim[k, j]} (ties fail), by the compiled counter.

    Method: per row, a bottom-up merge sort of its k entries left of the diagonal that counts, at each
    merge, the earlier-column entries strictly below each later-column entry (the classic merge-sort
    inversion count, Knuth, TAOCP vol. 3, 5.1.1): O(k log k) per row, exact integers.

    Args:
        sim: CPU similarity matrices, any float dtype (compared in float64; float16/bfloat16/float32 to
            float64 is exact, so the order of the entries is unchanged). The caller checks squareness and NaN.

    Returns:
        int64 counts (``0`` for rows 0 and 1), or ``None`` when the counter is not available (see
        :func:`available`) or the tensor is not on the CPU.
    """
    if sim.device.type != "cpu" or not available():
        return None
    lib = _STATE["lib"]
    n = sim.shape[-1]
    flat = sim.detach().reshape(-1, n, n).to(torch.float64).contiguous()
    out = torch.empty(flat.shape[:2], dtype=torch.int64)
    n_rows = flat.shape[0] * n
    threads = max(1, torch.get_num_threads())
    # work per row grows with its index in the sequence: many small tasks keep the threads balanced
    step = max(1, -(-n_rows // (8 * threads)))
    ranges = [(r, min(n_rows, r + step)) for r in range(0, n_rows, step)]
    sim_ptr, out_ptr = flat.data_ptr(), out.data_ptr()

    def run(span: tuple[int, int]) -> None:
        buf = torch.empty(2 * n, dtype=torch.float64)
        lib.adjacency_count_rows(sim_ptr, n, span[0], span[1], out_ptr, buf.data_ptr())  # type: ignore[attr-defined]

    if threads == 1 or len(ranges) == 1:
        for span in ranges:
            run(span)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(run, ranges))
    return out.reshape(sim.shape[:-1])
