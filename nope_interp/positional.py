"""Which positional scheme each attention layer of a model uses, measured rather than read from a config.

Hybrid models interleave NoPE layers with RoPE layers (SmolLM3 leaves RoPE out of every fourth layer), and
configs describe this in ways that are easy to misread (SmolLM3's ``no_rope_layers[i] == 1`` means layer i
USES RoPE). So the type of each layer is checked on a forward pass:

* a layer whose attention exposes rotated queries (``blocks.L.attn.hook_rot_q``, as TransformerLens's
  rotary ``HookedTransformer`` and a ``TransformerBridge`` of a rotary model do) is ``rope`` when the rotated
  queries differ from the unrotated ones (``hook_q``) and ``nope`` when they are equal;
* otherwise, a model that adds a non-zero positional embedding to the residual stream (``hook_pos_embed``)
  has ``learned`` positions (every layer sees them); a model with neither is ``nope`` in every layer
  (this project's models: TransformerLens's ``W_pos`` frozen at zero);
* a layer that is neither ``rope`` nor ``learned`` must attend evenly to a run of identical tokens (equal
  queries and keys give equal scores over the keys it may see): one that does not carries position some
  other way, ``alibi`` when the config says ALiBi (a per-head linear bias on the distance), else refused,
  rather than called NoPE.

``hook_rot_q`` must differ at some position other than the first (RoPE rotates position 0 by angle 0).
"""

import torch
from jaxtyping import Int
from torch import Tensor

from nope_interp.config import check_float
from nope_interp.errors import NopeInterpError
from nope_interp.model import check_model_dtype, check_tokens, evaluates

#: The layer types :func:`layer_positional_types` reports.
LAYER_TYPES = ("nope", "rope", "learned", "alibi")


@evaluates
@torch.no_grad()
def layer_positional_types(model: torch.nn.Module, tokens: Int[Tensor, "batch pos"] | None = None,
                           atol: float = 0.0, rtol: float = 1e-4) -> tuple[str, ...]:
    """The positional type of every attention layer of ``model``: one of :data:`LAYER_TYPES` per layer.

    Args:
        model: a ``HookedTransformer`` or a ``TransformerBridge`` (anything with ``cfg.n_layers``,
            ``cfg.d_vocab`` and ``run_with_cache``).
        tokens: the probe sequence (default: token ids 0..7, fewer when ``d_vocab`` or ``n_ctx`` is smaller).
        atol, rtol: rotated and unrotated queries count as equal when every entry differs by at most
            ``atol + rtol * max|q|`` (the layer's largest query entry): relative, so that a model with tiny
            weights is still told apart (RoPE moves the fastest-rotating pair by about its own size at pos 1).

    Raises:
        NopeInterpError: ``model`` has no ``cfg.n_layers`` / ``run_with_cache``; weights converted with
            ``model.half()`` (:func:`~nope_interp.model.check_model_dtype`); ``tokens`` that
            :func:`nope_interp.model.check_tokens` refuses (not a 2-D integer tensor, ids outside
            ``[0, d_vocab)``), of fewer than 2 positions (position 0 is never rotated, so one position cannot
            tell RoPE from NoPE) or more than ``n_ctx``; ``atol`` or ``rtol`` not a finite number >= 0; a
            layer whose queries are all zero (rotation cannot be seen); a layer that attends unevenly to
            identical tokens without being RoPE, learned or ALiBi (a positional mechanism this function does not
            know).
    """
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(model, "run_with_cache") or not isinstance(getattr(cfg, "n_layers", None), int):
        raise NopeInterpError(f"layer_positional_types needs a TransformerLens model, got {type(model).__name__}")
    check_model_dtype(model, "layer_positional_types")  # model.half(): one line with the fix, not a matmul error
    if tokens is None:
        tokens = torch.arange(min(8, int(cfg.d_vocab), int(cfg.n_ctx)))[None]
    tokens = check_tokens(model, tokens)   # a 2-D integer tensor of ids in [0, d_vocab)
    check_float("atol", atol, 0.0)
    check_float("rtol", rtol, 0.0)
    if tokens.shape[1] < 2 or tokens.shape[1] > cfg.n_ctx:
        raise NopeInterpError(f"tokens must be (batch, pos) with 2 <= pos <= n_ctx={cfg.n_ctx}, got shape "
                              f"{tuple(tokens.shape)}")
    n = cfg.n_layers
    names = {f"blocks.{i}.attn.hook_{w}" for i in range(n) for w in ("q", "rot_q")} | {"hook_pos_embed"}
    device = getattr(cfg, "device", None) or "cpu"
    _, cache = model.run_with_cache(tokens.to(device), names_filter=lambda name: name in names)
    out = []
    learned = "hook_pos_embed" in cache and bool(cache["hook_pos_embed"].abs().max() > 0)
    for i in range(n):
        q_name, rot_name = f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_rot_q"
        if rot_name in cache and q_name in cache:
            q, rq = cache[q_name].float(), cache[rot_name].float()
            scale = float(q.abs().max())
            if scale == 0.0:
                raise NopeInterpError(f"layer {i}'s queries are all zero on these tokens: RoPE cannot be told "
                                      "from NoPE; give other tokens")
            out.append("nope" if float((rq - q).abs().max()) <= atol + rtol * scale else "rope")
        else:
            out.append("learned" if learned else "nope")
    uneven = _uneven_on_identical_tokens(model, tokens[:1, :1].expand(1, tokens.shape[1]).to(device), n)
    for i in range(n):
        if out[i] == "nope" and uneven[i]:
            if getattr(cfg, "positional_embedding_type", None) != "alibi":
                raise NopeInterpError(f"layer {i} has no rotation and no positional embedding, yet attends unevenly "
                                      "to a run of identical tokens: it carries position some way this function "
                                      "does not know (supported: nope, rope, learned, alibi)")
            out[i] = "alibi"
    return tuple(out)


def _uneven_on_identical_tokens(model: torch.nn.Module, tokens: Int[Tensor, "1 pos"], n_layers: int) -> list[bool]:
    """Per layer: does any query's attention pattern on ``tokens`` (one token repeated) put unequal weights on
    the keys it attends to? Equal queries and keys give equal scores, so a layer without positions spreads
    its weight evenly over the keys its mask allows (causal, bidirectional or a sliding window alike), up to
    rounding: a relative spread of 1e-3 in float32, 0.3 in 16-bit models (so a weak position bias in a bf16
    model passes as even). A layer whose pattern is not cached (some bridges) counts as even."""
    names = {f"blocks.{i}.attn.hook_pattern" for i in range(n_layers)}
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    uneven = []
    for i in range(n_layers):
        name = f"blocks.{i}.attn.hook_pattern"
        if name not in cache:
            uneven.append(False)
            continue
        pattern = cache[name]
        # rounding alone makes a 16-bit model's weights uneven (text-nope, 64 identical tokens: 0.12 relative in
        # bf16, 0.016 in float16, 0 in float32); ALiBi's steepest head (slope 1/4 with 4 heads) varies by
        # 1 - exp(-7/4) = 0.83 over 8 tokens
        tol = 1e-3 if torch.finfo(pattern.dtype).bits >= 32 else 0.3
        pattern = pattern.double()  # batch head query key
        seen = pattern > 1e-6
        high = pattern.masked_fill(~seen, float("-inf")).amax(-1)
        low = pattern.masked_fill(~seen, float("inf")).amin(-1)
        uneven.append(bool(((high - low) > tol * high).any()))
    return uneven
