"""A hook-free forward pass for training: the function a ``HookedTransformer`` computes, done faster.

Training calls the model tens of thousands of times and never reads an activation, so it does not need
TransformerLens's hook points, its per-head ``einsum`` attention or the permanent dropout hooks. This
module computes the same logits from the same parameters (read from the model, so optimiser steps, tying
and ``state_dict`` are untouched) with one fused Q/K/V matrix product per layer and PyTorch's fused
``scaled_dot_product_attention``. Dropout (when the model was built with it) is applied at the same three
places in the same order as the permanent hooks of :func:`nope_interp.model.build_model` (token
embeddings, then each block's attention output and MLP output), so with the same RNG state the two
paths draw the same masks. The same pass also returns activations at the residual-stream and ``hook_z``
sites without materialising any attention pattern (:func:`fast_activations`): the long-sequence analysis
path, whose memory grows with pos rather than n_heads x pos^2. Every other analysis keeps using the hooked
model.

Equal to ``model(tokens)`` up to float rounding (tested in ``tests/test_fast_forward.py`` against the
hooked model for every supported option). Supported: positional ``none`` (NoPE), ``learned`` and ``rotary``
(through TransformerLens's own ``apply_rotary`` on queries and keys, so the rotation is the library's);
attention ``causal`` and ``bidirectional``; normalisation ``LN``, ``LNPre``, ``RMS``, ``RMSPre``;
activations ``gelu``, ``gelu_new``, ``relu``, ``silu``; tied or untied embeddings. Anything else
(grouped-query attention, parallel blocks, local attention, dynamic-NTK or log-n scaling, ...) is reported by
:func:`unsupported_reason` and the trainer falls back to the hooked forward.
"""

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from nope_interp.checks import in_order, repeated
from nope_interp.config import check_float
from nope_interp.errors import NopeInterpError
from nope_interp.model import TiedUnembed, check_tokens

__all__ = ["fast_logits", "fast_activations", "fast_activations_unsupported", "unsupported_reason"]

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
_NORMS = ("LN", "LNPre", "RMS", "RMSPre", None)


def attached_hooks(model: torch.nn.Module) -> list[str]:
    """Names of ``model``'s modules with forward (or forward-pre) hooks attached: the hooks that the fused
    forward of this module and the key-value-cached decoding of :func:`nope_interp.evaluate.greedy_decode`
    would not run as the hooked forward does. The model's own dropout hooks (permanent, added by
    :func:`nope_interp.model.build_model`) are not counted in eval mode, where they do nothing; in training
    mode they are. An empty list: every path computes the same thing, as far as module hooks go (global
    hooks of ``torch.nn.modules.module.register_module_forward_hook`` and replaced ``forward`` methods are
    not seen)."""
    out = []
    for name, module in model.named_modules():
        n = len(module._forward_hooks) + len(module._forward_pre_hooks)
        if not n:
            continue
        ours = 0 if module.training else sum(
            1 for h in getattr(module, "fwd_hooks", ())
            if getattr(getattr(h, "user_hook", None), "nope_interp_dropout", False))
        if n > ours:
            out.append(name or type(module).__name__)
    return out


