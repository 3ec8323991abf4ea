"""The adjacency analysis of one model on one task: prompts -> activations -> cosine matrices -> scores.

Follows ``docs/method.md`` ("Definitions", "Analysis inputs"): 256 test prompts of the task's full
prompt length (no padding), eval mode, every hook site of :data:`~nope_interp.hooks.ACTIVATION_POINTS`,
both reductions of the adjacency score and the lag profile, mean and spread over sequences.
"""

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp.activations import check_site_widths, iter_activations
from nope_interp.checks import is_int
from nope_interp.config import check_int
from nope_interp.errors import DegenerateInputWarning, NopeInterpError, user_stacklevel
from nope_interp.fast_forward import attached_hooks, fast_activations, fast_activations_unsupported
from nope_interp.hooks import ACTIVATION_POINTS, activation_hook_names, check_points
from nope_interp.model import LensModel, check_fits_memory, check_model, check_model_dtype, check_tokens, evaluates
from nope_interp.plotting import html_table
from nope_interp.similarity import (
    REDUCTIONS,
    ScoreSummary,
    _check_lag,
    _scores_and_matrix_sum,
    adjacency_score,
    cosine_similarity_matrix,
    degenerate_report,
    degenerate_sequences,
    lag_profile,
    lag_summary,
    source_tolerance,
    summarize,
    uniform_causal_lag_profile,
)
from nope_interp.stats import fmt_mean_std
from tasks import DEFAULT_WINDOW

#: Memory bound (bytes) of one chunk of prompts' cached activations in :func:`analyze_model`.
DEFAULT_CHUNK_BYTES = 2**27
#: Longer sequences keep no example cosine matrix (``example_sim`` is None): a pos x pos heatmap of more
#: positions is neither readable nor small.
EXAMPLE_MAX_POS = 512
#: At most this many prompts per chunk (one forward pass each), as :func:`~nope_interp.activations.collect_activations`.
MAX_CHUNK_PROMPTS = 512


