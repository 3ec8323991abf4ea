"""Diagnostics that say which mechanism is at work behind an adjacency score (model-holding measurements).

Three ways a trained NoPE model's first layer can end up, each with its own number:

* averaging (the paper's mechanism): layer-0 attention near uniform, so the relative attention entropy
  (:func:`layer0_attention_entropy`) is near 1;
* attention collapse: each query attends to a few keys, entropy far below 1, no averaging;
* a position code keyed to delimiter tokens: attention stays uniform but the value vectors of the content
  tokens (digits) collapse together while delimiters (``$``, ``+``, ``=``, ...) get long values, so the
  output is almost purely positional (:func:`positional_share` near 1) yet blocky rather than "nearer is
  more similar". :func:`value_geometry` measures the collapse.

The first two say what the layer looks like; :func:`layer0_interventions` tests them causally: it scores
``blocks.0.attn.hook_z`` again with each explanation undone (attention made uniform; the delimiters'
values made those of an average digit). An explanation holds for a model when undoing it brings the score
back towards the initialised model's.

Method: ``docs/method.md``, "The averaging argument" and "Which mechanism"; the mean decomposition is Song
& Zhong's (arXiv 2310.04861).
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
from nope_interp.interventions import pattern_replacement_hook
from nope_interp.model import check_tokens
from nope_interp.similarity import adjacency_scores_of_activations, degenerate_report

DIGITS = "0123456789"
#: The interventions of :func:`layer0_interventions`, in the order of its result.
INTERVENTIONS: tuple[str, ...] = ("none", "uniform_attention", "neutral_delimiters", "both")


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


def is_nope(model: HookedTransformer) -> bool:
    """True when no positional information enters ``model`` besides the causal mask: TransformerLens's
    ``"standard"`` positional embedding with an all-zero ``W_pos`` (how this toolkit builds NoPE models)."""
    return model.cfg.positional_embedding_type == "standard" and not bool(torch.any(model.W_pos != 0))


def _require_nope(model: HookedTransformer, what: str) -> None:
    if not is_nope(model):
        raise NopeInterpError(f"{what} applies to NoPE models (values depend on the token only)")


@torch.no_grad()
def value_geometry(model: HookedTransformer, task: tasks_pkg.Task) -> ValueGeometry:
    """The layer-0 value vectors ``v_t = ln1(W_E[t]) @ W_V + b_V`` of the digits and of the task's delimiters.

    Raises:
        NopeInterpError: a model whose first layer has positional embeddings in its input (then values
            depend on position too, and this measurement does not apply).
    """
    _require_nope(model, "value_geometry")
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


def _neutral_delimiters_hook(model: HookedTransformer, tokens: Tensor, content_ids: list[int], seed: int):
    """A ``blocks.0.attn.hook_v`` hook that gives every non-content token the value of a content token drawn
    at random (uniformly, independently per occurrence, from ``seed``)."""
    name = hook_name("v", 0)
    ids = torch.tensor(content_ids, device=model.cfg.device)
    _, cache = model.run_with_cache(ids.unsqueeze(0), names_filter=name, stop_at_layer=1, return_type=None)
    values = cache[name][0]  # content head d_head: under NoPE each position holds its token's value
    delimiter = ~torch.isin(tokens, ids)  # batch pos
    draw = torch.randint(len(content_ids), tokens.shape, generator=torch.Generator().manual_seed(seed))
    replacement = values[draw.to(values.device)]  # batch pos head d_head

    def hook(v: Float[Tensor, "batch pos head d_head"], hook: Any = None) -> Tensor:
        return torch.where(delimiter[..., None, None], replacement.to(v.dtype), v)

    return name, hook


@torch.no_grad()
def layer0_interventions(model: HookedTransformer, tokens: Int[Tensor, "batch pos"],
                         content: str = DIGITS, seed: int = 0) -> dict[str, float]:
    """The adjacency score at ``blocks.0.attn.hook_z`` with each explanation of a low score undone.

    Row-mean score (``docs/method.md``, "Definitions") of every sequence, mean over ``tokens``, in [0, 1],
    under each of :data:`INTERVENTIONS`:

    * ``none``: the model as it is (the score :func:`~nope_interp.analysis.analyze_tokens` reports there);
    * ``uniform_attention``: layer 0's attention pattern replaced by uniform causal attention (every query
      the plain mean of the values up to it), which undoes attention collapse;
    * ``neutral_delimiters``: at layer 0, the value vector (``hook_v``, all heads) of every token that is not
      one of ``content``'s characters replaced by the value of a content character drawn at random
      (uniformly, independently per occurrence: a resampling ablation), so that the values carry no
      delimiter; queries and keys still see the real tokens. This undoes a delimiter-keyed position code
      and leaves an untrained model's averaging of random values as it was (a constant replacement
      would not: it puts one shared vector at every delimiter);
    * ``both``: the two together: uniform averages of content values only.

    Layer 0 only (the forward stops after it). Inputs shorter than 3 positions cannot be scored.

    Args:
        model: a NoPE model (values depend on the token only, so the content tokens' values are measured
            once, on a sequence of the content characters).
        tokens: ``Int[Tensor, "batch pos"]``, batch >= 1, 3 <= pos <= n_ctx.
        content: the content characters (default the digits); every other token counts as a delimiter.
        seed: seed of the random draw of ``neutral_delimiters`` (the same draw for ``both``).

    Returns:
        ``{intervention: mean score}`` in the order of :data:`INTERVENTIONS`.

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`), longer than ``n_ctx`` or shorter than 3; an empty
            ``content`` or one with a character outside the vocabulary; a model with positional embeddings or
            bidirectional attention.

    Warns:
        DegenerateInputWarning: once, naming the interventions that leave sequences with parallel vectors
            at every position (for example ``both`` when the content tokens' values are identical).
    """
    _require_nope(model, "layer0_interventions")
    if model.cfg.attention_dir != "causal":
        raise NopeInterpError("layer0_interventions applies to causal attention (its uniform replacement is the "
                              f"uniform causal pattern), got attention_dir={model.cfg.attention_dir!r}")
    tokens = _checked_tokens(model, tokens).to(model.cfg.device)
    if not isinstance(content, str) or not content:
        raise NopeInterpError(f"content must be a non-empty string of characters, got {content!r}")
    try:
        content_ids = sorted(set(tasks_pkg.encode(content)))
    except tasks_pkg.UnknownCharacterError as exc:
        raise NopeInterpError(f"content: {exc}") from None
    z = hook_name("z", 0)
    uniform = (hook_name("pattern", 0), pattern_replacement_hook("uniform"))
    neutral = _neutral_delimiters_hook(model, tokens, content_ids, seed)
    hooks = {"none": [], "uniform_attention": [uniform], "neutral_delimiters": [neutral], "both": [uniform, neutral]}
    out = {}
    with degenerate_report("layer0_interventions", stacklevel=4):
        for kind in INTERVENTIONS:
            with model.hooks(fwd_hooks=hooks[kind]):
                _, cache = model.run_with_cache(tokens, names_filter=z, stop_at_layer=1, return_type=None)
            scores = adjacency_scores_of_activations(cache[z].flatten(-2).cpu(), ("row_mean",),
                                                     what=f"{z} ({kind})")["row_mean"]
            out[kind] = float(scores.mean())
    return out


def diagnose(model: HookedTransformer, task: tasks_pkg.Task, tokens: Int[Tensor, "batch pos"]) -> dict[str, Any]:
    """All diagnostics on ``tokens`` (``Int[Tensor, "batch pos"]``, batch >= 2, pos >= 3): ``l0_attention_entropy``,
    ``l0_z_positional_share`` (at ``blocks.0.attn.hook_z``), ``digit_value_spread``,
    ``delimiter_value_norm_ratio``, and ``l0_z_score_<intervention>`` for each of :data:`INTERVENTIONS`
    (:func:`layer0_interventions`, content = the digits).

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
            "digit_value_spread": geo.digit_spread, "delimiter_value_norm_ratio": geo.delimiter_norm_ratio,
            **{f"l0_z_score_{k}": v for k, v in layer0_interventions(model, tokens).items()}}
