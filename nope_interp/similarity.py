"""Cosine-similarity matrices and the adjacency score (pure functions on tensors).

Definitions (``docs/method.md``, "Definitions"):

* Self cosine-similarity matrix of a sequence X (pos x d_model): C[i, j] = X_i . X_j / (|X_i| |X_j|).
* Adjacency score of row k (0-based, k >= 2): over all k(k-1)/2 pairs i < j < k of earlier positions,
  the fraction with C[k, i] < C[k, j] (the nearer position is strictly more similar; ties fail).
  ``row_mean`` (the paper's matrix score) averages row scores over k = 2..pos-1; ``pooled`` (the
  authors' code) divides all successes by all pairs; ``pooled_rounded`` is ``pooled`` rounded to two
  decimals (Python's ``round(x, 2)``), the per-sequence number the authors report (mean ± std over
  sequences). Random order gives about 0.5, a perfect
  adjacency pattern 1.0, the reverse order 0.0. For a row without ties the row score equals
  (1 + tau) / 2, tau = Kendall's rank correlation of (position, similarity).
* Lag profile of a sequence: c(d) = mean over query positions i >= d of C[i, i - d], d = 1..D, with the
  recency gap c(1) - c(D) and the idealised curves of uniform causal and sliding-window averaging.
"""

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from nope_interp import ckernel
from nope_interp.checks import is_int, is_real, repeated
from nope_interp.config import check_int
from nope_interp.errors import DegenerateInputWarning, NopeInterpError, user_stacklevel
from nope_interp.model import check_fits_memory

#: Per-sequence reductions of the adjacency counts (module docstring): the paper's, the authors' code's, and the
#: authors' reported (rounded) score.
REDUCTIONS = ("row_mean", "pooled", "pooled_rounded")
#: Decimals of the authors' reported per-sequence score (``pooled_rounded``).
AUTHORS_DECIMALS = 2
#: Vectors with an L2 norm below this are "near zero": their cosines are undefined (NaN).
DEFAULT_MIN_NORM = 1e-8
#: Degenerate sequences (:func:`degenerate_sequences`): vectors parallel up to rounding, i.e. their unit vectors
#: differ by less than about ``DEGENERATE_ULPS`` units of the dtype's precision, so that the strictly-lower
#: cosines span less than ``(DEGENERATE_ULPS * eps) ** 2 / 2`` (:func:`degenerate_tolerance`): 1.2e-10 for
#: float32 activations. Measured 2026-12-01 on float32 models, one character repeated: spread 1.4e-13 to
#: 4.5e-13 at pos 32-64 (3 to 6 layers), 2.0e-12 (fused) and 6.3e-12 (hooked forward) at pos 256; real
#: task prompts and text 1e-3 to 1.3; a real but tiny signal (init mean 8, std 2e-4, addition prompts)
#: 3.9e-10. A heuristic: between those, rounding and signal cannot be told apart by the spread alone.
DEGENERATE_ULPS = 128
#: The same, for 16-bit activations (their precision is coarse enough that 128 units would flag real data).
DEGENERATE_ULPS_16BIT = 16


def _describe(x: object) -> str:
    """How an argument looks, for error messages: its type, or a tensor's dtype, shape and odd device/layout."""
    if not isinstance(x, Tensor):
        t = type(x)
        hint = " (convert it with torch.as_tensor)" if t.__module__ == "numpy" or isinstance(x, list | tuple) else ""
        return f"a {t.__name__ if t.__module__ == 'builtins' else f'{t.__module__}.{t.__name__}'}{hint}"
    where = " on the meta device (no data)" if x.device.type == "meta" else ""
    layout = f" {x.layout} (not dense)" if x.layout != torch.strided else ""
    return f"a {x.dtype}{layout} tensor of shape {tuple(x.shape)}{where}"


def check_tensor(x: object, name: str, shape: str, *, ndim: int | None = None, min_ndim: int = 0,
                 min_sizes: dict[int, int] | None = None, finite: bool = False, fn: str = "") -> None:
    """The shared check of a tensor argument: a dense, real floating ``torch.Tensor`` with data (not on the
    meta device) of at least 16 bits (float16, bfloat16, float32, float64; 8-bit floats are refused everywhere), of
    ``ndim`` dimensions (or at least ``min_ndim``), each dimension ``d`` of ``min_sizes``
    (negative indices, e.g. ``{-1: 1}``) at least that large, and with ``finite`` no NaN or inf entry.

    ``name`` is the argument (``x``, ``sim``, ...), ``shape`` its documented shape (``"(*batch, pos, d_model)"``),
    ``fn`` the public function (prefixed to the message).

    Raises:
        NopeInterpError: one line naming ``fn``, ``name``, what was expected and what was got.
    """
    where = f"{fn}: " if fn else ""
    want = f"{name} must be a real floating torch tensor of shape {shape}"
    if (not isinstance(x, Tensor) or not x.is_floating_point() or x.layout != torch.strided
            or x.device.type == "meta"):
        raise NopeInterpError(f"{where}{want}, got {_describe(x)}")
    if x.dtype.itemsize < 2:  # float8: torch has no isfinite for it, and its 3-bit mantissa rounds every cosine
        raise NopeInterpError(f"{where}{want} of float16 or a wider float, got {_describe(x)} (8-bit floats are too "
                              "coarse to compare cosines; convert with .float())")
    if (ndim is not None and x.ndim != ndim) or x.ndim < min_ndim:
        raise NopeInterpError(f"{where}{want}, got {x.ndim} dimension(s): shape {tuple(x.shape)}")
    for dim, low in (min_sizes or {}).items():
        if x.shape[dim] < low:
            raise NopeInterpError(f"{where}{want} with at least {low} along dimension {dim}, got shape "
                                  f"{tuple(x.shape)}")
    if finite:
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise NopeInterpError(f"{where}{name} must be finite, got {int(bad.sum())} NaN or inf entries of "
                                  f"{x.numel()} (first at index {first}: {float(x[first])})")


def _check_min_norm(min_norm: object, fn: str) -> float:
    """``min_norm`` as a float (numpy and ``Fraction`` values compare with tensors only as floats), checked."""
    if not is_real(min_norm) or not 0 <= min_norm < math.inf:
        raise NopeInterpError(f"{fn}: min_norm must be a finite number >= 0, got {min_norm!r}")
    return float(min_norm)


def _pow2_scaled(x64: Tensor) -> tuple[Tensor, Tensor]:
    """``x64 * 2**-e`` per vector (``e`` the binary exponent of its largest |entry|) and ``e``.

    Scaling by a power of two is exact, so the scaled vectors have the same direction bit for bit, their
    largest entry is in [0.5, 1) and their squares can neither overflow nor underflow to zero. The
    factor is applied in two halves because ``2**e`` alone overflows for subnormal vectors.
    Non-finite entries must have been replaced before (they would give NaN exponents).
    """
    _, e = torch.frexp(x64.abs().amax(dim=-1, keepdim=True))
    e = e.to(torch.float64)
    half = torch.floor(e / 2)
    return (x64 * torch.exp2(-half)).mul_(torch.exp2(half - e)), e


def _safe_norms(x64: Tensor) -> Tensor:
    """L2 norms of float64 vectors without overflow or underflow in the squares (inf only where the norm
    itself exceeds the float64 range). Non-finite entries must have been replaced before."""
    y, e = _pow2_scaled(x64)
    half = torch.floor(e / 2)
    n = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
    return (n * torch.exp2(half) * torch.exp2(e - half)).squeeze(-1)


#: Estimates below this many bytes are not checked by :func:`check_host_memory` (reading the free memory costs
#: more than such allocations; they fit any machine that runs the toolkit).
MEMORY_CHECK_FROM = 2**26


def check_host_memory(fn: str, need: dict[str, int], advice: str) -> None:
    """Refuse, before allocating, a call of ``fn`` (its name and sizes, e.g. ``"closed_form_uniform_cosine(n_pos=
    1000000)"``) whose tensors (``need``: estimated bytes by part) do not fit the free host memory
    (:func:`~nope_interp.model.check_fits_memory`): torch's allocator would fail with a traceback, or the
    operating system kill the process. ``advice`` says what to do instead. Estimates under
    :data:`MEMORY_CHECK_FROM` bytes pass unchecked.

    Raises:
        NopeInterpError: the estimate exceeds the free memory; the message gives the estimate.
    """
    if sum(need.values()) < MEMORY_CHECK_FROM:
        return
    check_fits_memory({k: int(v) for k, v in need.items()}, "cpu", fn, advice)


