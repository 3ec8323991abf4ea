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
from nope_interp.averaging import attention_window, relative_entropy_to_uniform
from nope_interp.config import check_int
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.interventions import pattern_replacement_hook
from nope_interp.model import LensModel, check_model, check_model_dtype, check_tokens, eval_mode
from nope_interp.similarity import adjacency_scores_of_activations, check_tensor, degenerate_report

DIGITS = "0123456789"
#: The interventions of :func:`layer0_interventions`, in the order of its result.
INTERVENTIONS: tuple[str, ...] = ("none", "uniform_attention", "neutral_delimiters", "both")


def positional_share(acts: Float[Tensor, "batch pos d"]) -> float:
    """Share of the (uncentred) second moment held by the per-position mean: ``batch * sum_p |mu_p|^2 /
    sum_{b,p} |h_{b,p}|^2`` in [0, 1] (1: every prompt has the same vector at each position).

    Scale-free: computed in float64 on the activations divided by their largest |entry|, so tiny and huge
    values work. Undefined results follow :func:`participation_ratio`: NaN (written as ``null`` in result
    JSON) when the measurement is undefined for finite input, here all-zero activations (0 / 0); non-finite
    input is refused, never turned into NaN.

    Raises:
        NopeInterpError: ``acts`` is not a dense real floating torch tensor with data of shape (batch >= 2,
            pos >= 1, d >= 1) (:func:`~nope_interp.similarity.check_tensor`), or has NaN or inf entries.
    """
    if isinstance(acts, Tensor) and acts.is_floating_point() and (acts.ndim != 3 or acts.shape[0] < 2):
        raise NopeInterpError(f"positional_share needs (batch >= 2, pos, d) activations, got shape "
                              f"{tuple(acts.shape)}")
    check_tensor(acts, "acts", "(batch >= 2, pos >= 1, d >= 1)", ndim=3, min_sizes={0: 2, 1: 1, 2: 1},
                 finite=True, fn="positional_share")
    a = acts.double()
    scale = float(a.abs().max())
    if scale == 0.0:
        return float("nan")
    a = a / scale
    return float(a.shape[0] * (a.mean(0) ** 2).sum()) / float((a**2).sum())


def _check_model_dtype(model: LensModel, fn: str) -> None:
    """:func:`nope_interp.model.check_model_dtype` (kept under its old name for this module's callers)."""
    check_model_dtype(model, fn)


def _check_task(task: object, fn: str) -> None:
    if not isinstance(task, tasks_pkg.Task):
        raise NopeInterpError(f"{fn}: task must be a tasks.Task (e.g. tasks.get_task('addition')), got "
                              f"{type(task).__name__} {task!r}"[:300])


def _check_task_prompts(task: tasks_pkg.Task, tokens: Tensor, fn: str) -> None:
    """Every row of ``tokens`` must decode to one of ``task``'s prompts (what :func:`value_geometry`'s
    delimiters are taken from)."""
    for b, row in enumerate(tokens.tolist()):
        prompt = None
        try:
            prompt = tasks_pkg.decode(row)
            task.solve(prompt)
        except (ValueError, tasks_pkg.TaskError):
            shown = repr(prompt) if prompt is not None else f"ids {row[:12]}"
            raise NopeInterpError(
                f"{fn}: tokens must be prompts of the task {task.name!r} (the delimiter measurements come from the "
                f"task), got row {b} = {shown[:80]}; pass the task's own prompts (task.analysis_tokens(n))") from None


def _checked_tokens(model: LensModel, tokens: Tensor) -> Tensor:
    tokens = check_tokens(model, tokens)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise NopeInterpError(f"sequences of {tokens.shape[1]} tokens exceed the model's n_ctx={model.cfg.n_ctx}")
    return tokens.contiguous()