@dataclass(frozen=True)
class AnalysisResult:
    """Adjacency scores at every hook site.

    Attributes:
        task: task name. sites: hook names in forward order. n_prompts: sequences analysed.
        scores: ``scores[reduction][site] = {"mean", "std", "n"}`` over sequences, values in [0, 1].
        per_sequence: ``per_sequence[reduction]``: ``Float[Tensor, "site batch"]`` scores.
        example_prompt: the prompt drawn in the heatmap; example_sim: its cosine matrices
            ``Float[Tensor, "site pos pos"]`` in [-1, 1] (None beyond :data:`EXAMPLE_MAX_POS` positions).
        meta: free-form provenance (model label, config, seeds).
        lag_profile: ``lag_profile[site]`` = :func:`~nope_interp.similarity.lag_summary` of the per-sequence
            lag profiles (c(d) for d = 1..pos - 1: mean and std over sequences, recency gap c(1) - c(D)).
        lag_per_sequence: ``Float[Tensor, "site batch lag"]`` the lag profiles, cosines in [-1, 1].
        mean_matrix_scores: ``mean_matrix_scores[reduction][site]``: the adjacency score, in [0, 1], of the
            prompt-averaged cosine similarity matrix (:func:`~nope_interp.similarity.mean_cosine_similarity_matrix`,
            the authors' heat-map titles) under ``row_mean`` and ``pooled``; empty beyond
            :data:`EXAMPLE_MAX_POS` positions; NaN at a site whose averaged matrix is constant up to rounding
            (every prompt's vectors parallel there: no order to score).
        n_pos: positions per sequence (0 when unknown: a result built by hand).
        example_index: which sequence (0-based, in the order given) ``example_prompt`` and ``example_sim`` are:
            0 unless :func:`analyze_tokens` was given every sequence's text and the first is degenerate.
    """

    task: str
    sites: tuple[str, ...]
    n_prompts: int
    scores: dict[str, dict[str, dict[str, float]]]
    per_sequence: dict[str, Float[Tensor, "site batch"]]
    example_prompt: str
    example_sim: Float[Tensor, "site pos pos"] | None
    meta: dict[str, Any] = field(default_factory=dict)
    protocol: str = "full"
    lag_profile: dict[str, dict[str, Any]] = field(default_factory=dict)
    lag_per_sequence: Tensor | None = None
    mean_matrix_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    n_pos: int = 0
    example_index: int = 0

    def uniform_causal_lag_profile(self) -> Float[Tensor, " lag"]:
        """The idealised lag profile (:func:`~nope_interp.similarity.uniform_causal_lag_profile`) for the lags
        of ``lag_profile``: sequences of ``n_pos`` positions, lags 1..D with D the profile's largest lag (which
        ``max_lag`` may have set below ``n_pos - 1``). Values in (0, 1), float64.

        Raises:
            NopeInterpError: no lag profile, or ``n_pos`` unknown.
        """
        if not self.lag_profile:
            raise NopeInterpError("this result has no lag profile")
        if self.n_pos < 2:
            raise NopeInterpError("this result does not record its sequence length (n_pos); build it with "
                                  "analyze_tokens or analyze_model")
        return uniform_causal_lag_profile(self.n_pos, len(next(iter(self.lag_profile.values()))["mean"]))

    def score(self, site: str, reduction: str = "row_mean") -> ScoreSummary:
        """The typed summary (mean, std, n over sequences) at ``site``; ``scores`` holds the same as JSON.

        Raises:
            NopeInterpError: a site that was not analysed, or an unknown reduction.
        """
        if not isinstance(site, str) or not isinstance(reduction, str):
            raise NopeInterpError(f"site and reduction must be strings, got {site!r} and {reduction!r}"[:300])
        if reduction not in self.scores:
            raise NopeInterpError(f"unknown reduction {reduction!r}; allowed: {', '.join(self.scores)}")
        if site not in self.scores[reduction]:
            raise NopeInterpError(f"site {site!r} was not analysed; analysed: {', '.join(self.sites)}")
        return ScoreSummary(**self.scores[reduction][site])

    def mean_matrix_score(self, site: str, reduction: str = "pooled") -> float:
        """The adjacency score of the prompt-averaged cosine similarity matrix at ``site`` (``mean_matrix_scores``).

        Raises:
            NopeInterpError: not measured (sequences longer than :data:`EXAMPLE_MAX_POS`); a site that was not
                analysed; a reduction other than ``row_mean`` or ``pooled``.
        """
        if not isinstance(site, str) or not isinstance(reduction, str):
            raise NopeInterpError(f"site and reduction must be strings, got {site!r} and {reduction!r}"[:300])
        if not self.mean_matrix_scores:
            raise NopeInterpError(f"the prompt-averaged matrix is not kept beyond {EXAMPLE_MAX_POS} positions")
        if reduction not in self.mean_matrix_scores:
            raise NopeInterpError(f"unknown reduction {reduction!r} for the prompt-averaged matrix; allowed: "
                                  f"{', '.join(self.mean_matrix_scores)}")
        if site not in self.mean_matrix_scores[reduction]:
            raise NopeInterpError(f"site {site!r} was not analysed; analysed: {', '.join(self.sites)}")
        return self.mean_matrix_scores[reduction][site]

    def _rows(self) -> list[list[str]]:
        """Per site: row-mean and pooled scores (mean ± std over sequences) and the recency gap, as text."""
        def text(reduction: str, site: str) -> str:
            st = self.scores.get(reduction, {}).get(site)
            return "-" if st is None else fmt_mean_std(st["mean"], st["std"], st["n"])

        rows = []
        for site in self.sites:
            gap = self.lag_profile.get(site, {}).get("recency_gap")
            rows.append([site, text("row_mean", site), text("pooled", site),
                         "-" if gap is None else fmt_mean_std(gap["mean"], gap["std"], gap["n"])])
        return rows

    def _title(self) -> str:
        inputs = self.task if self.protocol == self.task else f"{self.task}, {self.protocol} inputs"  # tokens, text
        return (f"Adjacency score of {self.n_prompts} sequences ({inputs}, {self.n_pos} positions), mean ± std over "
                f"sequences; 0.5 = chance")

    def __repr__(self) -> str:
        """The score table, not the tensors (the per-sequence scores and example matrices stay attributes)."""
        header = f"  {'site':30s} {'row mean':16s} {'pooled':16s} recency gap c(1) - c(D)"
        return "\n".join([self._title() + ":", header]
                         + [f"  {a:30s} {b:16s} {c:16s} {d}" for a, b, c, d in self._rows()])

    def _repr_html_(self) -> str:
        return html_table(self._title(), ["site", "row mean", "pooled", "recency gap c(1) - c(D)"], self._rows())

    def to_dict(self) -> dict[str, Any]:
        """Summary as plain Python values (scores per reduction and site, not the per-sequence tensors)."""
        out = {"task": self.task, "n_prompts": self.n_prompts, "protocol": self.protocol, "sites": list(self.sites),
               **({"n_pos": self.n_pos} if self.n_pos else {}),
               "scores": self.scores, "example_prompt": self.example_prompt,
               **({"example_index": self.example_index} if self.example_index else {})}
        if self.mean_matrix_scores:
            out["mean_matrix_scores"] = self.mean_matrix_scores
        if self.lag_profile and self.n_pos >= 2:
            out["lag_profile"] = {"uniform_causal": self.uniform_causal_lag_profile().tolist(),
                                  "sites": self.lag_profile}
        elif self.lag_profile:
            out["lag_profile"] = {"sites": self.lag_profile}
        return {**out, **self.meta}


