"""Counterfactual attention: replace a layer's attention pattern through ``blocks.L.attn.hook_pattern``.

Hooks are built by a small factory and applied only inside ``model.hooks(...)`` (TransformerLens
removes them when the block exits, also on an exception). A hook returns a new tensor; it never edits
the cached pattern in place (TransformerLens issue #157).

During greedy decoding every forward pass recomputes the whole sequence, so the replacement applies to
prompt and generated positions alike (:func:`nope_interp.evaluate.greedy_decode`; TransformerLens's
``model.generate`` needs ``use_past_kv_cache=False`` here: with its key/value cache a step's pattern has one
query row against all earlier keys, which the replacement refuses by name). ``random_matched`` draws fresh
random rows on every forward pass from one generator seeded at the start of the ``with`` block.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from nope_interp.averaging import (
    PATTERN_KINDS,
    attention_entropy,
    attention_window,
    identity_pattern,
    random_causal_pattern,
    uniform_causal_pattern,
)
from nope_interp.checks import is_int
from nope_interp.config import check_int
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.model import LensModel, check_model

PatternHook = Callable[..., Float[Tensor, "batch n_heads query_pos key_pos"]]


def pattern_replacement_hook(kind: str, generator: torch.Generator | None = None) -> PatternHook:
    """A hook for ``attn.hook_pattern`` that returns a replacement pattern of the same shape.

    Args:
        kind: ``"uniform"`` (uniform causal), ``"identity"`` (each position attends to itself) or
            ``"random_matched"`` (random causal rows whose entropies match the model's own rows).
        generator: randomness for ``random_matched`` (required for it).

    Raises:
        NopeInterpError: unknown kind, or ``random_matched`` without a ``torch.Generator``; when the hook runs,
            a pattern that is not square (a key/value-cache decoding step).
    """
    if kind not in PATTERN_KINDS:
        raise NopeInterpError(f"unknown pattern kind {kind!r}; allowed: {', '.join(PATTERN_KINDS)}")
    if kind == "random_matched" and not isinstance(generator, torch.Generator):
        raise NopeInterpError(f"pattern kind 'random_matched' needs a torch.Generator, got {generator!r}"[:200])

    def hook(pattern: Float[Tensor, "batch n_heads query_pos key_pos"], hook: HookPoint | None = None) -> Tensor:
        n = pattern.shape[-1]
        if pattern.shape[-2] != n:  # a key/value-cache step: its new queries against every earlier key
            raise NopeInterpError(
                f"pattern replacement needs the whole sequence's square pattern, got {pattern.shape[-2]} query "
                f"rows against {n} keys (a key/value-cache decoding step): decode with "
                "nope_interp.evaluate.greedy_decode or model.generate(..., use_past_kv_cache=False)")
        if kind == "uniform":
            new = uniform_causal_pattern(n).expand(pattern.shape)
        elif kind == "identity":
            new = identity_pattern(n).expand(pattern.shape)
        else:
            new = random_causal_pattern(attention_entropy(pattern.detach().cpu()), generator)
        return new.to(dtype=pattern.dtype, device=pattern.device).clone()

    return hook


def pattern_kind_unsupported(model: LensModel, layer: int, kind: str) -> str | None:
    """Why replacing layer ``layer``'s pattern by ``kind`` does not apply to ``model``, or None when it does:
    ``uniform`` and ``random_matched`` are causal patterns over every earlier key, so they would give a
    bidirectional layer causal averaging and let a sliding-window layer see keys outside its window;
    ``identity`` applies to any attention.

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; ``layer`` not an integer in [0, n_layers); an
            unknown ``kind``."""
    check_model(model)
    n_layers = model.cfg.n_layers
    if not is_int(layer) or not 0 <= layer < n_layers:  # checked whatever the kind: 99 is no layer of the model
        raise NopeInterpError(f"pattern_kind_unsupported: layer must be an integer in [0, {n_layers}) for a model "
                              f"with n_layers={n_layers}, got {layer!r}"[:300])
    if kind not in PATTERN_KINDS:
        raise NopeInterpError(f"unknown pattern kind {kind!r}; allowed: {', '.join(PATTERN_KINDS)}"[:300])
    if kind == "identity":
        return None
    if model.cfg.attention_dir != "causal":
        return f"{model.cfg.attention_dir} attention (the {kind} replacement is a causal pattern)"
    if attention_window(model.cfg, layer) is not None:
        return f"sliding-window attention (the {kind} replacement would let in keys outside the window)"
    return None


@contextmanager
def replaced_pattern(model: LensModel, layer: int, kind: str, seed: int = 0) -> Iterator[LensModel]:
    """Within the block, ``model``'s layer-``layer`` attention pattern is replaced by ``kind``.

    Raises:
        NopeInterpError: bad layer or kind; ``model`` not a TransformerLens model (a loaded run: pass ``.model``);
            ``seed`` not an integer in [0, 2**63); a kind that does not apply to the layer's attention
            (:func:`pattern_kind_unsupported`: a causal replacement on bidirectional or sliding-window attention).
    """
    check_model(model)
    name = hook_name("pattern", layer, n_layers=model.cfg.n_layers)
    if kind in PATTERN_KINDS:
        why = pattern_kind_unsupported(model, layer, kind)
        if why is not None:
            raise NopeInterpError(f"pattern kind {kind!r} does not apply to layer {layer}: {why}")
    seed = check_int("seed", seed, 0, 2**63 - 1)  # a Python int: torch refuses numpy seeds
    gen = torch.Generator().manual_seed(seed)
    with model.hooks(fwd_hooks=[(name, pattern_replacement_hook(kind, gen))]):
        yield model