def unsupported_reason(model: HookedTransformer, allow_sliding: bool = False) -> str | None:
    """Why :func:`fast_logits` cannot compute ``model``'s forward pass, or None when it can.

    Checks the TransformerLens config options the fast path does not implement, and refuses any other config
    field that is not at TransformerLens's default unless it is known not to change the computation (so an
    option this module does not know, such as ``scale_attn_by_inverse_layer_idx``, ``post_embedding_ln``,
    ``use_attention_sinks`` or mixture-of-experts MLPs, sends the caller to the hooked model instead of giving
    other numbers). With ``allow_sliding``,
    the sliding-window causal attention of :func:`nope_interp.model.build_model` passes (the analysis path
    :func:`fast_activations` supports it; the trainer does not use it).
    """
    c = model.cfg
    sliding = allow_sliding and _is_sliding(c)
    checks = [
        (c.positional_embedding_type not in ("standard", "rotary"),
         f"positional_embedding_type={c.positional_embedding_type!r}"),
        (bool(getattr(c, "use_dynamic_ntk_rope", False)), "dynamic-NTK rotary scaling"),
        (bool(getattr(c, "use_logn_attn", False)), "log-n attention scaling"),
        (getattr(c, "clip_qkv", None) is not None, "clip_qkv"),
        (c.normalization_type not in _NORMS, f"normalization_type={c.normalization_type!r}"),
        (c.act_fn not in _ACTIVATIONS, f"act_fn={c.act_fn!r}"),
        (c.attention_dir not in ("causal", "bidirectional"), f"attention_dir={c.attention_dir!r}"),
        (bool(getattr(c, "attn_types", None)) and not sliding, "local attention (attn_types)"),
        (getattr(c, "n_key_value_heads", None) not in (None, c.n_heads), "grouped-query attention"),
        (bool(getattr(c, "parallel_attn_mlp", False)), "parallel attention and MLP"),
        (bool(getattr(c, "attn_only", False)), "attention-only blocks"),
        (bool(getattr(c, "gated_mlp", False)), "gated MLP"),
        (not getattr(c, "use_attn_scale", True), "use_attn_scale=False"),
        (getattr(c, "attn_scale", math.sqrt(c.d_head)) != math.sqrt(c.d_head), "a custom attn_scale"),
        (bool(getattr(c, "use_local_attn", False)) and not sliding, "local attention"),
        (getattr(c, "final_rms", False), "final_rms"),
        (bool(getattr(c, "use_qk_norm", False)), "QK normalisation"),
        (getattr(c, "output_logits_soft_cap", -1.0) > 0, "logit soft-capping"),
        (getattr(c, "attn_scores_soft_cap", -1.0) > 0, "attention soft-capping"),
        (_special_architecture(getattr(c, "original_architecture", None)),
         f"original_architecture={getattr(c, 'original_architecture', None)!r} (post-norm or OLMo QK-norm blocks)"),
        (getattr(c, "n_devices", 1) != 1, f"n_devices={getattr(c, 'n_devices', 1)} (layers on several devices)"),
    ]
    reasons = [why for bad, why in checks if bad]
    # Every other config field must keep TransformerLens's default: an option added to (or not yet named
    # above from) the library, e.g. scale_attn_by_inverse_layer_idx or post_embedding_ln, changes what the
    # hooked model computes, and the fused pass would silently compute something else.
    defaults = _config_defaults()
    reasons += [f"{name}={getattr(c, name)!r}" for name, default in defaults.items()
                if name not in _FIELDS_ANY_VALUE and name not in _FIELDS_CHECKED
                and not _same(getattr(c, name, default), default)]
    return ", ".join(reasons) if reasons else None


#: HookedTransformerConfig fields whose every value the fused pass computes the same (shapes read from the
#: weights, metadata, init settings, hook-only switches, the rotary tables it takes from TransformerLens's own
#: ``apply_rotary``) or that :func:`unsupported_reason` checks by name above.
_FIELDS_ANY_VALUE = frozenset({
    "d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_mlp", "d_vocab", "d_vocab_out", "device", "dtype",
    "n_params", "model_name", "tokenizer_name", "from_checkpoint",
    "checkpoint_index", "checkpoint_label_type", "checkpoint_value", "default_prepend_bos",
    "tokenizer_prepends_bos", "trust_remote_code", "seed", "init_mode", "initializer_range", "init_weights",
    "eps", "uses_rms_norm", "layer_norm_folding", "tie_word_embeddings", "train_seq_length",
    "use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in", "use_hook_tokens",
    "rotary_dim", "rotary_base", "rotary_adjacent_pairs", "use_NTK_by_parts_rope", "NTK_by_parts_low_freq_factor",
    "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "NTK_original_ctx_len",
})
_FIELDS_CHECKED = frozenset({
    "positional_embedding_type", "use_dynamic_ntk_rope", "use_logn_attn", "clip_qkv", "normalization_type",
    "act_fn", "attention_dir", "attn_types", "use_local_attn", "window_size", "n_key_value_heads",
    "parallel_attn_mlp", "attn_only", "gated_mlp", "use_attn_scale", "attn_scale", "final_rms", "use_qk_norm",
    "output_logits_soft_cap", "attn_scores_soft_cap", "original_architecture", "n_devices",
})