#: The documented shape of activations (vectors per position).
ACTIVATIONS_SHAPE = "(*batch, pos, d_model)"


def check_activations(x: object, name: str = "x", fn: str = "") -> None:
    """:func:`check_tensor` for activations: at least 2 dimensions ``(*batch, pos, d_model)``, d_model >= 1
    (finiteness is not checked: see :func:`check_finite`).

    Raises:
        NopeInterpError: not a dense real floating tensor with data of 16 bits or more (float8 is refused), fewer
            than 2 dimensions, or d_model 0.
    """
    check_tensor(x, name, ACTIVATIONS_SHAPE, min_ndim=2, min_sizes={-1: 1}, fn=fn)


def nonfinite_positions(x: Float[Tensor, "*batch pos d_model"]) -> Bool[Tensor, "*batch pos"]:
    """True where the vector has a NaN or an infinite entry (its cosine similarities are undefined, NaN).

    A non-finite activation means non-finite weights or inputs upstream; it is not a near-zero vector
    (:func:`near_zero_positions` is False there).

    Raises:
        NopeInterpError: ``x`` is not a dense real floating tensor ``(*batch, pos, d_model)`` with data and
            d_model >= 1 (:func:`check_activations`).
    """
    check_activations(x, fn="nonfinite_positions")
    return ~torch.isfinite(x).all(dim=-1)


def near_zero_positions(
    x: Float[Tensor, "*batch pos d_model"], min_norm: float = DEFAULT_MIN_NORM
) -> Bool[Tensor, "*batch pos"]:
    """True where a finite vector's L2 norm is below ``min_norm`` or exactly 0 (its cosines are undefined).

    The norm is computed in float64 without overflow or underflow (for any finite input of any float
    dtype), so a vector of entries 1e-170 has norm about 1e-170, not 0. Vectors with NaN or inf entries
    are not near zero: :func:`nonfinite_positions` reports them.

    Raises:
        NopeInterpError: ``x`` as :func:`nonfinite_positions`; ``min_norm`` not a finite number >= 0.
    """
    check_activations(x, fn="near_zero_positions")
    min_norm = _check_min_norm(min_norm, "near_zero_positions")
    x64 = x.double()
    finite = torch.isfinite(x64).all(dim=-1)
    norms = _safe_norms(torch.where(finite.unsqueeze(-1), x64, 0.0))
    return finite & ((norms < min_norm) | (norms == 0))


def check_finite(x: Float[Tensor, "*batch pos d_model"], what: str = "activations") -> None:
    """Raise if any vector of ``x`` has a NaN or infinite entry (``what`` names the input in the message).

    Raises:
        NopeInterpError: naming how many vectors are non-finite and the first one's index; non-finite
            activations come from non-finite weights or inputs, not from near-zero vectors. ``x`` that is not
            a dense real floating tensor ``(*batch, pos, d_model)`` with data and d_model >= 1.
    """
    check_activations(x, what, fn="check_finite")
    bad = ~torch.isfinite(x).all(dim=-1)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        n_nan = int(torch.isnan(x).any(-1).sum())
        raise NopeInterpError(
            f"{what} are not finite: {int(bad.sum())} of {bad.numel()} vectors have NaN or inf entries "
            f"({n_nan} with NaN; first at index {first}); the model's weights or inputs are not finite")


def cosine_similarity_matrix(
    x: Float[Tensor, "*batch pos d_model"], min_norm: float = DEFAULT_MIN_NORM
) -> Float[Tensor, "*batch pos pos"]:
    """Self cosine-similarity matrix of each sequence, in float64, clamped to [-1, 1].

    Computed in float64 for any float input dtype (float16, bfloat16, float32, float64). Each vector is
    first scaled by a power of two (exact) so that its largest entry is in [0.5, 1): the result is the
    same for vectors of entries 1e-300 or 1e300 as at scale 1, without overflow or underflow (and bit for
    bit the same for a power-of-two scale). The upper triangle is replaced by the mirror image of the
    strictly lower one (the entries the adjacency score reads), so the matrix is exactly symmetric, and
    the diagonal is set to exactly 1. Vectors that are bit for bit equal after that scaling and
    normalisation (a repeated token's embedding) get exactly equal rows and columns and cosine exactly 1
    with each other (a matrix product alone can differ in the last bit there, which would decide their ties
    at random; ties count as failures).

    Args:
        x: activations; any leading batch dimensions.
        min_norm: vectors with an L2 norm below this (or exactly 0) are near zero; every entry in their
            row and column is NaN (reported, not hidden as 0). Use :func:`near_zero_positions` to find
            them. The norm is computed without overflow or underflow, so ``min_norm=0`` keeps every
            non-zero finite vector, however small.

    Returns:
        ``C[..., i, j]`` in [-1, 1] (float64), exactly symmetric, diagonal exactly 1; every entry in the
        row and column of a near-zero vector or of a vector with NaN/inf entries
        (:func:`nonfinite_positions`) is NaN.

    Raises:
        NopeInterpError: ``x`` is not a dense real floating torch tensor with data (a list, a numpy array, an
            integer, complex or float8 dtype, a meta tensor), has fewer than 2 dimensions or d_model = 0
            (:func:`check_activations`); ``min_norm`` is not a finite number >= 0.
    """
    check_activations(x, fn="cosine_similarity_matrix")
    min_norm = _check_min_norm(min_norm, "cosine_similarity_matrix")
    return _cosine(x, min_norm, symmetric=True)


def _cosine(x: Tensor, min_norm: float, symmetric: bool) -> Tensor:
    """:func:`cosine_similarity_matrix`; with ``symmetric=False`` the upper triangle and diagonal are left
    as the matrix product gave them (the strictly lower triangle, all the adjacency score reads, is the same)."""
    x64 = x.double()
    finite = torch.isfinite(x64).all(dim=-1)
    y, e = _pow2_scaled(x64 if bool(finite.all()) else torch.where(finite.unsqueeze(-1), x64, 0.0))
    del x64
    scaled_norms = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
    half = torch.floor(e / 2)
    norms = (scaled_norms * torch.exp2(half) * torch.exp2(e - half)).squeeze(-1)
    bad = ~finite | (norms < min_norm) | (norms == 0)
    unit = y.div_(torch.where(scaled_norms > 0, scaled_norms, 1.0))
    c = (unit @ unit.transpose(-1, -2)).clamp_(-1.0, 1.0)
    rep = _first_equal_position(unit)
    del unit, y
    if rep is not None:  # bit-identical unit vectors (a repeated token's embedding): give them identical cosines
        symmetric = True
    if symmetric:
        n = c.shape[-1]
        lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=c.device), diagonal=-1)
        c = torch.where(lower, c, c.transpose(-1, -2))  # upper = mirror of lower: exactly symmetric
        c.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    if rep is not None:  # C[k, j] = C[rep k, rep j]: equal vectors get equal rows and columns, and cosine 1
        c = _gather_representatives(c, rep)
    if bool(bad.any()):
        c.masked_fill_(bad.unsqueeze(-1) | bad.unsqueeze(-2), float("nan"))
    return c


def _gather_representatives(c: Tensor, rep: Tensor) -> Tensor:
    """``C'[..., k, j] = C[..., rep k, rep j]`` with the diagonal of C taken as exactly 1 first."""
    n = c.shape[-1]
    c = c.clone()
    c.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    c = torch.gather(c, -2, rep.unsqueeze(-1).expand(*rep.shape, n))
    return torch.gather(c, -1, rep.unsqueeze(-2).expand(*rep.shape[:-1], n, n))


