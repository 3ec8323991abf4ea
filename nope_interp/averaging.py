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

from nope_interp.checks import is_int
from nope_interp.errors import NopeInterpError
from nope_interp.similarity import (
    check_host_memory,
    check_tensor,
    degenerate_sequences,
    degenerate_tolerance,
    tie_equal_vectors,
)

PATTERN_KINDS = ("uniform", "identity", "random_matched")

#: How far an attention row's sum may be from 1 (float16 patterns round to about 1e-3 per row).
ROW_SUM_TOL = 1e-2


def _checked(x: object, name: str, shape: str, fn: str, *, ndim: int | None = None, min_ndim: int = 0) -> Tensor:
    """``x`` after the shared tensor check (:func:`nope_interp.similarity.check_tensor`: a real floating torch
    tensor of ``ndim`` dimensions, or at least ``min_ndim``, no empty dimension, every entry finite), detached
    (a tensor that requires grad is read, never differentiated)."""
    check_tensor(x, name, shape, ndim=ndim, min_ndim=min_ndim, finite=True, fn=fn)
    if 0 in x.shape:
        raise NopeInterpError(f"{fn}: {name} must not have an empty dimension, got shape {tuple(x.shape)}")
    return x.detach()


def check_size(name: str, value: object, low: int = 1) -> int:
    """``value`` as a Python int, checked: an integer (Python or numpy, not a bool) >= ``low``.

    Raises:
        NopeInterpError: not an integer, a bool, or below ``low``.
    """
    if not is_int(value) or value < low:
        raise NopeInterpError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_pattern(pattern: object, causal: Any = True, window: Any = None, name: str = "pattern",
                  fn: str = "check_pattern") -> Float[Tensor, "*batch query_pos key_pos"]:
    """An attention pattern, checked: a float tensor ``*batch query_pos key_pos`` with non-negative entries
    whose rows sum to 1 (within :data:`ROW_SUM_TOL`); when ``causal``, square with nothing above the diagonal
    (and, with a sliding ``window``, nothing more than ``window - 1`` keys back). Returned detached.

    Raises:
        NopeInterpError: not a real float tensor of at least 2 dimensions, or NaN/inf entries
            (:func:`nope_interp.similarity.check_tensor`; ``fn`` is the function named in the message);
            a negative entry; a row whose sum is not 1; ``causal`` not a bool; a causal pattern that is not square
            or puts weight on a later key (a bidirectional model's pattern: pass ``causal=False``) or outside
            its window.
    """
    p = _checked(pattern, name, "(*batch, query_pos, key_pos)", fn, min_ndim=2)
    if not isinstance(causal, bool):
        raise NopeInterpError(f"{fn}: causal must be True or False, got {causal!r}")
    if bool((p < 0).any()):
        raise NopeInterpError(f"{fn}: {name} must be non-negative (softmax weights), got a minimum of "
                              f"{float(p.min()):.3g}")
    err = float((p.double().sum(-1) - 1).abs().max())
    if err > ROW_SUM_TOL:
        raise NopeInterpError(f"{fn}: {name} rows must sum to 1 (softmax weights), got a row {err:.3g} away from 1")
    if causal:
        q, k = p.shape[-2:]
        if q != k:
            raise NopeInterpError(f"{fn}: {name} must be square (query_pos == key_pos) when causal, got "
                                  f"shape {tuple(p.shape)}")
        earlier = torch.tril(torch.ones(q, k, dtype=torch.bool, device=p.device))
        later = float(p.masked_fill(earlier, 0).abs().max())
        if later > 0:
            raise NopeInterpError(f"{fn}: {name} (checked as causal) puts weight {later:.3g} on a later key (a "
                                  f"bidirectional pattern: pass causal=False)")
        if window is not None:
            outside = float(p.masked_fill(~torch.tril(earlier, diagonal=-window), 0).abs().max())
            if outside > 0:
                raise NopeInterpError(f"{fn}: {name} puts weight {outside:.3g} on a key outside its sliding "
                                      f"window of {window}")
    return p