def _special_architecture(name: object) -> bool:
    """True for the architectures whose blocks TransformerLens builds differently from the config's other
    fields (post-norm blocks, the OLMo family's QK-norm on the full projections): ``original_architecture``
    is otherwise only a name."""
    if not isinstance(name, str):
        return False
    try:
        from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES
    except ImportError:  # another TransformerLens version: be safe
        POST_NORM_ARCHITECTURES = set()  # noqa: N806
    return name in POST_NORM_ARCHITECTURES or name.startswith("Olmo")


def _config_defaults() -> dict[str, object]:
    """TransformerLens's default of every ``HookedTransformerConfig`` field that has one."""
    import dataclasses

    from transformer_lens import HookedTransformerConfig

    return {f.name: f.default for f in dataclasses.fields(HookedTransformerConfig)
            if f.default is not dataclasses.MISSING}


def _same(value: object, default: object) -> bool:
    """``value == default`` for config values (floats, None, strings, dtypes), never raising."""
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - an exotic value: treat as different, the hooked path is always right
        return False


def _norm(x: Tensor, module: torch.nn.Module | None, kind: str | None, eps: float) -> Tensor:
    """TransformerLens's LayerNorm / RMSNorm (and their ``Pre`` variants without weights) as fused kernels."""
    if kind is None:
        return x
    weight = module.w if kind in ("LN", "RMS") else None
    if kind.startswith("LN"):
        return F.layer_norm(x, (x.shape[-1],), weight, module.b if kind == "LN" else None, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _dropout_p(model: HookedTransformer) -> float:
    """The dropout probability of the permanent hooks (0.0 when the model has none)."""
    return float(getattr(model, "nope_dropout", 0.0))


def _is_sliding(c: object) -> bool:
    """True for the sliding-window causal attention of :func:`nope_interp.model.build_model` (every layer local)."""
    kinds = getattr(c, "attn_types", None)
    return (bool(getattr(c, "use_local_attn", False)) and getattr(c, "attention_dir", "") == "causal"
            and bool(kinds) and all(t == "local" for t in kinds) and getattr(c, "window_size", None) is not None)


def _attention_mask(model: HookedTransformer, p: int, device: torch.device) -> Tensor | None:
    """The boolean key mask of a sliding-window model (query i keeps key j iff i - window < j <= i), else None."""
    if not _is_sliding(model.cfg):
        return None
    i = torch.arange(p, device=device)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - int(model.cfg.window_size))