def protocol_prompts(model: HookedTransformer, task: tasks_pkg.Task, n: int, seed: int,
                     exclude: frozenset[str] = frozenset(), protocol: str = "full",
                     window: int = DEFAULT_WINDOW) -> list[str]:
    """``n`` held-out analysis inputs of ``task`` under ``protocol`` (``tasks.protocol_inputs``), all of one
    length, checked to fit ``model``'s ``n_ctx``: the inputs every prompt-reading analysis uses.

    Args:
        model: the model that will read the inputs (only ``cfg.n_ctx`` is used).
        task: the task. n: inputs (>= 1). seed: seed of the sampler (>= 0). exclude: prompts not to use (a full
            line, prompt + answer, excludes its prompt).
        protocol: one of ``tasks.PROTOCOLS`` (``docs/method.md``, "Analysis inputs"): ``full`` (full-length
            prompts), ``authors`` (fixed-length lines left-padded with newlines) or ``window`` (``window``
            characters of concatenated held-out lines).

    Returns:
        ``n`` strings of equal length (characters = tokens).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model; unknown protocol (the message lists them); the
            inputs longer than ``n_ctx``; a ``window`` that is no length or shorter than 3 (no adjacency
            score), or other than 64 with another protocol (it would be ignored); too few held-out prompts; ``seed``
            not an integer >= 0.

    The ``authors`` protocol rebuilds the inputs of the paper's analysis code (Zuo et al., COLING 2025);
    ``docs/method.md`` describes all three.
    """
    check_model(model)
    if protocol not in tasks_pkg.PROTOCOLS:
        raise NopeInterpError(f"unknown protocol {protocol!r}; allowed: {', '.join(tasks_pkg.PROTOCOLS)}")
    if protocol == "window" and is_int(window) and window < 3:
        raise NopeInterpError(f"window must be an integer >= 3 (the adjacency score needs at least 3 positions), "
                              f"got {window}")
    # numpy integers as ints: the tasks package (and random.Random) takes Python ints only; tasks checks the rest
    n, seed, window = (int(v) if is_int(v) else v for v in (n, seed, window))
    try:
        too_long = inputs_too_long_error(task, protocol, window, model.cfg.n_ctx)
        if too_long is not None:
            raise too_long
        return tasks_pkg.protocol_inputs(task, protocol, n, seed, exclude, window)
    except tasks_pkg.TaskError as err:  # a window that is no length, too few held-out prompts, a bad seed
        raise NopeInterpError(str(err)) from None


def inputs_too_long(task: tasks_pkg.Task, protocol: str, window: int | None, n_ctx: int) -> str | None:
    """Why a model of ``n_ctx`` cannot read ``task``'s inputs under ``protocol`` (``window`` characters for the
    ``window`` protocol), with the ``window`` that fits where one does; None when they fit.

    Raises:
        tasks.TaskError: a protocol or window :func:`tasks.protocol_length` refuses.
    """
    err = inputs_too_long_error(task, protocol, window, n_ctx)
    return None if err is None else str(err)


def inputs_too_long_error(task: tasks_pkg.Task, protocol: str, window: int | None,
                          n_ctx: int) -> NopeInterpError | None:
    """:func:`inputs_too_long` as the error to raise, made by :meth:`NopeInterpError.naming`: the window that
    fits is named ``window`` in Python and as the command's flag (``--window``) on the command line (before: the
    Python message said ``(--window 48)``). None when the inputs fit.

    Raises:
        tasks.TaskError: a protocol or window :func:`tasks.protocol_length` refuses.
    """
    length = tasks_pkg.protocol_length(task, protocol, window)
    if length <= n_ctx:
        return None
    fix = ": {window} {n_ctx} or less fits" if protocol == "window" and n_ctx >= 3 else ""
    return NopeInterpError.naming("n_ctx={n_ctx} is too small for {task!r} {protocol_name} inputs of {length} tokens"
                                  + fix, n_ctx=n_ctx, task=task.name, protocol_name=protocol, length=length)


