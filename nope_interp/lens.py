"""Notebook API: analyses of a TransformerLens ``ActivationCache``, returning objects that display themselves.

Run any ``HookedTransformer`` with ``run_with_cache`` and pass the cache:

>>> _, cache = model.run_with_cache(tokens)                    # doctest: +SKIP
>>> scores = adjacency_scores(cache)    # every cached site of width d_model; a table in Jupyter
>>> scores.figure()                     # Plotly: score by site, mean ± std over sequences
>>> cosine_heatmap(cache, "blocks.0.attn.hook_z").figure()
>>> averaging_check(cache, layer=0)     # needs hook_pattern and hook_z of that layer in the cache
>>> lag_profile(cache).figure()         # mean cosine by distance, with the idealised uniform-causal curve

Each result is a frozen dataclass with ``to_dict()``, a text ``repr``, an HTML table in Jupyter
(``_repr_html_``) and ``figure()``. The method is described in ``docs/method.md``.
"""

import contextvars
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import ActivationCache

from nope_interp.averaging import attention_window, check_pattern, relative_entropy_to_uniform, sequence_spearmans
from nope_interp.checks import is_int
from nope_interp.config import check_int
from nope_interp.errors import DegenerateInputWarning, NopeInterpError, NopeInterpWarning, user_stacklevel
from nope_interp.hooks import hook_name, short_label
from nope_interp.plotting import html_table, plot_adjacency_by_layer, plot_cosine_heatmaps, plot_lag_profile
from nope_interp.similarity import (
    REDUCTIONS,
    adjacency_score,
    adjacency_score_of_activations,
    check_finite,
    check_scorable,
    check_tensor,
    cosine_similarity_matrix,
    degenerate_report,
    lag_summary,
    summarize,
    tie_equal_vectors,
    uniform_causal_lag_profile,
)
from nope_interp.similarity import lag_profile as _lag_profile
from nope_interp.stats import fmt_mean_std

T = TypeVar("T")

#: Hook-name endings of the cached activations that are vectors per position (scored by default).
VECTOR_SITES = ("hook_embed", "hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_z",
                "hook_attn_out", "hook_mlp_out")


#: Hook-name endings of attention weights, ``(batch, head, query, key)``: not one vector per position.
ATTENTION_SITES = ("hook_pattern", "hook_attn_scores")
#: Hook-name endings of activations with a heads axis after the positions, ``(batch, pos, head, d)``: their
#: heads are concatenated into one vector per position (``hook_z`` as the authors analysed it).
HEAD_SITES = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_rot_q", "hook_rot_k", "hook_q_input",
              "hook_k_input", "hook_v_input", "hook_scale", "hook_normalized")


def _check_cache(cache: object, fn: str) -> None:
    if not isinstance(cache, ActivationCache):
        hint = " (run_with_cache returns (logits, cache): pass the cache)" if isinstance(cache, tuple) else ""
        raise NopeInterpError(f"{fn}: cache must be a transformer_lens ActivationCache (from "
                              f"model.run_with_cache(tokens)), got a {type(cache).__name__}{hint}")
    meta = [name for name, t in cache.cache_dict.items() if isinstance(t, Tensor) and t.is_meta]
    if meta:
        raise NopeInterpError(f"{fn}: the cache holds meta-device tensors (shapes without values) at {meta[0]}"
                              f"{' and more' if len(meta) > 1 else ''}: run a model with real weights")
    if _CALLS.get() == 1:  # once per call of a public function, not again in the ones it calls
        p = active_dropout(getattr(cache, "model", None))
        if p > 0:
            warnings.warn(NopeInterpWarning(
                f"{fn}: the cache's model is in training mode with dropout {p:g}: if it was when the cache was made, "
                "its activations carry one random dropout mask and the scores are of that draw; call model.eval() "
                "before model.run_with_cache (the analysis functions, e.g. analyze_tokens, measure in eval mode)"),
                stacklevel=user_stacklevel())


#: How deep the current thread is in this module's public functions that take a cache (:func:`_counted`).
_CALLS: contextvars.ContextVar[int] = contextvars.ContextVar("nope_interp_lens_calls", default=0)


