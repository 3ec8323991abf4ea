"""NoPE ``HookedTransformer``s: the model config, presets, construction and the paper's initialisation.

NoPE route (design.md, "NoPE in TransformerLens 3.9"): TransformerLens has no
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

import json
import math
import warnings
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from nope_interp.errors import NopeInterpError

Positional = Literal["none", "learned", "rotary"]
Attention = Literal["causal", "bidirectional"]
POSITIONAL_CHOICES = ("none", "learned", "rotary")
ATTENTION_CHOICES = ("causal", "bidirectional")
ACT_FN_CHOICES = ("gelu", "gelu_new", "relu", "silu")
NORMALIZATION_CHOICES = ("LN", "LNPre", "RMS", "RMSPre")
#: Parameter-name suffixes of the weight matrices that the custom init draws from N(init_mean, init_std).
WEIGHT_MATRICES = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U")


@dataclass(frozen=True)
class ModelConfig:
    """A model's shape and initialisation (TransformerLens names). Frozen; JSON round-trip.

    Attributes:
        n_layers, d_model, n_heads, d_head, d_mlp, n_ctx, d_vocab: TransformerLens sizes (positive);
            ``n_heads * d_head`` must equal ``d_model`` so that ``hook_z`` with heads concatenated has
            width ``d_model`` (as in the paper's nanoGPT).
        act_fn: MLP activation, one of :data:`ACT_FN_CHOICES`.
        normalization: TransformerLens ``normalization_type``, one of :data:`NORMALIZATION_CHOICES`.
        positional: ``"none"`` (NoPE, default), ``"learned"`` (absolute) or ``"rotary"``.
        attention: ``"causal"`` (default) or ``"bidirectional"`` (a control: no adjacency pattern).
        init_mean, init_std: every weight matrix is drawn from N(init_mean, init_std**2)
            (paper: N(0, 0.02); grid mean {0, 4, 8} x std {0.002, 0.02, 0.2}).
        biases: if False (default, nanoGPT ``bias=False``), all biases are zero and frozen.
        seed: seed of the local generator used by the init (the global RNG is never touched).
    """

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_head: int = 32
    d_mlp: int = 512
    n_ctx: int = 64
    d_vocab: int = 96
    act_fn: str = "gelu"
    normalization: str = "LN"
    positional: str = "none"
    attention: str = "causal"
    init_mean: float = 0.0
    init_std: float = 0.02
    biases: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
                raise NopeInterpError(f"{name} must be a positive integer (1 to 1,000,000), got {value!r}")
        if self.n_heads * self.d_head != self.d_model:
            raise NopeInterpError(
                f"n_heads * d_head must equal d_model, got {self.n_heads} * {self.d_head} != {self.d_model}"
            )
        choices = {
            "act_fn": ACT_FN_CHOICES,
            "normalization": NORMALIZATION_CHOICES,
            "positional": POSITIONAL_CHOICES,
            "attention": ATTENTION_CHOICES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise NopeInterpError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not (isinstance(self.init_mean, (int, float)) and math.isfinite(self.init_mean)):
            raise NopeInterpError(f"init_mean must be a finite number, got {self.init_mean!r}")
        if not (isinstance(self.init_std, (int, float)) and math.isfinite(self.init_std) and self.init_std > 0):
            raise NopeInterpError(f"init_std must be a positive finite number, got {self.init_std!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise NopeInterpError(f"seed must be a non-negative integer, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Inverse of :meth:`to_dict`. Raises NopeInterpError on unknown keys or bad values."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise NopeInterpError(f"unknown ModelConfig field(s) {unknown}; allowed: {', '.join(sorted(known))}")
        return cls(**data)

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @property
    def n_params(self) -> int:
        """Trainable parameters of the built model (weight matrices and LayerNorm scales)."""
        return sum(p.numel() for p in build_model(self).parameters() if p.requires_grad)


#: Named model shapes. ``paper``: the paper's nanoGPT shape. ``cpu``: the shape the shipped models use,
#: chosen by measurement on 2 CPU cores (see README, "Training on CPU"). ``tiny``: tests.
PRESETS: dict[str, ModelConfig] = {
    "paper": ModelConfig(n_layers=6, d_model=384, n_heads=6, d_head=64, d_mlp=1536, n_ctx=256),
    "cpu": ModelConfig(n_layers=3, d_model=128, n_heads=4, d_head=32, d_mlp=512, n_ctx=64),
    "tiny": ModelConfig(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, n_ctx=48),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset ``name`` (one of :data:`PRESETS`) with optional field overrides.

    Raises:
        NopeInterpError: unknown preset name or field, or invalid values.
    """
    if name not in PRESETS:
        raise NopeInterpError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}")
    known = {f.name for f in fields(ModelConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise NopeInterpError(f"unknown ModelConfig field(s) {bad}; allowed: {', '.join(sorted(known))}")
    return replace(PRESETS[name], **overrides)


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


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> HookedTransformer:
    """Build a ``HookedTransformer`` for ``cfg`` and apply :func:`init_weights`.

    The global torch RNG is left as it was (construction runs under ``torch.random.fork_rng``).

    Args:
        cfg: the model config; ``positional="none"`` gives an exact NoPE model.
        device: where to put the model.

    Returns:
        The model, in eval mode (TransformerLens has no dropout, so train/eval behave the same).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with torch.random.fork_rng(devices=[]):
            model = HookedTransformer(to_hooked_transformer_config(cfg), move_to_device=False)
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
    ``biases=False``, all biases are frozen. Source: paper.md "Init" ([code]: all matrices N(0, 0.02)).
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