@torch.no_grad()
def layer0_attention_entropy(model: LensModel, tokens: Int[Tensor, "batch pos"]) -> float:
    """Mean relative entropy (1 = uniform over the allowed keys, 0 = one key) of layer 0's attention rows >= 1,
    over heads and prompts, in [0, 1]; the allowed keys follow the model's attention (causal, sliding window,
    bidirectional; NaN with a window of 1, where no row has a choice). Measured in eval mode (the model's
    mode is restored after). The mean over heads can hide one collapsed head among uniform ones:
    :func:`layer0_head_entropies` gives each head's.

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`), shorter than 2 positions or longer than ``n_ctx``; ``model``
            not a TransformerLens model, or one whose parameters are not of ``model.cfg.dtype`` (after
            ``model.half()``: convert with ``model.to(dtype)``).
    """
    _check_model_dtype(model, "layer0_attention_entropy")
    return float(_layer0_relative_entropy(model, _checked_tokens(model, tokens)).mean())


@torch.no_grad()
def layer0_head_entropies(model: LensModel, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, " head"]:
    """Each layer-0 head's mean relative attention entropy (as :func:`layer0_attention_entropy`, which is
    their mean), over prompts and query rows >= 1: ``[n_heads]``, float32 on the CPU, each in [0, 1].

    A head near 0 attends to one key per query (for example the first character of the query's line) and
    averages nothing, while the others can stay near 1; the mean over heads reads such a model as mildly
    non-uniform. Method: ours (the per-head form of the entropy diagnostic in ``docs/method.md``).

    Raises:
        NopeInterpError: as :func:`layer0_attention_entropy`.
    """
    _check_model_dtype(model, "layer0_head_entropies")
    rel = _layer0_relative_entropy(model, _checked_tokens(model, tokens))  # [batch, head, query >= 1]
    return rel.mean(dim=(0, 2)).float()


def _layer0_relative_entropy(model: LensModel, tokens: Tensor) -> Float[Tensor, "batch head query"]:
    """Relative entropy of layer 0's attention rows >= 1, per prompt, head and query (eval mode).

    Raises:
        NopeInterpError: ``tokens`` of fewer than 2 positions (no row has a choice of keys: the mean was NaN)."""
    if tokens.shape[1] < 2:
        raise NopeInterpError(f"tokens must have at least 2 positions (row 0 attends to itself alone, so one "
                              f"position has no attention entropy to measure), got shape {tuple(tokens.shape)}")
    name = hook_name("pattern", 0)
    with eval_mode(model):
        _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter=name, return_type=None)
    causal = model.cfg.attention_dir == "causal"
    rel = relative_entropy_to_uniform(cache[name].cpu(), causal, attention_window(model.cfg, 0))
    return rel[..., 1:]


@dataclass(frozen=True)
class ValueGeometry:
    """Layer-0 value vectors of single tokens (heads concatenated), which under NoPE depend on the token only.

    Attributes:
        digit_spread: RMS distance of the 10 digits' value vectors from their centroid divided by the
            centroid's norm (>= 0; small: the digits' values collapsed together).
        delimiter_norm_ratio: mean norm of the task's non-digit prompt characters' values divided by the
            digits' mean norm (> 1: delimiters carry longer values).
        delimiters: the non-digit characters of the task's prompts.
        digit_participation_ratio: ``(sum l)^2 / sum l^2`` of the eigenvalues ``l`` of the 10 digits' value
            covariance, in [1, 9]: how many directions the digits' values spread over (NaN if they are all
            equal). Uniform averaging of values confined to few directions gives a weaker "nearer is more
            similar" pattern than averaging generic ones.
    """

    digit_spread: float
    delimiter_norm_ratio: float
    delimiters: str
    digit_participation_ratio: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return asdict(self)


def is_nope(model: LensModel) -> bool:
    """True when no positional information enters ``model`` besides the causal mask: TransformerLens's
    ``"standard"`` positional embedding with an all-zero ``W_pos`` (how this toolkit builds NoPE models); for a
    ``TransformerBridge`` (no ``W_pos`` of its own), every layer measured ``nope`` by
    :func:`~nope_interp.positional.layer_positional_types` (one forward pass).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; a bridge whose layers
            :func:`~nope_interp.positional.layer_positional_types` cannot type.
    """
    check_model(model)
    if not isinstance(model, HookedTransformer):  # a bridge: GPT-2's W_pos was an AttributeError here
        from nope_interp.positional import layer_positional_types

        return all(kind == "nope" for kind in layer_positional_types(model))
    return model.cfg.positional_embedding_type == "standard" and not bool(torch.any(model.W_pos != 0))