def _counted(fn: Callable[..., T]) -> Callable[..., T]:
    """Count the calls of a public function that takes a cache, so that :func:`_check_cache` warns once per
    call of the user's, not again in the public functions it calls."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        token = _CALLS.set(_CALLS.get() + 1)
        try:
            return fn(*args, **kwargs)
        finally:
            _CALLS.reset(token)

    return wrapper


#: Float attributes through which a module applies dropout by a function call rather than a ``Dropout``
#: module (a Hugging Face Llama or Mistral attention's ``attention_dropout``).
_DROPOUT_ATTRIBUTES = ("attention_dropout", "dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop")


def active_dropout(model: object) -> float:
    """The largest dropout probability that acts in ``model`` now, in [0, 1]: 0 in eval mode or without
    dropout; else the largest of this toolkit's dropout (``model.nope_dropout``,
    :func:`~nope_interp.model.build_model`), a ``torch.nn.Dropout`` module's ``p`` and a float dropout attribute
    (:data:`_DROPOUT_ATTRIBUTES`, a Hugging Face attention's) of a submodule in training mode. 0 for anything
    that is not a ``torch.nn.Module``.

    Raises:
        Nothing: any object is accepted."""
    if not isinstance(model, torch.nn.Module) or not model.training:
        return 0.0
    ps = [float(getattr(model, "nope_dropout", 0.0) or 0.0)]
    for m in model.modules():
        if not m.training:
            continue
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            ps.append(float(m.p))
        ps += [float(v) for v in (getattr(m, a, None) for a in _DROPOUT_ATTRIBUTES)
               if isinstance(v, float) and 0 < v < 1]
    return max(ps)


def _entry(cache: ActivationCache, name: str, fn: str) -> Tensor:
    """``cache[name]``, refused by name unless it is a real floating tensor (a hand-built cache may hold numpy
    arrays or lists), and detached: the results and their figures never hold an autograd graph."""
    a = cache[name]
    check_tensor(a, f"the cache entry {name!r}", "(batch, pos, ...)", fn=fn)
    return a.detach()


@_counted
def site_activations(cache: ActivationCache, site: str) -> Float[Tensor, "batch pos d"]:
    """The activations of ``site`` as ``(batch, pos, d)``: vector sites ``(batch, pos, d)`` as they are;
    sites with heads after the positions, ``(batch, pos, head, d_head)`` (``hook_z``, ``hook_q``, ``hook_k``,
    ``hook_v``, ...: :data:`HEAD_SITES`), flattened with the heads concatenated. A cache of a single unbatched
    prompt gets a batch axis of 1.

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``; ``site`` not a string or not in the cache (the
            message lists what is); an attention site (``hook_pattern``, ``hook_attn_scores``: ``(batch, head,
            query, key)``, no vector per position); any other shape than ``(batch, pos, d)`` or, for
            :data:`HEAD_SITES`, ``(batch, pos, head, d_head)`` (the message names the hook and its shape); an
            empty batch or an axis of size 0; an entry that is not a real floating torch tensor (a numpy
            array or list in a hand-built cache).

    Returns:
        The activations, detached from any autograd graph.
    """
    _check_cache(cache, "site_activations")
    if not isinstance(site, str):
        raise NopeInterpError(f"site must be a hook name (a string), got {type(site).__name__} {site!r}"[:200])
    if site not in cache.cache_dict:
        raise NopeInterpError(f"hook {site!r} is not in the cache; cached: {', '.join(cache.cache_dict)}")
    a = _entry(cache, site, "site_activations")
    last = site.rsplit(".", 1)[-1]
    if last in ATTENTION_SITES:
        raise NopeInterpError(
            f"hook {site!r} holds attention weights of shape {tuple(a.shape)} (batch, head, query, key), not one "
            f"vector per position; score a vector site (e.g. {site.rsplit('.', 1)[0] + '.' if '.' in site else ''}"
            "hook_z) or compare the pattern with averaging_check(cache, layer)")
    if not cache.has_batch_dim:
        a = a.unsqueeze(0)
    if 0 in a.shape:
        raise NopeInterpError(f"hook {site!r} has shape {tuple(cache[site].shape)}: an empty batch or no positions "
                              "(run the model on at least one sequence)")
    if a.ndim == 4 and last in HEAD_SITES:
        a = a.reshape(a.shape[0], a.shape[1], -1)
    if a.ndim != 3:
        heads = f" or, for {', '.join(HEAD_SITES)}, (batch, pos, head, d_head)"
        raise NopeInterpError(f"hook {site!r} has shape {tuple(cache[site].shape)}; expected (batch, pos, d){heads}")
    return a


@_counted
def cached_vector_sites(cache: ActivationCache) -> list[str]:
    """The cached hook names that end in one of :data:`VECTOR_SITES`, in cache (forward) order.

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``.
    """
    _check_cache(cache, "cached_vector_sites")
    return [k for k in cache.cache_dict if k.endswith(VECTOR_SITES)]


def _scored(site: object, sites: tuple[str, ...], done: str) -> str:
    """``site`` if it is one of ``sites`` (the hook names a result holds), else a one-line NopeInterpError naming it
    and the allowed ones (a list or other unhashable value included: no TypeError)."""
    if not isinstance(site, str) or site not in sites:
        raise NopeInterpError(f"site {site!r} was not {done}; {done}: {', '.join(sites)}"[:500])
    return site


@dataclass(frozen=True)
class SiteScores:
    """Adjacency scores of every scored site of a cache.

    Attributes:
        reduction: one of :data:`~nope_interp.similarity.REDUCTIONS` (``row_mean``, ``pooled``,
            ``pooled_rounded``). sites: full hook names in forward order.
        per_sequence: ``{site: Float[Tensor, "batch"]}`` scores in [0, 1] (0.5 = chance, 1 = perfect).
        n_pos: sequence length.
    """

    reduction: str
    sites: tuple[str, ...]
    per_sequence: dict[str, Tensor]
    n_pos: int

    def summary(self, site: str) -> dict[str, float]:
        """``{"mean", "std", "n"}`` over sequences at ``site`` (one of :attr:`sites`).

        Raises:
            NopeInterpError: a site that was not scored (the message lists the scored ones).
        """
        return summarize(self.per_sequence[_scored(site, self.sites, "scored")]).to_dict()

    def to_dict(self) -> dict[str, Any]:
        """``{"reduction", "n_pos", "scores": {site: {"mean", "std", "n"}}}``."""
        return {"reduction": self.reduction, "n_pos": self.n_pos,
                "scores": {s: self.summary(s) for s in self.sites}}

    def _text(self, site: str) -> str:
        """``mean ± std`` at ``site``, the mean alone over one sequence (its spread is undefined, not 0)."""
        st = self.summary(site)
        return fmt_mean_std(st["mean"], st["std"], st["n"])

    def __repr__(self) -> str:
        lines = [f"adjacency score ({self.reduction}, {self.n_pos} positions), mean ± std over sequences:"]
        lines += [f"  {s:28s} {self._text(s)}" for s in self.sites]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = [[s, f"{self.summary(s)['mean']:.3f}",
                 "n/a" if self.summary(s)["n"] == 1 else f"{self.summary(s)['std']:.3f}", str(self.summary(s)["n"])]
                for s in self.sites]
        return html_table(f"Adjacency score ({self.reduction}; 0.5 = chance, 1 = nearer is always more similar)",
                      ["site", "mean", "std", "sequences"], rows)

    def figure(self, title: str = "Adjacency score by site") -> go.Figure:
        """Score by site, mean ± std over sequences, with the chance line at 0.5."""
        panel = {f"{self.reduction}, mean ± std over sequences": {s: self.summary(s) for s in self.sites}}
        return plot_adjacency_by_layer({f"{self.n_pos} positions": panel}, title)


def _sites(cache: object, sites: object, fn: str) -> list[str]:
    """The sites to score: ``sites`` as a list (default: every cached vector site), checked."""
    _check_cache(cache, fn)
    if isinstance(sites, str):
        raise NopeInterpError(f"sites must be a list of hook names, got the single string {sites!r} "
                              f"(write [{sites!r}] for a list of one)")
    if sites is not None and not isinstance(sites, list | tuple):
        raise NopeInterpError(f"{fn}: sites must be a list of hook names or None, got {type(sites).__name__}")
    if sites is not None and not sites:
        raise NopeInterpError(f"{fn}: sites must name at least one hook (or be None for every cached vector "
                              "site), got an empty list")
    sites = list(sites) if sites is not None else cached_vector_sites(cache)
    if not sites:
        raise NopeInterpError(f"no vector site in the cache; cached: {', '.join(cache.cache_dict)}")
    twice = sorted({s for s in sites if isinstance(s, str) and sites.count(s) > 1})
    if twice:  # the table would show a site twice while the per-site dicts keep one
        raise NopeInterpError(f"{fn}: sites names {', '.join(map(repr, twice))} more than once")
    shapes = {s: tuple(site_activations(cache, s).shape[:2]) for s in sites}
    if len(set(shapes.values())) > 1:  # one result holds one n_pos (and one set of sequences) for all sites
        raise NopeInterpError(f"{fn}: the sites hold different (batch, pos): "
                              + ", ".join(f"{s} {v}" for s, v in shapes.items())[:400]
                              + "; score them from one forward pass, or one call per shape")
    return sites


@_counted
def adjacency_scores(cache: ActivationCache, sites: list[str] | None = None,
                     reduction: str = "row_mean") -> SiteScores:
    """Adjacency score of every sequence at every site of ``cache`` (default: all cached vector sites).

    Args:
        cache: from ``model.run_with_cache(tokens)``; sequences of at least 3 positions.
        sites: full hook names (default :func:`cached_vector_sites`).
        reduction: ``"row_mean"`` (the paper's), ``"pooled"`` (the authors' code) or ``"pooled_rounded"``
            (``pooled`` rounded to two decimals, as the authors report it;
            :data:`~nope_interp.similarity.REDUCTIONS`).

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``; no scorable site; a site missing from the cache,
            or one that is not one vector per position (attention patterns; :func:`site_activations`); fewer
            than 3 positions; near-zero or non-finite vectors (their cosines are undefined); a site named twice;
            sites of different (batch, pos) (a hand-built cache); a cache holding meta-device tensors, an empty
            batch or an entry that is not a real floating tensor (:func:`site_activations`).

    Warns:
        DegenerateInputWarning: sequences whose vectors are parallel at every position of a site (one token
            repeated), once, naming every such site.
    """
    if reduction not in REDUCTIONS:
        raise NopeInterpError(f"unknown reduction {reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    sites = _sites(cache, sites, "adjacency_scores")
    with degenerate_report("the cached sequences"):  # one warning naming every degenerate site
        per = {s: adjacency_score_of_activations(site_activations(cache, s), reduction, what=f"activations at {s}")
               for s in sites}
    return SiteScores(reduction=reduction, sites=tuple(sites), per_sequence=per,
                      n_pos=site_activations(cache, sites[0]).shape[1])


@dataclass(frozen=True)
class LagProfile:
    """Lag profiles of every profiled site of a cache: c(d) = mean over positions i >= d of cos(x_i, x_{i-d}).

    Attributes:
        sites: full hook names in forward order. n_pos: sequence length. max_lag: D (lags 1..D).
        per_sequence: ``{site: Float[Tensor, "batch lag"]}`` c(d) of each sequence, in [-1, 1].
        uniform_causal: ``Float[Tensor, "lag"]`` the idealised curve of uniform causal averaging of
            i.i.d. inputs (:func:`~nope_interp.similarity.uniform_causal_lag_profile`).
        window: the layer-0 sliding window (keys per query) of the cache's model when it has one
            (:func:`~nope_interp.averaging.attention_window`), else None; :meth:`figure` then also draws the
            idealised sliding-window curve.
    """

    sites: tuple[str, ...]
    n_pos: int
    max_lag: int
    per_sequence: dict[str, Tensor]
    uniform_causal: Tensor
    window: int | None = None

    def summary(self, site: str) -> dict[str, Any]:
        """Mean and std over sequences of c(d) and of the recency gap c(1) - c(D) at ``site``
        (:func:`~nope_interp.similarity.lag_summary`).

        Raises:
            NopeInterpError: a site that was not profiled.
        """
        return lag_summary(self.per_sequence[_scored(site, self.sites, "profiled")])

    def to_dict(self) -> dict[str, Any]:
        """``{"n_pos", "max_lag", "uniform_causal": [...], "sites": {site: summary}}``."""
        return {"n_pos": self.n_pos, "max_lag": self.max_lag, "uniform_causal": self.uniform_causal.tolist(),
                "sites": {s: self.summary(s) for s in self.sites}}

    def _rows(self) -> list[list[str]]:
        rows = []
        for s in self.sites:
            m, gap = self.summary(s)["mean"], self.summary(s)["recency_gap"]
            spread = "" if gap["n"] == 1 else f" ± {gap['std']:.3f}"  # one sequence: no spread, not ± 0
            rows.append([s, f"{m[0]:.3f}", f"{m[-1]:.3f}", f"{gap['mean']:+.3f}{spread}", str(gap["n"])])
        u = self.uniform_causal
        rows.append(["idealised: uniform causal", f"{float(u[0]):.3f}", f"{float(u[-1]):.3f}",
                     f"{float(u[0] - u[-1]):+.3f}", ""])
        return rows

    def __repr__(self) -> str:
        lines = [f"lag profile ({self.n_pos} positions, lags 1..{self.max_lag}), mean over sequences: "
                 f"c(1), c({self.max_lag}), recency gap c(1) - c({self.max_lag}) ± std:"]
        lines += [f"  {r[0]:28s} {r[1]:>7s} {r[2]:>7s} {r[3]}" for r in self._rows()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return html_table(f"Lag profile ({self.n_pos} positions; c(d) = mean cosine of positions d apart)",
                      ["site", "c(1)", f"c({self.max_lag})", "recency gap (mean ± std)", "sequences"], self._rows())

    def figure(self, title: str | None = None, window: int | None = None) -> go.Figure:
        """c(d) by site (mean ± std over sequences) with the idealised uniform-causal curve (and the
        sliding-window one of width ``window``, by default the model's own :attr:`window`)."""
        return plot_lag_profile({s: self.summary(s) for s in self.sites}, self.uniform_causal.tolist(),
                                title or f"Lag profile ({self.n_pos} positions)",
                                window=self.window if window is None else window, n_pos=self.n_pos)


@_counted
def lag_profile(cache: ActivationCache, sites: list[str] | None = None, max_lag: int | None = None) -> LagProfile:
    """The lag profile of every sequence at every site of ``cache`` (default: all cached vector sites).

    Args:
        cache: from ``model.run_with_cache(tokens)``; sequences of at least 2 positions.
        sites: full hook names (default :func:`cached_vector_sites`).
        max_lag: the largest lag D, in [1, pos - 1] (default pos - 1).

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``; no vector site; a site missing from the cache, or
            one that is not one vector per position (attention patterns; :func:`site_activations`); fewer than
            2 positions; ``max_lag`` out of range; near-zero or non-finite vectors (their cosines are undefined;
            the message names the site); a site named twice; sites of different (batch, pos); a cache holding
            meta-device tensors, an empty batch or an entry that is not a real floating tensor.
    """
    sites = _sites(cache, sites, "lag_profile")
    max_lag = int(max_lag) if is_int(max_lag) else max_lag  # similarity.lag_profile checks for a Python int
    per = {s: _lag_profile(site_activations(cache, s), max_lag, what=f"activations at {s}") for s in sites}
    n_pos = site_activations(cache, sites[0]).shape[1]
    d_max = per[sites[0]].shape[-1]
    model = getattr(cache, "model", None)
    window = attention_window(model.cfg, 0) if hasattr(model, "cfg") else None
    return LagProfile(sites=tuple(sites), n_pos=n_pos, max_lag=d_max, per_sequence=per,
                      uniform_causal=uniform_causal_lag_profile(n_pos, d_max), window=window)


@dataclass(frozen=True)
class CosineView:
    """The cosine similarity matrix of one sequence at one site.

    Attributes:
        site: full hook name. batch_index: which sequence. matrix: ``Float[Tensor, "pos pos"]`` in [-1, 1].
        tokens: one label per position (characters or token strings), or None.
        adjacency: its adjacency score (row mean) in [0, 1].
    """

    site: str
    batch_index: int
    matrix: Tensor
    tokens: tuple[str, ...] | None
    adjacency: float

    def to_dict(self) -> dict[str, Any]:
        """Site, index, adjacency score and the matrix as nested lists (plain Python values)."""
        return {"site": self.site, "batch_index": self.batch_index, "adjacency": self.adjacency,
                "matrix": self.matrix.tolist()}

    def __repr__(self) -> str:
        n = self.matrix.shape[0]
        return f"CosineView({self.site}, sequence {self.batch_index}, {n}x{n}, adjacency {self.adjacency:.3f})"

    def _repr_html_(self) -> str:
        return html_table("Cosine similarity matrix", ["site", "sequence", "positions", "adjacency (row mean)"],
                      [[self.site, str(self.batch_index), str(self.matrix.shape[0]), f"{self.adjacency:.3f}"]])

    def figure(self) -> go.Figure:
        """Interactive heatmap on the diverging scale fixed to [-1, 1]."""
        labels = list(self.tokens) if self.tokens else [""] * self.matrix.shape[0]  # whole tokens, not 1st chars
        return plot_cosine_heatmaps(self.matrix.unsqueeze(0), [self.site], labels,
                                    f"cosine similarity, sequence {self.batch_index}, adjacency {self.adjacency:.3f}")


@_counted
def cosine_heatmap(cache: ActivationCache, site: str, batch_index: int = 0,
                   tokens: list[str] | str | None = None) -> CosineView:
    """The cosine similarity matrix of sequence ``batch_index`` at ``site``, with its adjacency score.

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``; ``site`` not cached, or not one vector per
            position (:func:`site_activations`); ``batch_index`` not an integer in range; ``tokens`` of the wrong
            length or not strings; NaN/inf or near-zero vectors in the sequence (the message names the site);
            a cache holding meta-device tensors, an empty batch or an entry that is not a real floating tensor.
    """
    acts = site_activations(cache, site)
    if not is_int(batch_index) or not 0 <= batch_index < acts.shape[0]:
        raise NopeInterpError(f"batch_index must be an integer in [0, {acts.shape[0] - 1}], got {batch_index!r}")
    batch_index = int(batch_index)  # stored in the CosineView
    if tokens is not None and (not isinstance(tokens, str | list | tuple)
                               or not all(isinstance(t, str) for t in tokens)):
        raise NopeInterpError(f"tokens must be a string or a list of strings (one per position), got {tokens!r}"[:200])
    if tokens is not None and len(tokens) != acts.shape[1]:
        raise NopeInterpError(f"tokens has {len(tokens)} entries for {acts.shape[1]} positions")
    x = acts[batch_index]
    return CosineView(site=site, batch_index=batch_index, matrix=cosine_similarity_matrix(x),
                      tokens=None if tokens is None else tuple(tokens),
                      adjacency=float(adjacency_score_of_activations(x, what=f"activations at {site}")))


@dataclass(frozen=True)
class AveragingCheck:
    """Does layer ``layer``'s output look like causal averaging? From its attention pattern and ``hook_z``.

    Attributes:
        layer: the layer. relative_entropy: mean row entropy of the pattern / that of uniform causal
            attention (1 = uniform), rows >= 1, over heads and sequences, in [0, 1].
        spearman_pred_obs: mean over sequences of the Spearman correlation (lower triangle) between the
            cosine matrix predicted from the attention rows (heads concatenated) and the observed one, in
            [-1, 1]; sequences where either matrix is constant up to rounding are left out (warned), NaN when
            none is left.
        adjacency_predicted, adjacency_observed: mean adjacency scores (row mean) of both matrices.
        predicted, observed: the two matrices of the first sequence, ``Float[Tensor, "pos pos"]``.
    """

    layer: int
    relative_entropy: float
    spearman_pred_obs: float
    adjacency_predicted: float
    adjacency_observed: float
    predicted: Tensor
    observed: Tensor

    def to_dict(self) -> dict[str, Any]:
        """The scalar measurements as plain Python values (``spearman_pred_obs`` NaN when no sequence is left)."""
        return {k: getattr(self, k) for k in ("layer", "relative_entropy", "spearman_pred_obs",
                                              "adjacency_predicted", "adjacency_observed")}

    def __repr__(self) -> str:
        return ("AveragingCheck(" + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in self.to_dict().items()) + ")")

    def _repr_html_(self) -> str:
        return html_table(f"Averaging check, layer {self.layer}", ["measurement", "value"],
                      [[k, f"{v:.3f}" if isinstance(v, float) else str(v)] for k, v in self.to_dict().items()])

    def figure(self) -> go.Figure:
        """Predicted (from the pattern) and observed cosine matrices of the first sequence, side by side."""
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2, subplot_titles=["predicted from the attention pattern",
                                                            f"observed ({short_label(hook_name('z', self.layer))})"])
        for c, m in enumerate((self.predicted, self.observed), start=1):
            fig.add_trace(go.Heatmap(z=m.numpy(), zmin=-1, zmax=1, zmid=0, colorscale="RdBu_r", showscale=(c == 2),
                                     colorbar={"title": "cosine"}), row=1, col=c)
            fig.update_yaxes(autorange="reversed", row=1, col=c)
        fig.update_layout(title=f"Layer {self.layer}: predicted vs observed cosine", width=1100, height=560)
        return fig


