"""Diagnostics that say which mechanism is at work behind an adjacency score (model-holding measurements).

Three ways a trained NoPE model's first layer can end up, each with its own number:

* averaging (the paper's mechanism): layer-0 attention near uniform, so the relative attention entropy
  (:func:`layer0_attention_entropy`) is near 1;
* attention collapse: each query attends to a few keys, entropy far below 1, no averaging;
* a position code keyed to delimiter tokens: attention stays uniform but the value vectors of the content
  tokens (digits) collapse together while delimiters (``$``, ``+``, ``=``, ...) get long values, so the
  output is almost purely positional (:func:`positional_share` near 1) yet blocky rather than "nearer is
  more similar". :func:`value_geometry` measures the collapse.

Method: ``docs/method.md``, "The averaging argument"; the mean decomposition is Song & Zhong's
(arXiv 2310.04861).
"""

from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp.averaging import relative_entropy_to_uniform
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.model import check_tokens

DIGITS = "0123456789"


def positional_share(acts: Float[Tensor, "batch pos d"]) -> float:
    """Share of the (uncentred) second moment held by the per-position mean: ``batch * sum_p |mu_p|^2 /
    sum_{b,p} |h_{b,p}|^2`` in [0, 1] (1: every prompt has the same vector at each position).

    Raises:
        NopeInterpError: fewer than 2 prompts, or all-zero activations.
    """
    if acts.ndim != 3 or acts.shape[0] < 2:
        raise NopeInterpError(f"positional_share needs (batch >= 2, pos, d) activations, got {tuple(acts.shape)}")
    a = acts.double()
    total = float((a**2).sum())
    if total == 0.0:
        raise NopeInterpError("positional_share of all-zero activations is undefined")
    return float(a.shape[0] * (a.mean(0) ** 2).sum()) / total


def _checked_tokens(model: HookedTransformer, tokens: Tensor) -> Tensor:
    tokens = check_tokens(model, tokens)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise NopeInterpError(f"sequences of {tokens.shape[1]} tokens exceed the model's n_ctx={model.cfg.n_ctx}")
    return tokens


@torch.no_grad()
def layer0_attention_entropy(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> float:
    """Mean relative entropy (1 = uniform causal attention, 0 = one key) of layer 0's attention rows >= 1,
    over heads and prompts, in [0, 1].

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`), or longer than ``n_ctx``.
    """
    tokens = _checked_tokens(model, tokens)
    name = hook_name("pattern", 0)
    _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter=name, return_type=None)
    causal = model.cfg.attention_dir == "causal"
    return float(relative_entropy_to_uniform(cache[name].cpu(), causal)[..., 1:].mean())


@dataclass(frozen=True)
class ValueGeometry:
    """Layer-0 value vectors of single tokens (heads concatenated), which under NoPE depend on the token only.

    Attributes:
        digit_spread: RMS distance of the 10 digits' value vectors from their centroid divided by the
            centroid's norm (>= 0; small: the digits' values collapsed together).
        delimiter_norm_ratio: mean norm of the task's non-digit prompt characters' values divided by the
            digits' mean norm (> 1: delimiters carry longer values).
        delimiters: the non-digit characters of the task's prompts.
    """

    digit_spread: float
    delimiter_norm_ratio: float
    delimiters: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@torch.no_grad()
def value_geometry(model: HookedTransformer, task: tasks_pkg.Task) -> ValueGeometry:
    """The layer-0 value vectors ``v_t = ln1(W_E[t]) @ W_V + b_V`` of the digits and of the task's delimiters.

    Raises:
        NopeInterpError: a model whose first layer has positional embeddings in its input (then values
            depend on position too, and this measurement does not apply).
    """
    if model.cfg.positional_embedding_type != "standard" or bool(torch.any(model.W_pos != 0)):
        raise NopeInterpError("value_geometry applies to NoPE models (values depend on the token only)")
    prompt = task.analysis_prompts(1, seed=0)[0]
    delimiters = "".join(sorted({c for c in prompt if c not in DIGITS}))
    ids = {c: tasks_pkg.encode(c)[0] for c in DIGITS + delimiters}
    emb = model.W_E[list(ids.values())].unsqueeze(0)  # 1 tok d_model
    block = model.blocks[0]
    v = torch.einsum("td,hdk->thk", block.ln1(emb)[0], block.attn.W_V) + block.attn.b_V
    v = v.flatten(1).double()
    digits, delims = v[: len(DIGITS)], v[len(DIGITS) :]
    centroid = digits.mean(0)
    spread = float(((digits - centroid) ** 2).sum(-1).mean().sqrt() / centroid.norm().clamp_min(1e-300))
    ratio = float(delims.norm(dim=-1).mean() / digits.norm(dim=-1).mean()) if len(delims) else float("nan")
    return ValueGeometry(digit_spread=spread, delimiter_norm_ratio=ratio, delimiters=delimiters)


def diagnose(model: HookedTransformer, task: tasks_pkg.Task, tokens: Int[Tensor, "batch pos"]) -> dict[str, Any]:
    """All three diagnostics on ``tokens`` (``Int[Tensor, "batch pos"]``, batch >= 2): ``l0_attention_entropy``,
    ``l0_z_positional_share`` (at ``blocks.0.attn.hook_z``), ``digit_value_spread``,
    ``delimiter_value_norm_ratio``.

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`) or longer than ``n_ctx``; fewer than 2 prompts; a
            model with positional embeddings (:func:`value_geometry`).
    """
    tokens = _checked_tokens(model, tokens)
    name = hook_name("z", 0)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter=name, return_type=None)
    geo = value_geometry(model, task)
    return {"l0_attention_entropy": layer0_attention_entropy(model, tokens),
            "l0_z_positional_share": positional_share(cache[name].flatten(-2).cpu()),
            "digit_value_spread": geo.digit_spread, "delimiter_value_norm_ratio": geo.delimiter_norm_ratio}
