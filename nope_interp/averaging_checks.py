"""Measurements that could prove the averaging-effect explanation wrong (the model-holding part).

The pure math lives in :mod:`nope_interp.averaging`; this module runs a model and measures. For each
layer and head, from one cache: the exact ``hook_z = pattern @ v`` identity; the cosine matrix
predicted from the attention pattern alone (:func:`~nope_interp.averaging.attention_row_cosine`)
against the observed cosine matrix of ``hook_z`` (Spearman rank correlation, adjacency scores of both);
how uniform the attention is (entropy relative to uniform); how close the observed cosines are to the
closed form sqrt(i/k); and the per-position variance against the 1/k of Chi et al. ("Latent Positional
Information is in the Self-Attention Variance of Transformer Language Models Without Positional
Embeddings", ACL 2023). Then counterfactuals: one layer's pattern replaced by uniform, identity or
entropy-matched random attention, with the adjacency score at every site and the task accuracy. The
method is described in ``docs/method.md`` ("The averaging effect").
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp.analysis import analyze_model, protocol_prompts
from nope_interp.averaging import (
    PATTERN_KINDS,
    attention_row_cosine,
    attention_window,
    closed_form_uniform_cosine,
    pattern_weighted_values,
    per_position_variance,
    relative_entropy_to_uniform,
    sequence_spearmans,
    vector_spearman,
)
from nope_interp.checks import is_int
from nope_interp.config import check_int
from nope_interp.errors import NopeInterpError
from nope_interp.evaluate import exact_match_accuracy
from nope_interp.hooks import hook_name
from nope_interp.interventions import pattern_kind_unsupported, replaced_pattern
from nope_interp.model import check_model_for_task, evaluates
from nope_interp.similarity import adjacency_score, check_scorable, cosine_similarity_matrix, tie_equal_vectors
from tasks import DEFAULT_WINDOW


@dataclass(frozen=True)
class PredictedVsObserved:
    """The cosine matrix predicted from the attention pattern against the observed one (means over prompts).

    Attributes:
        spearman_pred_obs: Spearman rank correlation of the strictly-lower-triangle entries of the
            predicted and observed matrices, in [-1, 1] (prompts where either matrix is constant up to rounding
            are skipped, :func:`nope_interp.averaging.sequence_spearmans`; NaN if none is left).
        adjacency_predicted, adjacency_observed: adjacency score (row mean) of each matrix, in [0, 1].
    """

    spearman_pred_obs: float
    adjacency_predicted: float
    adjacency_observed: float

    def to_dict(self) -> dict[str, float]:
        """``{"spearman_pred_obs", "adjacency_predicted", "adjacency_observed"}``."""
        return {"spearman_pred_obs": self.spearman_pred_obs, "adjacency_predicted": self.adjacency_predicted,
                "adjacency_observed": self.adjacency_observed}


@dataclass(frozen=True)
class LayerAveraging:
    """The averaging-effect measurements of one attention layer.

    Attributes:
        layer: 0-based layer.
        z_identity_max_abs_err: max |pattern @ v - hook_z| (float32 round-off, about 1e-7).
        heads_concat: :class:`PredictedVsObserved` of ``hook_z`` with heads concatenated (prediction:
            the heads' row Gram matrices summed, i.e. equal-variance heads).
        heads: one :class:`PredictedVsObserved` per head.
        relative_entropy: attention-row entropy over the entropy of uniform attention, mean over rows
            >= 1, heads and prompts (1 = uniform, 0 = one-hot).
        relative_entropy_by_row: the same per query row 1..pos-1 (mean over heads and prompts).
        closed_form_mae: mean |cos - sqrt(i/k)| over the lower triangle of the heads-concatenated
            ``hook_z`` cosine matrices.
        variance_ratio: per-position variance of the heads-concatenated ``hook_z`` divided by position
            0's, mean over prompts (one value per position).
        variance_vs_1_over_k_spearman, variance_vs_1_over_k_mae: ``variance_ratio`` against 1/k
            (1-based k): Spearman rank correlation and mean absolute difference.
    """

    layer: int
    z_identity_max_abs_err: float
    heads_concat: PredictedVsObserved
    heads: tuple[PredictedVsObserved, ...]
    relative_entropy: float
    relative_entropy_by_row: tuple[float, ...]
    closed_form_mae: float
    variance_ratio: tuple[float, ...]
    variance_vs_1_over_k_spearman: float
    variance_vs_1_over_k_mae: float

    @property
    def site(self) -> str:
        """The hook whose cosines are measured: ``blocks.<layer>.attn.hook_z``."""
        return hook_name("z", self.layer)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values with the attribute names as keys (tuples become lists; NaN where undefined)."""
        return {
            "layer": self.layer,
            "z_identity_max_abs_err": self.z_identity_max_abs_err,
            "heads_concat": self.heads_concat.to_dict(),
            "heads": [h.to_dict() for h in self.heads],
            "relative_entropy": self.relative_entropy,
            "relative_entropy_by_row": list(self.relative_entropy_by_row),
            "closed_form_mae": self.closed_form_mae,
            "variance_ratio": list(self.variance_ratio),
            "variance_vs_1_over_k_spearman": self.variance_vs_1_over_k_spearman,
            "variance_vs_1_over_k_mae": self.variance_vs_1_over_k_mae,
        }


@dataclass(frozen=True)
class AveragingReport:
    """Per-layer averaging-effect measurements of one model on one task.

    Attributes:
        task: task name. n_prompts: prompts measured. n_pos: tokens per prompt.
        layers: one :class:`LayerAveraging` per layer, in order.
        protocol: the input protocol the prompts were built with (``tasks.PROTOCOLS``).
    """

    task: str
    n_prompts: int
    n_pos: int
    layers: tuple[LayerAveraging, ...]
    protocol: str = "full"

    def to_dict(self) -> dict[str, Any]:
        """``{"task", "protocol", "n_prompts", "n_pos", "layers": [...]}``."""
        return {"task": self.task, "protocol": self.protocol, "n_prompts": self.n_prompts, "n_pos": self.n_pos,
                "layers": [lay.to_dict() for lay in self.layers]}


@dataclass(frozen=True)
class Condition:
    """One attention condition of a counterfactual: ``"clean"`` or a replacement kind.

    Attributes:
        kind: ``"clean"`` or one of :data:`~nope_interp.averaging.PATTERN_KINDS`.
        scores: adjacency score (row mean, mean over prompts, in [0, 1]) by full hook name, in forward order.
        exact_match: greedy exact match on the evaluation examples in [0, 1], or None if none were given.
    """

    kind: str
    scores: Mapping[str, float]
    exact_match: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{"scores": {hook: score}, "exact_match"}``."""
        return {"scores": dict(self.scores), "exact_match": self.exact_match}


@dataclass(frozen=True)
class CounterfactualReport:
    """Adjacency scores (and accuracy) with one layer's attention pattern left alone or replaced.

    Attributes:
        task: task name. layer: the layer whose pattern is replaced. n_prompts: prompts per condition.
        conditions: ``"clean"`` first, then one :class:`Condition` per replacement kind.
        protocol: the input protocol of the scored prompts (``tasks.PROTOCOLS``; exact match is always on
            the evaluation examples' own prompts).
        eval_prefix: the text read before every evaluation example's prompt for exact match (``"\\n"`` for a
            model trained on packed windows).
        n_eval: the evaluation examples each exact match is over (None when none was measured).
        pattern_seed: the seed of the random replacement patterns; None when no random kind
            (``random_matched``) was measured.
    """

    task: str
    layer: int
    n_prompts: int
    conditions: tuple[Condition, ...]
    protocol: str = "full"
    eval_prefix: str = ""
    n_eval: int | None = None
    pattern_seed: int | None = None

    def condition(self, kind: str) -> Condition:
        """The condition ``kind``.

        Raises:
            NopeInterpError: no condition of that kind was measured.
        """
        for c in self.conditions:
            if c.kind == kind:
                return c
        raise NopeInterpError(f"no condition {kind!r}; measured: {', '.join(c.kind for c in self.conditions)}")

    def to_dict(self) -> dict[str, Any]:
        """``{"task", "protocol", "layer", "n_prompts", "conditions": {kind: {"scores", "exact_match"}},
        "eval_prefix", "n_eval", "pattern_seed"}``."""
        return {"task": self.task, "protocol": self.protocol, "layer": self.layer, "n_prompts": self.n_prompts,
                "conditions": {c.kind: c.to_dict() for c in self.conditions}, "eval_prefix": self.eval_prefix,
                "n_eval": self.n_eval, "pattern_seed": self.pattern_seed}


@dataclass(frozen=True)
class CosineExample:
    """Predicted and observed cosine matrices of one layer on one prompt (for a figure).

    Attributes:
        task: task name. prompt: the prompt (one token per character). layer: 0-based layer.
        predicted: Float[Tensor, "pos pos"], cosine of the attention rows (heads summed), float64, in [-1, 1].
        observed: Float[Tensor, "pos pos"], cosine matrix of the heads-concatenated ``hook_z``.
        protocol: the input protocol the prompt was built with (``tasks.PROTOCOLS``).
    """

    task: str
    prompt: str
    layer: int
    predicted: Float[Tensor, "pos pos"]
    observed: Float[Tensor, "pos pos"]
    protocol: str = "full"


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def _heads_summed_cosine(pattern: Float[Tensor, "*batch n_heads query_pos key_pos"],
                         ) -> Float[Tensor, "*batch query_pos query_pos"]:
    """E<y_i, y_k> = sum_h <A_h[i], A_h[k]> for heads with equal-variance i.i.d. values, as a cosine."""
    a = pattern.double()
    spec = "bhqk,bhpk->bqp" if a.ndim == 4 else "hqk,hpk->qp"
    gram = torch.einsum(spec, a, a)
    d = gram.diagonal(dim1=-2, dim2=-1).sqrt()
    cos = (gram / (d.unsqueeze(-1) * d.unsqueeze(-2))).clamp(-1, 1)
    rows = a.movedim(-3, -2).flatten(-2)  # each query's rows of all heads, side by side
    return tie_equal_vectors(cos, rows)  # equal rows (collapsed attention) get exactly equal cosines


def _predicted_vs_observed(pattern: Tensor, z: Tensor) -> PredictedVsObserved:
    """pattern: batch q k (or batch head q k, summed over heads); z: batch q d. Means over sequences."""
    pred = _heads_summed_cosine(pattern) if pattern.ndim == 4 else attention_row_cosine(pattern)
    obs = cosine_similarity_matrix(z)
    # constant matrices (rounding noise) left out of the correlation and of both scores: one set of sequences
    rho, bad_pred, bad_obs = sequence_spearmans(pred, obs, pattern.dtype, z.dtype)
    bad = bad_pred | bad_obs
    predicted = adjacency_score(pred).masked_fill(bad, float("nan"))
    observed = adjacency_score(obs).masked_fill(bad, float("nan"))
    return PredictedVsObserved(spearman_pred_obs=_mean(rho), adjacency_predicted=float(predicted.nanmean()),
                               adjacency_observed=float(observed.nanmean()))


def _check_z_scorable(z: Tensor, layer: int, head: int | None = None) -> None:
    """Refuse ``hook_z`` (``batch pos n_heads d_head``) of ``layer`` whose vectors, heads concatenated or of one head
    (every head, or only ``head``), have NaN/inf entries or are near zero: their cosines are undefined
    (:func:`~nope_interp.similarity.check_scorable`; the message names the site and the head)."""
    site = hook_name("z", layer)
    check_scorable(z.flatten(-2), what=f"activations at {site}")
    for h in range(z.shape[-2]) if head is None else (head,):
        check_scorable(z[..., h, :], what=f"activations at {site} (head {h})")


@evaluates
@torch.no_grad()
def averaging_report(
    model: HookedTransformer, task: tasks_pkg.Task, n_prompts: int = 64, seed: int = 1,
    exclude: frozenset[str] = frozenset(), protocol: str = "full", window: int = DEFAULT_WINDOW,
) -> AveragingReport:
    """Per-layer (and per-head) averaging-effect measurements on held-out inputs of ``task``.

    Args:
        model: the model (any attention direction; the entropy is relative to the allowed keys).
        task: the task whose inputs are measured
            (:func:`~nope_interp.analysis.protocol_prompts` ``(n_prompts, seed, exclude, protocol, window)``).
        n_prompts: prompts (one forward pass over all of them).
        seed: seed of the prompt sampler. exclude: prompts not to use (e.g. training prompts).
        protocol: ``full`` (full-length prompts, default), ``authors`` (fixed-length lines left-padded with
            newlines) or ``window`` (``window`` characters of concatenated lines); see ``docs/method.md``.

    Returns:
        An :class:`AveragingReport` (fields documented in :class:`LayerAveraging`).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; prompts shorter than 3 tokens (no rank
            correlation); NaN or inf entries or near-zero vectors in a layer's ``hook_z``, heads concatenated or of
            one head (their cosines are undefined; the message names the site and the head); too many
            prompts asked; an unknown protocol or a bad ``window``; a model that cannot read the task's inputs
            (:func:`nope_interp.model.check_model_for_task`: a string for ``task``, ``n_ctx`` or ``d_vocab``
            too small, ``model.half()``); ``n_prompts`` not an integer >= 1.
    """
    check_model_for_task(model, task, None, "averaging_report")  # n_ctx: checked for the protocol's inputs
    n_prompts = check_int("n_prompts", n_prompts, 1, 10**7)
    tokens = task.prompt_tokens(protocol_prompts(model, task, n_prompts, seed, exclude, protocol, window))
    tokens = tokens.to(model.cfg.device)
    n_layers = model.cfg.n_layers
    names = {hook_name(p, layer) for layer in range(n_layers) for p in ("pattern", "z", "v")}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_type=None)
    n_pos = tokens.shape[1]
    causal = model.cfg.attention_dir == "causal"
    closed = closed_form_uniform_cosine(n_pos)
    low = torch.tril_indices(n_pos, n_pos, offset=-1)
    inv_k = 1.0 / torch.arange(1, n_pos + 1, dtype=torch.float64)
    layers = []
    for layer in range(n_layers):
        pattern = cache[hook_name("pattern", layer)].cpu()
        z = cache[hook_name("z", layer)].cpu()
        v = cache[hook_name("v", layer)].cpu()
        z_cat = z.flatten(-2)
        _check_z_scorable(z, layer)
        obs_cat = cosine_similarity_matrix(z_cat)
        var = per_position_variance(z_cat)
        var_ratio = (var / var[:, :1]).mean(0)
        rel_entropy = relative_entropy_to_uniform(pattern, causal, attention_window(model.cfg, layer))[..., 1:]
        layers.append(LayerAveraging(
            layer=layer,
            z_identity_max_abs_err=float((pattern_weighted_values(pattern, v) - z).abs().max()),
            heads_concat=_predicted_vs_observed(pattern, z_cat),
            heads=tuple(_predicted_vs_observed(pattern[:, h], z[:, :, h]) for h in range(pattern.shape[1])),
            relative_entropy=float(rel_entropy.mean()),
            relative_entropy_by_row=tuple(rel_entropy.mean((0, 1)).tolist()),
            closed_form_mae=float((obs_cat[:, low[0], low[1]] - closed[low[0], low[1]]).abs().mean()),
            variance_ratio=tuple(var_ratio.tolist()),
            variance_vs_1_over_k_spearman=vector_spearman(var_ratio, inv_k),
            variance_vs_1_over_k_mae=float((var_ratio - inv_k).abs().mean()),
        ))
    return AveragingReport(task=task.name, n_prompts=tokens.shape[0], n_pos=n_pos, layers=tuple(layers),
                           protocol=protocol)


@evaluates
def counterfactual_report(
    model: HookedTransformer, task: tasks_pkg.Task, layer: int = 0, kinds: Sequence[str] = PATTERN_KINDS,
    n_prompts: int = 64, seed: int = 1, eval_examples: Sequence[tasks_pkg.Example] | None = None,
    exclude: frozenset[str] = frozenset(), protocol: str = "full", window: int = DEFAULT_WINDOW,
    prefix: str = "", pattern_seed: int | None = None,
) -> CounterfactualReport:
    """Adjacency scores at every site (and exact match) with layer ``layer``'s attention pattern left
    alone (``"clean"``) or replaced by each of ``kinds`` (:func:`nope_interp.interventions.replaced_pattern`).

    Args:
        model: the model; its hooks are removed again even if a condition raises.
        task: the task analysed (:func:`~nope_interp.analysis.analyze_model` on ``n_prompts`` inputs of
            ``protocol``, default hook sites).
        layer: the layer whose ``hook_pattern`` is replaced. kinds: replacement kinds (``PATTERN_KINDS``).
        seed: seed of the prompts (and of the random replacement when ``pattern_seed`` is None).
        pattern_seed: seed of the random replacement patterns, an integer in [0, 2**63); None: ``seed``. Give
            each model its own (e.g. :func:`nope_interp.jobs.common.draw_seed` of its label) when a statistic
            over models should also vary over the draw.
        eval_examples: if given (not None), greedy exact match on them under each condition (an empty sequence
            is refused); else ``exact_match`` is None.
        protocol, window: the input protocol of the scored prompts (as :func:`averaging_report`); exact match
            reads the examples' own full prompts.
        prefix: text read before every example's prompt for exact match (``"\\n"`` for a model trained on
            packed windows: :func:`nope_interp.evaluate.predict`).

    Returns:
        A :class:`CounterfactualReport` with ``"clean"`` first, then ``kinds`` in order.

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; ``kinds`` a single string (not a list), naming an
            unknown kind or one kind twice (checked before any work); a layer out of range; a kind
            that does not apply to the layer's attention (:func:`~nope_interp.interventions.pattern_kind_unsupported`:
            ``uniform`` or ``random_matched`` on bidirectional or sliding-window attention); a
            model that cannot read the task's inputs (:func:`nope_interp.model.check_model_for_task`); an
            unknown protocol or a bad ``window``; ``prefix`` not a string; ``seed`` not an integer in
            [0, 2**63), ``pattern_seed`` not None nor one.
    """
    check_model_for_task(model, task, None, "counterfactual_report")  # n_ctx: checked for the protocol's inputs
    if not isinstance(prefix, str):
        raise NopeInterpError(f"counterfactual_report: prefix must be a string, got {type(prefix).__name__}")
    seed = check_int("seed", seed, 0, 2**63 - 1)  # a Python int: torch refuses numpy seeds
    if pattern_seed is not None:
        pattern_seed = check_int("pattern_seed", pattern_seed, 0, 2**63 - 1)
    pattern_seed = seed if pattern_seed is None else pattern_seed
    # numpy integers (np.arange) as the Python ints the analysis takes; their values are checked where used
    layer, n_prompts, window = (int(v) if is_int(v) else v for v in (layer, n_prompts, window))
    if isinstance(kinds, (str, bytes)) or not isinstance(kinds, Sequence):  # a str would be read letter by letter
        raise NopeInterpError(f"counterfactual_report: kinds must be a list of pattern kinds (e.g. [{kinds!r}]), got "
                              f"{type(kinds).__name__} {kinds!r}; allowed: {', '.join(PATTERN_KINDS)}"[:300])
    for kind in kinds:
        if not isinstance(kind, str) or kind not in PATTERN_KINDS:
            raise NopeInterpError(f"counterfactual_report: unknown pattern kind {kind!r} in kinds; allowed: "
                                  f"{', '.join(PATTERN_KINDS)}"[:300])
    twice = sorted({k for k in kinds if list(kinds).count(k) > 1})
    if twice:  # two identical conditions, and to_dict would keep one
        raise NopeInterpError(f"counterfactual_report: kinds names {', '.join(map(repr, twice))} more than once")
    for kind in kinds:  # before any work: a causal replacement on a bidirectional or sliding-window layer
        why = pattern_kind_unsupported(model, layer, kind) if kind in PATTERN_KINDS else None
        if why is not None:
            raise NopeInterpError(f"counterfactual_report: pattern kind {kind!r} does not apply to layer {layer}: "
                                  f"{why} (leave it out of kinds)")
    conditions = []
    for kind in ("clean", *kinds):
        if kind == "clean":
            res = analyze_model(model, task, n_prompts, seed, exclude=exclude, protocol=protocol, window=window)
            acc = None if eval_examples is None else exact_match_accuracy(model, task, eval_examples, prefix=prefix)
        else:
            with replaced_pattern(model, layer, kind, seed=pattern_seed):
                res = analyze_model(model, task, n_prompts, seed, exclude=exclude, protocol=protocol, window=window)
                acc = None if eval_examples is None else exact_match_accuracy(model, task, eval_examples, prefix=prefix)
        conditions.append(Condition(kind=kind, scores={s: v["mean"] for s, v in res.scores["row_mean"].items()},
                                    exact_match=acc))
    return CounterfactualReport(task=task.name, layer=layer, n_prompts=n_prompts, conditions=tuple(conditions),
                                protocol=protocol, eval_prefix=prefix,
                                n_eval=None if eval_examples is None else len(eval_examples),
                                pattern_seed=pattern_seed if "random_matched" in kinds else None)


@evaluates
@torch.no_grad()
def cosine_example(model: HookedTransformer, task: tasks_pkg.Task, layer: int = 0, seed: int = 1,
                   protocol: str = "full", window: int = DEFAULT_WINDOW,
                   exclude: frozenset[str] = frozenset()) -> CosineExample:
    """The predicted (from the attention pattern, heads summed, i.i.d. values) and the observed cosine
    matrix of ``hook_z`` at ``layer`` on one input of ``protocol``
    (:func:`~nope_interp.analysis.protocol_prompts` ``(1, seed, exclude)``: a full-length prompt by default;
    ``exclude``: prompts not to use, e.g. a trained model's training prompts).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; ``layer`` out of range; a model that cannot
            read the task's inputs (:func:`nope_interp.model.check_model_for_task`); an unknown protocol or a
            bad ``window``; NaN or inf entries or near-zero vectors in the layer's ``hook_z`` (their cosines are
            undefined; the message names the site).
    """
    check_model_for_task(model, task, None, "cosine_example")  # n_ctx: checked for the protocol's inputs
    prompt = protocol_prompts(model, task, 1, seed, exclude, protocol, window)[0]
    names = {hook_name("pattern", layer, model.cfg.n_layers), hook_name("z", layer)}
    tokens = task.prompt_tokens([prompt]).to(model.cfg.device)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_type=None)
    pred = _heads_summed_cosine(cache[hook_name("pattern", layer)][0].cpu())
    z = cache[hook_name("z", layer)][0].cpu()
    check_scorable(z.flatten(-2), what=f"activations at {hook_name('z', layer)}")  # else an all-NaN observed matrix
    obs = cosine_similarity_matrix(z.flatten(-2))
    return CosineExample(task=task.name, prompt=prompt, layer=layer, predicted=pred, observed=obs, protocol=protocol)