def pattern_weighted_values(
    pattern: Float[Tensor, "batch n_heads query_pos key_pos"], v: Float[Tensor, "batch key_pos n_kv_heads d_head"]
) -> Float[Tensor, "batch query_pos n_heads d_head"]:
    """z = pattern @ v per head: what TransformerLens stores at ``attn.hook_z`` (an exact identity).

    Raises:
        NopeInterpError: either is not a 4-D float tensor with finite entries; their batch or key sizes differ,
            or their head counts, unless ``v``'s divides ``pattern``'s (grouped-query attention: each key/value
            head serves ``n_heads / n_key_value_heads`` consecutive query heads, as in TransformerLens). Both
            are computed in the wider of their two dtypes.
    """
    pattern = _checked(pattern, "pattern", "(batch, n_heads, query_pos, key_pos)", "pattern_weighted_values", ndim=4)
    v = _checked(v, "v", "(batch, key_pos, n_heads, d_head)", "pattern_weighted_values", ndim=4)
    b, h, _, k = pattern.shape
    if (v.shape[0], v.shape[1]) == (b, k) and v.shape[2] < h and h % v.shape[2] == 0:
        # grouped-query attention: query head i reads key/value head i // (n_heads / n_key_value_heads),
        # TransformerLens's repeat_interleave
        v = v.repeat_interleave(h // v.shape[2], dim=2)
    if (v.shape[0], v.shape[1], v.shape[2]) != (b, k, h):
        raise NopeInterpError(f"pattern {tuple(pattern.shape)} (batch n_heads query_pos key_pos) and v "
                              f"{tuple(v.shape)} (batch key_pos n_heads d_head) disagree in batch, key_pos or n_heads "
                              "(v may have fewer heads when they divide n_heads: grouped-query attention)")
    dtype = torch.promote_types(pattern.dtype, v.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", pattern.to(dtype), v.to(dtype))


def attention_row_cosine(
    pattern: Float[Tensor, "*batch query_pos key_pos"],
) -> Float[Tensor, "*batch query_pos query_pos"]:
    """Predicted cosine matrix of an attention layer's output from its pattern alone (float64).

    The cosine between attention rows: the expected output cosine when the value vectors are i.i.d.,
    zero-mean and isotropic (module docstring). Values in [0, 1] for non-negative patterns.

    Raises:
        NopeInterpError: ``pattern`` is not a float tensor of at least 2 dimensions with finite entries, or has
            an all-zero row (its cosine is undefined).
    """
    a = _checked(pattern, "pattern", "(*batch, query_pos, key_pos)", "attention_row_cosine", min_ndim=2).double()
    gram = a @ a.transpose(-1, -2)
    norm = torch.linalg.vector_norm(a, dim=-1)
    if bool((norm == 0).any()):   # a zero row has no direction: its cosines were read as exactly 1 (tied rows)
        zero = (norm == 0).nonzero()[0].tolist()
        raise NopeInterpError(f"attention_row_cosine: pattern has {int((norm == 0).sum())} all-zero rows (first at "
                              f"index {tuple(zero)}); attention rows are weights summing to 1, and the cosine of a "
                              "zero row is undefined")
    cos = (gram / (norm.unsqueeze(-1) * norm.unsqueeze(-2)).clamp_min(1e-300)).clamp(-1.0, 1.0)
    return tie_equal_vectors(cos, a)  # equal rows (collapsed attention) get exactly equal cosines


def uniform_causal_pattern(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """A[q, k] = 1/(q+1) for k <= q, else 0 (what near-zero attention scores give).

    Raises:
        NopeInterpError: ``n_pos`` not an integer >= 1 (:func:`check_size`); a matrix that would not fit
            the free memory (:func:`~nope_interp.similarity.check_host_memory`).
    """
    n_pos = check_size("n_pos", n_pos)
    check_host_memory(f"uniform_causal_pattern(n_pos={n_pos})",
                      {"the pattern and its mask (float64)": 2 * 8 * n_pos**2}, "use fewer positions")
    mask = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.float64))
    return mask / mask.sum(-1, keepdim=True)


def identity_pattern(n_pos: int) -> Float[Tensor, "query_pos key_pos"]:
    """Each position attends only to itself (no averaging).

    Raises:
        NopeInterpError: ``n_pos`` not an integer >= 1 (:func:`check_size`); a matrix that would not fit
            the free memory (:func:`~nope_interp.similarity.check_host_memory`).
    """
    n_pos = check_size("n_pos", n_pos)
    check_host_memory(f"identity_pattern(n_pos={n_pos})", {"the pattern (float64)": 8 * n_pos**2},
                      "use fewer positions")
    return torch.eye(n_pos, dtype=torch.float64)


def closed_form_uniform_cosine(n_pos: int) -> Float[Tensor, "query_pos query_pos"]:
    """cos(y_i, y_k) = sqrt(min(i, k) / max(i, k)) in 1-based positions: uniform causal averaging of
    i.i.d. zero-mean inputs in the limit of large d_model (Zuo, Guerzhoy & Guerzhoy, COLING 2025).

    Raises:
        NopeInterpError: ``n_pos`` not an integer >= 1 (:func:`check_size`); a matrix that would not fit
            the free memory (:func:`~nope_interp.similarity.check_host_memory`).
    """
    n_pos = check_size("n_pos", n_pos)
    check_host_memory(f"closed_form_uniform_cosine(n_pos={n_pos})",
                      {"the matrix and three temporaries (float64)": 4 * 8 * n_pos**2}, "use fewer positions")
    pos = torch.arange(1, n_pos + 1, dtype=torch.float64)
    lo, hi = torch.minimum(pos[:, None], pos[None, :]), torch.maximum(pos[:, None], pos[None, :])
    return torch.sqrt(lo / hi)


def attention_entropy(pattern: Float[Tensor, "*batch query_pos key_pos"]) -> Float[Tensor, "*batch query_pos"]:
    """Shannon entropy of each attention row, in nats (0 * log 0 = 0), in [0, log(key_pos)].

    Raises:
        NopeInterpError: ``pattern`` is not an attention pattern (:func:`check_pattern` with ``causal=False``:
            negative entries or rows that do not sum to 1 would give entropies outside that range).
    """
    p = check_pattern(pattern, causal=False, fn="attention_entropy").double()
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
        NopeInterpError: ``window`` below 1, or given with ``causal=False``; ``pattern`` is not an attention
            pattern of that kind (:func:`check_pattern`: with ``causal=True`` a weight on a later key, as a
            bidirectional model's pattern has, would give values above 1).
    """
    if window is not None and (not is_int(window) or window < 1 or causal is not True):
        raise NopeInterpError(f"window must be an integer >= 1 with causal attention, got {window!r} "
                              f"(causal={causal})")
    window = None if window is None else int(window)
    pattern = check_pattern(pattern, causal, window, fn="relative_entropy_to_uniform")
    n = pattern.shape[-1]
    h = attention_entropy(pattern)
    if not causal:
        return h / math.log(n) if n > 1 else torch.full_like(h, float("nan"))
    keys = torch.arange(1, n + 1, dtype=torch.float64, device=h.device)
    if window is not None:
        keys = keys.clamp_max(window)
    out = h / torch.log(keys).clamp_min(1e-300)
    out[..., keys == 1] = float("nan")
    return out


def attention_window(cfg: Any, layer: int) -> int | None:
    """The sliding-window size (keys, the query's own included) of ``layer``, else None (every earlier key
    allowed).

    Read from a TransformerLens config with local attention (``use_local_attn`` and ``window_size``; models that
    mix global and local layers, ``attn_types`` GPT-Neo style, have a window only in their ``"local"`` layers),
    or from the Hugging Face fields a ``TransformerBridge``'s config carries (:func:`nope_interp.hf.bridge_from_hf`
    copies them): ``sliding_window`` in every layer (Mistral), or only in the ``"sliding_attention"`` layers of
    ``layer_types`` (Qwen2, Gemma), none when ``use_sliding_window`` is False. In both, query ``q`` sees keys
    ``q - window + 1 .. q``.

    Raises:
        NopeInterpError: ``layer`` not an index into ``attn_types`` or ``layer_types`` when the config has them.
    """
    if getattr(cfg, "use_local_attn", False):
        kinds, local, size = getattr(cfg, "attn_types", None), "local", cfg.window_size
    elif getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False:
        kinds, local, size = getattr(cfg, "layer_types", None), "sliding_attention", cfg.sliding_window
    else:
        return None
    if kinds:
        name = "attn_types" if local == "local" else "layer_types"
        if not is_int(layer) or not 0 <= layer < len(kinds):
            raise NopeInterpError(f"layer must be an integer in [0, {len(kinds)}) for this model's {name}, "
                                  f"got {layer!r}")
        if kinds[layer] != local:
            return None
    return int(size)


def random_causal_pattern(
    target_entropy: Float[Tensor, "*batch query_pos"], generator: torch.Generator, iters: int = 60
) -> Float[Tensor, "*batch query_pos key_pos"]:
    """A random causal pattern whose rows have the given entropies (nats).

    Each row is softmax(g / T) over the allowed keys 0..q with g ~ N(0, 1) from ``generator``; the
    temperature T is found by bisection (entropy rises monotonically with T) so the row entropy matches
    ``target_entropy`` to about 1e-6 where the target is reachable (at most log(q+1)).

    Raises:
        NopeInterpError: ``target_entropy`` not a float tensor with finite entries; ``generator`` not a
            ``torch.Generator`` (the draw must be reproducible); ``iters`` not an integer >= 1; patterns that would
            not fit the free memory (:func:`~nope_interp.similarity.check_host_memory`).
    """
    target_entropy = _checked(target_entropy, "target_entropy", "(*batch, query_pos)", "random_causal_pattern",
                              min_ndim=1)
    if not isinstance(generator, torch.Generator):
        raise NopeInterpError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
                              f"got {type(generator).__name__}")
    iters = check_size("iters", iters)
    n = target_entropy.shape[-1]
    shape = (*target_entropy.shape, n)
    check_host_memory(f"random_causal_pattern(target_entropy of shape {tuple(target_entropy.shape)})",
                      {"the logits and five temporaries (float64)": 6 * 8 * math.prod(shape)},
                      "use fewer or shorter rows")
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
    """Variance across the d_model coordinates of each position's vector (Chi et al., 2023), float64.

    Raises:
        NopeInterpError: ``x`` is not a float tensor of at least 2 dimensions with finite entries.
    """
    x = _checked(x, "x", "(*batch, pos, d_model)", "per_position_variance", min_ndim=2)
    return x.double().var(dim=-1, unbiased=False)


def lower_triangle_spearman(pred: Float[Tensor, "pos pos"], obs: Float[Tensor, "pos pos"]) -> float:
    """Spearman rank correlation (scipy) between the strictly-lower-triangle entries of two matrices, in
    [-1, 1]; NaN when either triangle is constant.

    Raises:
        NopeInterpError: either is not a square 2-D float tensor with finite entries; their shapes differ;
            fewer than 3 positions.
    """
    pred = _checked(pred, "pred", "(pos, pos)", "lower_triangle_spearman", ndim=2)
    obs = _checked(obs, "obs", "(pos, pos)", "lower_triangle_spearman", ndim=2)
    if pred.shape != obs.shape or pred.shape[0] != pred.shape[1]:
        raise NopeInterpError(f"pred and obs must be square matrices of one shape, got {tuple(pred.shape)} and "
                              f"{tuple(obs.shape)}")
    n = pred.shape[-1]
    if n < 3:
        raise NopeInterpError(f"lower_triangle_spearman: need at least 3 positions for a rank correlation, got {n}")
    idx = torch.tril_indices(n, n, offset=-1)
    a = pred[idx[0], idx[1]].double().cpu().numpy()
    b = obs[idx[0], idx[1]].double().cpu().numpy()
    if np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(spearmanr(a, b).statistic)


def sequence_spearmans(pred: Float[Tensor, "batch pos pos"], obs: Float[Tensor, "batch pos pos"],
                       pred_dtype: torch.dtype, obs_dtype: torch.dtype) -> tuple[list[float], Tensor, Tensor]:
    """:func:`lower_triangle_spearman` of each sequence's predicted and observed cosine matrices, NaN for the
    sequences where either matrix is constant up to the rounding of the values it came from
    (:func:`~nope_interp.similarity.degenerate_sequences` with the tolerance of ``pred_dtype`` (the attention
    pattern's) and ``obs_dtype`` (the activations'), not of the float64 matrices): their ranks would be
    rounding noise. The one rule of :func:`nope_interp.lens.averaging_check` and the averaging job; this
    project's check, not the paper's (``docs/method.md``, "Definitions": degenerate sequences).

    Returns:
        ``(rho, degenerate_pred, degenerate_obs)``: one correlation per sequence in [-1, 1] or NaN, and which
        sequences' predicted / observed matrices are constant (bool, ``batch``).

    Raises:
        NopeInterpError: as :func:`lower_triangle_spearman`; a dtype that is not floating.
    """
    bad_pred = degenerate_sequences(pred, tol=degenerate_tolerance(pred_dtype))
    bad_obs = degenerate_sequences(obs, tol=degenerate_tolerance(obs_dtype))
    rho = [math.nan if bool(bad_pred[b] | bad_obs[b]) else lower_triangle_spearman(pred[b], obs[b])
           for b in range(pred.shape[0])]
    return rho, bad_pred, bad_obs


def vector_spearman(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> float:
    """Spearman rank correlation (scipy) of two vectors, in [-1, 1]; NaN if either is constant.

    Raises:
        NopeInterpError: either is not a 1-D float tensor with finite entries; their lengths differ; fewer
            than 2 entries.
    """
    a = _checked(a, "a", "(n,)", "vector_spearman", ndim=1)
    b = _checked(b, "b", "(n,)", "vector_spearman", ndim=1)
    if a.shape != b.shape or a.shape[0] < 2:
        raise NopeInterpError(f"a and b must be vectors of one length >= 2, got {tuple(a.shape)} and {tuple(b.shape)}")
    x, y = a.double().cpu().numpy(), b.double().cpu().numpy()
    if np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    return float(spearmanr(x, y).statistic)