def analyze_model(
    model: HookedTransformer,
    task: tasks_pkg.Task,
    n_prompts: int = 256,
    seed: int = 0,
    points: tuple[str, ...] = ACTIVATION_POINTS,
    exclude: frozenset[str] = frozenset(),
    meta: dict[str, Any] | None = None,
    protocol: str = "full",
    window: int = DEFAULT_WINDOW,
    max_bytes: int = DEFAULT_CHUNK_BYTES,
) -> AnalysisResult:
    """Cosine matrices, adjacency scores and lag profiles of ``model`` on ``n_prompts`` prompts of ``task``.

    Args:
        model: a HookedTransformer (NoPE or not) whose ``n_ctx`` fits the task's prompts.
        task: the task supplying prompts.
        n_prompts: number of prompts (paper: 256); seed: seed of the prompt sampler.
        points: hook points to analyse.
        exclude: prompts not to use (pass the training prompts of a trained model; a full line excludes its
            prompt).
        meta: extra fields for :meth:`AnalysisResult.to_dict`.
        protocol: input protocol, one of ``tasks.PROTOCOLS`` (``docs/method.md``, "Analysis inputs"):
            ``full`` (default), ``authors`` or ``window`` (``window`` characters of concatenated lines).
        max_bytes: memory bound of one chunk of prompts' cached activations (:func:`analysis_chunk_size`).
            Inputs of at most :data:`EXAMPLE_MAX_POS` tokens go through ``run_with_cache`` (hooks run); longer
            ones through the fused path of :func:`analyze_tokens` when the model allows it. Prompts are run,
            and scored site by site, one chunk at a time, so peak memory does not grow
            with ``n_prompts`` (only the per-sequence scores do: 16 bytes per prompt and site).

    Raises:
        NopeInterpError: ``model`` not a TransformerLens model (a loaded run: pass ``.model``); ``task`` not
            a :class:`tasks.Task`; ``n_prompts`` < 1; ``seed`` not an integer >= 0; the inputs do not fit
            ``n_ctx``; unknown, repeated or no points; unknown protocol; activations with NaN or inf entries
            (non-finite weights), or near-zero vectors, at a site (the message names it).

    Warns:
        DegenerateInputWarning: as :func:`analyze_tokens`.
    """
    check_model(model)
    if not isinstance(task, tasks_pkg.Task):
        raise NopeInterpError(f"task must be a tasks.Task (e.g. tasks.get_task('reversal')), got "
                              f"{type(task).__name__} {task!r}"[:200])
    n_prompts = check_int("n_prompts", n_prompts, 1, 10**7)
    seed = check_int("seed", seed, 0, 2**63 - 1)
    prompts = protocol_prompts(model, task, n_prompts, seed, exclude, protocol, window)
    length = len(prompts[0])
    return analyze_tokens(model, task.prompt_tokens(prompts), points, task=task.name, example_prompt=prompts,
                          meta=meta, protocol=protocol, max_bytes=max_bytes,
                          forward="hooked" if length <= EXAMPLE_MAX_POS else "auto")


#: How :func:`analyze_tokens` computes activations.
FORWARDS = ("auto", "hooked", "fast")


