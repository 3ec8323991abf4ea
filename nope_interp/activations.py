"""Collect activations with ``run_with_cache(names_filter=...)`` and stack them per hook point.

``attn.hook_z`` (``batch pos n_heads d_head``) is flattened to ``batch pos d_model`` with heads
concatenated, as the authors' code analysed it; every other point already has width ``d_model``.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from nope_interp.checks import in_order
from nope_interp.config import check_int
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import ACTIVATION_POINTS, activation_hook_names, check_points
from nope_interp.model import LensModel, check_model_dtype, check_tokens, evaluates


@dataclass(frozen=True)
class Activations:
    """Activations at several hook points, stacked.

    Attributes:
        acts: ``Float[Tensor, "site batch pos d_model"]`` (float32, on the CPU), one slice per hook
            point in forward order (the ``site`` axis runs over hook sites).
        labels: the TransformerLens hook name of each slice, e.g. ``"blocks.0.attn.hook_z"``.
    """

    acts: Float[Tensor, "site batch pos d_model"]
    labels: tuple[str, ...]

    def __getitem__(self, label: str) -> Float[Tensor, "batch pos d_model"]:
        """The activations of one hook name; NopeInterpError (listing the names) if absent."""
        if label not in self.labels:
            raise NopeInterpError(f"hook {label!r} was not collected; collected: {', '.join(self.labels)}")
        return self.acts[self.labels.index(label)]


def _checked(model: LensModel, tokens: Tensor) -> Tensor:
    check_model_dtype(model, "collect_activations")
    tokens = check_tokens(model, tokens)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise NopeInterpError(f"sequences of {tokens.shape[1]} tokens exceed the model's n_ctx={model.cfg.n_ctx}")
    return tokens


def iter_activations(
    model: LensModel,
    tokens: Int[Tensor, "batch pos"],
    points: tuple[str, ...] = ACTIVATION_POINTS,
    batch_size: int = 512,
) -> Iterator[Activations]:
    """:func:`collect_activations` one chunk of at most ``batch_size`` sequences at a time, in order.

    Memory holds one chunk's activations (``site x batch_size x pos x d_model`` float32), however many
    sequences ``tokens`` has. The tokens are checked (and the points resolved) before the first forward pass.

    Raises:
        NopeInterpError: as :func:`collect_activations`.
    """
    tokens = _checked(model, tokens)
    batch_size = check_int("iter_activations: batch_size", batch_size, 1, 10**9)
    names = activation_hook_names(model.cfg.n_layers, check_points(points))
    check_site_widths(model, names)
    return _iter_chunks(model, tokens, names, batch_size)


def check_site_widths(model: LensModel, names: list[str] | tuple[str, ...]) -> None:
    """Refuse a set of hook sites whose vectors differ in width, which the analyses stack into one
    ``site x batch x pos x width`` tensor: ``hook_z`` (heads concatenated) has ``n_heads * d_head`` features,
    the residual stream ``d_model``; TransformerLens allows the two to differ.

    Raises:
        NopeInterpError: ``hook_z`` sites mixed with residual-stream sites in a model where
            ``n_heads * d_head != d_model`` (the message says to analyse ``("z",)`` on its own); ``names`` not
            iterable or a single string (:func:`~nope_interp.checks.in_order`). A generator is read once, a set
            sorted.
    """
    names = in_order("names", names, "hook names", "check_site_widths", key=str)  # read once: any() and all() below
    cfg = model.cfg
    z_width = int(cfg.n_heads) * int(cfg.d_head)
    if z_width != cfg.d_model and any(n.endswith("hook_z") for n in names) and \
            not all(n.endswith("hook_z") for n in names):
        raise NopeInterpError(f"this model's hook_z has n_heads * d_head = {z_width} features and its residual "
                              f"stream d_model = {cfg.d_model}: analyse points ('z',) and the residual-stream points "
                              "in separate calls")


@evaluates  # a generator: eval mode while the chunks are drawn
def _iter_chunks(model: LensModel, tokens: Tensor, names: list[str], batch_size: int) -> Iterator[Activations]:
    for start in range(0, tokens.shape[0], batch_size):
        toks = tokens[start : start + batch_size].to(model.cfg.device)
        with torch.no_grad():
            _, cache = model.run_with_cache(toks, names_filter=lambda n: n in names, return_type=None)
        per = []
        for n in names:
            a = cache[n]
            if a.ndim == 4:  # hook_z: batch pos n_heads d_head -> batch pos d_model
                a = a.reshape(a.shape[0], a.shape[1], -1)
            per.append(a.float().cpu())
        del cache
        yield Activations(acts=torch.stack(per), labels=tuple(names))


@torch.no_grad()
def collect_activations(
    model: LensModel,
    tokens: Int[Tensor, "batch pos"],
    points: tuple[str, ...] = ACTIVATION_POINTS,
    batch_size: int = 512,
) -> Activations:
    """Run ``model`` on ``tokens`` caching only the requested points, and stack them.

    Args:
        model: any HookedTransformer with ``n_heads * d_head == d_model``.
        tokens: a batch of equal-length sequences (no padding) of ids in ``[0, d_vocab)``, ``1 <= pos <= n_ctx``.
        points: a subset of :data:`~nope_interp.hooks.ACTIVATION_POINTS`.
        batch_size: sequences per forward pass (bounds the forward pass's memory; the result holds all of
            them: use :func:`iter_activations` to stream).

    Raises:
        NopeInterpError: unknown or repeated point; sequences longer than ``n_ctx``; ``tokens`` that are not a 2-D
            integer tensor with at least one sequence and position, or hold an id outside ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`); ``hook_z`` and residual-stream points of different
            widths (:func:`check_site_widths`); ``batch_size`` not an integer >= 1 (a bool, a float, None).
    """
    batch_size = check_int("collect_activations: batch_size", batch_size, 1, 10**9)
    points = check_points(points)  # read once: a generator would be empty for the labels below
    chunks = [a.acts for a in iter_activations(model, tokens, points, batch_size)]
    return Activations(acts=torch.cat(chunks, dim=1),
                       labels=tuple(activation_hook_names(model.cfg.n_layers, points)))
