"""Measurements that could prove the averaging-effect explanation wrong (model-holding code).

For each layer and head, from one cache: the exact ``hook_z = pattern @ v`` identity; the cosine
matrix predicted from the attention pattern alone (:func:`~nope_interp.averaging.attention_row_cosine`)
against the observed cosine matrix of ``hook_z`` (Spearman rank correlation, adjacency scores of
both); how uniform the attention is (entropy relative to uniform); how close the observed cosines are
to the closed form sqrt(i/k); and the per-position variance against Chi et al.'s 1/k. Then
counterfactuals: the first layer's pattern replaced by uniform, identity or entropy-matched random
attention, with the adjacency score at every later site and the task accuracy.
"""

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp.analysis import analyze_model
from nope_interp.averaging import (
    PATTERN_KINDS,
    attention_row_cosine,
    closed_form_uniform_cosine,
    lower_triangle_spearman,
    pattern_weighted_values,
    per_position_variance,
    relative_entropy_to_uniform,
    vector_spearman,
)
from nope_interp.evaluate import exact_match_accuracy
from nope_interp.hooks import hook_name
from nope_interp.interventions import replaced_pattern
from nope_interp.similarity import adjacency_score, cosine_similarity_matrix


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def _predicted_vs_observed(pattern: torch.Tensor, z: torch.Tensor) -> dict[str, float]:
    """pattern: batch q k (or batch head q k, summed over heads); z: batch q d. Means over sequences."""
    if pattern.ndim == 4:  # heads concatenated: E<y_i, y_k> = sum_h <A_h[i], A_h[k]> for equal-variance heads
        gram = torch.einsum("bhqk,bhpk->bqp", pattern.double(), pattern.double())
        d = gram.diagonal(dim1=-2, dim2=-1).sqrt()
        pred = (gram / (d.unsqueeze(-1) * d.unsqueeze(-2))).clamp(-1, 1)
    else:
        pred = attention_row_cosine(pattern)
    obs = cosine_similarity_matrix(z)
    rho = [lower_triangle_spearman(pred[b], obs[b]) for b in range(pred.shape[0])]
    return {"spearman_pred_obs": _mean(rho), "adjacency_predicted": float(adjacency_score(pred).mean()),
            "adjacency_observed": float(adjacency_score(obs).mean())}


@torch.no_grad()
def averaging_report(
    model: HookedTransformer, task: tasks_pkg.Task, n_prompts: int = 64, seed: int = 1,
    exclude: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Per-layer (and per-head) averaging-effect measurements on full-length prompts of ``task``.

    Returns a JSON-ready dict: ``layers[L]`` with ``z_identity_max_abs_err`` (float32 round-off, ~1e-7),
    ``heads_concat`` and ``heads[h]`` (``spearman_pred_obs`` in [-1, 1], ``adjacency_predicted``,
    ``adjacency_observed`` in [0, 1]), ``relative_entropy`` (mean over rows >= 1, heads and prompts;
    1 = uniform), ``closed_form_mae`` (mean |cos - sqrt(i/k)| over the lower triangle of the
    heads-concatenated ``hook_z``), ``variance_ratio`` (per-position variance of ``hook_z`` divided by
    position 0's, averaged over prompts) with ``variance_vs_1_over_k_spearman`` and
    ``variance_vs_1_over_k_mae`` (1-based k).
    """
    prompts = task.analysis_prompts(n_prompts, seed, exclude)
    tokens = task.prompt_tokens(prompts).to(model.cfg.device)
    n_layers = model.cfg.n_layers
    names = {hook_name(p, layer) for layer in range(n_layers) for p in ("pattern", "z")}
    names |= {f"blocks.{layer}.attn.hook_v" for layer in range(n_layers)}
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
        v = cache[f"blocks.{layer}.attn.hook_v"].cpu()
        z_cat = z.flatten(-2)
        obs_cat = cosine_similarity_matrix(z_cat)
        var = per_position_variance(z_cat)
        var_ratio = (var / var[:, :1]).mean(0)
        layers.append({
            "layer": layer,
            "z_identity_max_abs_err": float((pattern_weighted_values(pattern, v) - z).abs().max()),
            "heads_concat": _predicted_vs_observed(pattern, z_cat),
            "heads": [_predicted_vs_observed(pattern[:, h], z[:, :, h]) for h in range(pattern.shape[1])],
            "relative_entropy": float(relative_entropy_to_uniform(pattern, causal)[..., 1:].mean()),
            "relative_entropy_by_row": relative_entropy_to_uniform(pattern, causal)[..., 1:].mean((0, 1)).tolist(),
            "closed_form_mae": float((obs_cat[:, low[0], low[1]] - closed[low[0], low[1]]).abs().mean()),
            "variance_ratio": var_ratio.tolist(),
            "variance_vs_1_over_k_spearman": vector_spearman(var_ratio, inv_k),
            "variance_vs_1_over_k_mae": float((var_ratio - inv_k).abs().mean()),
        })
    return {"task": task.name, "n_prompts": len(prompts), "n_pos": n_pos, "layers": layers}


def counterfactual_report(
    model: HookedTransformer, task: tasks_pkg.Task, layer: int = 0, kinds: Sequence[str] = PATTERN_KINDS,
    n_prompts: int = 64, seed: int = 1, eval_examples: Sequence[tasks_pkg.Example] | None = None,
    exclude: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Adjacency scores (row mean) at every site, and exact match if ``eval_examples`` is given, with
    layer ``layer``'s attention pattern left alone (``"clean"``) or replaced by each of ``kinds``."""
    out: dict[str, Any] = {"task": task.name, "layer": layer, "n_prompts": n_prompts, "conditions": {}}
    for kind in ("clean", *kinds):
        if kind == "clean":
            res = analyze_model(model, task, n_prompts, seed, exclude=exclude)
            acc = exact_match_accuracy(model, task, eval_examples) if eval_examples else None
        else:
            with replaced_pattern(model, layer, kind, seed=seed):
                res = analyze_model(model, task, n_prompts, seed, exclude=exclude)
                acc = exact_match_accuracy(model, task, eval_examples) if eval_examples else None
        out["conditions"][kind] = {"scores": {s: v["mean"] for s, v in res.scores["row_mean"].items()},
                                   "exact_match": acc}
    return out