def tie_equal_vectors(sim: Float[Tensor, "*batch pos pos"], vectors: Float[Tensor, "*batch pos d"],
                      ) -> Float[Tensor, "*batch pos pos"]:
    """``sim`` (a cosine-like matrix computed from ``vectors`` by a matrix product) with every position whose
    vector is bit for bit equal to an earlier one's given that one's row and column, and similarity exactly
    1 between them. A matrix product can give two equal vectors' similarities to a third that differ in the
    last bit, which breaks at random the ties that rank-based scores count as failures (or Spearman averages).
    Returns ``sim`` itself when no sequence repeats a vector. Used by :func:`cosine_similarity_matrix` and the
    pattern-predicted cosine matrices (collapsed attention gives equal rows).

    Raises:
        NopeInterpError: ``sim`` or ``vectors`` not a dense real floating torch tensor with data (of at least 2
            dimensions; float16 and wider, :func:`check_tensor`); ``vectors`` and ``sim`` disagree in their leading
            or position dimensions.
    """
    check_tensor(sim, "sim", SIM_SHAPE, min_ndim=2, fn="tie_equal_vectors")
    check_tensor(vectors, "vectors", "(*batch, pos, d)", min_ndim=2, fn="tie_equal_vectors")
    if tuple(vectors.shape[:-1]) != tuple(sim.shape[:-1]) or sim.shape[-1] != sim.shape[-2]:
        raise NopeInterpError(f"tie_equal_vectors: sim {tuple(sim.shape)} must be (*batch, pos, pos) for vectors "
                              f"{tuple(vectors.shape)} (*batch, pos, d)")
    rep = _first_equal_position(vectors)
    return sim if rep is None else _gather_representatives(sim, rep)


#: The integer dtype of each float width: a float tensor viewed as it holds each entry's bits (viewing float32 as
#: int64 would pair entries, and fail for an odd width).
_SAME_WIDTH_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _first_equal_position(unit: Tensor) -> Tensor | None:
    """For each position, the first position of its sequence whose vector is bit for bit the same
    (``(*batch, pos)`` indices), or None when no sequence repeats a vector. A matrix product computes the
    cosines of two equal vectors with a third along different summation paths, so they can differ in the last
    bit (a repeated token's embedding: 177 of 200 random trials), which would break the ties that score as
    failures at random; mapping every repeat to its first occurrence makes them exact."""
    *batch, n, d = unit.shape
    if n < 2:
        return None
    flat = unit.reshape(-1, n, d)
    # fast exact screen: an integer hash of each vector's bits (wrapping integer sums do not depend on the
    # summation order, so equal vectors hash equal); no equal hashes in any sequence means no repeats
    coef = torch.randint(-(2**62), 2**62, (d,), generator=torch.Generator().manual_seed(d), dtype=torch.int64)
    bits = flat.contiguous().view(_SAME_WIDTH_INT[flat.dtype.itemsize]).long()  # each entry's bits, any float width
    hashes = (bits * coef.to(flat.device)).sum(-1).sort(dim=-1).values
    if not bool((hashes[:, 1:] == hashes[:, :-1]).any()):
        return None
    # the bits, not the float values, as keys: a float16 sequence index would be inexact past 2048 sequences
    seq = torch.arange(flat.shape[0], device=unit.device).repeat_interleave(n).unsqueeze(-1)
    keys = torch.cat([seq, bits.reshape(-1, d)], dim=-1)  # the sequence index keeps repeats within a sequence
    del bits
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    pos = torch.arange(n, device=unit.device).repeat(flat.shape[0])
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.int64, device=unit.device)
    first.scatter_reduce_(0, inverse, pos, reduce="amin")
    rep = first[inverse].reshape(*batch, n)
    return None if bool((rep == torch.arange(n, device=unit.device)).all()) else rep


def row_pair_counts(n_pos: int) -> Int[Tensor, " pos"]:
    """Pairs i < j < k compared in row k: k(k-1)/2 (0 for rows 0 and 1).

    Raises:
        NopeInterpError: ``n_pos`` is not an integer >= 0; the counts (and two temporaries of their size) would not
            fit the free memory.
    """
    if not is_int(n_pos) or n_pos < 0:
        raise NopeInterpError(f"row_pair_counts: n_pos must be an integer >= 0, got {n_pos!r}")
    check_host_memory(f"row_pair_counts(n_pos={int(n_pos)})", {"counts and temporaries (int64)": 3 * 8 * int(n_pos)},
                      "use fewer positions")
    k = torch.arange(int(n_pos), dtype=torch.int64)
    return k * (k - 1) // 2


#: The documented shape of cosine-similarity matrices.
SIM_SHAPE = "(*batch, pos, pos)"


def _check_square(sim: object, fn: str, min_pos: int = 0) -> None:
    """``sim`` is a dense real floating tensor with data whose last two dimensions are square (>= ``min_pos``)."""
    check_tensor(sim, "sim", SIM_SHAPE, min_ndim=2, fn=fn)
    if sim.shape[-1] != sim.shape[-2] or sim.shape[-1] < min_pos:
        at_least = f" of at least {min_pos} positions" if min_pos else ""
        raise NopeInterpError(f"{fn}: a similarity matrix must be square in its last two dims{at_least}, got "
                              f"{tuple(sim.shape)}")


def _check_square_no_nan(sim: object, fn: str = "adjacency_counts") -> None:
    """:func:`_check_square`, and no NaN or inf entry below the diagonal (the entries that are compared)."""
    _check_square(sim, fn)
    if bool(torch.isfinite(sim).all()):  # the common case: no NaN anywhere, no pos x pos mask needed
        return
    n = sim.shape[-1]
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=sim.device), diagonal=-1)
    below = sim[..., lower]
    if bool(torch.isnan(below).any()):
        raise NopeInterpError(f"{fn}: sim has {int(torch.isnan(below).sum())} NaN entries below the diagonal: "
                              "near-zero vectors (near_zero_positions) or vectors with NaN/inf entries "
                              "(nonfinite_positions); drop those positions")
    if bool(torch.isinf(below).any()):
        raise NopeInterpError(f"{fn}: sim must be finite below the diagonal (cosines are in [-1, 1]), got "
                              f"{int(torch.isinf(below).sum())} inf entries")


#: Below this many positions :func:`adjacency_counts` compares all pairs; from it on, it sorts.
SORT_THRESHOLD = 48


def adjacency_counts(sim: Float[Tensor, "*batch pos pos"]) -> Int[Tensor, "*batch pos"]:
    """Successes per row: #{i < j < k : sim[k, i] < sim[k, j]} (ties and NaN comparisons fail).

    Exact in every method (the same integers): on the CPU, the compiled merge-sort counter of
    :mod:`nope_interp.ckernel` (O(pos log pos) per row) when it is available; otherwise, on the tensor's
    device, all-pairs comparison (:func:`adjacency_counts_naive`) below :data:`SORT_THRESHOLD` positions
    and the vectorised O(pos log pos)-per-row count of :func:`adjacency_counts_sorted` from it on.

    Raises:
        NopeInterpError: ``sim`` is not a dense real floating tensor with data; the last two dimensions are
            not square; the matrix has NaN entries below the diagonal (near-zero vectors; see
            :func:`cosine_similarity_matrix`) or inf entries there.
    """
    _check_square_no_nan(sim, "adjacency_counts")
    if sim.shape[-1] >= 3 and sim.numel() > 0:
        counts = ckernel.adjacency_counts_c(sim)
        if counts is not None:
            return counts.to(sim.device)
    if sim.shape[-1] < SORT_THRESHOLD:
        return adjacency_counts_naive(sim)
    return adjacency_counts_sorted(sim)


