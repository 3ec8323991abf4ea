"""Ablations of the positional structure of the residual stream: does the model *use* it?

The mean decomposition of Song & Zhong (arXiv 2310.04861): over many prompts of one task, the
positional mean mu[p] is the average activation at position p; the content part is h_p - mu[p]. The
positional subspace is spanned by the top-r principal directions of the centred means mu - mean_p(mu).

Ablations (each a hook factory; applied only through ``model.hooks``/``run_with_hooks``):

* ``shuffle_positional``: h_p - mu[p] + mu[pi(p)] for a random permutation pi (content kept, position
  scrambled);
* ``mean_positional``: h_p - mu[p] + mean_p mu (position removed, content kept);
* ``mean_positional_random``: h_p + |mean_p mu - mu[p]| u_p with u_p a random unit vector per position, drawn
  once (the control of ``mean_positional``: a shift of the same size at every position, in a random direction;
  this project's);
* ``project_out``: remove the rank-r positional subspace (controls: a random subspace of the same rank,
  ``project_out_random``, and the top-r principal directions of the content part h - mu, ``project_out_content``,
  which hold as much variance as any r directions outside position do);
* ``shuffle_vectors``: permute whole vectors across positions (a floor: destroys everything);
* ``swap_prompts``: exchange activations between prompts at the same position (keeps position, destroys
  content): every prompt of a forward pass gets another prompt's vectors (a random permutation of the batch
  with no fixed point, drawn once per batch size, so the repeated forward passes of greedy decoding read the
  same donors; before 2026-12-03 a fresh permutation on every pass left some prompts unswapped).

Greedy decoding: every ablation acts on the prompt positions 0..P-1 only (P = the task's full prompt
length; mu, permutations and subspaces are defined there). Positions of generated answer tokens pass
through unchanged, for every ablation alike. This holds for decoding that reruns the whole sequence on every
step (:func:`nope_interp.evaluate.greedy_decode`, or TransformerLens's ``model.generate(...,
use_past_kv_cache=False)``). With a key/value cache (``generate``'s default) each step's forward pass holds
the new token alone, which a hook cannot tell from a one-token prompt at position 0: it is then ablated as
position 0 (``project_out``) or refused as a 1-position sequence (``mean_positional``).
"""

import math
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int, Integer
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from nope_interp.checks import is_int, is_real
from nope_interp.errors import NopeInterpError
from nope_interp.similarity import check_host_memory, check_tensor

#: How far ``basis.T @ basis`` may be from the identity for a basis to count as orthonormal (float32 bases
#: computed by an SVD are orthonormal to about 1e-6).
ORTHONORMAL_TOL = 1e-4


def _check_rank(rank: object, high: int, fn: str) -> int:
    if not is_int(rank) or not 0 <= rank <= high:
        raise NopeInterpError(f"{fn}: rank must be an integer in [0, {high}], got {rank!r}")
    return int(rank)


def check_basis(basis: object, d_model: int, fn: str) -> Float[Tensor, "d_model rank"]:
    """``basis`` checked as an orthonormal basis of a subspace of R^d_model: a real float tensor
    ``(d_model, rank)`` with finite entries and ``basis.T @ basis`` within :data:`ORTHONORMAL_TOL` of the
    identity (projecting out a non-orthonormal basis removes the wrong amount). Returned as float64.

    Raises:
        NopeInterpError: any of these fails; ``fn`` names the public function in the message.
    """
    check_tensor(basis, "basis", "(d_model, rank)", ndim=2, finite=True, fn=fn)
    if basis.shape[0] != d_model:
        raise NopeInterpError(f"{fn}: basis must have d_model={d_model} rows, got shape {tuple(basis.shape)}")
    b = basis.detach().double()
    err = float((b.T @ b - torch.eye(b.shape[1], dtype=torch.float64, device=b.device)).abs().max()) if b.shape[1] \
        else 0.0
    if err > ORTHONORMAL_TOL:
        raise NopeInterpError(f"{fn}: basis must have orthonormal columns (basis.T @ basis = I), got an entry "
                              f"{err:.3g} away from the identity ("
                              + ("16-bit rounding alone: give the basis in float32 or float64"
                                 if torch.finfo(basis.dtype).bits <= 16 and err <= 64 * torch.finfo(basis.dtype).eps
                                 else "orthonormalise it with torch.linalg.qr") + ")")
    return b