@evaluates
def analyze_tokens(
    model: LensModel,
    tokens: Int[Tensor, "batch pos"],
    points: tuple[str, ...] = ACTIVATION_POINTS,
    *,
    max_lag: int | None = None,
    task: str = "tokens",
    example_prompt: str | Sequence[str] = "",
    meta: dict[str, Any] | None = None,
    protocol: str = "tokens",
    forward: str = "auto",
    max_bytes: int = DEFAULT_CHUNK_BYTES,
) -> AnalysisResult:
    """Cosine matrices, adjacency scores and lag profiles of ``model`` on any equal-length token sequences.

    The engine of :func:`analyze_model`, open to inputs no task builds: random tokens, long windows of task
    text, natural text tokenised by the caller. Sequences are run in chunks (about ``max_bytes`` of cached
    activations each) and scored site by site; both reductions come from one count per matrix.

    Args:
        model: a HookedTransformer, or a TransformerBridge around a Hugging Face model (:mod:`nope_interp.hf`;
            hooked path), whose ``n_ctx`` is at least ``pos``.
        tokens: ids in ``[0, d_vocab)``, ``pos >= 3`` (the score compares pairs of earlier positions).
        points: hook points to analyse (:data:`~nope_interp.hooks.ACTIVATION_POINTS`).
        max_lag: the lag profile's largest lag D (default pos - 1; memory and time grow with pos * D).
        task, example_prompt, protocol, meta: recorded in the result (``task`` names the inputs, e.g.
            ``"random"``). ``example_prompt``: the text of the first sequence (a string), or the text of every
            sequence (a sequence of ``batch`` strings): then the heatmap's example is the first sequence that
            is degenerate at no site (a repeated-token sequence has no order to draw; sequence 0 when all are),
            and ``example_index`` says which.
        forward: ``"hooked"`` (``run_with_cache``: user hooks run; TransformerLens keeps every head's
            ``pos x pos`` scores and pattern, 4.9 GB at pos = 8,192 for the ``cpu`` preset), ``"fast"``
            (:func:`~nope_interp.fast_forward.fast_activations`: fused attention, memory linear in pos, equal
            up to float rounding, no hooks) or ``"auto"`` (fast when the model and points allow it and no hook
            is attached to the model: :func:`~nope_interp.fast_forward.attached_hooks`).
        max_bytes: memory bound of one chunk's cached activations (:func:`analysis_chunk_size`).

    Raises:
        NopeInterpError: fewer than 3 positions; sequences longer than ``n_ctx``; ids outside the vocabulary;
            unknown, repeated or no points; unknown ``forward``; ``max_bytes`` < 1; ``meta`` not a dict; ``task`` or
            ``protocol`` not a string; ``example_prompt`` neither a string nor ``batch`` strings;
            ``forward="fast"`` for a model it does not support or with hooks attached (they would not run);
            ``max_lag`` outside [1, pos - 1];
            non-finite or near-zero activations at a site (the message names it); a sequence whose cosine
            similarity matrix (``8 * pos**2`` bytes, with a temporary) would not fit the free memory; a model
            whose parameters are not of ``cfg.dtype`` (``model.half()``: :func:`~nope_interp.model.check_model_dtype`);
            ``hook_z`` points mixed with residual-stream points in a model with ``n_heads * d_head != d_model``
            (:func:`~nope_interp.activations.check_site_widths`); a model on the meta device.

    Warns:
        DegenerateInputWarning: sequences whose vectors are parallel at every position of a site (one token
            repeated): one warning naming every such site, over all chunks; their counts go into
            ``meta["degenerate_sequences"]`` (``{site: sequences}``, absent when there are none).
    """
    if forward not in FORWARDS:
        raise NopeInterpError(f"unknown forward {forward!r}; allowed: {', '.join(FORWARDS)}")
    max_bytes = check_int("max_bytes", max_bytes, 1, 2**62)
    if meta is not None and not isinstance(meta, dict):
        raise NopeInterpError(f"meta must be a dict of extra result fields or None, got {type(meta).__name__}")
    for name, value in (("task", task), ("protocol", protocol)):
        if not isinstance(value, str):
            raise NopeInterpError(f"{name} must be a string (it is recorded in the result), got "
                                  f"{type(value).__name__}")
    check_model_dtype(model, "analyze_tokens")
    tokens = check_tokens(model, tokens)
    example_texts = _example_texts(example_prompt, tokens.shape[0])
    n_pos = tokens.shape[1]
    if n_pos < 3:
        raise NopeInterpError(f"the adjacency score needs at least 3 positions, got pos={n_pos}")
    if n_pos > model.cfg.n_ctx:
        raise NopeInterpError(f"sequences of {n_pos} tokens exceed the model's n_ctx={model.cfg.n_ctx}")
    # each sequence's cosine similarity matrix is float64 pos x pos, with one temporary of its size: at 65,536
    # tokens 64 GiB, which would fail in torch's allocator with a traceback
    check_fits_memory({"one sequence's cosine similarity matrix and a temporary (float64)": 2 * 8 * n_pos**2}, "cpu",
                      f"the adjacency score of {n_pos}-token sequences", "use shorter sequences")
    points = check_points(points)  # read once: a generator given is used twice below
    labels = tuple(activation_hook_names(model.cfg.n_layers, points))
    check_site_widths(model, labels)
    why = fast_activations_unsupported(model, labels)
    if forward == "fast" and why is not None:
        raise NopeInterpError(f"forward='fast' does not support {why}; use forward='hooked'")
    hooked_at = attached_hooks(model) if forward != "hooked" else []
    if forward == "fast" and hooked_at:
        raise NopeInterpError(f"forward='fast' would not run the hooks attached at {', '.join(hooked_at[:3])}"
                              f"{', ...' if len(hooked_at) > 3 else ''}; use forward='hooked' (or 'auto')")
    fast = forward == "fast" or (forward == "auto" and why is None and not hooked_at)
    if max_lag is not None:
        _check_lag(n_pos, max_lag)
    chunk = analysis_chunk_size(len(labels), n_pos, model.cfg.d_model, max_bytes)
    per_chunk: dict[str, list[Tensor]] = {r: [] for r in REDUCTIONS}
    lag_chunks: list[Tensor] = []
    example_sim = None
    example_index, example_found = 0, False
    keep_mean = n_pos <= EXAMPLE_MAX_POS  # the prompt-averaged matrix: site x pos x pos float64
    sim_sum = torch.zeros(len(labels), n_pos, n_pos, dtype=torch.float64) if keep_mean else None
    if forward == "auto" and why is None and hooked_at and n_pos > EXAMPLE_MAX_POS:
        warnings.warn(f"hooks are attached at {', '.join(hooked_at[:3])}{', ...' if len(hooked_at) > 3 else ''}: "
                      f"analysing {n_pos} positions with the hooked forward, whose memory grows with pos^2 (remove "
                      "the hooks for the fused path)", stacklevel=user_stacklevel())
    # the activations are cast to float32 below: degeneracy is judged at the model's own precision if coarser
    source_dtype = getattr(model.cfg, "dtype", None)
    source_dtype = source_dtype if isinstance(source_dtype, torch.dtype) and source_dtype.is_floating_point else None
    with degenerate_report(f"{task} inputs", tokens.shape[0]) as found:  # one warning in all
        for start in range(0, tokens.shape[0], chunk):  # one chunk of sequences in memory at a time
            toks = tokens[start : start + chunk]
            if fast:
                got = fast_activations(model, toks.to(model.cfg.device), labels)
                acts = torch.stack([got[name].float().cpu() for name in labels])
                del got
            else:
                acts = next(iter_activations(model, toks, points, batch_size=chunk)).acts
            scores_by_site = []
            for i, site in enumerate(labels):  # one site's float64 copies at a time
                got, total = _scores_and_matrix_sum(acts[i], REDUCTIONS, what=f"activations at {site}",
                                                    matrix_sum=sim_sum is not None, source_dtype=source_dtype)
                scores_by_site.append(got)
                if sim_sum is not None:
                    sim_sum[i] += total
            if n_pos <= EXAMPLE_MAX_POS and not example_found:
                # the first sequence with an order to draw at every site, in whichever chunk it comes (sequence 0
                # when only its text was given, or when every sequence is degenerate)
                scored = torch.stack([sc["row_mean"] for sc in scores_by_site]).isfinite().all(dim=0)
                if len(example_texts) == 1 or bool(scored.any()):
                    local = 0 if len(example_texts) == 1 else int(scored.nonzero()[0, 0])
                    example_index, example_found = start + local, True
                    example_sim = cosine_similarity_matrix(acts[:, local])
                elif start == 0:  # the fallback, until a later chunk holds one
                    example_sim = cosine_similarity_matrix(acts[:, 0])
            lag_chunks.append(torch.stack([lag_profile(acts[i], max_lag, what=f"activations at {site}")
                                           for i, site in enumerate(labels)]))
            del acts
            for r in REDUCTIONS:
                per_chunk[r].append(torch.stack([sc[r] for sc in scores_by_site]))
    degenerate = {what.removeprefix("activations at "): n for what, n in found.items()}
    per_sequence = {r: torch.cat(per_chunk[r], dim=1) for r in REDUCTIONS}
    scores = {
        r: {site: summarize(per_sequence[r][i]).to_dict() for i, site in enumerate(labels)} for r in REDUCTIONS
    }
    lags = torch.cat(lag_chunks, dim=1)  # site batch lag
    mean_matrix: dict[str, dict[str, float]] = {}
    if sim_sum is not None:
        mean_sim = (sim_sum / tokens.shape[0]).clamp_(-1.0, 1.0)
        # an averaged matrix constant up to rounding (every prompt's vectors parallel at that site) has no order:
        # NaN, not a score of rounding noise (the per-sequence warning above names the site)
        flat = degenerate_sequences(mean_sim, source_tolerance(torch.float32, source_dtype))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateInputWarning)
            mean_matrix = {r: {site: float("nan") if bool(flat[i]) else float(adjacency_score(mean_sim[i], r))
                               for i, site in enumerate(labels)} for r in ("row_mean", "pooled")}
    return AnalysisResult(task=task, sites=labels, n_prompts=tokens.shape[0], scores=scores,
                          per_sequence=per_sequence, example_prompt=example_texts[example_index],
                          example_sim=example_sim, example_index=example_index,
                          meta={**(meta or {}), **({"degenerate_sequences": degenerate} if degenerate else {})},
                          protocol=protocol,
                          lag_profile={site: lag_summary(lags[i]) for i, site in enumerate(labels)},
                          lag_per_sequence=lags, mean_matrix_scores=mean_matrix, n_pos=int(tokens.shape[1]))


