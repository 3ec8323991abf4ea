"""NoPE ``HookedTransformer``s: the model config, presets, construction and the paper's initialisation.

NoPE route (``docs/method.md``, "Models and training"): TransformerLens 3.9 has no
``positional_embedding_type="none"``, so a ``"standard"`` model is built and its ``pos_embed.W_pos`` is
zeroed and frozen (``requires_grad=False``), as in TransformerLens's own NoPE demo. ``hook_pos_embed``
then outputs exact zeros and no position information enters the residual stream. Our
:class:`ModelConfig` (``positional="none"``) is the source of truth; TransformerLens still reports
``"standard"``. Tests prove NoPE is exact (permutation invariance / equivariance).

Differences from the paper's nanoGPT by default: no dropout (paper: 0.2) and untied input/output embeddings
(paper: tied), both available as options (``ModelConfig.dropout``, ``ModelConfig.tied_embeddings``; the
``paper-recipe`` preset turns both on), and no 1/sqrt(2 n_layers) scaling of residual output projections.
With ``biases=False`` (default) every bias, LayerNorm biases included, is zero and frozen, matching
nanoGPT's ``bias=False``.
"""

import contextlib
import dataclasses
import functools
import inspect
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.hook_points import HookPoint
from transformer_lens.model_bridge import TransformerBridge

from nope_interp.checks import is_int
from nope_interp.config import (
    ACT_FN_CHOICES,
    ATTENTION_CHOICES,
    NORMALIZATION_CHOICES,
    POSITIONAL_CHOICES,
    PRESETS,
    ModelConfig,
    preset,
)
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name

#: Parameter-name suffixes of the weight matrices that the custom init draws from N(init_mean, init_std).
WEIGHT_MATRICES = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U")
__all__ = ["ModelConfig", "PRESETS", "preset", "build_model", "TiedUnembed", "DROPOUT_POINTS", "init_weights",
           "check_nope", "check_tokens", "check_device", "load_state",
           "n_parameters", "model_memory_bytes", "available_memory_bytes",
           "check_fits_memory", "check_model_fits", "format_bytes",
           "to_hooked_transformer_config", "WEIGHT_MATRICES", "POSITIONAL_CHOICES", "ATTENTION_CHOICES",
           "ACT_FN_CHOICES", "NORMALIZATION_CHOICES"]

#: Any TransformerLens model the token-level analyses accept: a ``HookedTransformer`` (this project's models,
#: or any other) or a ``TransformerBridge`` around a Hugging Face model (:mod:`nope_interp.hf`).
LensModel = HookedTransformer | TransformerBridge


def to_hooked_transformer_config(cfg: ModelConfig) -> HookedTransformerConfig:
    """The TransformerLens config for ``cfg`` (no ``seed``: TransformerLens would reseed global RNGs).

    ``normalization="none"`` becomes ``normalization_type=None`` (``ln1``/``ln2`` are identities and
    there is no ``ln_final``). ``attention="sliding"`` becomes ``attention_dir="causal"`` with TransformerLens's local
    attention in every layer (``use_local_attn=True``, ``attn_types=["local"] * n_layers``,
    ``window_size=cfg.window``): query i keeps key j iff ``i - window < j <= i``, so ``window`` counts the
    query itself and ``window=1`` attends to the query's own position only.
    """
    pos_type = "rotary" if cfg.positional == "rotary" else "standard"
    sliding = cfg.attention == "sliding"
    local = ({"use_local_attn": True, "attn_types": ["local"] * cfg.n_layers, "window_size": cfg.window}
             if sliding else {})
    return HookedTransformerConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_mlp=cfg.d_mlp,
        n_ctx=cfg.n_ctx,
        d_vocab=cfg.d_vocab,
        act_fn=cfg.act_fn,
        normalization_type=None if cfg.normalization == "none" else cfg.normalization,
        attention_dir="causal" if sliding else cfg.attention,
        **local,
        positional_embedding_type=pos_type,
        default_prepend_bos=False,
        device="cpu",
    )


