"""NoPE ``HookedTransformer``s: the model config, presets, construction and the paper's initialisation.

NoPE route (``docs/method.md``, "Models and training"): TransformerLens 3.9 has no
``positional_embedding_type="none"``, so a ``"standard"`` model is built and its ``pos_embed.W_pos`` is
zeroed and frozen (``requires_grad=False``), as in TransformerLens's own NoPE demo. ``hook_pos_embed``
then outputs exact zeros and no position information enters the residual stream. Our
:class:`ModelConfig` (``positional="none"``) is the source of truth; TransformerLens still reports
``"standard"``. Tests prove NoPE is exact (permutation invariance / equivariance).

Differences from the paper's nanoGPT, by design of TransformerLens: no dropout (paper: 0.2), untied
input/output embeddings (paper: tied), no 1/sqrt(2 n_layers) scaling of residual output projections.
With ``biases=False`` (default) every bias, LayerNorm biases included, is zero and frozen, matching
nanoGPT's ``bias=False``.
"""

import warnings

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.hook_points import HookPoint

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
           "check_nope",
           "to_hooked_transformer_config", "WEIGHT_MATRICES", "POSITIONAL_CHOICES", "ATTENTION_CHOICES",
           "ACT_FN_CHOICES", "NORMALIZATION_CHOICES"]


def to_hooked_transformer_config(cfg: ModelConfig) -> HookedTransformerConfig:
    """The TransformerLens config for ``cfg`` (no ``seed``: TransformerLens would reseed global RNGs)."""
    pos_type = "rotary" if cfg.positional == "rotary" else "standard"
    return HookedTransformerConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_mlp=cfg.d_mlp,
        n_ctx=cfg.n_ctx,
        d_vocab=cfg.d_vocab,
        act_fn=cfg.act_fn,
        normalization_type=cfg.normalization,
        attention_dir=cfg.attention,
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

    return hook


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> HookedTransformer:
    """Build a ``HookedTransformer`` for ``cfg`` and apply :func:`init_weights`.

    The global torch RNG is left as it was (construction runs under ``torch.random.fork_rng``).

    Args:
        cfg: the model config; ``positional="none"`` gives an exact NoPE model.
        device: where to put the model.

    With ``tied_embeddings`` the unembedding is a :class:`TiedUnembed`; with ``dropout > 0`` a permanent
    hook at ``hook_embed``, ``blocks.L.hook_attn_out`` and ``blocks.L.hook_mlp_out`` applies dropout when
    the model is in train mode and is the identity in eval mode (permanent hooks survive
    ``reset_hooks()``; TransformerLens has no dropout of its own).

    Returns:
        The model, in eval mode.
    """
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
    init_weights(model, cfg)
    model.to(device, print_details=False)
    model.eval()
    return model


def init_weights(model: HookedTransformer, cfg: ModelConfig) -> None:
    """Re-initialise ``model`` in place as the paper does, keeping NoPE exact.

    Every parameter whose name ends in one of :data:`WEIGHT_MATRICES` (``embed.W_E``,
    ``blocks.L.attn.W_Q/W_K/W_V/W_O``, ``blocks.L.mlp.W_in/W_out``, ``unembed.W_U``), plus
    ``pos_embed.W_pos`` when ``positional="learned"``, is drawn from N(init_mean, init_std**2) with a local
    ``torch.Generator`` seeded by ``cfg.seed``, in ``named_parameters`` order. Biases are set to zero;
    LayerNorm scales to 1. With ``positional="none"``, ``W_pos`` is zeroed and frozen. With
    ``biases=False``, all biases are frozen. Source: ``docs/method.md``, "Models and training" (the authors'
    code draws all matrices from N(0, 0.02)).
    """
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


def check_nope(model: HookedTransformer, cfg: ModelConfig) -> None:
    """Raise NopeInterpError if a ``positional="none"`` model has any non-zero positional weight."""
    if cfg.positional != "none":
        return
    w_pos = getattr(getattr(model, "pos_embed", None), "W_pos", None)
    if w_pos is not None and bool(torch.any(w_pos != 0)):
        raise NopeInterpError("positional='none' but pos_embed.W_pos is not all zero: the weights are corrupt")