def _check_acts(acts: object, fn: str, shape: str = "(batch, pos, d_model)", ndim: int = 3) -> Tensor:
    check_tensor(acts, "acts" if ndim == 3 else "mu", shape, ndim=ndim, min_sizes={i: 1 for i in range(ndim)},
                 finite=True, fn=fn)
    return acts.detach()

ABLATIONS = ("shuffle_positional", "mean_positional", "project_out", "project_out_random", "shuffle_vectors",
             "swap_prompts", "mean_positional_random", "project_out_content")
ResidHook = Callable[..., Float[Tensor, "batch pos d_model"]]


def positional_means(acts: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "pos d_model"]:
    """mu[p]: the mean activation at each position over prompts (float64); Song & Zhong's positional mean.

    Raises:
        NopeInterpError: ``acts`` is not a real float tensor ``(batch, pos, d_model)`` with data and finite
            entries.
    """
    return _check_acts(acts, "positional_means").double().mean(0)


def positional_decomposition(
    acts: Float[Tensor, "batch pos d_model"], rel_zero: float = 1e-6
) -> dict[str, Any]:
    """How much of a site's structure is positional: Song & Zhong's mean decomposition h = mu[p] + c.

    Splits each activation into its positional mean mu[p] (over prompts) and its content part
    c = h - mu[p], and measures both (the adjacency score of ``docs/method.md``, row mean):

    * ``positional_variance_fraction``: sum_p |mu[p] - m|^2 / sum_{b,p} |h[b,p] - m|^2 * batch, with m the
      grand mean: the share of the activation variance explained by position (law of total variance;
      in [0, 1]).
    * ``adjacency_full``: mean over prompts of the adjacency score of h (as ``analyze`` reports it).
    * ``adjacency_positional``: the adjacency score of the single sequence mu.
    * ``adjacency_content``: mean over prompts of the adjacency score of c.

    A position whose content part is zero in some prompt has undefined content cosines: the fixed
    prefix of a task's prompts (``$`` at position 0 is the same vector in every prompt), or a fixed
    token that a model ignoring the earlier tokens maps to one vector (seen in the chance-level
    indexing models). All three scores and the variance share therefore use only the positions whose
    content is non-zero in every prompt, in their order (``dropped_positions`` lists the others); a
    content vector counts as zero below ``rel_zero`` times the median norm of h.

    Caveat for fixed-format prompts: a token that always sits at the same position (``(`` in
    ``order(``, ``+`` in full-length additions) is part of mu[p], so "positional" here means "the same
    at this position in every prompt", token identity included; norms that differ a lot between such
    positions make the variance share large (measured at blocks.1.hook_resid_pre, mean over 3 seeds:
    addition 0.76, reversal 0.93, ordering 0.95; indexing 0.42).

    Raises:
        NopeInterpError: ``acts`` not a real float tensor with finite entries; fewer than 2 prompts, or fewer
            than 3 usable positions; ``rel_zero`` not a finite number in [0, 1).
    """
    from nope_interp.similarity import adjacency_score_of_activations

    acts = _check_acts(acts, "positional_decomposition")
    if acts.shape[0] < 2:
        raise NopeInterpError(f"positional_decomposition needs (batch >= 2, pos, d_model), got {tuple(acts.shape)}")
    if not is_real(rel_zero) or not math.isfinite(rel_zero) or not 0 <= rel_zero < 1:
        raise NopeInterpError(f"positional_decomposition: rel_zero must be a finite number in [0, 1), got {rel_zero!r}")
    source = acts.dtype
    h = acts.double()
    content = h - h.mean(0)
    scale = float(torch.linalg.vector_norm(h, dim=-1).median())
    zero = (torch.linalg.vector_norm(content, dim=-1) <= rel_zero * scale).any(0)
    keep = torch.nonzero(~zero).flatten()
    if keep.numel() < 3:
        raise NopeInterpError(f"positional_decomposition: fewer than 3 of the {h.shape[1]} positions have a "
                              f"non-zero content part in every prompt (usable: {keep.tolist()}), so no adjacency "
                              f"score can be computed")
    h, content = h[:, keep], content[:, keep]
    mu = h.mean(0)
    grand = mu.mean(0)
    total = float(((h - grand) ** 2).sum(-1).mean())
    between = float(((mu - grand) ** 2).sum(-1).mean())
    return {
        "positional_variance_fraction": between / total if total > 0 else float("nan"),
        # degeneracy judged at the precision the activations came in (h is their float64 copy)
        "adjacency_full": float(adjacency_score_of_activations(h, source_dtype=source).nanmean()),
        "adjacency_positional": float(adjacency_score_of_activations(mu, source_dtype=source)),
        "adjacency_content": float(adjacency_score_of_activations(content, source_dtype=source).nanmean()),
        "dropped_positions": torch.nonzero(zero).flatten().tolist(),
        "n_prompts": int(h.shape[0]),
    }