def position_in_values(model: LensModel) -> str | None:
    """Why layer 0's value vectors depend on position (positional embeddings added to the residual stream), or
    None when they depend on the token only: NoPE, rotary or ALiBi (which act on queries, keys or scores, not values).
    The value-vector diagnostics (:func:`value_geometry`) and the causal test need None.

    For a ``TransformerBridge`` the layer types are measured (:func:`~nope_interp.positional.layer_positional_types`):
    values depend on position only with ``learned`` positional embeddings (RoPE and ALiBi act on the attention
    scores, not the values).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model (:func:`is_nope`); a bridge whose layers cannot be
            typed."""
    check_model(model)
    if not isinstance(model, HookedTransformer):
        from nope_interp.positional import layer_positional_types

        if "learned" in layer_positional_types(model):
            return "learned positional embeddings (layer-0 values depend on position)"
        return None
    if model.cfg.positional_embedding_type in ("rotary", "alibi") or is_nope(model):
        return None
    return f"{model.cfg.positional_embedding_type} positional embeddings (layer-0 values depend on position)"


def _check_ids(model: LensModel, ids: list[int], what: str) -> None:
    bad = [i for i in ids if i >= model.cfg.d_vocab]
    if bad:
        raise NopeInterpError(f"{what}: {tasks_pkg.decode([bad[0]])!r} has token id {bad[0]}, outside the model's "
                              f"vocabulary [0, {model.cfg.d_vocab})")


@torch.no_grad()
def value_geometry(model: HookedTransformer, task: tasks_pkg.Task) -> ValueGeometry:
    """The layer-0 value vectors ``v_t = ln1(W_E[t]) @ W_V + b_V`` of the digits and of the task's delimiters.

    Raises:
        NopeInterpError: a ``TransformerBridge`` (its weights are the Hugging Face model's: no ``b_V`` in a
            bias-free model, grouped key/value heads; before: a TypeError); a model whose first layer has
            positional embeddings in its input (then values
            depend on position too, and this measurement does not apply); a task character outside the
            model's ``d_vocab``; ``task`` not a :class:`tasks.Task`; ``model`` not a TransformerLens model, or
            one whose parameters are not of ``model.cfg.dtype`` (after ``model.half()``); value vectors with
            NaN or inf entries (non-finite weights).
    """
    _check_model_dtype(model, "value_geometry")
    _check_task(task, "value_geometry")
    if not isinstance(model, HookedTransformer):
        raise NopeInterpError(f"value_geometry reads a HookedTransformer's own layer-0 weights; got a "
                              f"{type(model).__name__} (the task diagnostics and diagnose are for task models)")
    why = position_in_values(model)
    if why is not None:
        raise NopeInterpError(f"value_geometry does not apply to this model: {why}")
    prompt = task.analysis_prompts(1, seed=0)[0]
    delimiters = "".join(sorted({c for c in prompt if c not in DIGITS}))
    ids = {c: tasks_pkg.encode(c)[0] for c in DIGITS + delimiters}
    _check_ids(model, list(ids.values()), f"value_geometry on {task.name}")
    emb = model.W_E[list(ids.values())].unsqueeze(0)  # 1 tok d_model
    block = model.blocks[0]
    v32 = (torch.einsum("td,hdk->thk", block.ln1(emb)[0], block.attn.W_V) + block.attn.b_V).flatten(1)
    if not bool(torch.isfinite(v32).all()):
        raise NopeInterpError("value_geometry: the layer-0 value vectors are not finite (NaN or inf entries): the "
                              "model's weights are not finite")
    v = v32.double()
    digits, delims = v[: len(DIGITS)], v[len(DIGITS) :]
    centroid = digits.mean(0)
    spread = float(((digits - centroid) ** 2).sum(-1).mean().sqrt() / centroid.norm().clamp_min(1e-300))
    ratio = float(delims.norm(dim=-1).mean() / digits.norm(dim=-1).mean()) if len(delims) else float("nan")
    return ValueGeometry(digit_spread=spread, delimiter_norm_ratio=ratio, delimiters=delimiters,
                         digit_participation_ratio=participation_ratio(v32[: len(DIGITS)]))