class TiedUnembed(nn.Module):
    """An unembedding tied to the token embedding: ``W_U = W_E.T`` (nanoGPT's weight tying).

    Replaces TransformerLens's ``Unembed`` and keeps its interface (``W_U``, ``b_U``, ``hook_in``,
    ``hook_out``), so ``model.W_U`` and the hooks work as usual; ``W_U`` is a view of the one shared
    parameter ``embed.W_E``, so optimiser steps, ``state_dict`` and loading keep them identical. ``b_U``
    is a zero buffer (no output bias, as nanoGPT with ``bias=False``).
    """

    def __init__(self, embed: nn.Module, d_vocab_out: int):
        super().__init__()
        self._embed = (embed,)  # a tuple: not registered as a submodule, so W_E is saved once
        self.register_buffer("b_U", torch.zeros(d_vocab_out), persistent=False)
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:  # noqa: N802 - TransformerLens's name
        """The transpose of the token embedding ``W_E``."""
        return self._embed[0].W_E.T

    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits ``residual @ W_E.T`` (through ``hook_in`` and ``hook_out``)."""
        return self.hook_out(F.linear(self.hook_in(residual), self._embed[0].W_E, self.b_U))


#: Where dropout acts (nanoGPT's placement): the embeddings and every block's attention and MLP output.
DROPOUT_POINTS = ("embed", "attn_out", "mlp_out")


def _dropout_hook(p: float):
    def hook(x: Tensor, hook: HookPoint) -> Tensor:
        return F.dropout(x, p, training=hook.training)

    hook.nope_interp_dropout = True  # the model's own (a no-op in eval mode): fast_forward.attached_hooks skips it
    return hook


def n_parameters(cfg: ModelConfig) -> int:
    """The number of float parameters of the model of ``cfg`` (frozen and zero ones included, as
    TransformerLens allocates them): embeddings, positions, attention, MLP and normalisation weights
    (LayerNorm ``w`` and ``b``, RMSNorm ``w``; none for ``LNPre``, ``RMSPre`` and ``none``)."""
    d, h, dh, m, n_ctx, v = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.n_ctx, cfg.d_vocab
    norm = {"LN": 2 * d, "RMS": d}.get(cfg.normalization, 0)  # parameters of one normalisation layer
    block = 4 * d * h * dh + 3 * h * dh + d + 2 * d * m + m + d + 2 * norm  # attention, MLP, two norms
    pos = n_ctx * d if cfg.positional != "rotary" else 0
    embed = v * d if cfg.tied_embeddings else 2 * v * d + v  # untied: W_E, W_U and the bias b_U
    return embed + pos + cfg.n_layers * block + norm


def model_memory_bytes(cfg: ModelConfig) -> int:
    """Bytes the model of ``cfg`` occupies: float32 parameters (:func:`n_parameters`) plus, with rotary
    positions, TransformerLens's per-layer sine and cosine tables (``n_ctx x d_head`` each)."""
    buffers = cfg.n_layers * 2 * cfg.n_ctx * cfg.d_head * 4 if cfg.positional == "rotary" else 0
    return 4 * n_parameters(cfg) + buffers


def _cpu_available_bytes() -> int | None:
    """Memory free for a new allocation on this machine: ``MemAvailable`` of ``/proc/meminfo`` (else the
    free physical pages), and no more than the room left under a cgroup v2 memory limit. None if unknown."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


def available_memory_bytes(device: str | torch.device = "cpu") -> int | None:
    """Bytes free on ``device`` for new tensors: host memory for ``"cpu"`` (see :func:`_cpu_available_bytes`),
    ``torch.cuda.mem_get_info`` for a CUDA device; None when it cannot be told (then nothing is refused)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return None
    if dev.type == "cpu":
        return _cpu_available_bytes()
    if dev.type == "cuda" and torch.cuda.is_available():
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    return None