def _forward(model: HookedTransformer, tokens: Tensor, p_drop: float, record: frozenset[str] = frozenset(),
             logits: bool = True) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The shared forward pass: logits (when ``logits``) and the activations named in ``record``
    (TransformerLens hook names: ``hook_embed``, ``blocks.L.hook_resid_pre/mid/post``, ``blocks.L.attn.hook_z``
    flattened to ``batch pos n_heads*d_head``). Without logits, layers after the last recorded one are skipped."""
    c = model.cfg
    b, p = tokens.shape
    train = model.training and p_drop > 0
    out: dict[str, Tensor] = {}

    def drop(x: Tensor) -> Tensor:
        return F.dropout(x, p_drop, training=True) if train else x

    def keep(name: str, x: Tensor) -> None:
        if name in record:
            out[name] = x

    embed = model.embed.W_E[tokens]
    keep("hook_embed", embed)
    x = drop(embed)
    rotary = c.positional_embedding_type == "rotary"
    if not rotary:  # a rotary model has no pos_embed
        w_pos = model.pos_embed.W_pos
        if w_pos.requires_grad or bool(torch.any(w_pos != 0)):
            x = x + w_pos[:p]
    act = _ACTIVATIONS[c.act_fn]
    h, dh = c.n_heads, c.d_head
    mask = _attention_mask(model, p, tokens.device)
    causal = c.attention_dir == "causal" and mask is None
    last = c.n_layers - 1 if logits else max((int(n.split(".")[1]) for n in record if n.startswith("blocks.")),
                                             default=-1)
    for layer, block in enumerate(model.blocks):
        if layer > last:
            break
        keep(f"blocks.{layer}.hook_resid_pre", x)
        attn = block.attn
        normed = _norm(x, block.ln1, c.normalization_type, c.eps)
        w_qkv = torch.cat([attn.W_Q, attn.W_K, attn.W_V], 0).permute(1, 0, 2).reshape(c.d_model, 3 * h * dh)
        b_qkv = torch.cat([attn.b_Q, attn.b_K, attn.b_V], 0).reshape(3 * h * dh)
        qkv = torch.addmm(b_qkv, normed.reshape(b * p, c.d_model), w_qkv).view(b, p, 3, h, dh)
        if rotary:  # TransformerLens's rotation, on [batch, pos, head, d_head] as in its attention
            q_, k_, v_ = qkv.unbind(2)
            q, k, v = (attn.apply_rotary(q_).transpose(1, 2), attn.apply_rotary(k_).transpose(1, 2),
                       v_.transpose(1, 2))
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        z = z.transpose(1, 2).reshape(b * p, h * dh)
        keep(f"blocks.{layer}.attn.hook_z", z.view(b, p, h * dh))
        attn_out = torch.addmm(attn.b_O, z, attn.W_O.reshape(h * dh, c.d_model)).view(b, p, c.d_model)
        x = x + drop(attn_out)
        keep(f"blocks.{layer}.hook_resid_mid", x)
        normed = _norm(x, block.ln2, c.normalization_type, c.eps)
        mlp = block.mlp
        hidden = act(torch.addmm(mlp.b_in, normed.reshape(b * p, c.d_model), mlp.W_in))
        x = x + drop(torch.addmm(mlp.b_out, hidden, mlp.W_out).view(b, p, c.d_model))
        keep(f"blocks.{layer}.hook_resid_post", x)
    if not logits:
        return None, out
    x = _norm(x, getattr(model, "ln_final", None), c.normalization_type, c.eps)  # none: no ln_final
    if isinstance(model.unembed, TiedUnembed):
        return F.linear(x, model.embed.W_E, model.unembed.b_U), out
    return x @ model.unembed.W_U + model.unembed.b_U, out


def fast_logits(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], dropout: float | None = None
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of ``model`` on ``tokens`` without hooks: the same values as ``model(tokens)`` up to float
    rounding, with gradients to the model's own parameters.

    Args:
        model: a ``HookedTransformer`` built by :func:`nope_interp.model.build_model` (or any with
            supported options). Hooks added by the user are NOT run on this path.
        tokens: token ids in ``[0, d_vocab)``, at most ``n_ctx`` positions.
        dropout: dropout probability in [0, 1) applied (in train mode only) after the token embedding
            and each block's attention and MLP output; default: the model's own (``model.nope_dropout``,
            set by ``build_model``; 0.0 if absent).

    Raises:
        NopeInterpError: the model uses an option the fast path does not implement
            (:func:`unsupported_reason`); tokens that :func:`nope_interp.model.check_tokens` refuses (not a
            2-D integer tensor, an id outside ``[0, d_vocab)``: a negative id would silently select the last
            embedding rows) or longer than ``n_ctx``; ``dropout`` not a number in [0, 1).
    """
    why = unsupported_reason(model)
    if why is not None:
        raise NopeInterpError(f"fast_logits does not support {why}; use model(tokens)")
    tokens = check_tokens(model, tokens)
    c = model.cfg
    b, p = tokens.shape
    if p > c.n_ctx:
        raise NopeInterpError(f"tokens have {p} positions, more than n_ctx={c.n_ctx}")
    if dropout is not None:
        check_float("dropout", dropout, 0.0, 1.0, high_open=True)
    p_drop = _dropout_p(model) if dropout is None else dropout
    return _forward(model, tokens, p_drop)[0]


