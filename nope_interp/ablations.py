"""Ablations of the positional structure of the residual stream (issue: does the model *use* it?).

The mean decomposition of Song & Zhong (arXiv 2310.04861): over many prompts of one task, the
positional mean mu[p] is the average activation at position p; the content part is h_p - mu[p]. The
positional subspace is spanned by the top-r principal directions of the centred means mu - mean_p(mu).

Ablations (each a hook factory; applied only through ``model.hooks``/``run_with_hooks``):

* ``shuffle_positional``: h_p - mu[p] + mu[pi(p)] for a random permutation pi (content kept, position
  scrambled);
* ``mean_positional``: h_p - mu[p] + mean_p mu (position removed, content kept);
* ``project_out``: remove the rank-r positional subspace (control: a random subspace of the same rank);
* ``shuffle_vectors``: permute whole vectors across positions (a floor: destroys everything);
* ``swap_prompts``: exchange activations between prompts at the same position (keeps position, destroys
  content).

Greedy decoding: every ablation acts on the prompt positions 0..P-1 only (P = the task's full prompt
length; mu, permutations and subspaces are defined there). Positions of generated answer tokens pass
through unchanged, for every ablation alike.
"""

from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from nope_interp.errors import NopeInterpError

ABLATIONS = ("shuffle_positional", "mean_positional", "project_out", "project_out_random", "shuffle_vectors",
             "swap_prompts")
ResidHook = Callable[..., Float[Tensor, "batch pos d_model"]]


def positional_means(acts: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "pos d_model"]:
    """mu[p]: the mean activation at each position over prompts (float64)."""
    return acts.double().mean(0)


def positional_subspace(mu: Float[Tensor, "pos d_model"], rank: int) -> Float[Tensor, "d_model rank"]:
    """Orthonormal basis of the top-``rank`` principal directions of the centred positional means.

    Raises:
        NopeInterpError: rank outside [0, min(pos - 1, d_model)].
    """
    n, d = mu.shape
    if not 0 <= rank <= min(n - 1, d):
        raise NopeInterpError(f"rank must be in [0, {min(n - 1, d)}] (pos - 1 and d_model bound it), got {rank}")
    centred = mu.double() - mu.double().mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    return vh[:rank].T.contiguous()


def random_subspace(d_model: int, rank: int, generator: torch.Generator) -> Float[Tensor, "d_model rank"]:
    """A uniformly random orthonormal basis of ``rank`` directions (QR of a Gaussian matrix)."""
    if not 0 <= rank <= d_model:
        raise NopeInterpError(f"rank must be in [0, {d_model}], got {rank}")
    q, r = torch.linalg.qr(torch.randn(d_model, max(rank, 1), generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).contiguous()[:, :rank]


def project_out(h: Float[Tensor, "... d_model"], basis: Float[Tensor, "d_model rank"]) -> Float[Tensor, "... d_model"]:
    """h minus its projection onto the span of ``basis`` (orthonormal columns)."""
    b = basis.to(h.dtype)
    return h - (h @ b) @ b.T


def _prompt_part(fn: Callable[[Tensor], Tensor], n_prompt: int) -> ResidHook:
    """Wrap a transform of the prompt positions into a hook that leaves later positions unchanged."""

    def hook(resid: Float[Tensor, "batch pos d_model"], hook: HookPoint | None = None) -> Tensor:
        p = min(n_prompt, resid.shape[1])
        head = fn(resid[:, :p].double()).to(resid.dtype)
        return torch.cat([head, resid[:, p:]], dim=1)

    return hook


def ablation_hook(
    kind: str, mu: Float[Tensor, "pos d_model"], *, perm: Int[Tensor, " pos"] | None = None,
    basis: Float[Tensor, "d_model rank"] | None = None, generator: torch.Generator | None = None,
) -> ResidHook:
    """A residual-stream hook for ablation ``kind`` acting on the first ``mu.shape[0]`` positions.

    Args:
        kind: one of :data:`ABLATIONS` (``project_out_random`` is ``project_out`` with a random basis).
        mu: positional means on the prompt positions.
        perm: the permutation of prompt positions for ``shuffle_positional``/``shuffle_vectors``.
        basis: the subspace for ``project_out``/``project_out_random``.
        generator: for ``swap_prompts`` (a fresh permutation of the batch on each forward pass).

    Raises:
        NopeInterpError: unknown kind or a missing argument.
    """
    if kind not in ABLATIONS:
        raise NopeInterpError(f"unknown ablation {kind!r}; allowed: {', '.join(ABLATIONS)}")
    n = mu.shape[0]
    mu = mu.double()
    if kind in ("shuffle_positional", "shuffle_vectors") and perm is None:
        raise NopeInterpError(f"ablation {kind!r} needs perm")
    if kind in ("project_out", "project_out_random") and basis is None:
        raise NopeInterpError(f"ablation {kind!r} needs basis")
    if kind == "swap_prompts" and generator is None:
        raise NopeInterpError("ablation 'swap_prompts' needs a generator")

    def transform(h: Tensor) -> Tensor:
        m = mu.to(h.device)
        if kind == "shuffle_positional":
            return h - m + m[perm]
        if kind == "mean_positional":
            return h - m + m.mean(0, keepdim=True)
        if kind in ("project_out", "project_out_random"):
            return project_out(h, basis.to(h.device))
        if kind == "shuffle_vectors":
            return h[:, perm]
        order = torch.randperm(h.shape[0], generator=generator).to(h.device)
        return h[order]

    return _prompt_part(transform, n)
