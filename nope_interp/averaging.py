"""The averaging effect (``docs/method.md``, "The averaging effect"): pure functions on attention patterns.

In a causal attention layer the output at query position q is the pattern-weighted average of the
value vectors of positions 0..q. If the values were i.i.d. zero-mean isotropic vectors, the expected
inner product of two outputs would be the inner product of their attention rows, so the cosine matrix
of the outputs is predicted by the cosine matrix of the attention rows:

    pred[q1, q2] = <A[q1], A[q2]> / (|A[q1]| |A[q2]|)

With uniform causal attention (A[q, k] = 1/(q+1) for k <= q) this is sqrt((i)/(k)) in 1-based
positions i <= k (the closed form of Zuo, Guerzhoy & Guerzhoy, COLING 2025), and the per-coordinate
variance of the output at 1-based position k is 1/k times that of the inputs (Chi et al., ACL 2023).
The measurements that use these functions on models are in :mod:`nope_interp.averaging_checks`.
"""

import math
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from scipy.stats import spearmanr
from torch import Tensor

from nope_interp.errors import NopeInterpError

PATTERN_KINDS = ("uniform", "identity", "random_matched")


def pattern_weighted_values(
    pattern: Float[Tensor, "batch n_heads query_pos key_pos"], v: Float[Tensor, "batch key_pos n_heads d_head"]
) -> Float[Tensor, "batch query_pos n_heads d_head"]:
    """z = pattern @ v per head: what TransformerLens stores at ``attn.hook_z`` (an exact identity)."""
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


def attention_row_cosine(
    pattern: Float[Tensor, "*batch query_pos key_pos"],
) -> Float[Tensor, "*batch query_pos query_pos"]:
    """Predicted cosine matrix of an attention layer's output from its pattern alone (float64).

    The cosine between attention rows: the expected output cosine when the value vectors are i.i.d.,
    zero-mean and isotropic (module docstring). Values in [0, 1] for non-negative patterns.
    """
    a = pattern.double()
    gram = a @ a.transpose(-1, -2)
    norm = torch.linalg.vector_norm(a, dim=-1)
    return (gram / (norm.unsqueeze(-1) * norm.unsqueeze(-2)).clamp_min(1e-300)).clamp(-1.0, 1.0)


def uniform_causal_pattern(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """A[q, k] = 1/(q+1) for k <= q, else 0 (what near-zero attention scores give)."""
    if n_pos < 1:
        raise NopeInterpError(f"n_pos must be >= 1, got {n_pos}")
    mask = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.float64))
    return mask / mask.sum(-1, keepdim=True)


def identity_pattern(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """Each position attends only to itself (no averaging)."""
    return torch.eye(n_pos, dtype=torch.float64)


def closed_form_uniform_cosine(n_pos: int) -> Float[Tensor, "query_pos query_pos"]:
    """cos(y_i, y_k) = sqrt(min(i, k) / max(i, k)) in 1-based positions: uniform causal averaging of
    i.i.d. zero-mean inputs in the limit of large d_model (Zuo, Guerzhoy & Guerzhoy, COLING 2025)."""
    pos = torch.arange(1, n_pos + 1, dtype=torch.float64)
    lo, hi = torch.minimum(pos[:, None], pos[None, :]), torch.maximum(pos[:, None], pos[None, :])
    return torch.sqrt(lo / hi)


def attention_entropy(pattern: Float[Tensor, "*batch query_pos key_pos"]) -> Float[Tensor, "*batch query_pos"]:
    """Shannon entropy of each attention row, in nats (0 * log 0 = 0)."""
    p = pattern.double()
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1)