def _example_texts(example_prompt: Any, batch: int) -> tuple[str, ...]:
    """``example_prompt`` of :func:`analyze_tokens` as a tuple: one string (sequence 0's text) or ``batch``."""
    if isinstance(example_prompt, str):
        return (example_prompt,)
    if isinstance(example_prompt, (list, tuple)) and len(example_prompt) == batch \
            and all(isinstance(t, str) for t in example_prompt):
        return tuple(example_prompt)
    if isinstance(example_prompt, (list, tuple)):
        kinds = sorted({type(t).__name__ for t in example_prompt if not isinstance(t, str)})
        got = f"{len(example_prompt)} items" + (f", not all strings ({', '.join(kinds)})" if kinds else "")
    else:
        got = type(example_prompt).__name__
    raise NopeInterpError(f"example_prompt must be a string (the first sequence's text) or one string per "
                          f"sequence ({batch}), got {got}")


def analysis_chunk_size(n_sites: int, n_pos: int, d_model: int, max_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Prompts per chunk of :func:`analyze_model`: as many as keep one chunk's cached activations
    (``n_sites x chunk x n_pos x d_model`` float32) within ``max_bytes``, at least 1 and at most
    :data:`MAX_CHUNK_PROMPTS`."""
    per_prompt = max(1, n_sites * n_pos * d_model * 4)
    return max(1, min(MAX_CHUNK_PROMPTS, max_bytes // per_prompt))


#: What :func:`text_windows_of` and :func:`analyze_text` take as a tokenizer: None (the tasks' character
#: vocabulary, :mod:`tasks.vocab`, what this project's models read), a callable ``str -> ids``, or an object with
#: ``encode`` (a Hugging Face tokenizer: ``encode(text, add_special_tokens=False)``, no BOS inside windows).
Tokenizer = Any


def _unknown_characters(text: str) -> str:
    """Where the first character outside the 96-character vocabulary is (line and column, 1-based) and
    which such characters the text holds: never the text itself (it may be a book)."""
    vocab = set(tasks_pkg.vocab.VOCAB)
    bad = sorted({c for c in text if c not in vocab})
    first = min(text.index(c) for c in bad)
    line = text.count("\n", 0, first) + 1
    col = first - (text.rfind("\n", 0, first) + 1) + 1
    shown = ", ".join(repr(c) for c in bad[:10]) + (", ..." if len(bad) > 10 else "")
    return (f"line {line}, column {col}: character {text[first]!r} is not in the 96-character vocabulary "
            f"({len(bad)} such characters: {shown})")


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    if tokenizer is None:
        if not set(text) <= set(tasks_pkg.vocab.VOCAB):
            raise NopeInterpError(f"{_unknown_characters(text)}: remove or replace them, or analyse with the "
                                  "tokenizer your model reads")
        return tasks_pkg.vocab.encode(text)
    if isinstance(tokenizer, str | os.PathLike | bytes):  # a str has .encode: it is not a tokenizer
        raise NopeInterpError(f"tokenizer must be a tokenizer, not a path or string ({tokenizer!r}); load one from "
                              "a folder with nope_interp.hf.load_hf_tokenizer(path)"[:300])
    try:
        if hasattr(tokenizer, "encode"):
            try:
                ids = tokenizer.encode(text, add_special_tokens=False)
            except TypeError as err:
                if "add_special_tokens" not in str(err):  # the tokenizer's own failure, not the keyword
                    raise
                ids = tokenizer.encode(text)  # an encode without that keyword
        elif callable(tokenizer):
            ids = tokenizer(text)
        else:
            ids = None
    except NopeInterpError:
        raise
    except Exception as err:  # the user's tokenizer failed: say so in one line, whatever it raised
        raise NopeInterpError(f"the tokenizer failed on the text: {type(err).__name__}: {err}"[:300]) from None
    if ids is None and not callable(tokenizer):
        raise NopeInterpError(f"tokenizer must be None, a callable str -> ids or an object with encode(), "
                              f"got {type(tokenizer).__name__}")
    if hasattr(ids, "ids"):  # a `tokenizers` Encoding
        ids = ids.ids
    if hasattr(ids, "tolist"):  # a tensor or numpy array
        ids = ids.tolist()
    if not isinstance(ids, list | tuple):
        raise NopeInterpError(f"the tokenizer must return a flat sequence of integer token ids, got "
                              f"{type(ids).__name__}")
    out = []
    for i in ids:
        if not is_int(i):
            raise NopeInterpError(f"the tokenizer must return a flat sequence of integer token ids, got an element "
                                  f"of type {type(i).__name__}")
        if not 0 <= int(i) < 2**62:
            raise NopeInterpError(f"the tokenizer returned the id {int(i)}: token ids are >= 0")
        out.append(int(i))
    return out


def text_windows_of(texts: str | list[str] | tuple[str, ...], length: int, n_windows: int | None = None,
                    tokenizer: Tokenizer = None) -> Int[Tensor, "n length"]:
    """Equal-length token windows of human-written text, for :func:`analyze_tokens`: each text is tokenised
    on its own and cut into consecutive, non-overlapping windows of ``length`` tokens from its start (a
    window never spans two texts; the remainder of each text is dropped), texts in the order given, at most
    ``n_windows`` windows in all (None: every window).

    Args:
        texts: one string or a list of strings (documents).
        length: tokens per window, >= 3. n_windows: >= 1 or None.
        tokenizer: see :data:`Tokenizer`.

    Raises:
        NopeInterpError: no text, a bad ``length`` or ``n_windows``, a tokenizer that is not one or returns
            something other than integer ids, a character outside the vocabulary (default tokenizer), or
            no text with ``length`` tokens (the message gives the longest).

    Method: this project's input protocol for models without a task (``docs/method.md``, "Analysis inputs");
    the paper analysed task prompts only.
    """
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list | tuple) or not texts or not all(isinstance(t, str) for t in texts):
        raise NopeInterpError("texts must be a string or a non-empty list or tuple of strings (documents, in order)")
    if not is_int(length) or length < 3:
        raise NopeInterpError(f"length must be an integer >= 3 (tokens per window), got {length!r}")
    if n_windows is not None and (not is_int(n_windows) or n_windows < 1):
        raise NopeInterpError(f"n_windows must be an integer >= 1 or None, got {n_windows!r}")
    length, n_windows = int(length), None if n_windows is None else int(n_windows)
    windows: list[list[int]] = []
    longest = 0
    for text in texts:
        ids = _encode(tokenizer, text)
        longest = max(longest, len(ids))
        for start in range(0, len(ids) - length + 1, length):
            windows.append(ids[start : start + length])
            if n_windows is not None and len(windows) == n_windows:
                return torch.tensor(windows, dtype=torch.long)
    if not windows:
        raise NopeInterpError(f"no text has {length} tokens (the longest has {longest}): give longer texts or "
                              "a smaller length")
    return torch.tensor(windows, dtype=torch.long)


#: The keyword arguments :func:`analyze_text` passes on to :func:`analyze_tokens` (its keyword-only ones).
ANALYZE_TEXT_KWARGS = ("max_lag", "task", "example_prompt", "meta", "protocol", "forward", "max_bytes")


def analyze_text(model: LensModel, texts: str | list[str] | tuple[str, ...], length: int,
                 n_windows: int | None = 256, tokenizer: Tokenizer = None,
                 points: tuple[str, ...] = ACTIVATION_POINTS, **kwargs: Any) -> AnalysisResult:
    """:func:`analyze_tokens` on windows of human-written text (:func:`text_windows_of`): the adjacency
    analysis of any model on natural text, tokenised by the tokenizer it reads. The result's ``task`` is
    ``"text"`` and its ``protocol`` ``"text"`` unless given; ``example_prompt`` is the first window decoded
    when the tokenizer can decode (the default one can).

    Args:
        model: a HookedTransformer or a TransformerBridge (``n_ctx >= length``).
        texts, length, n_windows, tokenizer: as :func:`text_windows_of` (default 256 windows, as the paper's
            256 prompts).
        points, kwargs: as :func:`analyze_tokens` (:data:`ANALYZE_TEXT_KWARGS`: ``max_lag``, ``meta``,
            ``forward``, ...).

    Raises:
        NopeInterpError: a keyword argument :func:`analyze_tokens` does not take, before any work; everything
            :func:`text_windows_of` and :func:`analyze_tokens` raise (ids outside the model's vocabulary among
            them: a tokenizer that is not the model's); no ``tokenizer`` for a model
            that does not read the toolkit's character vocabulary (a ``TransformerBridge``, or a ``d_vocab``
            other than ``tasks.D_VOCAB``): its ids would be analysed as if they were that model's tokens.

    Warns:
        DegenerateInputWarning: as :func:`analyze_tokens` (a text of one repeated character, say).

    Method: the adjacency score and lag profile of ``docs/method.md`` ("Definitions"), on the inputs of
    "Analysis inputs" (natural text instead of task prompts, a direction the paper names as future work).
    """
    unknown = sorted(set(kwargs) - set(ANALYZE_TEXT_KWARGS))
    if unknown:  # before any windowing or forward pass (a raw TypeError otherwise, after the text is cut)
        raise NopeInterpError(f"analyze_text: unknown keyword argument(s) {', '.join(unknown)}; allowed: "
                              f"{', '.join(ANALYZE_TEXT_KWARGS)} (passed on to analyze_tokens)")
    check_model(model)
    if tokenizer is None and (not isinstance(model, HookedTransformer) or model.cfg.d_vocab != tasks_pkg.D_VOCAB):
        raise NopeInterpError(
            f"analyze_text: give the model's own tokenizer (tokenizer=...): without one the text is encoded with the "
            f"toolkit's {tasks_pkg.D_VOCAB}-character vocabulary, which this {type(model).__name__} (d_vocab="
            f"{model.cfg.d_vocab}) does not read (nope_interp.hf.load_hf_tokenizer loads a saved one)")
    tokens = text_windows_of(texts, length, n_windows, tokenizer)
    kwargs.setdefault("task", "text")
    kwargs.setdefault("protocol", "text")
    if "example_prompt" not in kwargs:  # every window's text: the heatmap draws the first with an order
        kwargs["example_prompt"] = [decode_window(window, tokenizer)[:200] for window in tokens]
    return analyze_tokens(model, tokens, points, **kwargs)


def decode_window(window: Int[Tensor, " pos"], tokenizer: Tokenizer = None) -> str:
    """The text of one window of :func:`text_windows_of` by the same tokenizer ("" when it cannot decode)."""
    try:
        if tokenizer is None:
            return tasks_pkg.vocab.decode(window.tolist())
        text = tokenizer.decode(window.tolist()) if hasattr(tokenizer, "decode") else ""
        return text if isinstance(text, str) else ""
    except Exception:  # noqa: BLE001 - a decode that fails only loses the example text
        return ""