def adjacency_counts_sorted(
    sim: Float[Tensor, "*batch pos pos"], max_elements: int = 2**25
) -> Int[Tensor, "*batch pos"]:
    """:func:`adjacency_counts` by ranking each row once and counting ordered pairs level by level.

    Method: row k keeps its k entries left of the diagonal; the rest is set to -inf. One stable sort
    per row turns values into distinct ranks, with ties broken against the pair order (so a tied pair
    i < j gets r_i > r_j and is not counted: ties fail). The number of pairs i < j with r_i < r_j is
    then counted by a most-significant-bit-first radix partition (as in a bottom-up merge-sort
    inversion count): at bit b, within each group of ranks sharing the higher bits, every element
    whose bit is 1 is preceded in column order by some elements whose bit is 0, and those pairs are
    exactly the ordered pairs first separated at bit b. Each level is a few O(pos) passes (cumsum,
    scatter); there are log2(pos) levels. Memory: O(pos^2) per sequence (sequences are processed in
    chunks of about ``max_elements`` matrix entries); no pos^3 tensor.

    Raises:
        NopeInterpError: as :func:`adjacency_counts`; ``max_elements`` not an integer >= 1.
    """
    _check_square_no_nan(sim, "adjacency_counts_sorted")
    max_elements = check_int("adjacency_counts_sorted: max_elements", max_elements, 1, 2**62)
    n = sim.shape[-1]
    flat = sim.reshape(-1, n, n)
    # bound memory: about max_elements matrix entries per chunk of sequences (at least one sequence)
    chunk = max(1, max_elements // (n * n))
    out = [_sorted_counts(flat[i : i + chunk]) for i in range(0, flat.shape[0], chunk)]
    return torch.cat(out).reshape(sim.shape[:-1])


def _sorted_counts(sim: Tensor, block_elements: int = 2**20) -> Tensor:
    """Row blocks of one chunk: rows [r0, r1) only need the columns left of r1 - 1, so each block is
    ranked and counted at its own (power-of-two) width; blocks stay small enough to stay in cache."""
    n = sim.shape[-1]
    total = torch.zeros(sim.shape[:-1], dtype=torch.int64, device=sim.device)
    r0 = 2  # rows 0 and 1 have no pairs
    while r0 < n:
        m = 1 << max(1, (r0 - 1).bit_length())  # width for rows up to about 2 * r0
        rows = max(1, min(n - r0, m - r0 + 1, block_elements // (m * max(1, sim.shape[0]))))
        r1 = r0 + rows
        total[:, r0:r1] = _count_rows(sim[:, r0:r1, : r1 - 1], r0, m)
        r0 = r1
    return total


def _count_rows(block: Tensor, first_row: int, m: int) -> Tensor:
    """Counts for rows first_row .. first_row + rows - 1 of a block ``[batch, rows, cols]`` (cols < m)."""
    b, rows, cols = block.shape
    v = torch.full((b, rows, m), float("-inf"), dtype=torch.float64, device=block.device)
    v[..., :cols] = block
    k = torch.arange(first_row, first_row + rows, device=block.device)
    v.masked_fill_(torch.arange(m, device=block.device)[None, :] >= k[:, None], float("-inf"))  # j >= k
    # ascending values; among ties the later column first (sort the reversed row stably)
    order = torch.argsort(v.flip(-1), dim=-1, stable=True)
    del v
    idx_dtype = torch.int32
    ranks = torch.empty(order.shape, dtype=idx_dtype, device=block.device)
    arange = torch.arange(m, device=block.device, dtype=idx_dtype)
    ranks.scatter_(-1, (m - 1) - order, arange.expand(order.shape).contiguous())
    del order
    total = torch.zeros(ranks.shape[:-1], dtype=torch.int64, device=block.device)
    nxt = torch.empty_like(ranks)
    for bit in range(m.bit_length() - 2, -1, -1):
        bits = (ranks >> bit) & 1
        cz = torch.cumsum(1 - bits, dim=-1, dtype=idx_dtype)
        cz -= 1 - bits  # zeros strictly before, in the current arrangement
        h = (ranks >> (bit + 1)) << bit  # zeros in all earlier groups (each group holds 2**bit of them)
        zb = cz - h  # zeros before, within the group
        total += (bits * zb).sum(-1, dtype=torch.int64)
        newpos = torch.where(bits.bool(), arange + (1 << bit) - zb, cz + h)
        nxt.scatter_(-1, newpos.long(), ranks)
        ranks, nxt = nxt, ranks
    return total


def adjacency_counts_naive(
    sim: Float[Tensor, "*batch pos pos"], max_elements: int = 2**24
) -> Int[Tensor, "*batch pos"]:
    """:func:`adjacency_counts` by comparing every pair (the reference; O(pos^3) per sequence).

    Computed in chunks of sequences so that no intermediate tensor holds more than about
    ``max_elements`` booleans.

    Raises:
        NopeInterpError: as :func:`adjacency_counts`; ``max_elements`` not an integer >= 1.
    """
    _check_square_no_nan(sim, "adjacency_counts_naive")
    max_elements = check_int("adjacency_counts_naive: max_elements", max_elements, 1, 2**62)
    n = sim.shape[-1]
    flat = sim.reshape(-1, n, n)
    # pair (i, j) counts in row k iff i < j < k
    idx = torch.arange(n, device=sim.device)
    valid = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < idx[:, None, None])  # k i j
    chunk = max(1, max_elements // max(1, n**3))
    out = []
    for start in range(0, flat.shape[0], chunk):
        s = flat[start : start + chunk]
        less = s.unsqueeze(-1) < s.unsqueeze(-2)  # [b, k, i, j] = s[k, i] < s[k, j]
        out.append((less & valid).sum(dim=(-1, -2)))
    return torch.cat(out).reshape(sim.shape[:-1])


def cosine_spread(sim: Float[Tensor, "*batch pos pos"], block_elements: int = 2**22) -> Float[Tensor, " *batch"]:
    """Max minus min of the strictly lower triangle of each cosine matrix (the entries the adjacency score
    compares): in [0, 2] for cosines; NaN entries are ignored, and a matrix with no other entry gives NaN.
    Computed in blocks of rows (about ``block_elements`` entries of extra memory), never copying the matrix.

    Raises:
        NopeInterpError: ``sim`` is not a dense real floating tensor with data; the last two dimensions are
            not square or there are fewer than 2 positions; an inf entry below the diagonal (cosines are in
            [-1, 1]: the spread would be inf or NaN); ``block_elements`` not an integer >= 1.
    """
    _check_square(sim, "cosine_spread", min_pos=2)
    block_elements = check_int("cosine_spread: block_elements", block_elements, 1, 2**62)
    n = sim.shape[-1]
    flat = sim.reshape(-1, n, n)
    hi = torch.full(flat.shape[:1], float("-inf"), dtype=torch.float64, device=sim.device)
    lo = torch.full(flat.shape[:1], float("inf"), dtype=torch.float64, device=sim.device)
    rows = max(1, block_elements // max(1, flat.shape[0] * n))
    cols = torch.arange(n, device=sim.device)
    for r0 in range(1, n, rows):  # row 0 has no entry below the diagonal
        block = flat[:, r0 : r0 + rows].to(torch.float64, copy=True)  # never the caller's tensor
        below = cols[None, :] < torch.arange(r0, r0 + block.shape[1], device=sim.device)[:, None]
        if bool((torch.isinf(block) & below).any()):
            raise NopeInterpError("cosine_spread: sim must have no inf entry below the diagonal (cosines are in "
                                  "[-1, 1]; NaN entries are ignored)")
        keep = below & ~torch.isnan(block)
        hi = torch.maximum(hi, block.masked_fill(~keep, float("-inf")).amax(dim=(-1, -2)))
        lo = torch.minimum(lo, block.masked_fill_(~keep, float("inf")).amin(dim=(-1, -2)))
        del block
    out = hi - lo
    out[torch.isinf(hi) & (hi < 0)] = float("nan")  # no entry that is not NaN
    return out.reshape(sim.shape[:-2])


def degenerate_tolerance(dtype: torch.dtype, cosines: bool = False) -> float:
    """The spread below which :func:`degenerate_sequences` calls a sequence degenerate, for vectors of
    ``dtype`` (``(ulps * eps) ** 2 / 2``, ulps = :data:`DEGENERATE_ULPS`, or :data:`DEGENERATE_ULPS_16BIT` for
    16-bit types; at least ``DEGENERATE_ULPS`` float64 eps, 2.8e-14, the rounding of the float64 cosines
    themselves, which decides for float64 vectors), or with ``cosines`` for a cosine matrix of ``dtype``
    given as such: float64 is assumed to come from float32 vectors (this module's matrices), a lower precision
    rounds the cosines themselves (``ulps_16bit * eps``, linear).

    Raises:
        NopeInterpError: ``dtype`` is not a floating ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise NopeInterpError(f"degenerate_tolerance needs a float dtype, got {dtype}")
    if cosines:
        if dtype == torch.float64:
            return degenerate_tolerance(torch.float32)
        return DEGENERATE_ULPS_16BIT * torch.finfo(dtype).eps
    ulps = DEGENERATE_ULPS_16BIT if torch.finfo(dtype).bits <= 16 else DEGENERATE_ULPS
    # floor: the cosines are computed in float64, whose own rounding (about d_model * eps64) would hide
    # float64 vectors' degeneracy below it ((128 eps64)^2 / 2 = 4e-28 is far under that rounding)
    return max((ulps * torch.finfo(dtype).eps) ** 2 / 2, DEGENERATE_ULPS * torch.finfo(torch.float64).eps)


def source_tolerance(dtype: torch.dtype, source_dtype: torch.dtype | None = None) -> float:
    """:func:`degenerate_tolerance` of vectors held as ``dtype`` but computed as ``source_dtype`` (None: as
    ``dtype``): the larger of the two, so that a cast after the computation (bfloat16 -> float32, float32 ->
    float64) never hides rounding-level spreads. Returns a spread of cosines (dimensionless, > 0).

    Raises:
        NopeInterpError: a dtype that is not a floating ``torch.dtype``.

    Method: this project's check, not the paper's (``docs/method.md``, "Definitions": degenerate sequences).
    """
    tol = degenerate_tolerance(dtype)
    return tol if source_dtype is None else max(tol, degenerate_tolerance(source_dtype))


def degenerate_sequences(sim: Float[Tensor, "*batch pos pos"],
                         tol: float | None = None) -> Bool[Tensor, " *batch"]:
    """True where a cosine matrix is constant below the diagonal up to rounding (:func:`cosine_spread` <
    ``tol``; None: :func:`degenerate_tolerance` of the matrix's dtype): every vector of the sequence parallel
    (one token repeated in a model without positional encoding; a constant input) or, rarely, vectors at
    equal angles. Such a matrix has no order to score (counted, its score would be 0 where the cosines tie
    exactly and set by rounding otherwise): :func:`adjacency_score` gives it NaN and :func:`summarize` leaves
    it out. A matrix with only NaN entries is not degenerate (the scores refuse it anyway).

    Raises:
        NopeInterpError: as :func:`cosine_spread`; ``tol`` not a number >= 0.

    Method: this project's check, not the paper's (``docs/method.md``, "Definitions": degenerate sequences).
    """
    _check_square(sim, "degenerate_sequences", min_pos=2)
    if tol is None:
        tol = degenerate_tolerance(sim.dtype, cosines=True)
    if not is_real(tol) or not tol >= 0:
        raise NopeInterpError(f"tol must be a number >= 0 or None, got {tol!r}")
    return cosine_spread(sim) < float(tol)  # NaN compares False


def _warn_degenerate(mask: Tensor, what: str) -> None:
    """Report the degenerate sequences of ``mask`` (a bool per sequence): to the innermost
    :func:`degenerate_report`, or as one :class:`~nope_interp.errors.DegenerateInputWarning`."""
    n_bad, n = int(mask.sum()), int(mask.numel())
    if _REPORTS:
        found, totals = _REPORTS[-1]
        found[what] = found.get(what, 0) + n_bad
        totals[what] = totals.get(what, 0) + n
        return
    if n_bad:
        warnings.warn(DegenerateInputWarning(
            f"{what}: {n_bad} of {n} sequences have constant cosines (vectors parallel up to rounding, e.g. one "
            "token repeated): they have no order to score, so their adjacency scores are NaN and left out of every "
            "summary",
            what, n_bad, n), stacklevel=user_stacklevel())


#: The open :func:`degenerate_report` s, innermost last: ({what: degenerate}, {what: sequences}).
_REPORTS: list[tuple[dict[str, int], dict[str, int]]] = []


@contextlib.contextmanager
def degenerate_report(summary_what: str = "the inputs", n_sequences: int | None = None,
                      stacklevel: int | None = None) -> Iterator[dict[str, int]]:
    """Collect the degenerate sequences that scores inside the block find, as ``{what: sequences}`` (summed
    over calls; filled on exit), and report them as ONE :class:`~nope_interp.errors.DegenerateInputWarning`
    naming every site, so that an analysis of many sites and chunks warns once. Nested reports pass their
    counts to the outer one, which warns. Other warnings are not touched. ``n_sequences``: how many sequences
    each site scores in all (default: counted). ``stacklevel``: as :func:`warnings.warn`, from the
    ``with`` statement's caller."""
    found: dict[str, int] = {}
    totals: dict[str, int] = {}
    _REPORTS.append((found, totals))
    try:
        yield found
    finally:
        _REPORTS.pop()
    bad = {k: v for k, v in found.items() if v}
    found.clear()
    found.update(bad)
    if n_sequences is not None:
        totals = {k: n_sequences for k in totals}
    if _REPORTS:  # nested: the outer report warns
        outer_found, outer_totals = _REPORTS[-1]
        for k, v in totals.items():
            outer_found[k] = outer_found.get(k, 0) + bad.get(k, 0)
            outer_totals[k] = outer_totals.get(k, 0) + v
        return
    if bad:
        worst = max(bad, key=bad.get)
        sites = ", ".join(f"{k.removeprefix('activations at ')} ({v}/{totals[k]})" for k, v in bad.items())
        warnings.warn(DegenerateInputWarning(
            f"{summary_what}: sequences with constant cosines (vectors parallel up to rounding, e.g. one token "
            f"repeated) at {len(bad)} site(s): {sites}; their adjacency scores are NaN (no order to score) and "
            "left out of every summary",
            worst, bad[worst], totals[worst]), stacklevel=user_stacklevel() if stacklevel is None else stacklevel)


def adjacency_score(
    sim: Float[Tensor, "*batch pos pos"], reduction: str = "row_mean"
) -> Float[Tensor, "*batch"]:
    """Adjacency probability score of each matrix, in [0, 1] (float64); NaN for a degenerate matrix (constant
    below the diagonal up to rounding, :func:`degenerate_sequences`: it has no order to score, and a number
    would be rounding noise).

    Args:
        sim: cosine-similarity matrices (only the strictly lower triangle is used).
        reduction: ``"row_mean"`` (paper: mean of row scores over rows k >= 2), ``"pooled"``
            (authors' code: total successes / total pairs) or ``"pooled_rounded"`` (``pooled`` rounded to
            :data:`AUTHORS_DECIMALS` decimals, as the authors report it).

    Raises:
        NopeInterpError: ``sim`` is not a dense real floating torch tensor with data (an integer dtype, a
            list, a meta tensor) or not square in its last two dimensions; unknown reduction; fewer than 3
            positions (no pair to compare); NaN or inf entries below the diagonal; no matrix (a batch of 0).

    Warns:
        DegenerateInputWarning: matrices constant below the diagonal (:func:`degenerate_sequences`).
    """
    _check_reductions((reduction,))
    _check_square_no_nan(sim, "adjacency_score")
    _check_positions(sim.shape[-1], fn="adjacency_score", shape=tuple(sim.shape))
    if sim.numel() == 0:
        raise NopeInterpError(f"no matrix to score (shape {tuple(sim.shape)})")
    counts = adjacency_counts(sim)
    flat = degenerate_sequences(sim)
    _warn_degenerate(flat, "cosine matrices")
    return _reduce(counts, reduction).masked_fill(flat, float("nan"))


def _check_reductions(reductions: object) -> None:
    if isinstance(reductions, str):
        raise NopeInterpError(f"reductions must be a list, got the single string {reductions!r} "
                              f"(write [{reductions!r}] for a list of one)")
    if not isinstance(reductions, Sequence) or not reductions:
        raise NopeInterpError(f"reductions must be a non-empty list of {', '.join(REDUCTIONS)}, got {reductions!r}")
    for reduction in reductions:
        if reduction not in REDUCTIONS:
            raise NopeInterpError(f"unknown reduction {reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    twice = repeated(reductions)
    if twice:  # the result holds one score per reduction: the second would be dropped
        raise NopeInterpError(f"reductions names {', '.join(map(repr, twice))} more than once")


def _check_positions(n: int, what: str = "", fn: str = "", shape: tuple[int, ...] | None = None) -> None:
    if n < 3:
        where = f"{what}: " if what and what != "activations" else ""
        seen = f" (shape {shape})" if shape is not None else ""
        raise NopeInterpError(f"{fn + ': ' if fn else ''}{where}the adjacency score needs at least 3 positions, got "
                              f"pos={n}{seen}")


def _reduce(counts: Tensor, reduction: str) -> Tensor:
    """Scores from the success counts per row (``*batch pos``) by ``reduction``."""
    succ = counts.double()
    pairs = row_pair_counts(counts.shape[-1]).double().to(succ.device)
    if reduction == "pooled":
        return succ.sum(-1) / pairs.sum()
    if reduction == "pooled_rounded":
        # Python's round(x, 2) of each float (it rounds the exact binary value: 0.475 -> 0.47); multiplying by
        # 100 first, as torch.round(x, decimals=2) and np.round do, can land on a tie that the value is not (0.48)
        pooled = succ.sum(-1) / pairs.sum()
        return torch.tensor([round(v, AUTHORS_DECIMALS) for v in pooled.flatten().tolist()],
                            dtype=pooled.dtype, device=pooled.device).reshape(pooled.shape)
    return (succ[..., 2:] / pairs[2:]).mean(-1)


@dataclass(frozen=True)
class ScoreSummary:
    """Mean and spread of per-sequence scores, over the sequences that have one.

    Attributes:
        mean: mean over scored sequences (NaN when none is). std: sample standard deviation (ddof=1; 0 for one
            scored sequence, NaN for none). n: number of scored sequences. n_degenerate: sequences left out
            because their score is undefined (NaN: a degenerate sequence, :func:`degenerate_sequences`).
    """

    mean: float
    std: float
    n: int
    n_degenerate: int = 0

    def to_dict(self) -> dict[str, float | int]:
        """Plain Python values (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`);
        ``n_degenerate`` only when sequences were left out."""
        extra = {"n_degenerate": self.n_degenerate} if self.n_degenerate else {}
        return {"mean": self.mean, "std": self.std, "n": self.n, **extra}


def summarize(scores: Float[Tensor, " batch"]) -> ScoreSummary:
    """Mean, sample std and count of a 1-D tensor of per-sequence scores. NaN entries are undefined scores
    (degenerate sequences, which :func:`adjacency_scores_of_activations` scores NaN): left out and counted in
    ``n_degenerate``, so that every reduction over sequences sees the same sequences (the prompt-averaged
    matrix, the averaging check's correlations).

    Raises:
        NopeInterpError: ``scores`` is not a non-empty 1-D dense real floating tensor with data, or has inf
            entries (a score is always finite or undefined: an infinite one is garbage upstream).
    """
    if isinstance(scores, Tensor) and scores.is_floating_point() and (scores.ndim != 1 or scores.numel() == 0):
        raise NopeInterpError(f"summarize needs a non-empty 1-D tensor, got shape {tuple(scores.shape)}")
    check_tensor(scores, "scores", "(batch,) with batch >= 1", ndim=1, min_sizes={0: 1}, fn="summarize")
    if bool(torch.isinf(scores).any()):
        raise NopeInterpError("summarize: scores has inf entries (a score is finite, or NaN where undefined)")
    scored = scores[~torch.isnan(scores)].double()
    n = int(scored.numel())
    mean = float(scored.mean()) if n else float("nan")
    std = float(scored.std()) if n > 1 else 0.0 if n == 1 else float("nan")
    return ScoreSummary(mean=mean, std=std, n=n, n_degenerate=int(scores.numel()) - n)


def adjacency_score_of_activations(
    x: Float[Tensor, "*batch pos d_model"], reduction: str = "row_mean", max_elements: int = 2**25,
    min_norm: float = DEFAULT_MIN_NORM, what: str = "activations", source_dtype: torch.dtype | None = None,
) -> Float[Tensor, "*batch"]:
    """:func:`adjacency_score` of :func:`cosine_similarity_matrix` without holding every matrix at once.

    Sequences are processed in chunks of about ``max_elements`` cosine entries (at least one
    sequence), so memory stays O(pos^2) per chunk however many sequences and layers are passed.
    ``what`` names ``x`` in error messages.

    Raises:
        NopeInterpError: as :func:`adjacency_scores_of_activations`.

    Warns:
        DegenerateInputWarning: as :func:`adjacency_scores_of_activations`.
    """
    return adjacency_scores_of_activations(x, (reduction,), max_elements, min_norm, what, source_dtype)[reduction]


def adjacency_scores_of_activations(
    x: Float[Tensor, "*batch pos d_model"], reductions: Sequence[str] = REDUCTIONS, max_elements: int = 2**25,
    min_norm: float = DEFAULT_MIN_NORM, what: str = "activations", source_dtype: torch.dtype | None = None,
) -> dict[str, Float[Tensor, "*batch"]]:
    """The adjacency score of every sequence under each of ``reductions``, counting each matrix once.

    Chunked as :func:`adjacency_score_of_activations`; scores in [0, 1] (float64), NaN for a degenerate
    sequence (vectors parallel up to rounding at every position: no order to score), identical to
    :func:`adjacency_score` of :func:`cosine_similarity_matrix`. ``what`` names ``x`` in error messages.
    ``source_dtype``: the dtype ``x`` was computed in when it was converted since (a bfloat16 model's
    activations cast to float32, float32 ones to float64): degeneracy is judged at the rounding of the coarser
    of the two (default ``x.dtype``), else a cast would hide it.

    Raises:
        NopeInterpError: ``x`` not a dense real floating torch tensor with data of at least 2 dimensions and
            d_model >= 1 (:func:`check_activations`); ``reductions`` empty, a single string, naming an unknown
            reduction or one twice; fewer than 3 positions; a batch of 0; vectors with NaN or inf entries
            (:func:`check_finite`); near-zero vectors (norm below ``min_norm``), whose cosines are undefined;
            ``min_norm`` not a finite number >= 0; ``max_elements`` not an integer >= 1.

    Warns:
        DegenerateInputWarning: sequences whose vectors are all parallel up to rounding
            (:func:`degenerate_sequences` at :func:`degenerate_tolerance` of ``x``'s dtype), once per call,
            naming ``what`` and how many (inside :func:`degenerate_report`: counted there instead).
    """
    return _scores_and_matrix_sum(x, reductions, max_elements, min_norm, what, source_dtype=source_dtype)[0]


def _scores_and_matrix_sum(
    x: Any, reductions: Any, max_elements: Any = 2**25, min_norm: Any = DEFAULT_MIN_NORM,
    what: str = "activations", matrix_sum: bool = False, source_dtype: Any = None,
) -> tuple[dict[str, Tensor], Tensor | None]:
    """:func:`adjacency_scores_of_activations`, and with ``matrix_sum`` the sum over sequences of their cosine
    matrices (float64 ``pos x pos``, exactly symmetric; its diagonal is the number of sequences) from the same
    matrices, so the prompt-averaged matrix costs no second pass over the activations."""
    _check_reductions(reductions)
    check_activations(x, "x" if what == "activations" else f"x ({what})", fn="adjacency_scores_of_activations")
    min_norm = _check_min_norm(min_norm, "adjacency_scores_of_activations")
    max_elements = check_int("max_elements", max_elements, 1, 2**62)  # a Python int: no numpy overflow
    n = x.shape[-2]
    _check_positions(n, what, "adjacency_scores_of_activations", tuple(x.shape))
    check_scorable(x, min_norm, what)
    flat = x.reshape(-1, n, x.shape[-1])
    if flat.shape[0] == 0:
        raise NopeInterpError(f"{what}: no sequence to score (a batch of 0)")
    chunk = max(1, max_elements // max(1, n * n))
    tol = source_tolerance(x.dtype, source_dtype)
    counts, degenerate = [], []
    total = torch.zeros(n, n, dtype=torch.float64, device=x.device) if matrix_sum else None
    for i in range(0, flat.shape[0], chunk):
        sim = _cosine(flat[i : i + chunk], min_norm, symmetric=False)
        counts.append(adjacency_counts(sim))
        degenerate.append(degenerate_sequences(sim, tol))
        if total is not None:
            total += sim.sum(0)  # its strictly lower triangle is the symmetric matrices'
        del sim
    degenerate = torch.cat(degenerate)
    _warn_degenerate(degenerate, what)
    counts = torch.cat(counts)
    if total is not None:  # the upper triangle as the mirror of the lower one, the diagonal one per sequence
        lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=total.device), diagonal=-1)
        total = torch.where(lower, total, total.T)
        total.diagonal().fill_(float(flat.shape[0]))
    # a degenerate sequence has no order to score: NaN, left out of every summary (summarize), not rounding noise
    return {r: _reduce(counts, r).masked_fill(degenerate, float("nan")).reshape(x.shape[:-2])
            for r in reductions}, total


def mean_cosine_similarity_matrix(
    x: Float[Tensor, "batch pos d_model"], max_elements: int = 2**25, min_norm: float = DEFAULT_MIN_NORM,
    what: str = "activations",
) -> Float[Tensor, "pos pos"]:
    """The prompt-averaged cosine similarity matrix: the mean over sequences of :func:`cosine_similarity_matrix`
    of each, in float64, entries in [-1, 1], exactly symmetric with a diagonal of 1. The authors' heat maps
    show this matrix and title it with its adjacency score (:func:`adjacency_score` of the result), a
    different quantity from the mean of per-sequence scores: averaging cancels each prompt's content and
    keeps what all prompts share, position among it (``docs/method.md``, "Definitions").

    Sequences are processed in chunks of about ``max_elements`` cosine entries, so memory stays O(pos^2).

    Raises:
        NopeInterpError: ``x`` not a dense real floating tensor of 3 dimensions with data, a batch, pos or
            d_model of 0; vectors with NaN or inf entries or near zero (their cosines are undefined; ``what``, a
            string, names ``x``);
            ``min_norm`` not a finite number >= 0; ``max_elements`` not an integer >= 1.
    """
    check_tensor(x, "x", "(batch, pos, d_model)", ndim=3, min_sizes={0: 1, 1: 1, 2: 1},
                 fn="mean_cosine_similarity_matrix")
    if not isinstance(what, str):
        raise NopeInterpError(f"mean_cosine_similarity_matrix: what must be a string naming x, got {what!r}"[:200])
    min_norm = _check_min_norm(min_norm, "mean_cosine_similarity_matrix")
    max_elements = check_int("max_elements", max_elements, 1, 2**62)  # a Python int: no numpy overflow
    check_scorable(x, min_norm, what)
    n = x.shape[-2]
    chunk = max(1, max_elements // max(1, n * n))
    total = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    for i in range(0, x.shape[0], chunk):
        total += _cosine(x[i : i + chunk], min_norm, symmetric=True).sum(0)
    return (total / x.shape[0]).clamp_(-1.0, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# The lag profile: mean cosine at each distance

def check_scorable(x: Float[Tensor, "*batch pos d_model"], min_norm: float = DEFAULT_MIN_NORM,
                   what: str = "activations") -> None:
    """Raise unless every vector of ``x`` is finite and not near zero, so that all their cosines are defined.

    Args:
        x: activations. min_norm: the L2 norm below which a vector counts as zero (:func:`near_zero_positions`).
        what: how the message names ``x`` (e.g. ``"activations at blocks.0.attn.hook_z"``).

    Raises:
        NopeInterpError: NaN or inf entries (:func:`check_finite`), or near-zero vectors (the message gives
            their count and the first index).
    """
    check_finite(x, what)
    zero = near_zero_positions(x, min_norm)
    if bool(zero.any()):
        first = tuple(int(i) for i in zero.nonzero()[0])
        raise NopeInterpError(
            f"{what} have {int(zero.sum())} near-zero vectors (L2 norm < min_norm={min_norm:g}; first at index "
            f"{first}): their cosines are undefined; drop those positions or lower min_norm")


def _check_lag(n_pos: int, max_lag: object) -> int:
    """The maximal lag D for ``n_pos`` positions: ``max_lag`` checked to be an int in [1, n_pos - 1], or
    ``n_pos - 1`` when it is None."""
    if n_pos < 2:
        raise NopeInterpError(f"the lag profile needs at least 2 positions, got pos={n_pos}")
    if max_lag is None:
        return n_pos - 1
    if not is_int(max_lag) or not 1 <= max_lag <= n_pos - 1:
        raise NopeInterpError(f"max_lag must be an integer in [1, {n_pos - 1}] (pos - 1) or None, got {max_lag!r}")
    return int(max_lag)


def _unit_vectors(x: Tensor) -> Tensor:
    """Float64 unit vectors of finite, non-zero vectors, scaled exactly as in :func:`cosine_similarity_matrix`."""
    y, _ = _pow2_scaled(x.double())
    return y.div_(torch.linalg.vector_norm(y, dim=-1, keepdim=True))


#: Fewest query positions per band of :func:`lag_profile` (a band is one matrix product of ``block x
#: (block + max_lag)`` cosines, of which ``block x max_lag`` are kept).
MIN_LAG_BLOCK = 256


def _lag_sums(u: Tensor, max_lag: int, max_elements: int) -> Tensor:
    """Sums over query positions i >= d of the clamped cosine of unit vectors ``u`` (``seq pos d``) at
    positions i and i - d, for d = 1..max_lag: ``seq lag`` float64.

    Query positions are taken in blocks of ``block`` (at least :data:`MIN_LAG_BLOCK` where memory allows);
    one block's band of the cosine matrix (its queries against the ``max_lag`` keys before each) is one
    matrix product, and the wanted diagonals are gathered from it. Memory: about ``seq * block * (block +
    max_lag)`` float64 entries, bounded by ``max_elements`` (at least one block of one query), never
    ``pos x pos``."""
    s, n, _ = u.shape
    lags = torch.arange(1, max_lag + 1, device=u.device)
    # blocks of at least MIN_LAG_BLOCK queries: few lags would otherwise mean many tiny products
    block = max(1, min(n - 1, max(max_lag, MIN_LAG_BLOCK)))
    while block > 1 and s * block * (block + max_lag) > max_elements:
        block //= 2
    sums = torch.zeros(s, max_lag, dtype=torch.float64, device=u.device)
    for q0 in range(1, n, block):
        q1 = min(n, q0 + block)
        k0 = max(0, q0 - max_lag)
        band = u[:, q0:q1] @ u[:, k0 : q1 - 1].transpose(-1, -2)  # seq query key
        key = torch.arange(q0, q1, device=u.device)[:, None] - lags[None, :]  # query lag -> key position
        valid = key >= 0
        picked = band.gather(-1, (key - k0).clamp_(min=0).expand(s, -1, -1)).clamp_(-1.0, 1.0)  # seq query lag
        sums += picked.masked_fill_(~valid, 0.0).sum(-2)
    return sums


def lag_profile(
    x: Float[Tensor, "*batch pos d_model"], max_lag: int | None = None, min_norm: float = DEFAULT_MIN_NORM,
    what: str = "activations", max_elements: int = 2**24,
) -> Float[Tensor, "*batch lag"]:
    """The lag profile of each sequence: c(d) = mean over query positions i >= d of cos(x_i, x_{i-d}).

    Entry ``[..., d - 1]`` is c(d) for d = 1..D (D = ``max_lag``, default pos - 1), in [-1, 1] (float64).
    Each cosine is the one :func:`cosine_similarity_matrix` gives (float64 for any float dtype, exact
    power-of-two scaling, clamped to [-1, 1]); c(d) averages the pos - d entries of the d-th diagonal
    below the main one. Where the adjacency score asks whether nearer positions are more similar (an
    order), the lag profile says how much: it is the similarity as a function of distance, to compare
    with the idealised curves of :func:`uniform_causal_lag_profile` and :func:`sliding_window_lag_profile`.

    Only the wanted diagonals are computed, in blocks of query positions (sequences and blocks chunked
    to about ``max_elements`` float64 entries), so memory grows with pos * D, not pos^2, and the time with
    pos * D * d_model. ``what`` names ``x`` in error messages.

    Raises:
        NopeInterpError: ``x`` not a dense real floating torch tensor with data of at least 2 dimensions and
            d_model >= 1 (:func:`check_activations`); fewer than 2 positions; ``max_lag`` not an integer in
            [1, pos - 1]; vectors with NaN or inf entries (:func:`check_finite`); near-zero vectors (norm
            below ``min_norm``); ``min_norm`` not a finite number >= 0; ``max_elements`` not an integer >= 1; no
            sequence (a batch of 0).
    """
    check_activations(x, "x" if what == "activations" else f"x ({what})", fn="lag_profile")
    min_norm = _check_min_norm(min_norm, "lag_profile")
    max_elements = check_int("max_elements", max_elements, 1, 2**62)  # a Python int: no numpy overflow
    n = x.shape[-2]
    d_max = _check_lag(n, max_lag)
    if x.numel() == 0:
        raise NopeInterpError(f"lag_profile: no sequence to profile (a batch of 0), got shape {tuple(x.shape)}")
    check_scorable(x, min_norm, what)
    flat = x.reshape(-1, n, x.shape[-1])
    chunk = max(1, max_elements // max(1, n * x.shape[-1] + 3 * d_max * min(n, d_max)))
    counts = (n - torch.arange(1, d_max + 1, dtype=torch.float64, device=x.device))
    out = [_lag_sums(_unit_vectors(flat[i : i + chunk]), d_max, max_elements) / counts
           for i in range(0, flat.shape[0], chunk)]
    return torch.cat(out).reshape(*x.shape[:-2], d_max)


def recency_gap(profile: Float[Tensor, "*batch lag"]) -> Float[Tensor, "*batch"]:
    """c(1) - c(D) of lag profiles (:func:`lag_profile`): how much more similar the previous position is
    than the farthest one profiled, in [-2, 2]; about 0 where similarity does not fall with distance.

    Raises:
        NopeInterpError: an empty lag axis; ``profile`` not a dense real floating tensor with data, or with
            NaN or inf entries (cosines are finite).
    """
    if isinstance(profile, Tensor) and (profile.ndim < 1 or profile.shape[-1] < 1):
        raise NopeInterpError(f"recency_gap needs lag profiles with at least one lag, got shape {tuple(profile.shape)}")
    check_tensor(profile, "profile", "(*batch, lag)", min_ndim=1, finite=True, fn="recency_gap")
    return profile[..., 0] - profile[..., -1]


def sliding_window_lag_profile(n_pos: int, window: int, max_lag: int | None = None) -> Float[Tensor, " lag"]:
    """The idealised lag profile of sliding-window uniform attention of width ``window`` over i.i.d. inputs.

    Position i averages the ``min(i + 1, window)`` inputs at positions max(0, i - window + 1)..i. For
    i.i.d. zero-mean isotropic inputs in a large dimension, the cosine of two such averages tends to the
    number of shared inputs over the square root of the product of the two counts; this is averaged over
    query positions i = d..n_pos - 1 as in :func:`lag_profile`. Away from the start (i >= window - 1 + d)
    each term is max(0, 1 - d / window): the profile falls linearly to 0 at d = window. A window of at
    least ``n_pos`` is uniform causal attention (:func:`uniform_causal_lag_profile`).

    Returns:
        ``[d - 1]`` = idealised c(d) for d = 1..D (default D = n_pos - 1), in [0, 1), float64.

    Raises:
        NopeInterpError: ``n_pos`` < 2; ``window`` not an integer >= 1; ``max_lag`` not in [1, n_pos - 1]; a
            table of positions that would not fit the free memory (:func:`check_host_memory`).
    """
    if not is_int(n_pos):
        raise NopeInterpError(f"n_pos must be an integer >= 2, got {n_pos!r}")
    n_pos = int(n_pos)
    d_max = _check_lag(n_pos, max_lag)
    if not is_int(window) or window < 1:
        raise NopeInterpError(f"window must be an integer >= 1, got {window!r}")
    window = min(int(window), n_pos)  # a window of n_pos or more keys is uniform causal attention
    _check_lag_memory("sliding_window_lag_profile", n_pos, d_max)

    def terms(i: Tensor, d: Tensor) -> Tensor:
        j = i - d  # key positions
        size_i = torch.clamp(i + 1, max=window)
        size_j = torch.clamp(j + 1, min=1, max=window)
        shared = torch.clamp(j - torch.clamp(i - window + 1, min=0) + 1, min=0)
        return torch.where(j >= 0, shared / torch.sqrt(size_i * size_j), 0.0)

    return _lag_means(n_pos, d_max, terms)


def uniform_causal_lag_profile(n_pos: int, max_lag: int | None = None) -> Float[Tensor, " lag"]:
    """The idealised lag profile of uniform causal attention over i.i.d. inputs.

    Position i is the mean of the inputs at positions 0..i. For i.i.d. zero-mean isotropic inputs in a
    large dimension, the cosine of positions i and i - d tends to sqrt((i - d + 1) / (i + 1)) (the shared
    i - d + 1 inputs over the root of the two counts); this is averaged over query positions i = d..n_pos - 1
    as in :func:`lag_profile`. Every small lag tends to 1 as n_pos grows: the recency gap shrinks with
    the length of the sequence.

    Returns:
        ``[d - 1]`` = idealised c(d) for d = 1..D (default D = n_pos - 1), in (0, 1), float64.

    Raises:
        NopeInterpError: ``n_pos`` < 2 or not an integer; ``max_lag`` not in [1, n_pos - 1]; a table of positions
            that would not fit the free memory (:func:`check_host_memory`).
    """
    if not is_int(n_pos):
        raise NopeInterpError(f"n_pos must be an integer >= 2, got {n_pos!r}")
    n_pos = int(n_pos)
    d_max = _check_lag(n_pos, max_lag)
    _check_lag_memory("uniform_causal_lag_profile", n_pos, d_max)
    return _lag_means(n_pos, d_max,
                      lambda i, d: torch.where(i >= d, torch.sqrt(torch.clamp(i - d + 1, min=0) / (i + 1)), 0.0))


#: Elements of the (lags x positions) table an idealised lag profile builds at once (32 MiB of float64).
_LAG_CHUNK = 1 << 22


def _check_lag_memory(fn: str, n_pos: int, d_max: int) -> None:
    """:func:`check_host_memory` for :func:`_lag_means`: the positions (float64) and about six temporaries of
    one block of lags x positions."""
    block = min(d_max, max(1, _LAG_CHUNK // n_pos)) * n_pos
    check_host_memory(f"{fn}(n_pos={n_pos}, max_lag={d_max})",
                      {"positions (float64)": 8 * n_pos, "a block of lags x positions and temporaries": 6 * 8 * block},
                      "use fewer positions")


def _lag_means(n_pos: int, d_max: int, terms: Callable[[Tensor, Tensor], Tensor]) -> Float[Tensor, " lag"]:
    """``[d - 1]`` = mean over query positions i = d..n_pos - 1 of ``terms(i, d)`` (zero for i < d), for d =
    1..d_max, built a block of lags at a time so that memory stays bounded for long sequences."""
    i = torch.arange(n_pos, dtype=torch.float64)[None, :]  # query positions
    step = max(1, _LAG_CHUNK // n_pos)
    out = []
    for start in range(1, d_max + 1, step):
        d = torch.arange(start, min(d_max, start + step - 1) + 1, dtype=torch.float64)[:, None]
        out.append(terms(i, d).sum(-1) / (n_pos - d.squeeze(-1)))
    return torch.cat(out)


def lag_summary(profiles: Float[Tensor, "batch lag"]) -> dict[str, Any]:
    """Mean and spread over sequences of lag profiles (:func:`lag_profile`), as plain Python values.

    Returns:
        ``{"lags": [1..D], "mean": [c(d)], "std": [sample std, ddof=1; 0 for one sequence], "n": sequences,
        "recency_gap": {"mean", "std", "n"} of c(1) - c(D) per sequence}``; cosines in [-1, 1].

    Raises:
        NopeInterpError: not a non-empty 2-D dense real floating tensor with data (sequences x lags); NaN or
            inf entries (cosines are finite).
    """
    if isinstance(profiles, Tensor) and (profiles.ndim != 2 or profiles.shape[0] == 0 or profiles.shape[1] == 0):
        raise NopeInterpError(f"lag_summary needs a non-empty (sequences, lags) tensor, got shape "
                              f"{tuple(profiles.shape)}")
    check_tensor(profiles, "profiles", "(sequences, lags)", ndim=2, finite=True, fn="lag_summary")
    p = profiles.double()
    std = p.std(0) if p.shape[0] > 1 else torch.zeros(p.shape[1], dtype=torch.float64)
    return {"lags": list(range(1, p.shape[1] + 1)), "mean": p.mean(0).tolist(), "std": std.tolist(),
            "n": int(p.shape[0]), "recency_gap": summarize(recency_gap(p)).to_dict()}