def relative_entropy_to_uniform(
    pattern: Float[Tensor, "*batch query_pos key_pos"], causal: bool = True, window: int | None = None
) -> Float[Tensor, "*batch query_pos"]:
    """Row entropy divided by the entropy of uniform attention over the row's allowed keys.

    Causal: log(q+1) for query q; with a sliding ``window`` (query q sees keys q - window + 1 .. q, as
    TransformerLens's local attention), log(min(q+1, window)). A row with a single allowed key (row 0, or
    every row when ``window == 1``) is NaN: its entropy is 0 either way.
    Bidirectional (``causal=False``): log(key_pos) for every row. 1.0 means uniform, 0.0 one-hot.

    Raises:
        NopeInterpError: ``window`` below 1, or given with ``causal=False``.
    """
    n = pattern.shape[-1]
    h = attention_entropy(pattern)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1 or not causal):
        raise NopeInterpError(f"window must be an integer >= 1 with causal attention, got {window!r} "
                              f"(causal={causal})")
    if not causal:
        return h / math.log(n) if n > 1 else torch.full_like(h, float("nan"))
    keys = torch.arange(1, n + 1, dtype=torch.float64, device=h.device)
    if window is not None:
        keys = keys.clamp_max(window)
    out = h / torch.log(keys).clamp_min(1e-300)
    out[..., keys == 1] = float("nan")
    return out


def attention_window(cfg: Any) -> int | None:
    """The sliding-window size of a TransformerLens config with local attention (``use_local_attn``), else
    None (every earlier key allowed)."""
    return int(cfg.window_size) if getattr(cfg, "use_local_attn", False) else None


def random_causal_pattern(
    target_entropy: Float[Tensor, "*batch query_pos"], generator: torch.Generator, iters: int = 60
) -> Float[Tensor, "*batch query_pos key_pos"]:
    """A random causal pattern whose rows have the given entropies (nats).

    Each row is softmax(g / T) over the allowed keys 0..q with g ~ N(0, 1) from ``generator``; the
    temperature T is found by bisection (entropy rises monotonically with T) so the row entropy matches
    ``target_entropy`` to about 1e-6 where the target is reachable (at most log(q+1)).
    """
    n = target_entropy.shape[-1]
    shape = (*target_entropy.shape, n)
    logits = torch.randn(shape, generator=generator, dtype=torch.float64)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
    logits = logits.masked_fill(~allowed, float("-inf"))
    target = target_entropy.double().clamp(min=0.0)
    target = torch.minimum(target, torch.log(torch.arange(1, n + 1, dtype=torch.float64)))
    lo = torch.full(target.shape, -8.0, dtype=torch.float64)  # log10 temperature bounds
    hi = torch.full(target.shape, 8.0, dtype=torch.float64)
    for _ in range(iters):
        mid = (lo + hi) / 2
        h = attention_entropy(torch.softmax(logits / (10**mid).unsqueeze(-1), dim=-1))
        too_high = h > target
        hi = torch.where(too_high, mid, hi)
        lo = torch.where(too_high, lo, mid)
    return torch.softmax(logits / (10 ** ((lo + hi) / 2)).unsqueeze(-1), dim=-1)


def per_position_variance(x: Float[Tensor, "*batch pos d_model"]) -> Float[Tensor, "*batch pos"]:
    """Variance across the d_model coordinates of each position's vector (Chi et al., 2023), float64."""
    return x.double().var(dim=-1, unbiased=False)


def lower_triangle_spearman(pred: Float[Tensor, "pos pos"], obs: Float[Tensor, "pos pos"]) -> float:
    """Spearman rank correlation (scipy) between the strictly-lower-triangle entries of two matrices."""
    n = pred.shape[-1]
    if n < 3:
        raise NopeInterpError(f"need at least 3 positions for a rank correlation, got {n}")
    idx = torch.tril_indices(n, n, offset=-1)
    a = pred[idx[0], idx[1]].double().cpu().numpy()
    b = obs[idx[0], idx[1]].double().cpu().numpy()
    if np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(spearmanr(a, b).statistic)


def vector_spearman(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> float:
    """Spearman rank correlation (scipy) of two vectors; NaN if either is constant."""
    x, y = a.double().cpu().numpy(), b.double().cpu().numpy()
    if np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(spearmanr(x, y).statistic)