@_counted
def averaging_check(cache: ActivationCache, layer: int = 0, causal: bool | None = None,
                    window: int | None = None) -> AveragingCheck:
    """Compare layer ``layer``'s observed ``hook_z`` cosines with those predicted from its attention pattern.

    The prediction assumes i.i.d. zero-mean isotropic value vectors: then the expected inner product of two
    outputs is the inner product of their attention rows (summed over heads when heads are concatenated);
    see ``docs/method.md``, "The averaging argument". The relative entropy counts the keys the model allows:
    with a sliding window, min(q + 1, window) per query: ``window`` (keys per query, >= 1) when given, else read
    from the cache's model when it has one (a cache built without its model reads as global attention: give
    ``window`` for a sliding-window model's cache then).
    ``causal`` (default: the cache's model's ``attention_dir``, else True) decides which keys count; one that
    contradicts the cache's model is refused (a causal model's pattern scored as bidirectional would read
    exactly uniform causal attention as 0.73 of uniform), and so is a bidirectional pattern checked as causal
    on a cache without a model, not scored above 1.

    Warns:
        DegenerateInputWarning: sequences whose observed or predicted cosines are constant up to rounding (one
            token repeated; collapsed or identity attention), once, naming which; they are left out of
            ``spearman_pred_obs``.

    Raises:
        NopeInterpError: ``cache`` not an ``ActivationCache``; ``blocks.{layer}.attn.hook_pattern`` or ``hook_z``
            missing from the cache; NaN or inf entries in the pattern or in ``hook_z`` (the message names the site);
            near-zero vectors in ``hook_z`` (their cosines are undefined); a pattern that is not softmax
            weights of that kind (:func:`nope_interp.averaging.check_pattern`); ``hook_z`` and the pattern
            disagree in batch, positions or heads; fewer than 3 positions; ``layer`` not an integer >= 0, or
            not below the cache's model's ``n_layers``; ``causal`` not a bool or None, or not the cache's model's
            attention direction; ``window`` not an integer >= 1, given with
            bidirectional attention, or not the cache's model's own window; a cache entry that is not a real
            floating tensor, a cache holding meta-device tensors or an empty batch.
    """
    _check_cache(cache, "averaging_check")
    layer = int(layer) if is_int(layer) else layer  # a numpy integer as an int (stored in the AveragingCheck)
    model = getattr(cache, "model", None)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)
    n_layers = n_layers if is_int(n_layers) else None
    # checks layer: an integer >= 0, below the cache's model's n_layers when it has a model
    p_name, z_name = hook_name("pattern", layer, n_layers), hook_name("z", layer, n_layers)
    for n in (p_name, z_name):
        if n not in cache.cache_dict:
            raise NopeInterpError(f"averaging_check needs {n!r} in the cache; cached: {', '.join(cache.cache_dict)}")
    pattern = _entry(cache, p_name, "averaging_check")
    pattern_dtype = pattern.dtype
    pattern = pattern.double().cpu()
    if not cache.has_batch_dim:
        pattern = pattern.unsqueeze(0)
    if pattern.ndim != 4:
        raise NopeInterpError(f"averaging_check: {p_name} has shape {tuple(pattern.shape)}; expected (batch, head, "
                              "query, key)")
    check_finite(pattern, f"attention pattern at {p_name}")
    if pattern.shape[-1] < 3:
        raise NopeInterpError(f"averaging_check: the cache holds sequences of {pattern.shape[-1]} positions at "
                              f"{p_name}; the rank correlation of the cosines needs at least 3")
    raw_z = _entry(cache, z_name, "averaging_check")
    z_heads = raw_z.shape[-2] if raw_z.ndim == (4 if cache.has_batch_dim else 3) else None  # (.., head, d_head)
    z = site_activations(cache, z_name).double().cpu()
    check_scorable(z, what=f"activations at {z_name}")  # near-zero vectors have no cosine: refused by name
    if z_heads is not None and pattern.shape[1] != z_heads:
        raise NopeInterpError(f"{p_name} has {pattern.shape[1]} heads and {z_name} {z_heads}: they must come from "
                              "the same layer of the same model")
    if causal is not None and not isinstance(causal, bool):
        raise NopeInterpError(f"averaging_check: causal must be True, False or None (the cache's model's), got "
                              f"{causal!r}")
    model_dir = getattr(getattr(model, "cfg", None), "attention_dir", None)
    if causal is not None and model_dir in ("causal", "bidirectional") and causal != (model_dir == "causal"):
        # a causal model's pattern checked as bidirectional was scored against the wrong uniform (all keys, not the
        # q + 1 allowed): a relative entropy of 0.73 for exactly uniform causal attention
        raise NopeInterpError(f"averaging_check: causal={causal}, but the cache's model has {model_dir} attention: "
                              f"leave causal out, or give {model_dir == 'causal'}")
    if causal is None:
        causal = (model_dir or "causal") == "causal"
    own = attention_window(model.cfg, layer) if causal is True and model is not None else None
    if window is not None:
        window = check_int("window", window, 1, 10**9)
        if causal is not True:
            raise NopeInterpError("averaging_check: window (a causal sliding window) needs causal attention; got "
                                  f"causal={causal} and window={window}")
        if own is not None and own != window:
            raise NopeInterpError(f"averaging_check: window={window}, but the cache's model attends over {own} keys "
                                  f"at layer {layer}: leave window out, or give {own}")
    else:
        window = own
    check_pattern(pattern, causal, window, name=f"the attention pattern at {p_name}")
    if pattern.shape[0] != z.shape[0] or pattern.shape[-2] != z.shape[-2]:
        raise NopeInterpError(f"{p_name} {tuple(pattern.shape)} and {z_name} {tuple(z.shape)} disagree in batch or "
                              f"query positions")
    gram = torch.einsum("bhqk,bhpk->bqp", pattern, pattern)
    d = gram.diagonal(dim1=-2, dim2=-1).sqrt()
    pred = tie_equal_vectors((gram / (d.unsqueeze(-1) * d.unsqueeze(-2))).clamp(-1, 1),
                             pattern.movedim(1, 2).flatten(2))  # equal rows (collapsed attention): equal cosines
    obs = cosine_similarity_matrix(z)
    # sequences whose matrices are constant up to the rounding of the cache's dtypes are left out (ranks of noise)
    rho, bad_pred, bad_obs = sequence_spearmans(pred, obs, pattern_dtype, raw_z.dtype)
    bad = bad_obs | bad_pred
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateInputWarning)  # warned once below, naming both matrices
        # the sequences left out of spearman_pred_obs are left out of both scores too, so all three read the
        # same sequences (NaN when none is left)
        adjacency_predicted = float(adjacency_score(pred).masked_fill(bad, float("nan")).nanmean())
        adjacency_observed = float(adjacency_score(obs).masked_fill(bad, float("nan")).nanmean())
    if bool(bad.any()):
        parts = [f"{int(m.sum())} with constant {kind}" for m, kind in (
            (bad_obs, f"observed cosines at {z_name} (vectors parallel up to rounding, e.g. one token repeated)"),
            (bad_pred, f"predicted cosines (attention rows at {p_name} all equal or all orthogonal: collapsed or "
                       "identity attention)")) if m.any()]
        warnings.warn(DegenerateInputWarning(
            f"averaging_check, layer {layer}: of {bad.numel()} sequences, {' and '.join(parts)}; they are left out of "
            "spearman_pred_obs and of the adjacency scores (NaN when none is left)",
            z_name, int(bad.sum()), int(bad.numel())), stacklevel=user_stacklevel())
    return AveragingCheck(
        layer=layer, relative_entropy=float(relative_entropy_to_uniform(pattern, causal, window)[..., 1:].mean()),
        spearman_pred_obs=float(torch.tensor(rho, dtype=torch.float64).nanmean()),
        adjacency_predicted=adjacency_predicted, adjacency_observed=adjacency_observed, predicted=pred[0],
        observed=obs[0])


__all__ = ["adjacency_scores", "cosine_heatmap", "averaging_check", "lag_profile", "site_activations",
           "cached_vector_sites", "SiteScores", "CosineView", "AveragingCheck", "LagProfile"]