def format_bytes(n: int | float) -> str:
    """``n`` bytes in a short human form (``"3.2 GiB"``, ``"512 MiB"``, ``"1.5 TiB"``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def check_fits_memory(need: dict[str, int], device: str | torch.device, what: str, advice: str,
                      config: type | None = None) -> None:
    """Raise NopeInterpError when the estimated bytes ``need`` (parts by name) exceed the free memory of
    ``device``; the message gives the estimate, its parts and what is free. Nothing is checked where the
    free memory cannot be told (:func:`available_memory_bytes` is None).

    ``config``: the config class whose fields ``advice`` names as :meth:`~nope_interp.errors.NopeInterpError.naming`
    placeholders (``"lower {batch_size}"``: ``batch_size`` in Python, ``--batch-size`` on the command line); it
    becomes the error's ``config``. Without it ``advice`` is plain text.

    Raises:
        NopeInterpError: ``sum(need.values())`` > free memory on ``device``.
    """
    total, free = sum(need.values()), available_memory_bytes(device)
    if free is not None and total > free:
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in need.items() if v)
        template = "{what} needs about {total} ({parts}) but only {free} is free on {device}; "
        values = {"what": what, "total": format_bytes(total), "parts": parts, "free": format_bytes(free),
                  "device": device}
        if config is None:
            raise NopeInterpError.naming(template + "{advice}", advice=advice, **values)
        err = NopeInterpError.naming(template + advice, **values)
        err.config = config
        raise err


def check_model_fits(cfg: ModelConfig, device: str | torch.device = "cpu", what: str = "the model") -> None:
    """Refuse, before allocating anything, a model whose weights (:func:`model_memory_bytes`) do not fit the
    free memory of ``device`` (and of the host, where every model is built first).

    Raises:
        NopeInterpError: the estimate exceeds the free memory; the message gives the estimate.
    """
    need = {"weights": model_memory_bytes(cfg)}
    n = n_parameters(cfg)
    count = f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
    what = f"{what} ({cfg.n_layers} layers, d_model {cfg.d_model}, {count} parameters)"
    advice = "choose a smaller preset or smaller model sizes"
    check_fits_memory(need, "cpu", what, advice)
    if torch.device(device).type != "cpu":
        check_fits_memory(need, device, what, advice)


def check_device(device: str | torch.device) -> torch.device:
    """Check a device before anything is built on it and return it as a ``torch.device``.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` (N written with the digits 0-9, below the number of
            visible GPUs), ``"mps"`` where available, ``"auto"`` (CUDA when available, else CPU), or a
            ``torch.device`` of one of these.

    Raises:
        NopeInterpError: not a string or ``torch.device``; an unknown device name (``"tpu"``, ``"cuda:x"``);
            a CUDA or MPS device that this machine does not have. One line, naming the allowed values.
    """
    allowed = "auto, cpu, cuda or cuda:N (N a GPU index)"
    if isinstance(device, str):
        if device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if not re.fullmatch(r"(cpu|cuda|cuda:[0-9]+|mps)", device):
            raise NopeInterpError(f"device must be one of {allowed}, got {device!r}")
        device = torch.device(device)
    elif not isinstance(device, torch.device):
        raise NopeInterpError(f"device must be one of {allowed}, got {type(device).__name__} {device!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise NopeInterpError(f"device {str(device)!r} requested but CUDA is not available here; use cpu or auto")
        if device.index is not None and device.index >= count:
            raise NopeInterpError(f"device {str(device)!r} does not exist: this machine has {count} GPU(s), "
                                  f"cuda:0 to cuda:{count - 1}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise NopeInterpError("device 'mps' requested but MPS is not available here; use cpu or auto")
    elif device.type != "cpu":
        raise NopeInterpError(f"device must be one of {allowed}, got {str(device)!r}")
    return device


def _no_rotation(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The rotation of a NoPE layer in a hybrid rotary model (``ModelConfig.nope_layers``): none."""
    return x


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> HookedTransformer:
    """Build a ``HookedTransformer`` for ``cfg`` and apply :func:`init_weights`.

    The global torch RNG is left as it was (construction runs under ``torch.random.fork_rng``).

    Args:
        cfg: the model config; ``positional="none"`` gives an exact NoPE model.
        device: where to put the model (see :func:`check_device`; ``"auto"`` picks CUDA when available).

    With ``tied_embeddings`` the unembedding is a :class:`TiedUnembed`; with ``dropout > 0`` a permanent
    hook at ``hook_embed``, ``blocks.L.hook_attn_out`` and ``blocks.L.hook_mlp_out`` applies dropout when
    the model is in train mode and is the identity in eval mode (permanent hooks survive
    ``reset_hooks()``; TransformerLens has no dropout of its own). With ``nope_layers`` (rotary models),
    those layers' ``apply_rotary`` is the identity: NoPE layers in a RoPE model.

    Returns:
        The model, in eval mode.

    Raises:
        NopeInterpError: ``cfg`` is not a :class:`ModelConfig`; an unknown or unavailable ``device``
            (:func:`check_device`); the model would not fit the free memory (:func:`check_model_fits`).
    """
    if not isinstance(cfg, ModelConfig):
        raise NopeInterpError(f"cfg must be a ModelConfig (see nope_interp.config.preset), got {type(cfg).__name__}")
    device = check_device(device)
    check_model_fits(cfg, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with torch.random.fork_rng(devices=[]):
            model = HookedTransformer(to_hooked_transformer_config(cfg), move_to_device=False)
    if cfg.tied_embeddings:
        model.unembed = TiedUnembed(model.embed, cfg.d_vocab)
        model.setup()
    if cfg.dropout > 0:
        layers = range(cfg.n_layers)
        names = [hook_name("embed")] + [hook_name(p, layer) for layer in layers for p in DROPOUT_POINTS[1:]]
        for name in names:
            model.hook_dict[name].add_perma_hook(_dropout_hook(cfg.dropout))
    model.nope_dropout = cfg.dropout  # read by the trainer's hook-free forward (nope_interp.fast_forward)
    for layer in cfg.nope_layers or ():
        # a NoPE layer in a rotary model: TransformerLens's rotation becomes the identity for this layer only,
        # so hook_rot_q equals hook_q there (nope_interp.positional measures it) and every path (hooked,
        # fast_forward, with_context) sees the same layer
        model.blocks[layer].attn.apply_rotary = _no_rotation
    _init_weights(model, cfg)
    model.to(device, print_details=False)
    model.eval()
    return model


#: TransformerLens config fields a model and the :class:`ModelConfig` said to describe it must agree on.
_MATCHED_FIELDS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab", "act_fn",
                   "normalization_type", "attention_dir", "positional_embedding_type", "use_local_attn",
                   "window_size")


def check_model_config(model: object, cfg: object, what: str = "cfg") -> None:
    """Raise unless ``cfg`` describes ``model``: a function that takes both (:func:`init_weights`,
    :func:`with_context`) would otherwise rebuild or rewrite a different model without a word (a
    learned-position model copied without its positions, a NoPE model given positional weights).

    Args:
        model: a ``HookedTransformer``.
        cfg: the :class:`ModelConfig` said to describe it; ``what`` names it in the message.

    Raises:
        NopeInterpError: ``model`` is not a TransformerLens model or ``cfg`` not a ``ModelConfig``; the
            TransformerLens config of ``cfg`` (:func:`to_hooked_transformer_config`) differs from
            ``model.cfg`` in any of :data:`_MATCHED_FIELDS` (every difference is named); tied embeddings on
            one side only; ``cfg.positional`` is ``"none"`` but ``W_pos`` is not all zero, or ``"learned"``
            but ``W_pos`` is all zero and frozen (a NoPE model).
    """
    check_model(model)
    if not isinstance(cfg, ModelConfig):
        raise NopeInterpError(f"{what} must be a ModelConfig (see nope_interp.config.preset), got {type(cfg).__name__}")
    want = to_hooked_transformer_config(cfg)
    diffs = [f"{f}={getattr(model.cfg, f, None)!r} in the model, {getattr(want, f)!r} from {what}"
             for f in _MATCHED_FIELDS if getattr(model.cfg, f, None) != getattr(want, f)]
    tied = isinstance(getattr(model, "unembed", None), TiedUnembed)
    if tied != cfg.tied_embeddings:
        diffs.append(f"tied embeddings {tied} in the model, {cfg.tied_embeddings} from {what}")
    w_pos = getattr(getattr(model, "pos_embed", None), "W_pos", None)
    if w_pos is not None and cfg.positional == "none" and bool(torch.any(w_pos != 0)):
        diffs.append(f"the model has positional embeddings (W_pos not all zero), {what} has positional='none'")
    frozen_zero = w_pos is not None and not w_pos.requires_grad and not bool(torch.any(w_pos != 0))
    if frozen_zero and cfg.positional == "learned":
        diffs.append(f"the model has no positional embeddings (W_pos zero and frozen), {what} has positional='learned'")
    if diffs:
        raise NopeInterpError(f"{what} does not describe this model: {'; '.join(diffs)}")


def init_weights(model: HookedTransformer, cfg: ModelConfig) -> None:
    """Re-initialise ``model`` in place as the paper does, keeping NoPE exact.

    Every parameter whose name ends in one of :data:`WEIGHT_MATRICES` (``embed.W_E``,
    ``blocks.L.attn.W_Q/W_K/W_V/W_O``, ``blocks.L.mlp.W_in/W_out``, ``unembed.W_U``), plus
    ``pos_embed.W_pos`` when ``positional="learned"``, is drawn from N(init_mean, init_std**2) with a local
    ``torch.Generator`` seeded by ``cfg.seed``, in ``named_parameters`` order. Biases are set to zero;
    LayerNorm scales to 1. With ``positional="none"``, ``W_pos`` is zeroed and frozen. With
    ``biases=False``, all biases are frozen. Source: ``docs/method.md``, "Models and training" (the authors'
    code draws all matrices from N(0, 0.02)).

    Raises:
        NopeInterpError: ``cfg`` does not describe ``model`` (:func:`check_model_config`).
    """
    check_model_config(model, cfg)
    _init_weights(model, cfg)


def _init_weights(model: HookedTransformer, cfg: ModelConfig) -> None:
    """:func:`init_weights` without the check (a freshly constructed model's ``W_pos`` is TransformerLens's
    random draw, whatever ``cfg.positional`` is)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.split(".")[-1]
            if leaf in WEIGHT_MATRICES or (leaf == "W_pos" and cfg.positional == "learned"):
                draw = torch.normal(cfg.init_mean, cfg.init_std, size=tuple(param.shape), generator=gen)
                param.copy_(draw.to(param.dtype))
            elif leaf == "W_pos":
                param.zero_()
                param.requires_grad_(False)
            elif leaf.startswith("b"):
                param.zero_()
                param.requires_grad_(cfg.biases)
            elif leaf == "w":
                param.fill_(1.0)


def load_state(model: HookedTransformer, state: object, source: str = "the weights") -> None:
    """Load the state dict ``state`` into ``model`` in place, or say exactly what does not match.

    Args:
        model: the model, built from the config the weights claim to belong to.
        state: ``{parameter name: tensor}`` as written by ``model.state_dict()``.
        source: where the weights came from (a file name), for the error message.

    Raises:
        NopeInterpError: ``state`` is not a dict of tensors, or its keys or shapes differ from the model's.
            The one-line message names the missing keys, the unexpected keys and each shape mismatch
            (the first three of each, with counts), so a config that does not fit its weights is found. A
            parameter with a NaN or infinite entry (named, with the count).
    """
    if not isinstance(state, dict):
        raise NopeInterpError(f"{source} is not a state dict (name -> tensor): got {type(state).__name__}")
    expected = model.state_dict()

    def listed(what: str, items: list[str]) -> str:
        more = f" and {len(items) - 3} more" if len(items) > 3 else ""
        return f"{len(items)} {what}: {', '.join(items[:3])}{more}"

    not_tensor = [f"{k!r} ({type(v).__name__})" for k, v in state.items() if not isinstance(v, Tensor)]
    missing = [repr(k) for k in expected if k not in state]
    unexpected = [repr(k) for k in state if k not in expected]
    shapes = [f"{k!r} is {tuple(v.shape)} in the file, {tuple(expected[k].shape)} in the model"
              for k, v in state.items() if k in expected and isinstance(v, Tensor) and v.shape != expected[k].shape]
    problems = [listed(what, items) for what, items in (("entries that are not tensors", not_tensor),
                                                        ("missing keys", missing), ("unexpected keys", unexpected),
                                                        ("shape mismatches", shapes)) if items]
    if problems:
        raise NopeInterpError(f"{source} do not match the model config: {'; '.join(problems)}")
    params = {name for name, _ in model.named_parameters()}  # buffers (the -inf attention IGNORE) are exempt
    bad = [f"{k!r} ({int((~torch.isfinite(v)).sum())} entries)" for k, v in state.items()
           if k in params and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:  # TransformerLens would run on: a NaN attention score becomes weight 0, silently
        raise NopeInterpError(f"{source} hold NaN or infinite parameters: {listed('parameters', bad)}")
    model.load_state_dict(state)


def with_context(model: HookedTransformer, cfg: ModelConfig, n_ctx: int) -> tuple[HookedTransformer, ModelConfig]:
    """A copy of a NoPE ``model`` (built from ``cfg``) that accepts sequences of up to ``n_ctx`` tokens.

    Without positional embeddings nothing in the weights depends on ``n_ctx``: it only sizes the causal
    mask buffers. The copy is built from ``cfg`` with the new ``n_ctx`` and given every parameter of
    ``model`` (the masks are rebuilt), so it computes the same function on the positions both accept; it is
    how a trained NoPE model is run past its training length (length generalisation). ``model`` itself is
    untouched; the copy is in eval mode on the same device. An ``n_ctx`` at or below the model's returns
    ``(model, cfg)`` unchanged.

    Raises:
        NopeInterpError: ``cfg`` does not describe ``model`` (:func:`check_model_config`: the copy would be a
            different model); ``n_ctx`` not an integer >= 1; a model with learned positional embeddings (it
            has none past its own ``n_ctx``); a new config that does not fit memory (:func:`check_model_fits`).
    """
    check_model_config(model, cfg)
    if not is_int(n_ctx) or n_ctx < 1:
        raise NopeInterpError(f"n_ctx must be an integer >= 1, got {n_ctx!r}")
    n_ctx = int(n_ctx)
    if n_ctx <= cfg.n_ctx:
        return model, cfg
    if cfg.positional == "learned":
        raise NopeInterpError(f"a model with learned positional embeddings has none past its n_ctx={cfg.n_ctx}; "
                              f"it cannot be run on {n_ctx} tokens")
    new_cfg = dataclasses.replace(cfg, n_ctx=n_ctx)
    device = next(model.parameters()).device
    check_model_fits(new_cfg, device, f"the model with n_ctx={n_ctx}")
    bigger = build_model(new_cfg, device=device)
    # pos_embed.W_pos of a model without learned positions is all zeros and sized by n_ctx: the new one stays
    params = {k: v for k, v in model.named_parameters() if k != "pos_embed.W_pos"}
    missing = bigger.load_state_dict(params, strict=False)
    if missing.unexpected_keys or any(k in params for k in missing.missing_keys):
        raise NopeInterpError(f"with_context: parameters do not match ({missing})")
    bigger.eval()
    return bigger, new_cfg


def check_nope(model: HookedTransformer, cfg: ModelConfig) -> None:
    """Raise NopeInterpError if a ``positional="none"`` model has any non-zero positional weight."""
    if cfg.positional != "none":
        return
    w_pos = getattr(getattr(model, "pos_embed", None), "W_pos", None)
    if w_pos is not None and bool(torch.any(w_pos != 0)):
        raise NopeInterpError("positional='none' but pos_embed.W_pos is not all zero: the weights are corrupt")


def check_model(model: object) -> None:
    """Raise :class:`NopeInterpError` unless ``model`` is a TransformerLens model (it has a ``cfg``) with real
    weights (none on the ``meta`` device); a loaded run (:func:`nope_interp.pretrained.load_run`) is named,
    with the attribute to pass instead."""
    if not hasattr(model, "cfg") or not isinstance(model, torch.nn.Module):
        hint = ": a loaded run, pass its .model" if hasattr(model, "model") and hasattr(model, "path") else ""
        raise NopeInterpError(f"model must be a TransformerLens model (HookedTransformer or TransformerBridge), "
                              f"got a {type(model).__name__}{hint}")
    if any(p.is_meta for p in model.parameters()):
        raise NopeInterpError("model has parameters on the meta device (shapes without values): load or "
                              "initialise its weights first (e.g. model.to_empty(device='cpu') then load a state dict)")


def check_model_dtype(model: object, fn: str) -> None:
    """Refuse a TransformerLens model (:func:`check_model`) whose parameters are not all of ``model.cfg.dtype``:
    ``model.half()`` (``.bfloat16()``, ``.double()``) converts the weights but keeps the old ``cfg.dtype``, to
    which TransformerLens's layer norms cast, so the model's own forward fails on a dtype mismatch (16-bit
    weights) or silently mixes precisions. ``model.to(dtype)`` converts both and is supported.

    Raises:
        NopeInterpError: one line naming ``fn``, the parameters' dtypes, ``cfg.dtype`` and the fix.
    """
    check_model(model)
    want = getattr(model.cfg, "dtype", None)
    if not isinstance(model, HookedTransformer) or not isinstance(want, torch.dtype):
        return
    have = sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point()})
    if have and have != [str(want)]:
        fix = f"model.to({have[0]})" if len(have) == 1 else "model.to(dtype) for one dtype"
        raise NopeInterpError(
            f"{fn}: model's parameters are {', '.join(have)} but model.cfg.dtype is {want} (as after model.half(): "
            f"TransformerLens's layer norms cast to cfg.dtype, so its forward fails or mixes precisions); convert it "
            f"with {fix}, which updates cfg.dtype too")


def check_model_for_task(model: object, task: object, n_pos: int | None, fn: str) -> None:
    """Refuse a model that cannot read ``task``'s inputs, before any forward pass fails deep in TransformerLens:
    not a TransformerLens model, or one whose parameters are not of ``cfg.dtype`` (:func:`check_model_dtype`);
    ``task`` not a ``tasks.Task``; a vocabulary smaller than the task's characters (``d_vocab`` below
    ``tasks.D_VOCAB``); inputs of ``n_pos`` tokens longer than ``n_ctx`` (``None``: not checked).

    Raises:
        NopeInterpError: one line naming ``fn`` and what does not fit.
    """
    import tasks as tasks_pkg

    check_model_dtype(model, fn)
    if not isinstance(task, tasks_pkg.Task):
        raise NopeInterpError(f"{fn}: task must be a tasks.Task (e.g. tasks.get_task('reversal')), got "
                              f"{type(task).__name__} {task!r}"[:300])
    if model.cfg.d_vocab < tasks_pkg.D_VOCAB:
        raise NopeInterpError(f"{fn}: the model's d_vocab={model.cfg.d_vocab} is smaller than the tasks' vocabulary "
                              f"of {tasks_pkg.D_VOCAB} characters")
    if n_pos is not None and n_pos > model.cfg.n_ctx:
        raise NopeInterpError(f"{fn}: n_ctx={model.cfg.n_ctx} is too small for {task.name!r} inputs of {n_pos} tokens")


def check_tokens(model: LensModel, tokens: object, name: str = "tokens") -> Int[Tensor, "batch pos"]:
    """Check a batch of token ids for ``model`` and return it as a contiguous ``torch.long`` tensor (same
    values, same device; TransformerLens's embedding views its input, so a transposed batch would fail there).

    Args:
        model: the model the ids are for (its ``cfg.d_vocab``).
        tokens: ``Int[Tensor, "batch pos"]``, at least one sequence of at least one position, every id in
            ``[0, d_vocab)``. ``name`` is the parameter named in the error message.

    Raises:
        NopeInterpError: ``model`` is not a TransformerLens model (:func:`check_model`); not a tensor; a
            float, complex or bool dtype; not 2-D; an empty batch or sequence; on the meta device (no data) or
            sparse; an id outside
            ``[0, d_vocab)`` (the message gives the first such id and where it is). An id of -1 would
            otherwise silently select the last embedding row.
    """
    check_model(model)
    if not isinstance(tokens, Tensor):
        raise NopeInterpError(f"{name} must be a torch tensor of integer token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise NopeInterpError(f"{name} must hold integer token ids (torch.long), got dtype {tokens.dtype}")
    if tokens.ndim != 2 or 0 in tokens.shape:
        raise NopeInterpError(f"{name} must be 2-D (batch >= 1, pos >= 1), got shape {tuple(tokens.shape)}")
    if tokens.device.type == "meta" or tokens.layout != torch.strided:
        got = "on the meta device (no data)" if tokens.device.type == "meta" else f"of layout {tokens.layout}"
        raise NopeInterpError(f"{name} must be a dense tensor with data, got one {got}")
    d_vocab = model.cfg.d_vocab
    bad = (tokens < 0) | (tokens >= d_vocab)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise NopeInterpError(
            f"{name} must be token ids in [0, {d_vocab}) (d_vocab={d_vocab}), got {int(tokens[where])} at {name}"
            f"[{', '.join(map(str, where))}] ({int(bad.sum())} ids out of range; min {int(tokens.min())}, "
            f"max {int(tokens.max())})")
    return tokens.long().contiguous()


@contextlib.contextmanager
def eval_mode(model: object) -> Iterator[None]:
    """Within the block ``model`` (any ``torch.nn.Module``; anything else is left alone) is in eval mode, so
    dropout is off and an analysis of the same inputs gives the same numbers; every submodule's own mode
    is restored afterwards, also on an exception.

    >>> with eval_mode(model):                                   # doctest: +SKIP
    ...     _, cache = model.run_with_cache(tokens)
    """
    if not isinstance(model, nn.Module):
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


F_ = TypeVar("F_", bound=Callable[..., Any])


def evaluates(fn: F_) -> F_:
    """Decorator for a function that measures a model (its first argument, or ``model=``): the call runs
    under :func:`eval_mode`, so a model left in train mode (dropout on) is measured as in eval mode and is
    handed back in the mode it came in. A generator function computes each item in eval mode and hands the
    model back in its own mode between items, so a generator left half-drawn (a ``break`` in a notebook cell)
    does not keep the model in eval mode behind the user's back."""
    def model_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        return kwargs["model"] if "model" in kwargs else (args[0] if args else None)

    def drawn_in_eval_mode(model: object, gen: Iterator[Any]) -> Iterator[Any]:
        try:
            while True:
                with eval_mode(model):
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
                yield item
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        model = model_of(args, kwargs)
        with eval_mode(model):
            result = fn(*args, **kwargs)
        # a generator (also one wrapped by another decorator) runs its body while it is iterated
        return drawn_in_eval_mode(model, result) if inspect.isgenerator(result) else result

    return wrapper  # type: ignore[return-value]
