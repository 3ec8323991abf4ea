"""Cosine-similarity matrices and the adjacency score (pure functions on tensors).

Definitions (paper.md, "Definitions"):

* Self cosine-similarity matrix of a sequence X (pos x d_model): C[i, j] = X_i . X_j / (|X_i| |X_j|).
* Adjacency score of row k (0-based, k >= 2): over all k(k-1)/2 pairs i < j < k of earlier positions,
  the fraction with C[k, i] < C[k, j] (the nearer position is strictly more similar; ties fail).
  ``row_mean`` (the paper's matrix score) averages row scores over k = 2..pos-1; ``pooled`` (the
  authors' code) divides all successes by all pairs. Random order gives about 0.5, a perfect
  adjacency pattern 1.0, the reverse order 0.0. For a row without ties the row score equals
  (1 + tau) / 2, tau = Kendall's rank correlation of (position, similarity).
"""

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from nope_interp.errors import NopeInterpError

REDUCTIONS = ("row_mean", "pooled")
#: Vectors with an L2 norm below this are "near zero": their cosines are undefined (NaN).
DEFAULT_MIN_NORM = 1e-8


def near_zero_positions(
    x: Float[Tensor, "*batch pos d_model"], min_norm: float = DEFAULT_MIN_NORM
) -> Bool[Tensor, "*batch pos"]:
    """True where the vector's L2 norm is below ``min_norm`` (its cosine similarities are undefined)."""
    return torch.linalg.vector_norm(x.double(), dim=-1) < min_norm


def cosine_similarity_matrix(
    x: Float[Tensor, "*batch pos d_model"], min_norm: float = DEFAULT_MIN_NORM
) -> Float[Tensor, "*batch pos pos"]:
    """Self cosine-similarity matrix of each sequence, in float64, clamped to [-1, 1].

    Args:
        x: activations; any leading batch dimensions.
        min_norm: vectors with norm below this are near zero; every entry in their row and column is
            NaN (reported, not hidden as 0). Use :func:`near_zero_positions` to find them.

    Returns:
        ``C[..., i, j]`` in [-1, 1] (float64), symmetric, diagonal 1 (NaN for near-zero vectors).
    """
    x64 = x.double()
    norms = torch.linalg.vector_norm(x64, dim=-1, keepdim=True)
    unit = x64 / norms.clamp_min(min_norm)
    c = (unit @ unit.transpose(-1, -2)).clamp(-1.0, 1.0)
    bad = norms.squeeze(-1) < min_norm
    if bool(bad.any()):
        nan = torch.full_like(c, float("nan"))
        c = torch.where(bad.unsqueeze(-1) | bad.unsqueeze(-2), nan, c)
    return c


def row_pair_counts(n_pos: int) -> Int[Tensor, " pos"]:
    """Pairs i < j < k compared in row k: k(k-1)/2 (0 for rows 0 and 1)."""
    k = torch.arange(n_pos, dtype=torch.int64)
    return k * (k - 1) // 2


def adjacency_counts(
    sim: Float[Tensor, "*batch pos pos"], max_elements: int = 2**24
) -> Int[Tensor, "*batch pos"]:
    """Successes per row: #{i < j < k : sim[k, i] < sim[k, j]} (ties and NaN comparisons fail).

    Vectorised over pairs; O(pos^3) work per sequence, computed in chunks of sequences so that no
    intermediate tensor holds more than about ``max_elements`` booleans.

    Raises:
        NopeInterpError: if the last two dimensions are not square, or the matrix has NaN entries
            below the diagonal (near-zero vectors; see :func:`cosine_similarity_matrix`).
    """
    if sim.ndim < 2 or sim.shape[-1] != sim.shape[-2]:
        raise NopeInterpError(f"a similarity matrix must be square in its last two dims, got {tuple(sim.shape)}")
    n = sim.shape[-1]
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
    if bool(torch.isnan(sim[..., lower]).any()):
        raise NopeInterpError("the similarity matrix has NaN entries (near-zero vectors); drop those positions")
    flat = sim.reshape(-1, n, n)
    # pair (i, j) counts in row k iff i < j < k
    idx = torch.arange(n)
    valid = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < idx[:, None, None])  # k i j
    chunk = max(1, max_elements // max(1, n**3))
    out = []
    for start in range(0, flat.shape[0], chunk):
        s = flat[start : start + chunk]
        less = s.unsqueeze(-1) < s.unsqueeze(-2)  # [b, k, i, j] = s[k, i] < s[k, j]
        out.append((less & valid).sum(dim=(-1, -2)))
    return torch.cat(out).reshape(sim.shape[:-1])


def adjacency_score(
    sim: Float[Tensor, "*batch pos pos"], reduction: str = "row_mean"
) -> Float[Tensor, "*batch"]:
    """Adjacency probability score of each matrix, in [0, 1] (float64).

    Args:
        sim: cosine-similarity matrices (only the strictly lower triangle is used).
        reduction: ``"row_mean"`` (paper: mean of row scores over rows k >= 2) or ``"pooled"``
            (authors' code: total successes / total pairs).

    Raises:
        NopeInterpError: unknown reduction; fewer than 3 positions (no pair to compare); NaN entries.
    """
    if reduction not in REDUCTIONS:
        raise NopeInterpError(f"unknown reduction {reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    n = sim.shape[-1]
    if n < 3:
        raise NopeInterpError(f"the adjacency score needs at least 3 positions, got pos={n}")
    succ = adjacency_counts(sim).double()
    pairs = row_pair_counts(n).double()
    if reduction == "pooled":
        return succ.sum(-1) / pairs.sum()
    return (succ[..., 2:] / pairs[2:]).mean(-1)


@dataclass(frozen=True)
class ScoreSummary:
    """Mean and spread of per-sequence scores.

    Attributes:
        mean: mean over sequences. std: sample standard deviation (ddof=1; 0 for one sequence).
        n: number of sequences.
    """

    mean: float
    std: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready dict."""
        return {"mean": self.mean, "std": self.std, "n": self.n}


def summarize(scores: Float[Tensor, " batch"]) -> ScoreSummary:
    """Mean, sample std and count of a 1-D tensor of per-sequence scores."""
    if scores.ndim != 1 or scores.numel() == 0:
        raise NopeInterpError(f"summarize needs a non-empty 1-D tensor, got shape {tuple(scores.shape)}")
    std = float(scores.double().std()) if scores.numel() > 1 else 0.0
    return ScoreSummary(mean=float(scores.double().mean()), std=std, n=int(scores.numel()))