#: :func:`participation_ratio` calls rows equal up to rounding when their spread around the mean is at most this
#: many units of their dtype's precision (``torch.finfo(dtype).eps``) relative to the rows' norm. Storing values in
#: a dtype moves each entry by at most half a unit, so storage alone leaves a relative spread of at most 0.5 units;
#: arithmetic in the dtype adds a few. 128 units of float32 is 1.5e-5; of bfloat16 it would be 1.0, calling every
#: input rounding, so 16-bit dtypes get :data:`PR_ROUNDING_ULPS_16BIT` (bfloat16 0.031, float16 0.0039: the
#: shipped addition model's digit values, spread 0.10-0.36 of their norm, are measured at 16 bits too).
PR_ROUNDING_ULPS = 128
PR_ROUNDING_ULPS_16BIT = 4


def participation_ratio(x: Float[Tensor, "n d"]) -> float:
    """``(sum l)^2 / sum l^2`` over the eigenvalues ``l`` of the covariance of the rows of ``x`` (centred), in
    [1, min(n - 1, d)]: the effective number of directions the rows spread over (Gao et al., 2017, "A theory
    of multineuronal dimensionality"). Scale-free; computed in float64 on the rescaled rows, so tiny and huge
    values work. NaN (written as ``null`` in result JSON) when the measurement is undefined for finite input:
    the rows are equal up to rounding (their spread around the mean is at most :data:`PR_ROUNDING_ULPS` units of
    ``x``'s dtype relative to the rows' norm, :data:`PR_ROUNDING_ULPS_16BIT` for 16-bit dtypes: then what is
    left is rounding, not directions), all-zero rows included.
    Non-finite input is refused, never turned into NaN (as :func:`positional_share`).

    Raises:
        NopeInterpError: ``x`` is not a dense real floating torch tensor with data of shape (n >= 2, d >= 1)
            (:func:`~nope_interp.similarity.check_tensor`), or has NaN or inf entries.
    """
    check_tensor(x, "x", "(n >= 2, d >= 1)", ndim=2, min_sizes={0: 2, 1: 1}, finite=True, fn="participation_ratio")
    x64 = x.double()
    scale = float(x64.abs().max())
    if scale == 0.0:
        return float("nan")
    x64 = x64 / scale
    c = x64 - x64.mean(0)
    ulps = PR_ROUNDING_ULPS_16BIT if torch.finfo(x.dtype).bits <= 16 else PR_ROUNDING_ULPS
    if float(c.norm()) <= ulps * torch.finfo(x.dtype).eps * float(x64.norm()):
        return float("nan")
    eig = torch.linalg.svdvals(c) ** 2  # the covariance eigenvalues up to a common factor
    return float(eig.sum()) ** 2 / float((eig**2).sum())


def _content_values(model: HookedTransformer, content_ids: list[int]) -> Float[Tensor, "content head d_head"]:
    """Layer-0 value vectors of the content tokens, one one-token sequence each (under NoPE a token's value
    does not depend on its position)."""
    name = hook_name("v", 0)
    ids = torch.tensor(content_ids, device=model.cfg.device).unsqueeze(1)  # content 1
    _, cache = model.run_with_cache(ids, names_filter=name, stop_at_layer=1, return_type=None)
    return cache[name][:, 0]