#: Hook names :func:`fast_activations` records (``{layer}`` runs over the layers).
FAST_HOOKS = ("hook_embed", "blocks.{layer}.hook_resid_pre", "blocks.{layer}.attn.hook_z",
              "blocks.{layer}.hook_resid_mid", "blocks.{layer}.hook_resid_post")


@torch.no_grad()
def fast_activations(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], names: list[str] | tuple[str, ...]
) -> dict[str, Float[Tensor, "batch pos d_model"]]:
    """Activations at the hook ``names`` without hooks or a materialised attention pattern (no dropout).

    The same values as ``model.run_with_cache(tokens)`` at those names up to float rounding (``attn.hook_z``
    flattened to ``batch pos n_heads*d_head``, as :mod:`nope_interp.activations` does), computed with
    PyTorch's fused attention, so memory grows with ``pos`` (the activations) rather than with
    ``n_heads * pos^2`` (TransformerLens keeps every head's scores and pattern): 4.9 GB for one 8,192-token
    sequence of the ``cpu`` preset through ``run_with_cache``. The long-sequence path of
    :func:`nope_interp.analysis.analyze_tokens`. Layers after the last requested one are not run.

    Args:
        model: a model :func:`fast_activations_unsupported` accepts (sliding-window attention included).
        tokens: token ids in ``[0, d_vocab)``, at most ``n_ctx`` positions.
        names: TransformerLens hook names of the forms in :data:`FAST_HOOKS`.

    Raises:
        NopeInterpError: an unsupported model option or hook name; a hook name given twice (the result holds
            one entry per name; a set is accepted, the result comes in forward order anyway; a generator
            is read once: before, the checks used it up and the result was ``{}``); tokens that
            :func:`nope_interp.model.check_tokens` refuses (an id outside ``[0, d_vocab)``, a float or 1-D tensor)
            or longer than ``n_ctx``.
    """
    if isinstance(names, (str, bytes)):
        raise NopeInterpError(f"fast_activations: names must be a list of hook names, got the single string "
                              f"{names!r} (write [{names!r}] for a list of one)")
    names = in_order("names", names, "hook names", "fast_activations", key=str)  # read once: checked, then computed
    why = fast_activations_unsupported(model, names)
    if why is not None:
        raise NopeInterpError(f"fast_activations does not support {why}; use run_with_cache")
    twice = repeated(names)
    if twice:
        raise NopeInterpError(f"fast_activations: names holds {', '.join(map(repr, twice))} more than once")
    tokens = check_tokens(model, tokens)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise NopeInterpError(f"tokens have {tokens.shape[1]} positions, more than n_ctx={model.cfg.n_ctx}")
    return _forward(model, tokens, 0.0, frozenset(names), logits=False)[1]


def fast_activations_unsupported(model: torch.nn.Module, names: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why :func:`fast_activations` cannot compute ``names`` for ``model``, or None when it can: not a
    ``HookedTransformer`` (a ``TransformerBridge`` runs Hugging Face modules), 16-bit weights (TransformerLens
    computes the layer norms of a float16 or bfloat16 model in float32, this forward in the model's dtype: the
    row-mean scores of the two differed by up to 0.004 in bfloat16, so every analysis of such a model now
    computes what TransformerLens does), the reasons of
    :func:`unsupported_reason` except sliding-window attention (supported here), and unknown hook names.

    Raises:
        NopeInterpError: ``names`` not iterable, or a single string (read letter by letter before: give a list of
            one) (:func:`~nope_interp.checks.in_order`; a set is read sorted).
    """
    names = in_order("names", names, "hook names", "fast_activations_unsupported", key=str)
    if not isinstance(model, HookedTransformer):
        return f"a {type(model).__name__} (only HookedTransformer)"
    if model.cfg.dtype in (torch.float16, torch.bfloat16):
        return f"{model.cfg.dtype} weights (TransformerLens computes their layer norms in float32)"
    why = unsupported_reason(model, allow_sliding=True)
    if why is not None:
        return why
    allowed = {pat.format(layer=layer) for pat in FAST_HOOKS for layer in range(model.cfg.n_layers)}
    bad = [n for n in names if n not in allowed]
    return f"hook names {', '.join(map(repr, bad))}" if bad else None