def positional_subspace(mu: Float[Tensor, "pos d_model"], rank: int) -> Float[Tensor, "d_model rank"]:
    """Orthonormal basis of the top-``rank`` principal directions of the centred positional means.

    Raises:
        NopeInterpError: ``mu`` not a real float tensor ``(pos, d_model)`` with finite entries; ``rank`` not an
            integer in [0, min(pos - 1, d_model)] (pos - 1 and d_model bound it); ``rank`` above the number of
            directions the centred means actually span (singular values above 1e-9 of the largest): the rest
            of the basis would be arbitrary directions, not positional ones.
    """
    mu = _check_acts(mu, "positional_subspace", "(pos, d_model)", ndim=2)
    n, d = mu.shape
    rank = _check_rank(rank, min(n - 1, d), "positional_subspace")
    centred = mu.double() - mu.double().mean(0, keepdim=True)
    return _top_directions(centred, rank, "positional_subspace: the centred positional means span")


def _top_directions(rows: Float[Tensor, "n d_model"], rank: int, what: str) -> Float[Tensor, "d_model rank"]:
    """The top-``rank`` right singular vectors of ``rows`` as columns; NopeInterpError (``what`` + the count)
    when ``rows`` span fewer directions (singular values above 1e-9 of the largest)."""
    _, sv, vh = torch.linalg.svd(rows, full_matrices=False)
    spanned = int((sv > 1e-9 * float(sv[0])).sum()) if float(sv[0]) > 0 else 0
    if rank > spanned:
        raise NopeInterpError(f"{what} {spanned} direction(s), so rank {rank} would add arbitrary ones; "
                              f"use rank <= {spanned}")
    return vh[:rank].T.contiguous()


def content_subspace(acts: Float[Tensor, "batch pos d_model"], rank: int) -> Float[Tensor, "d_model rank"]:
    """Orthonormal basis of the top-``rank`` principal directions (uncentred: h - mu has mean zero at every
    position) of the content part h - mu[p] of ``acts``, pooled over prompts and positions: the directions
    holding the most variance that is not position's, the variance-rich control of :func:`positional_subspace`.
    Principal components of the content part of the mean decomposition (Song & Zhong, arXiv 2310.04861); the
    use as a control is this project's.

    Raises:
        NopeInterpError: ``acts`` not a real float tensor ``(batch >= 2, pos, d_model)`` with finite entries;
            ``rank`` not an integer in [0, d_model]; ``rank`` above the number of directions the content spans
            (singular values above 1e-9 of the largest).
    """
    acts = _check_acts(acts, "content_subspace")
    if acts.shape[0] < 2:
        raise NopeInterpError(f"content_subspace needs (batch >= 2, pos, d_model), got {tuple(acts.shape)}")
    rank = _check_rank(rank, acts.shape[2], "content_subspace")
    content = (acts.double() - acts.double().mean(0, keepdim=True)).reshape(-1, acts.shape[2])
    return _top_directions(content, rank, "content_subspace: the content part spans")