def _draw_content(tokens: Tensor, content_ids: list[int], generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(delimiter, index)``, both ``batch pos``: which positions hold a non-content token, and the index into
    ``content_ids`` of the value each position gets (its own token's for content tokens; a uniform draw for
    delimiters). A draw never gives positions 0 and 1 the same value (when a delimiter is among them and
    there are 2+ content tokens): their layer-0 outputs would be parallel, an exact tie in every later row
    that float rounding decides (ties count as failures), a bias of up to -0.02 in the mean score. The
    generator gives one ``batch pos`` draw, then one ``batch`` redraw used only there."""
    n = len(content_ids)
    ids = torch.tensor(content_ids)
    tok = tokens.cpu()
    delimiter = ~torch.isin(tok, ids)
    draw = torch.randint(n, tok.shape, generator=generator)
    redraw = torch.randint(max(n - 1, 1), (tok.shape[0],), generator=generator)
    own = torch.searchsorted(ids, tok.clamp(ids[0], ids[-1]))  # the content index of content tokens
    index = torch.where(delimiter, draw, own)
    if n > 1 and tok.shape[1] >= 2:
        clash = index[:, 0] == index[:, 1]
        fix1 = clash & delimiter[:, 1]                     # redraw position 1, avoiding position 0's value
        fix0 = clash & ~delimiter[:, 1] & delimiter[:, 0]  # else position 0, avoiding position 1's
        index[:, 1] = torch.where(fix1, redraw + (redraw >= index[:, 0]).long(), index[:, 1])
        index[:, 0] = torch.where(fix0, redraw + (redraw >= index[:, 1]).long(), index[:, 0])
    return delimiter, index


def _neutral_delimiters_hook(delimiter: Tensor, index: Tensor, values: Tensor):
    """A ``blocks.0.attn.hook_v`` hook that gives every delimiter position the value of the content token
    ``index`` names (:func:`_draw_content`)."""
    replacement = values[index.to(values.device)]  # batch pos head d_head
    mask = delimiter.to(values.device)[..., None, None]

    def hook(v: Float[Tensor, "batch pos head d_head"], hook: Any = None) -> Tensor:
        return torch.where(mask, replacement.to(v.dtype), v)

    return hook_name("v", 0), hook


def layer0_interventions_unsupported(model: LensModel, n_pos: int | None = None) -> str | None:
    """Why :func:`layer0_interventions` does not apply to ``model`` (on inputs of ``n_pos`` positions; None: any
    length), or None when it does: positional embeddings added to the residual stream (values then depend on
    position; NoPE, rotary and ALiBi models qualify: those act on the attention scores only), attention that is
    not causal, a sliding window in layer 0 narrower than the inputs (the uniform replacement, uniform over
    every earlier position, would let keys outside the window in; a window in later layers does not matter, as
    only layer 0's pattern is replaced), or a ``TransformerBridge`` (the neutral-delimiter test reads the
    layer-0 weights of a ``HookedTransformer``).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; ``n_pos`` not None or an integer >= 1."""
    check_model(model)
    if n_pos is not None:
        n_pos = check_int("n_pos", n_pos, 1, 2**62)
    why = position_in_values(model)
    if why is not None:
        return why
    if model.cfg.attention_dir != "causal":
        return f"{model.cfg.attention_dir} attention (the uniform replacement is the uniform causal pattern)"
    window = attention_window(model.cfg, 0)
    if window is not None and (n_pos is None or n_pos > window):
        return (f"sliding-window attention of {window} keys in layer 0 (the uniform causal replacement would "
                "ignore the window)")
    if not isinstance(model, HookedTransformer):  # before: a TypeError on a bias-free model's missing b_V
        return f"a {type(model).__name__} (the neutral-delimiter test reads a HookedTransformer's layer-0 weights)"
    return None


def layer0_interventions(model: LensModel, tokens: Int[Tensor, "batch pos"],
                         content: str = DIGITS, seed: int = 0, n_draws: int = 8) -> dict[str, float]:
    """The adjacency score at ``blocks.0.attn.hook_z`` with each explanation of a low score undone.

    Row-mean score (``docs/method.md``, "Definitions") of every sequence, mean over ``tokens``, in [0, 1],
    under each of :data:`INTERVENTIONS`:

    * ``none``: the model as it is (the score :func:`~nope_interp.analysis.analyze_tokens` reports there);
    * ``uniform_attention``: layer 0's attention pattern replaced by uniform causal attention (every query
      the plain mean of the values up to it). This undoes whatever the trained pattern does: attention
      collapse, or any other non-uniform weighting;
    * ``neutral_delimiters``: at layer 0, the value vector (``hook_v``, all heads) of every token that is not
      one of ``content``'s characters replaced by the value of a content character drawn at random
      (uniformly, independently per occurrence: a resampling ablation; except that positions 0 and 1 never
      get the same value, which would make an exact tie that rounding decides); queries and keys still see
      the real tokens. This removes anything the values of non-content tokens carry of their own (norm, direction):
      a delimiter-keyed position code, among others. On an untrained model it leaves the average of random
      values random (a constant replacement would not: it puts one shared vector at every delimiter). On a
      trained model whose content values collapsed together, the drawn values are nearly alike, so the
      replacement is nearly constant; the score is rank-based and reads the remaining differences;
    * ``both``: the two together: uniform averages of content values only, which is the averaging argument
      applied to the trained content values (close to the paper's pattern by construction unless those
      values are few-dimensional).

    ``neutral_delimiters`` and ``both`` are the mean over ``n_draws`` independent draws (the draw-to-draw
    standard deviation of a 256-prompt mean is 0.003-0.006 on the shipped models, 0.001-0.002 on reversal).
    Layer 0 only (the forward stops after it), in eval mode (each module's mode is restored after). Inputs
    shorter than 3 positions cannot be scored. Method: ``docs/method.md``, "Which mechanism: layer-0 diagnostics".

    Args:
        model: a causal NoPE (or rotary) model without sliding-window attention
            (:func:`layer0_interventions_unsupported`). Layer-0 values then depend on the token only, so the
            content tokens' values are measured once.
        tokens: ``Int[Tensor, "batch pos"]``, batch >= 1, 3 <= pos <= n_ctx.
        content: the content characters (default the digits); every other token counts as a delimiter,
            the tasks' fixed prefixes (``rev(``, ``wherex(``, ``order(``) included.
        seed: seed of the random draws (the same draws for ``neutral_delimiters`` and ``both``), in
            [0, 2**63 - 1].
        n_draws: draws averaged, in [1, 1000].

    Returns:
        ``{intervention: mean score}`` in the order of :data:`INTERVENTIONS`.

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`), longer than ``n_ctx`` or shorter than 3; an empty
            ``content``, one with a character outside the vocabulary or with an id outside the model's
            ``d_vocab``, or none of whose characters occurs in ``tokens``; ``seed`` or ``n_draws`` out of
            range; ``model`` not a TransformerLens model, or one the interventions do not apply to
            (:func:`layer0_interventions_unsupported`), or one whose parameters are not of ``model.cfg.dtype``
            (``model.half()`` keeps the old ``cfg.dtype`` and TransformerLens cannot run it; a model converted
            with ``model.to(torch.float16)`` is supported).

    Warns:
        DegenerateInputWarning: once, naming the interventions that leave sequences with parallel vectors
            at every position (for example ``both`` when the content tokens' values are identical).
    """
    _check_model_dtype(model, "layer0_interventions")
    tokens = _checked_tokens(model, tokens).to(model.cfg.device)
    why = layer0_interventions_unsupported(model, tokens.shape[1])
    if why is not None:
        raise NopeInterpError(f"layer0_interventions does not apply to this model: {why}")
    seed = check_int("seed", seed, 0, 2**63 - 1)  # a Python int: torch refuses numpy seeds
    n_draws = check_int("n_draws", n_draws, 1, 1000)
    if not isinstance(content, str) or not content:
        raise NopeInterpError(f"content must be a non-empty string of characters, got {content!r}")
    try:
        content_ids = sorted(set(tasks_pkg.encode(content)))
    except tasks_pkg.UnknownCharacterError as exc:
        raise NopeInterpError(f"content: {exc}") from None
    _check_ids(model, content_ids, "content")
    if not bool(torch.isin(tokens, torch.tensor(content_ids, device=tokens.device)).any()):
        raise NopeInterpError(f"content {content!r}: none of its characters occurs in tokens, so every position "
                              "would count as a delimiter (the default content is the digits)")
    with degenerate_report("layer0_interventions"):
        return _layer0_interventions(model, tokens, content_ids, seed, n_draws)


@torch.no_grad()
def _layer0_interventions(model: LensModel, tokens: Tensor, content_ids: list[int], seed: int,
                          n_draws: int) -> dict[str, float]:
    z = hook_name("z", 0)
    uniform = (hook_name("pattern", 0), pattern_replacement_hook("uniform"))
    generator = torch.Generator().manual_seed(seed)
    with eval_mode(model):
        values = _content_values(model, content_ids)

        def score(hooks: list, kind: str) -> float:
            with model.hooks(fwd_hooks=hooks):
                _, cache = model.run_with_cache(tokens, names_filter=z, stop_at_layer=1, return_type=None)
            what = f"{z} ({kind})" if kind in ("none", "uniform_attention") else f"{z} ({kind}, {n_draws} draws)"
            return float(adjacency_scores_of_activations(cache[z].flatten(-2).cpu(), ("row_mean",),
                                                         what=what)["row_mean"].nanmean())

        out = {"none": score([], "none"), "uniform_attention": score([uniform], "uniform_attention")}
        neutral, both = [], []
        for _ in range(n_draws):
            hook = _neutral_delimiters_hook(*_draw_content(tokens, content_ids, generator), values)
            neutral.append(score([hook], "neutral_delimiters"))
            both.append(score([uniform, hook], "both"))
    out["neutral_delimiters"], out["both"] = sum(neutral) / n_draws, sum(both) / n_draws
    return {k: out[k] for k in INTERVENTIONS}


def diagnose(model: HookedTransformer, task: tasks_pkg.Task, tokens: Int[Tensor, "batch pos"],
             seed: int = 0) -> dict[str, Any]:
    """All diagnostics on ``tokens`` (``Int[Tensor, "batch pos"]``, batch >= 2, pos >= 3): ``l0_attention_entropy``,
    ``l0_min_head_entropy`` (the lowest of :func:`layer0_head_entropies`: one collapsed head that the mean over
    heads hides), ``l0_z_positional_share`` (at ``blocks.0.attn.hook_z``), ``digit_value_spread``,
    ``delimiter_value_norm_ratio``, ``digit_value_participation_ratio`` (:func:`value_geometry`), and, where
    :func:`layer0_interventions` applies (causal attention without a sliding window),
    ``l0_z_score_<intervention>`` for each of :data:`INTERVENTIONS` (content = the digits). Measured in eval
    mode (the model's mode is restored after). ``seed``: the seed of the interventions' random draws
    (:func:`layer0_interventions`), an integer in [0, 2**63); jobs seed it by the model's label
    (:func:`nope_interp.jobs.common.draw_seed`; paired models share one).

    ``tokens`` must be prompts of ``task`` (``task.analysis_tokens(n)``): the delimiter measurements
    (:func:`value_geometry`) come from the task's prompts, the others from ``tokens``, and the two must
    describe the same inputs. ``l0_z_positional_share`` is NaN where it is undefined (all-zero ``hook_z``:
    :func:`positional_share`).

    Raises:
        NopeInterpError: ``tokens`` that are not a 2-D integer tensor of ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`) or longer than ``n_ctx``; a row of ``tokens`` that is not
            a prompt of ``task``; ``task`` not a :class:`tasks.Task`; fewer than 2 prompts; a model with
            positional embeddings (:func:`value_geometry`), or whose parameters are not of ``model.cfg.dtype``
            (after ``model.half()``: convert with ``model.to(dtype)``); non-finite activations or weights;
            ``seed`` not an integer in [0, 2**63).

    Warns:
        DegenerateInputWarning: once, when an intervention leaves sequences with parallel vectors.
    """
    seed = check_int("seed", seed, 0, 2**63 - 1)  # a Python int: torch refuses numpy seeds
    _check_model_dtype(model, "diagnose")
    _check_task(task, "diagnose")
    tokens = _checked_tokens(model, tokens)
    if tokens.shape[0] < 2:   # before: reported by positional_share, a function the caller never called
        raise NopeInterpError(f"diagnose needs at least 2 prompts (the per-position mean of hook_z is taken over "
                              f"prompts), got tokens of shape {tuple(tokens.shape)}")
    _check_task_prompts(task, tokens, "diagnose")
    name = hook_name("z", 0)
    with torch.no_grad(), eval_mode(model):
        _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter=name, return_type=None)
    geo = value_geometry(model, task)
    rel = _layer0_relative_entropy(model, tokens)  # [batch, head, query >= 1]
    out = {"l0_attention_entropy": float(rel.mean()), "l0_min_head_entropy": float(rel.mean(dim=(0, 2)).min()),
           "l0_z_positional_share": positional_share(cache[name].flatten(-2).cpu()),
           "digit_value_spread": geo.digit_spread, "delimiter_value_norm_ratio": geo.delimiter_norm_ratio,
           "digit_value_participation_ratio": geo.digit_participation_ratio}
    if layer0_interventions_unsupported(model, tokens.shape[1]) is None:
        with degenerate_report("diagnose"):
            out.update({f"l0_z_score_{k}": v for k, v in layer0_interventions(model, tokens, seed=seed).items()})
    return out