def random_subspace(d_model: int, rank: int, generator: torch.Generator) -> Float[Tensor, "d_model rank"]:
    """A uniformly random orthonormal basis of ``rank`` directions (QR of a Gaussian matrix, signs fixed by
    the diagonal of R so that the distribution is Haar; Mezzadri, Notices of the AMS 2007).

    Raises:
        NopeInterpError: ``d_model`` not an integer >= 1; ``rank`` not an integer in [0, d_model]; ``generator``
            not a ``torch.Generator``; a basis that would not fit the free memory
            (:func:`~nope_interp.similarity.check_host_memory`).
    """
    if not is_int(d_model) or d_model < 1:
        raise NopeInterpError(f"random_subspace: d_model must be an integer >= 1, got {d_model!r}")
    d_model = int(d_model)
    rank = _check_rank(rank, d_model, "random_subspace")
    if not isinstance(generator, torch.Generator):
        raise NopeInterpError(f"random_subspace: generator must be a torch.Generator, got {type(generator).__name__}")
    check_host_memory(f"random_subspace(d_model={d_model}, rank={rank})",
                      {"the Gaussian matrix, its QR factors and the basis (float64)": 4 * 8 * d_model * max(rank, 1)
                       + 8 * max(rank, 1) ** 2}, "use a smaller d_model or rank")
    q, r = torch.linalg.qr(torch.randn(d_model, max(rank, 1), generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).contiguous()[:, :rank]


def project_out(h: Float[Tensor, "... d_model"], basis: Float[Tensor, "d_model rank"]) -> Float[Tensor, "... d_model"]:
    """h minus its orthogonal projection onto the span of ``basis`` (orthonormal columns), in ``h``'s dtype.

    Raises:
        NopeInterpError: ``h`` not a real float tensor with finite entries; ``basis`` not an orthonormal
            ``(d_model, rank)`` basis for ``h``'s last dimension (:func:`check_basis`).
    """
    check_tensor(h, "h", "(..., d_model)", min_ndim=1, finite=True, fn="project_out")
    b = check_basis(basis, h.shape[-1], "project_out").to(h.dtype)
    return h - (h @ b) @ b.T


def derangement(n: int, generator: torch.Generator) -> Int[Tensor, " n"]:
    """A uniformly random permutation of ``range(n)`` with no fixed point (rejection sampling: about e draws).

    Raises:
        NopeInterpError: ``n`` not an integer >= 2 (one element cannot be moved); ``generator`` not a
            ``torch.Generator``; a permutation that would not fit the free memory
            (:func:`~nope_interp.similarity.check_host_memory`).
    """
    if not is_int(n) or n < 2:
        raise NopeInterpError(f"derangement: n must be an integer >= 2, got {n!r}")
    if not isinstance(generator, torch.Generator):
        raise NopeInterpError(f"derangement: generator must be a torch.Generator, got {type(generator).__name__}")
    check_host_memory(f"derangement(n={int(n)})", {"the permutation, a range and a mask (int64)": 17 * int(n)},
                      "use a smaller n")
    while True:
        perm = torch.randperm(int(n), generator=generator)
        if not bool((perm == torch.arange(int(n))).any()):
            return perm


def _prompt_part(fn: Callable[[Tensor], Tensor], n_prompt: int) -> ResidHook:
    """Wrap a transform of the prompt positions into a hook that leaves later positions unchanged."""

    def hook(resid: Float[Tensor, "batch pos d_model"], hook: HookPoint | None = None) -> Tensor:
        p = min(n_prompt, resid.shape[1])
        head = fn(resid[:, :p].double()).to(resid.dtype)
        return torch.cat([head, resid[:, p:]], dim=1)

    return hook


def ablation_hook(
    kind: str, mu: Float[Tensor, "pos d_model"], *, perm: Integer[Tensor, " pos"] | None = None,
    basis: Float[Tensor, "d_model rank"] | None = None, generator: torch.Generator | None = None,
) -> ResidHook:
    """A residual-stream hook for ablation ``kind`` acting on the first ``mu.shape[0]`` positions.

    Args:
        kind: one of :data:`ABLATIONS` (``project_out_random`` is ``project_out`` with a random basis).
        mu: positional means on the prompt positions.
        perm: the permutation of prompt positions for ``shuffle_positional``/``shuffle_vectors`` (any integer dtype,
            uint8 included; used as int64).
        basis: the subspace for ``project_out``, ``project_out_random`` and ``project_out_content``.
        generator: for ``swap_prompts`` (a permutation of the batch without fixed points, drawn once per batch
            size) and ``mean_positional_random`` (its random directions, drawn once when the hook is built).

    Raises:
        NopeInterpError: unknown kind or a missing argument; ``mu`` not a real float tensor ``(pos, d_model)``
            with finite entries; ``perm`` not a permutation of ``range(pos)``; ``basis`` not an orthonormal
            ``(d_model, rank)`` basis (:func:`check_basis`); ``generator`` not a ``torch.Generator``; ``perm``,
            ``basis`` or ``generator`` given to a kind that does not use it (it would be ignored). When the
            hook runs: activations whose width is not ``mu``'s, or, for the kinds that use ``mu`` or ``perm``,
            sequences shorter than ``mu``'s positions; ``swap_prompts`` on a batch of one prompt (nothing to
            swap with).
    """
    if kind not in ABLATIONS:
        raise NopeInterpError(f"unknown ablation {kind!r}; allowed: {', '.join(ABLATIONS)}")
    uses = {"perm": ("shuffle_positional", "shuffle_vectors"),
            "basis": ("project_out", "project_out_random", "project_out_content"),
            "generator": ("swap_prompts", "mean_positional_random")}
    for arg, value in (("perm", perm), ("basis", basis), ("generator", generator)):
        if value is not None and kind not in uses[arg]:  # a careless call would run another ablation than meant
            raise NopeInterpError(f"ablation_hook: {arg}= is not used by ablation {kind!r} (only by "
                                  f"{', '.join(uses[arg])}): leave it out")
    mu = _check_acts(mu, "ablation_hook", "(pos, d_model)", ndim=2).double()
    n = mu.shape[0]
    if kind in ("shuffle_positional", "shuffle_vectors"):
        if perm is None:
            raise NopeInterpError(f"ablation {kind!r} needs perm")
        if (not isinstance(perm, Tensor) or perm.dtype.is_floating_point or perm.dtype.is_complex
                or perm.dtype == torch.bool or perm.ndim != 1
                or not torch.equal(torch.sort(perm.cpu()).values, torch.arange(n, dtype=perm.dtype))):
            got = (f"{perm.dtype} of shape {tuple(perm.shape)}" if isinstance(perm, Tensor)
                   else type(perm).__name__)
            raise NopeInterpError(f"ablation_hook: perm must be a permutation of range({n}) (an integer tensor of the "
                                  f"{n} prompt positions, each once), got a {got} that is not")
        # int64 for indexing: torch reads a uint8 index as a boolean mask (a wrong result, with only a deprecation
        # warning) and refuses int8 / int16 / int32 indices inside the hook
        perm = perm.to(torch.long)
    if kind in ("project_out", "project_out_random", "project_out_content"):
        if basis is None:
            raise NopeInterpError(f"ablation {kind!r} needs basis")
        basis = check_basis(basis, mu.shape[1], "ablation_hook")
    if kind in ("swap_prompts", "mean_positional_random") and not isinstance(generator, torch.Generator):
        raise NopeInterpError(f"ablation {kind!r} needs a torch.Generator, got {type(generator).__name__}")
    shift = None
    orders: dict[int, Tensor] = {}  # swap_prompts: one derangement per batch size
    if kind == "mean_positional_random":
        size = (mu.mean(0, keepdim=True) - mu).norm(dim=-1, keepdim=True)  # mean_positional's shift, per position
        u = torch.randn(mu.shape, generator=generator, dtype=torch.float64)
        shift = size * u / u.norm(dim=-1, keepdim=True)

    def transform(h: Tensor) -> Tensor:
        if h.shape[-1] != mu.shape[1]:
            raise NopeInterpError(f"ablation hook {kind!r} was built for d_model={mu.shape[1]} (mu's width), applied "
                                  f"to activations of width {h.shape[-1]}")
        if kind in ("shuffle_positional", "mean_positional", "shuffle_vectors", "mean_positional_random") \
                and h.shape[1] != n:
            raise NopeInterpError(f"ablation hook {kind!r} acts on the {n} prompt positions of mu, applied to a "
                                  f"sequence of {h.shape[1]} positions: build it with mu of this prompt length")
        m = mu.to(h.device)
        if kind == "shuffle_positional":
            return h - m + m[perm]
        if kind == "mean_positional":
            return h - m + m.mean(0, keepdim=True)
        if kind == "mean_positional_random":
            return h + shift.to(h.device)
        if kind in ("project_out", "project_out_random", "project_out_content"):
            return project_out(h, basis.to(h.device))
        if kind == "shuffle_vectors":
            return h[:, perm]
        b = h.shape[0]
        if b not in orders:
            if b < 2:
                raise NopeInterpError("ablation 'swap_prompts' needs at least 2 prompts in a forward pass (each "
                                      "prompt takes another's vectors), got 1")
            orders[b] = derangement(b, generator)
        return h[orders[b].to(h.device)]

    return _prompt_part(transform, n)
