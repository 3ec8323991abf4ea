"""``nope-interp ablate``: accuracy and loss lost when the positional structure is scrambled or removed.

For each trained model and its task: estimate the positional means mu at each ablated site on held-out
full-length prompts (disjoint from the training prompts and from the evaluation prompts), then apply
each ablation of :mod:`nope_interp.ablations` at that site and measure exact match (greedy decoding),
answer-token loss (teacher forcing) and the adjacency score at every site, against the clean baseline.
A model trained with the packed objective reads every prompt after the newline it was evaluated with in
training (its run's ``eval_prefix``); that position is then part of the prompt positions ablated and scored.

``protocol`` chooses the inputs of a task model (``docs/method.md``, "Analysis inputs"). ``full`` (default) is
the above. Under ``authors`` or ``window`` every input is a context of the protocol's length built its way
(``tasks.protocol_examples``: a held-out prompt left-padded with newlines, or ``window`` characters of
newline-joined held-out lines ending with a complete prompt): mu is estimated on the protocol's analysis
inputs (``tasks.protocol_inputs``), every position of the context is ablated, and exact match and answer loss
are read on the answer after the context, the adjacency scores on the protocol's inputs. No evaluation
prefix is added (the context holds its own newlines). Under ``window``, position means position in the window,
not in the prompt: the ablations then remove the absolute position of the window, which a prompt's own
structure does not share.
Before ablating, each site is split into positional mean and content part
(:func:`nope_interp.ablations.positional_decomposition`: variance share and adjacency of each part; the
mean decomposition of Song & Zhong, arXiv 2310.04861). The rank curve: exact match with the top-r
positional subspace projected out, beside the same with random subspaces of rank r (several draws:
mean and spread) and with the top-r principal directions of the content part h - mu (as much variance as
directions outside position hold: the control a random subspace, holding about r / d_model of it, is not).
Runs of the same task (the shipped seeds) are summarised by mean, std and 95% CI
(:func:`nope_interp.stats.mean_std_ci`). The method is described in ``docs/method.md``.

A character-level language model of ``nope-interp train-text`` (task ``text``) has no answers to match: its
``exact_match`` is the next-character accuracy (greedy top-1 over every position) and its ``answer_loss`` the
next-character cross-entropy in nats (bits per character x ln 2), on windows of its training length from
the held-out plays; mu and the adjacency scores come from other held-out windows of that length (random
offsets, so a window may overlap another).

Writes ``results/ablate/{ablate.json, ablate.csv, ablate_seeds.csv, ablate_seeds.md,
ablate_decomposition.csv}`` and ``figures/ablate/ablations.html`` (plus ``ablations_seeds.html`` when
some task has two or more runs); under a protocol other than ``full`` every name ends in
``_<protocol_tag>`` (``ablate_authors.json``, ``ablations_window48.html``).
"""

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.ablations import (
    ABLATIONS,
    ResidHook,
    ablation_hook,
    content_subspace,
    positional_decomposition,
    positional_means,
    positional_subspace,
    random_subspace,
)
from nope_interp.analysis import analyze_tokens, protocol_prompts
from nope_interp.config import FrozenConfig, check_choice, check_int, check_used, opt
from nope_interp.errors import Fields, Message, NopeInterpError
from nope_interp.evaluate import answer_loss, exact_match_accuracy
from nope_interp.hooks import hook_name, short_label
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    draw_seed,
    emit,
    entry_tokens,
    eval_prefix,
    job_models,
    keyed_generator,
    locked_write,
    progress,
    protocol_tag,
    protocol_window,
    run_path,
    shipped_entries,
    text_task_name,
    with_protocol,
)
from nope_interp.model import evaluates
from nope_interp.plotting import line_mode, save_figure, with_plotlyjs
from nope_interp.stats import SeedStats, error_bar, fmt_mean_std, mean_std_ci
from tasks import DEFAULT_WINDOW

NAME = "ablate"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
TAKES_TEXT = True  # train-text language models: next-character accuracy on held-out text
DEFAULT_MODELS = "the four shipped models; --with-seeds adds their extra shipped seeds"
#: Not --with-candidates: the seed statistics pool every model of a task as seeds of one recipe, and the
#: candidates are other recipes (packed and paper-lr runs among them; give them with --run to ablate them).
SOURCES = ("run", "pretrained", "init", "task", "n_digits", "preset", "with_seeds")

#: The ablations, in table order (those of :mod:`nope_interp.ablations`).
KINDS = ABLATIONS
#: One colour per ablation kind, shared by the per-run and the seed figures.
KIND_COLORS = dict(zip(KINDS, ["#d62728", "#ff7f0e", "#1f77b4", "#aec7e8", "#7f7f7f", "#2ca02c", "#ffbb78",
                              "#9edae5"], strict=True))
#: The rank curve's content line: a darker shade of ``project_out_content``'s bars, apart from the positional blue.
CONTENT_LINE_COLOR = "#0e7c86"
#: The scores of a site's position/content decomposition that are averaged over seeds.
DECOMPOSITION_KEYS = ("positional_variance_fraction", "adjacency_full", "adjacency_positional", "adjacency_content")
#: The rank of every ``project_out*`` ablation in the per-site table when ``rank`` is not given.
DEFAULT_RANK = 4
#: Seeds of the prompt samplers: evaluation prompts, prompts for mu, prompts for the adjacency scores.
EVAL_SEED, MU_SEED, ANALYSIS_SEED = 11, 12, 3


@dataclass(frozen=True)
class AblateConfig(FrozenConfig):
    """Settings of ``ablate``.

    Raises:
        NopeInterpError: an empty or negative ``layers``; an unknown or empty ``kinds``; ``rank`` or a
            ``ranks`` entry negative, or ``ranks`` empty; ``rank`` given while ``kinds`` has no ``project_out*``
            kind (it would be ignored); ``n_random``, ``n_eval`` or ``n_analysis`` below 1
            (below 2 with ``swap_prompts``); ``n_mu`` below 2; an unknown ``protocol``; ``window`` outside
            [3, 1000000] (one too short to hold a newline and the task's longest prompt is refused once the
            models are known, naming the least that can), or set (even to 64) without protocol ``window``.
    """

    layers: tuple[int, ...] | None = opt(None, "ablate blocks.L.hook_resid_pre for these L (default: every layer "
                                               "after the first, plus the last resid_post)")
    kinds: tuple[str, ...] | None = opt(None, "ablations (default all): shuffle_positional and mean_positional "
                                              "(position scrambled / removed, content kept; matched control: "
                                              "mean_positional_random, a shift of the same size in a random "
                                              "direction), project_out (the rank-r positional subspace; matched "
                                              "controls: project_out_random, project_out_content), shuffle_vectors "
                                              "(a floor: destroys everything), swap_prompts (position kept, "
                                              "content destroyed)")
    rank: int | None = opt(None, f"rank of the project_out* kinds in the per-site table (default {DEFAULT_RANK}; "
                                 "only with a project_out* kind)")
    ranks: tuple[int, ...] = opt((0, 1, 2, 4, 8, 16), "ranks of the rank curve (ranks above pos - 1 are skipped)")
    n_random: int = opt(3, "random-subspace draws per rank")
    n_eval: int = opt(200, "held-out prompts scored (under --protocol authors/window: contexts ending in one)")
    n_mu: int = opt(256, "prompts to estimate the positional means")
    n_analysis: int = opt(48, "prompts for the adjacency scores under each ablation")
    protocol: str = opt("full", f"inputs of task models: {', '.join(tasks_pkg.PROTOCOLS)} (docs/method.md)")
    window: int | None = opt(None, "characters per context of the window protocol (default: the longest that fits "
                                   f"every model's n_ctx with the answer, at most {DEFAULT_WINDOW})")

    def __post_init__(self) -> None:
        if self.layers is not None:
            if not self.layers:
                raise NopeInterpError("layers must not be empty (None: the default sites)")
            for layer in self.layers:
                check_int("layers", layer, 0, 10_000)
        if self.kinds is not None:
            if not self.kinds:
                raise NopeInterpError(f"kinds must not be empty (None: all); allowed: {', '.join(KINDS)}")
            for k in self.kinds:
                if k not in KINDS:
                    raise NopeInterpError(f"kinds: unknown ablation {k!r}; allowed: {', '.join(KINDS)}")
        if self.rank is not None:
            check_int("rank", self.rank, 0, 100_000)   # 0 removes nothing: an identity control, stated in the outputs
        check_used("rank", self.rank, None, any(k.startswith("project_out") for k in self.kinds_used),
                   "with a project_out* ablation among the {kinds} (the rank curve has its own ranks)")
        if not self.ranks:
            raise NopeInterpError("ranks must not be empty")
        for r in self.ranks:
            check_int("ranks", r, 0, 100_000)
        check_int("n_random", self.n_random, 1, 10_000)
        check_int("n_eval", self.n_eval, 1, 10**6)
        check_int("n_mu", self.n_mu, 2, 10**6)
        check_int("n_analysis", self.n_analysis, 1, 100_000)
        if "swap_prompts" in self.kinds_used and min(self.n_eval, self.n_analysis) < 2:
            raise NopeInterpError.naming("swap_prompts gives each prompt another prompt's vectors: it needs {n_eval} "
                                         "and {n_analysis} >= 2, got {a} and {b}; raise them or leave swap_prompts "
                                         "out of {kinds}", a=self.n_eval, b=self.n_analysis)
        check_choice("protocol", self.protocol, tasks_pkg.PROTOCOLS)
        if self.window is not None:
            check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, None, self.protocol == "window", "with {protocol} window")

    @property
    def window_used(self) -> int:
        """The ``window`` argument of the protocol helpers: ``window`` under the window protocol (once
        :func:`run` has resolved a default of None), :data:`tasks.DEFAULT_WINDOW` otherwise."""
        return protocol_window(self.protocol, self.window or DEFAULT_WINDOW)

    @property
    def kinds_used(self) -> tuple[str, ...]:
        """The ablations run: ``kinds``, or all of :data:`KINDS` when it is None."""
        return KINDS if self.kinds is None else tuple(self.kinds)

    @property
    def rank_used(self) -> int | None:
        """``rank`` (:data:`DEFAULT_RANK` when None) when an ablation run projects out a subspace (a kind named
        ``project_out*``), else None: the rank then applies to nothing (the rank curve has its own ``ranks``)."""
        if not any(k.startswith("project_out") for k in self.kinds_used):
            return None
        return DEFAULT_RANK if self.rank is None else self.rank


CONFIG = AblateConfig


@dataclass(frozen=True)
class Measurement:
    """One model measured clean or under one ablation.

    Attributes:
        exact_match: fraction in [0, 1] of the evaluation prompts whose greedy answer is entirely right.
        answer_loss: mean cross-entropy over the answer tokens (nats, >= 0), teacher-forced.
        adjacency: row-mean adjacency score in [0, 1] (mean over prompts) at every hook site, by full hook
            name; empty where it was not measured.
    """

    exact_match: float
    answer_loss: float
    adjacency: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"exact_match", "answer_loss", "adjacency": {site: score}}``."""
        return {"exact_match": self.exact_match, "answer_loss": self.answer_loss, "adjacency": dict(self.adjacency)}


@dataclass(frozen=True)
class Decomposition:
    """A site of the clean model split into positional mean and content part
    (:func:`nope_interp.ablations.positional_decomposition`), or why that could not be done.

    Attributes:
        site: full hook name.
        positional_variance_fraction: share in [0, 1] of the activation variance explained by position.
        adjacency_full, adjacency_positional, adjacency_content: adjacency scores in [0, 1] of h, of the
            positional means mu and of the content h - mu.
        dropped_positions: positions left out (content zero in some prompt). n_prompts: prompts used.
        error: why the decomposition is missing (a degenerate model), else None; the scores are then NaN.
    """

    site: str
    positional_variance_fraction: float = math.nan
    adjacency_full: float = math.nan
    adjacency_positional: float = math.nan
    adjacency_content: float = math.nan
    dropped_positions: tuple[int, ...] = ()
    n_prompts: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the decomposition was computed."""
        return self.error is None

    def value(self, key: str) -> float:
        """One of the :data:`DECOMPOSITION_KEYS` scores."""
        if key not in DECOMPOSITION_KEYS:
            raise NopeInterpError(f"unknown decomposition key {key!r}; allowed: {', '.join(DECOMPOSITION_KEYS)}")
        return float(getattr(self, key))

    def to_dict(self) -> dict[str, Any]:
        """The scores, ``dropped_positions`` and ``n_prompts``; or ``{"error": message}``."""
        if self.error is not None:
            return {"error": self.error}
        return {**{k: getattr(self, k) for k in DECOMPOSITION_KEYS},
                "dropped_positions": list(self.dropped_positions), "n_prompts": self.n_prompts}


@dataclass(frozen=True)
class SiteAblation:
    """Every ablation at one site: the clean decomposition there and a measurement per ablation kind."""

    site: str
    decomposition: Decomposition
    ablations: Mapping[str, Measurement]


@dataclass(frozen=True)
class RankPoint:
    """One point of the rank curve.

    Attributes:
        rank: dimensions projected out. positional: exact match in [0, 1] with the top-``rank`` positional
            subspace removed. random_draws: exact match with a random subspace of that rank removed, one
            per draw; random_mean, random_std: their mean and sample std (0.0 for one draw). content: exact
            match with the top-``rank`` principal directions of the content part h - mu removed
            (:func:`~nope_interp.ablations.content_subspace`: the variance-rich control; NaN where the content
            part spans fewer than ``rank`` directions, and by default when not measured).
    """

    rank: int
    positional: float
    random_mean: float
    random_std: float
    random_draws: tuple[float, ...]
    content: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """``{"rank", "positional", "random_mean", "random_std", "random_draws", "content"}``."""
        return {"rank": self.rank, "positional": self.positional, "random_mean": self.random_mean,
                "random_std": self.random_std, "random_draws": list(self.random_draws), "content": self.content}


@dataclass(frozen=True)
class RankCurve:
    """The rank curve at ``site``: ``points`` for the ranks <= ``max_rank`` (the centred means span at most
    min(pos - 1, d_model) directions); ``skipped_ranks`` were asked for but exceed it."""

    site: str
    points: tuple[RankPoint, ...]
    max_rank: int
    skipped_ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """``{"site", "points": [...], "max_rank", "skipped_ranks"}``."""
        return {"site": self.site, "points": [p.to_dict() for p in self.points], "max_rank": self.max_rank,
                "skipped_ranks": list(self.skipped_ranks)}


@dataclass(frozen=True)
class RunAblation:
    """Every ablation of one model.

    Attributes:
        label: the model's label (:attr:`ModelEntry.label`). run: its directory (a task run's or a
            ``train-text`` run's) as an absolute path, symlinks resolved (:func:`run_path`), for every kind of
            model alike; None for an initialised model. run_name: the name in tables (``shipped`` for a shipped
            model, else the directory name).
        model_seed: the model's init seed. task: task name. n_eval, n_mu: prompts evaluated and used for mu.
        rank: rank of the ``project_out*`` kinds in the site table; None when no such kind ran (it applies to
            nothing then). clean: the unablated model.
        sites: the ablated sites in order. rank_curve: the rank curve at the first site.
        metric: what ``exact_match`` measures: ``exact_match`` (task answers) or ``next_char_accuracy``
            (a ``train-text`` language model, task ``text``).
        eval_prefix: the text read before every prompt (:func:`~nope_interp.jobs.common.eval_prefix`: ``"\\n"``
            for a model trained with the packed objective); its positions are ablated and scored with the rest.
            Only under protocol ``full``: the other protocols' contexts hold their own newlines.
        protocol: the inputs (``full``, ``authors``, ``window``; ``text`` for a ``train-text`` model).
        window: characters per input of the ``window`` protocol (:data:`tasks.DEFAULT_WINDOW` otherwise).
        recipe: the model's recipe settings as JSON (all but the seeds; runs are pooled over seeds only when
            equal). draw_seed: the seed of its random draws (:func:`model_draw_seed`); each draw has its own
            generator keyed by it and by the site and kind (the rank curve: site, ``rank_curve`` and the rank;
            :func:`~nope_interp.jobs.common.keyed_generator`), so a kind's draw is the same whichever other kinds
            and sites are measured (files written before 2026-12-04 drew with one generator for all, in order).
    """

    label: str
    run: str | None
    run_name: str
    model_seed: int
    task: str
    n_eval: int
    n_mu: int
    rank: int | None
    clean: Measurement
    sites: tuple[SiteAblation, ...]
    rank_curve: RankCurve
    metric: str = "exact_match"
    eval_prefix: str = ""
    protocol: str = "full"
    window: int = DEFAULT_WINDOW
    recipe: str = ""
    draw_seed: int = 0

    def site(self, name: str) -> SiteAblation:
        """The ablations at site ``name``. Raises NopeInterpError if it was not ablated."""
        for s in self.sites:
            if s.site == name:
                return s
        raise NopeInterpError(f"site {name!r} was not ablated; ablated: {', '.join(s.site for s in self.sites)}")

    def accuracy_lost(self, site: str, kind: str) -> float:
        """Clean exact match minus exact match under ablation ``kind`` at ``site`` (in [-1, 1])."""
        return self.clean.exact_match - self.site(site).ablations[kind].exact_match

    def to_dict(self) -> dict[str, Any]:
        """The run's entry of ``ablate.json`` (``results[i]``); ``rank`` is null when no ``project_out*`` kind
        ran."""
        return {"task": self.task, "n_eval": self.n_eval, "n_mu": self.n_mu, "rank": self.rank,
                "clean": self.clean.to_dict(),
                "sites": {s.site: {k: m.to_dict() for k, m in s.ablations.items()} for s in self.sites},
                "decomposition": {s.site: s.decomposition.to_dict() for s in self.sites},
                "rank_curve": self.rank_curve.to_dict(), "run": self.run, "model_seed": self.model_seed,
                "metric": self.metric, "eval_prefix": self.eval_prefix, "protocol": self.protocol,
                **({"window": self.window} if self.protocol == "window" else {}),
                "recipe": json.loads(self.recipe) if self.recipe else {}, "draw_seed": self.draw_seed}

    def table_rows(self) -> list[dict[str, Any]]:
        """``ablate.csv`` rows: the clean model, then one per site and ablation (deltas against clean); the
        last columns say what ``exact_match`` holds (``metric``: ``next_char_accuracy`` for a text model) and the
        seed of the run's random draws (``draw_seed``), so a row can be redrawn."""
        clean = self.clean
        rows = [{"run": self.run, "task": self.task, "site": "-", "ablation": "clean",
                 "exact_match": clean.exact_match, "accuracy_loss": 0.0, "answer_loss": clean.answer_loss,
                 "loss_increase": 0.0, "eval_prefix": escaped(self.eval_prefix), "metric": self.metric,
                 "draw_seed": self.draw_seed}]
        for s in self.sites:
            for kind, m in s.ablations.items():
                rows.append({"run": self.run, "task": self.task, "site": s.site, "ablation": kind,
                             "exact_match": m.exact_match, "accuracy_loss": clean.exact_match - m.exact_match,
                             "answer_loss": m.answer_loss, "loss_increase": m.answer_loss - clean.answer_loss,
                             "eval_prefix": escaped(self.eval_prefix), "metric": self.metric,
                             "draw_seed": self.draw_seed})
        return rows

    def decomposition_rows(self) -> list[dict[str, Any]]:
        """``ablate_decomposition.csv`` rows: one per site (its scores, or its ``error``), with the seed of the
        run's random draws (``draw_seed``)."""
        return [{"run": self.run, "task": self.task, "site": s.site,
                 **{k: (" ".join(map(str, v)) if isinstance(v, list) else v)
                    for k, v in s.decomposition.to_dict().items()}, "eval_prefix": escaped(self.eval_prefix),
                 "draw_seed": self.draw_seed}
                for s in self.sites]


@dataclass(frozen=True)
class SiteLossStats:
    """Accuracy lost at ``site`` over seeds: a :class:`SeedStats` per ablation kind."""

    site: str
    by_kind: Mapping[str, SeedStats]


@dataclass(frozen=True)
class SeedRankPoint:
    """Exact match at one rank of the rank curve over seeds: positional subspace, random (the mean over
    draws of each run) and top content directions removed."""

    rank: int
    positional: SeedStats
    random: SeedStats
    content: SeedStats


@dataclass(frozen=True)
class SeedDecomposition:
    """The clean decomposition of ``site`` over seeds (only sites where every run has one)."""

    site: str
    positional_variance_fraction: SeedStats
    adjacency_full: SeedStats
    adjacency_positional: SeedStats
    adjacency_content: SeedStats

    def to_dict(self) -> dict[str, Any]:
        """``{key: stats}`` for the :data:`DECOMPOSITION_KEYS`."""
        return {k: getattr(self, k).to_dict() for k in DECOMPOSITION_KEYS}


@dataclass(frozen=True)
class TaskSeedSummary:
    """The runs of one task summarised over seeds (mean, sample std, 95% Student-t CI).

    Attributes:
        task: task name. runs: the run directories (None for an initialised model); run_names: their names.
        clean_exact_match: of the unablated models. accuracy_loss: per site present in every run.
        rank_curve: per rank present in every run. decomposition: per site decomposed in every run.
        eval_prefix: the text every run of the group read before its prompts (runs of one task with
            different prefixes, e.g. packed and answer-only models, have different prompt positions and
            are summarised apart).
        protocol, window: the inputs every run of the group read (:attr:`RunAblation.protocol`, ``window``).
        rank: the rank of the ``project_out*`` kinds in ``accuracy_loss`` (:attr:`RunAblation.rank`; None when
            no such kind ran).
    """

    task: str
    runs: tuple[str | None, ...]
    run_names: tuple[str, ...]
    clean_exact_match: SeedStats
    accuracy_loss: tuple[SiteLossStats, ...]
    rank_curve: tuple[SeedRankPoint, ...]
    decomposition: tuple[SeedDecomposition, ...]
    eval_prefix: str = ""
    protocol: str = "full"
    window: int = DEFAULT_WINDOW
    rank: int | None = None

    @property
    def group(self) -> str:
        """The group's name in tables and ``ablate.json``: the task, plus the prefix when there is one
        (``addition (prompts after '\\n')``) and the protocol when it is ``authors`` or ``window``
        (``addition (window inputs of 44 characters)``)."""
        name = self.task if not self.eval_prefix else f"{self.task} (prompts after {self.eval_prefix!r})"
        if self.protocol in ("full", "text"):
            return name
        return f"{name} ({self.protocol} inputs{f' of {self.window} characters' if self.protocol == 'window' else ''})"

    @property
    def n_seeds(self) -> int:
        """Number of runs."""
        return self.clean_exact_match.n_seeds

    def to_dict(self) -> dict[str, Any]:
        """The task's entry of ``seed_summary`` in ``ablate.json``."""
        return {"runs": list(self.runs), "clean_exact_match": self.clean_exact_match.to_dict(),
                "accuracy_loss": {s.site: {k: st.to_dict() for k, st in s.by_kind.items()} for s in self.accuracy_loss},
                "rank_curve": {str(p.rank): {"positional": p.positional.to_dict(), "random": p.random.to_dict(),
                                             "content": p.content.to_dict()} for p in self.rank_curve},
                "decomposition": {d.site: d.to_dict() for d in self.decomposition}, "eval_prefix": self.eval_prefix,
                "protocol": self.protocol, "rank": self.rank}


@dataclass(frozen=True)
class AblateResult:
    """What ``ablate`` measured: one :class:`RunAblation` per model, the per-task seed summary and the
    wall time in seconds."""

    config: AblateConfig
    runs: tuple[RunAblation, ...]
    seed_summary: tuple[TaskSeedSummary, ...]
    wall_time_s: float

    @property
    def protocol(self) -> str:
        """The inputs named at the top of ``ablate.json``: the task models' protocol (``config.protocol``), or
        ``text`` when every model is a ``train-text`` model (no task protocol applies; each result also names
        its own inputs, a text model's as ``text``)."""
        if self.runs and all(r.protocol == "text" for r in self.runs):
            return "text"
        return self.config.protocol

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``ablate.json`` (without provenance): ``{"results": [...], "seed_summary": {group:
        ...}, "protocol", ["window"]}`` (:attr:`TaskSeedSummary.group`; ``protocol`` is :attr:`protocol`: the task
        models' inputs, ``text`` without task models; each result also names its own)."""
        protocol = self.protocol
        return {"results": [r.to_dict() for r in self.runs],
                "seed_summary": {s.group: s.to_dict() for s in self.seed_summary}, "protocol": protocol,
                **({"window": self.config.window} if protocol == "window" else {})}


def escaped(prefix: str) -> str:
    """``prefix`` with backslash escapes (a newline as the two characters ``\\n``), for CSV cells."""
    return prefix.encode("unicode_escape").decode("ascii")


def default_sites(n_layers: int) -> list[str]:
    """``hook_resid_pre`` of every layer after the first (where the adjacency pattern exists), and the last
    ``hook_resid_post``."""
    return [hook_name("resid_pre", layer) for layer in range(1, n_layers)] + [hook_name("resid_post", n_layers - 1)]


def ablation_sites(config: AblateConfig, n_layers: int) -> list[str]:
    """The sites ablated in a model of ``n_layers`` layers: ``blocks.L.hook_resid_pre`` for the ``layers`` of
    ``config``, else :func:`default_sites`.

    Raises:
        NopeInterpError: a layer outside [0, n_layers).
    """
    if config.layers is None:
        return default_sites(n_layers)
    outside = [layer for layer in config.layers if layer >= n_layers]
    if outside:
        raise NopeInterpError(f"layers lists {outside[0]}, outside a model of n_layers={n_layers} "
                              f"(0..{n_layers - 1})")
    return [hook_name("resid_pre", layer, n_layers=n_layers) for layer in config.layers]


def default_models(config: AblateConfig) -> list[ModelEntry]:
    """The shipped trained model of every task."""
    return shipped_entries(tasks_pkg.TASK_NAMES)


@evaluates
@torch.no_grad()
def _site_acts(model: HookedTransformer, tokens: Int[Tensor, "batch pos"],
               site: str) -> Float[Tensor, "batch pos d_model"]:
    _, cache = model.run_with_cache(tokens, names_filter=site, return_type=None)
    return cache[site]


Hooks = list[tuple[str, ResidHook]]


@dataclass(frozen=True)
class _Inputs:
    """What one model is ablated on: ``measure(hooks, with_scores)``, the tokens for mu, and names."""

    measure: Callable[[Hooks, bool], Measurement]
    mu_tokens: Tensor
    n_eval: int
    task: str
    metric: str
    prefix: str = ""
    protocol: str = "full"


def _task_inputs(entry: ModelEntry, config: AblateConfig) -> _Inputs:
    model, task = entry.model, entry.task
    protocol, window = config.protocol, config.window_used
    prefix = eval_prefix(entry) if protocol == "full" else ""
    try:
        examples = tasks_pkg.protocol_examples(task, protocol, config.n_eval, EVAL_SEED, entry.train_prompts, window)
    except tasks_pkg.TaskError as err:  # too few held-out prompts that fit, a window too short for a prompt
        raise NopeInterpError.naming("{label}: the {n} evaluation prompts ({n_eval}): {why}", label=entry.label,
                                     n=config.n_eval, why=str(err)) from None
    # the final prompts of the evaluation contexts, kept out of the inputs mu is estimated on
    used = frozenset(ex.prompt.rsplit("\n", 1)[-1] for ex in examples)
    try:
        mu_inputs = protocol_prompts(model, task, config.n_mu, MU_SEED, entry.train_prompts | used, protocol, window)
    except NopeInterpError as err:
        raise NopeInterpError.naming("{label}: the {n} inputs for the positional means ({n_mu}), drawn outside the "
                                     "{used} evaluation prompts ({n_eval}): {why}", label=entry.label, n=config.n_mu,
                                     used=len(used), why=str(err)) from None
    return _Inputs(measure=lambda hooks, scores: _measure(model, task, examples, config.n_analysis, hooks, scores,
                                                          exclude=entry.train_prompts, prefix=prefix,
                                                          protocol=protocol, window=window),
                   mu_tokens=task.prompt_tokens([prefix + p for p in mu_inputs]), n_eval=len(examples),
                   task=task.name, metric="exact_match", prefix=prefix, protocol=protocol)


def _text_inputs(entry: ModelEntry, config: AblateConfig) -> _Inputs:
    from nope_interp.text_train import eval_tokens

    windows = eval_tokens(config.n_eval, int(entry.source["text_window"]))
    mu_tokens = entry_tokens(entry, config.n_mu, MU_SEED)[2]  # held-out windows of the training length
    analysis = entry_tokens(entry, config.n_analysis, ANALYSIS_SEED)[2]
    return _Inputs(measure=lambda hooks, scores: _measure_text(entry.model, windows, analysis, hooks, scores),
                   mu_tokens=mu_tokens, n_eval=windows.shape[0], task=text_task_name(entry),
                   metric="next_char_accuracy", protocol="text")



@torch.no_grad()
def _measure_text(model: HookedTransformer, windows: Int[Tensor, "batch length_plus_1"],
                  analysis: Int[Tensor, "n pos"], hooks: Hooks, with_scores: bool = True,
                  batch_size: int = 32) -> Measurement:
    """Next-character accuracy (greedy top-1 over every position), cross-entropy in nats and (``with_scores``)
    the adjacency scores on ``analysis``, with ``hooks`` attached."""
    correct, nll, count = 0, 0.0, 0
    with model.hooks(fwd_hooks=hooks):
        for i in range(0, windows.shape[0], batch_size):
            rows = windows[i : i + batch_size].to(model.cfg.device)
            logits = model(rows[:, :-1], return_type="logits")
            correct += int((logits.argmax(-1) == rows[:, 1:]).sum())
            nll += F.cross_entropy(logits.flatten(0, 1).double(), rows[:, 1:].flatten(), reduction="sum").item()
            count += rows[:, 1:].numel()
        scores = (analyze_tokens(model, analysis, task="text", forward="hooked").scores["row_mean"]
                  if with_scores else {})
    return Measurement(exact_match=correct / count, answer_loss=nll / count,
                       adjacency={s: v["mean"] for s, v in scores.items()})


@evaluates
def _measure(model: HookedTransformer, task: tasks_pkg.Task, examples: Sequence[tasks_pkg.Example],
             n_analysis: int, hooks: list[tuple[str, ResidHook]], with_scores: bool = True,
             exclude: frozenset[str] = frozenset(), prefix: str = "", protocol: str = "full",
             window: int = DEFAULT_WINDOW) -> Measurement:
    """Exact match, answer loss and (``with_scores``) the adjacency scores with ``hooks`` attached (scores on
    ``n_analysis`` held-out inputs of ``protocol``, ``exclude``: the model's training prompts), every example
    read after ``prefix`` (:func:`~nope_interp.jobs.common.eval_prefix`; its positions are scored too)."""
    with model.hooks(fwd_hooks=hooks):
        acc = exact_match_accuracy(model, task, examples, prefix=prefix)
        with torch.no_grad():
            # the prefix joins each prompt: the loss mask still covers exactly the answer and its end of line
            batch = task.training_batch([tasks_pkg.Example(prefix + ex.prompt, ex.answer) for ex in examples])
            loss = float(answer_loss(model, batch))
        if with_scores:
            try:
                prompts = protocol_prompts(model, task, n_analysis, ANALYSIS_SEED, exclude, protocol, window)
            except NopeInterpError as err:  # too few held-out prompts: name the flag that asks for them
                raise NopeInterpError.naming("the {n} prompts for the adjacency scores ({n_analysis}): {why}",
                                             n=n_analysis, why=str(err)) from None
            scores = analyze_tokens(model, task.prompt_tokens([prefix + p for p in prompts]), task=task.name,
                                    example_prompt=prefix + prompts[0], protocol=protocol,
                                    forward="hooked").scores["row_mean"]
        else:
            scores = {}
    return Measurement(exact_match=acc, answer_loss=loss, adjacency={s: v["mean"] for s, v in scores.items()})


def _decompose(site: str, acts: Float[Tensor, "batch pos d_model"]) -> Decomposition:
    try:
        d = positional_decomposition(acts)
    except NopeInterpError as err:  # a degenerate model: report it, do not lose the ablations
        return Decomposition(site=site, error=str(err))
    return Decomposition(site=site, **{k: d[k] for k in DECOMPOSITION_KEYS},
                         dropped_positions=tuple(d["dropped_positions"]), n_prompts=d["n_prompts"])


def model_draw_seed(entry: ModelEntry) -> int:
    """The seed of a model's random draws (permutations, random subspaces and directions, prompt swaps):
    :func:`~nope_interp.jobs.common.draw_seed` of its label (before 2026-12-03 every model used seed 0: the
    random-subspace control of three seeds was one subspace). Each (site, kind) draws from its own
    :func:`~nope_interp.jobs.common.keyed_generator` of this seed (since 2026-12-04; before, one generator ran
    through every site and kind in order, so a kind's draw changed with the others requested)."""
    return draw_seed(entry.label)


def _check_ranks(entry: ModelEntry, config: AblateConfig, n_prompt: int) -> None:
    """Refuse ``rank`` (with a project-out kind) or ``ranks`` (all of them) above what ``n_prompt`` positions
    and ``d_model`` allow: the centred positional means span at most min(n_prompt - 1, d_model) directions."""
    max_rank = min(n_prompt - 1, int(entry.model.cfg.d_model))
    if config.rank_used is not None and config.rank_used > max_rank:
        raise NopeInterpError.naming("{label}: {rank} {value} is above the {max_rank} positional directions its "
                                     "{n_prompt}-position inputs can span (min(positions - 1, d_model)): {rank} "
                                     "{max_rank} or less", label=entry.label, value=config.rank_used,
                                     max_rank=max_rank, n_prompt=n_prompt)
    if all(r > max_rank for r in config.ranks):
        raise NopeInterpError.naming("{label}: every {ranks} value ({values}) is above the {max_rank} positional "
                                     "directions its {n_prompt}-position inputs can span: give {ranks} <= {max_rank}",
                                     label=entry.label, values=", ".join(map(str, config.ranks)), max_rank=max_rank,
                                     n_prompt=n_prompt)


def _kind_hook(kind: str, mu: Tensor, acts: Tensor, rank: int | None, seed: int, site: str) -> ResidHook:
    """The hook of ablation ``kind`` at ``site``, its random draws (permutation, subspace, directions, prompt
    swaps) from :func:`~nope_interp.jobs.common.keyed_generator` ``(seed, site, kind)``: the same for a model,
    site and kind whichever other kinds and sites the call measures (until 2026-12-04 one generator ran through
    every site and kind in order, so a kind's draw changed with the others requested)."""
    gen = keyed_generator(seed, site, kind)
    if kind in ("shuffle_positional", "shuffle_vectors"):
        return ablation_hook(kind, mu, perm=torch.randperm(mu.shape[0], generator=gen))
    if kind == "project_out":
        return ablation_hook(kind, mu, basis=positional_subspace(mu, rank))
    if kind == "project_out_random":
        return ablation_hook(kind, mu, basis=random_subspace(mu.shape[1], rank, gen))
    if kind == "project_out_content":
        return ablation_hook(kind, mu, basis=content_subspace(acts, rank))
    if kind in ("swap_prompts", "mean_positional_random"):
        return ablation_hook(kind, mu, generator=gen)
    return ablation_hook(kind, mu)


def ablate_model(entry: ModelEntry, config: AblateConfig, *, seed: int | None = None,
                 log: Log = None) -> RunAblation:
    """Every ablation at every site of ``config``, plus the rank curve at the first site, for one model.

    Evaluation contexts (``n_eval``) and the inputs for mu (``n_mu``) are drawn under ``config.protocol``
    (full-length prompts by default; module docstring) outside ``entry.train_prompts``, the final prompts of
    the evaluation contexts kept out of mu's inputs (for a ``train-text`` model: windows of its training length
    from the held-out plays, metric next-character accuracy); ``seed`` seeds the permutations, random
    subspaces and prompt swaps (default :func:`model_draw_seed`).

    Raises:
        NopeInterpError: a layer outside the model; ``rank`` (with a project-out kind) or every ``ranks`` value
            above min(pos - 1, d_model), checked before any measurement; too few distinct
            held-out prompts; inputs longer than the model's ``n_ctx``; a ``window`` too short to hold a
            prompt; ``seed`` not None nor an integer in [0, 2**63), checked before any work.
    """
    if seed is not None:
        seed = check_int("seed", seed, 0, 2**63 - 1)  # a Python int: torch refuses numpy seeds
    model = entry.model
    sites = ablation_sites(config, model.cfg.n_layers)
    rank_site = sites[0]
    inputs = _text_inputs(entry, config) if entry.kind == "text" else _task_inputs(entry, config)
    name, n_prompt = inputs.task, inputs.mu_tokens.shape[1]
    _check_ranks(entry, config, n_prompt)
    seed = model_draw_seed(entry) if seed is None else seed
    t0 = time.perf_counter()
    clean = inputs.measure([], True)
    if clean.exact_match < 0.5:
        emit(log, f"{name}: clean {_metric_words(inputs.metric)} {clean.exact_match:.3f} on these inputs "
                  f"({inputs.protocol}): the accuracy an ablation can take is at most that")
    site_results = []
    for site in sites:
        acts = _site_acts(model, inputs.mu_tokens, site)
        mu = positional_means(acts)
        dec = _decompose(site, acts)
        per: dict[str, Measurement] = {}
        for kind in config.kinds_used:
            per[kind] = inputs.measure([(site, _kind_hook(kind, mu, acts, config.rank_used, seed, site))], True)
        site_results.append(SiteAblation(site=site, decomposition=dec, ablations=per))
        emit(log, f"{name} {site}: decomposition not computed: {dec.error}" if not dec.ok else
             f"{name} {site}: position explains {dec.positional_variance_fraction:.2f} of the variance; "
             f"adjacency full {dec.adjacency_full:.2f}, positional mean {dec.adjacency_positional:.2f}, "
             f"content {dec.adjacency_content:.2f}")
        emit(log, f"{name} {site}: {_metric_words(inputs.metric)} left under " + ", ".join(
             f"{k} {v.exact_match:.3f}" for k, v in per.items())
             + f" (clean {clean.exact_match:.3f}; {time.perf_counter() - t0:.0f}s)")
    rank_acts = _site_acts(model, inputs.mu_tokens, rank_site)
    mu = positional_means(rank_acts)
    max_rank = min(mu.shape[0] - 1, mu.shape[1])  # the centred means span at most pos - 1 directions
    points = []
    for r in [r for r in config.ranks if r <= max_rank]:
        hook = ablation_hook("project_out", mu, basis=positional_subspace(mu, r))
        pos = inputs.measure([(rank_site, hook)], False)
        rand = []
        gen = keyed_generator(seed, rank_site, "rank_curve", str(r))  # rank r's draws, whatever else is asked
        for _ in range(config.n_random):
            hook = ablation_hook("project_out_random", mu, basis=random_subspace(mu.shape[1], r, gen))
            rand.append(inputs.measure([(rank_site, hook)], False).exact_match)
        try:
            hook = ablation_hook("project_out_content", mu, basis=content_subspace(rank_acts, r))
            content = inputs.measure([(rank_site, hook)], False).exact_match
        except NopeInterpError as err:  # the content part spans fewer than r directions
            emit(log, f"{name} rank curve r={r}: no content control ({err})")
            content = math.nan
        rt = torch.tensor(rand, dtype=torch.float64)
        points.append(RankPoint(rank=r, positional=pos.exact_match, random_mean=float(rt.mean()),
                                random_std=float(rt.std()) if len(rand) > 1 else 0.0, random_draws=tuple(rand),
                                content=content))
    curve = RankCurve(site=rank_site, points=tuple(points), max_rank=max_rank,
                      skipped_ranks=tuple(r for r in config.ranks if r > max_rank))
    emit(log, f"{name} rank curve at {rank_site}, {_metric_words(inputs.metric)} left with r directions removed: "
         + ", ".join(
        f"r={p.rank}: {p.positional:.3f} vs random {p.random_mean:.3f}, content {p.content:.3f}" for p in points))
    return RunAblation(label=entry.label, run=run_path(entry),
                       run_name=entry.label if entry.run is None else entry.run.name,
                       model_seed=entry.model_cfg.seed, task=name, n_eval=inputs.n_eval,
                       n_mu=inputs.mu_tokens.shape[0], rank=config.rank_used, clean=clean, sites=tuple(site_results),
                       rank_curve=curve, metric=inputs.metric, eval_prefix=inputs.prefix, protocol=inputs.protocol,
                       window=config.window_used, recipe=_recipe(entry), draw_seed=seed)


def _recipe(entry: ModelEntry) -> str:
    """The settings that make the model's recipe (:func:`nope_interp.jobs.compare.recipe_settings`: all but
    the seeds) as canonical JSON: runs are pooled as seeds only when these are equal."""
    from nope_interp.jobs.compare import recipe_settings  # compare imports the demo job; keep the import local

    if entry.kind == "text":
        return json.dumps({"text": text_task_name(entry),
                           "model": {k: v for k, v in entry.model_cfg.to_dict().items() if k != "seed"}},
                          sort_keys=True, default=str)
    return json.dumps(recipe_settings(entry), sort_keys=True, default=str)


def seed_summary(runs: Sequence[RunAblation]) -> tuple[TaskSeedSummary, ...]:
    """Across the runs of each task (seeds): mean, std and 95% CI (:func:`nope_interp.stats.mean_std_ci`)
    of the clean exact match, of the accuracy lost per site and ablation, of exact match on the rank curve
    (positional, and the random mean of each run) and of the clean decomposition per site. Only sites,
    ablations and ranks present in every run of the task count (ranks matched by value); a site whose
    decomposition failed in some run is left out of the decomposition. The CI is Student's t over seeds, so
    with 3 seeds it is wide. Only runs of one recipe are pooled (:attr:`RunAblation.recipe`: every model,
    training and task setting but the seeds; before 2026-12-03 runs of other shapes or learning rates were
    pooled as seeds); runs that read different prefixes before their prompts (:attr:`RunAblation.eval_prefix`)
    also form separate groups. Groups are in order of first appearance."""
    by_task: dict[tuple[str, str, str, int, str], list[RunAblation]] = {}
    for r in runs:
        by_task.setdefault((r.task, r.eval_prefix, r.protocol, r.window, r.recipe), []).append(r)
    out = []
    for (task, prefix, protocol, window, _recipe_json), rs in by_task.items():
        site_maps = [{s.site: s for s in r.sites} for r in rs]
        losses, decs = [], []
        for s in rs[0].sites:
            if not all(s.site in m for m in site_maps):
                continue
            losses.append(SiteLossStats(site=s.site, by_kind={
                kind: mean_std_ci([r.clean.exact_match - m[s.site].ablations[kind].exact_match
                                   for r, m in zip(rs, site_maps, strict=True)])
                for kind in s.ablations if all(kind in m[s.site].ablations for m in site_maps)}))
        for s in rs[0].sites:
            if all(s.site in m and m[s.site].decomposition.ok for m in site_maps):
                decs.append(SeedDecomposition(site=s.site, **{
                    k: mean_std_ci([m[s.site].decomposition.value(k) for m in site_maps]) for k in DECOMPOSITION_KEYS}))
        curve = []
        by_rank = [{p.rank: p for p in r.rank_curve.points} for r in rs]
        for p in rs[0].rank_curve.points:
            if all(p.rank in m for m in by_rank):
                curve.append(SeedRankPoint(rank=p.rank, positional=mean_std_ci([m[p.rank].positional for m in by_rank]),
                                           random=mean_std_ci([m[p.rank].random_mean for m in by_rank]),
                                           content=mean_std_ci([m[p.rank].content for m in by_rank])))
        out.append(TaskSeedSummary(task=task, runs=tuple(r.run for r in rs), run_names=tuple(r.run_name for r in rs),
                                   clean_exact_match=mean_std_ci([r.clean.exact_match for r in rs]),
                                   accuracy_loss=tuple(losses), rank_curve=tuple(curve), decomposition=tuple(decs),
                                   eval_prefix=prefix, protocol=protocol, window=window, rank=rs[0].rank))
    return tuple(out)


def run(config: AblateConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> AblateResult:
    """Ablate every model of ``models`` (default :func:`default_models`) on its task and summarise over seeds
    (see the module docstring).

    Raises:
        NopeInterpError: no models; a layer outside a model, a model whose ``n_ctx`` cannot hold its
            evaluation prefix, the task's longest prompt and answer (under ``full``) or the protocol's context
            and the answer (otherwise), a window that cannot hold a task's longest prompt after a newline, or
            a protocol other than ``full`` with a ``train-text`` model (all checked before any work); see
            :func:`ablate_model`.

    Under the window protocol without ``config.window``, the window is the longest that every task model
    can read with its answer (``n_ctx`` - longest answer - 1), at most :data:`tasks.DEFAULT_WINDOW`; the
    result's ``config`` holds it.
    """
    models = job_models("ablate", models, lambda: default_models(config))
    if not models:
        raise NopeInterpError.naming("no models to ablate: no shipped model found; give {sources}",
                                     sources=Fields("run", "pretrained", sep=" or "))
    task_models = [e for e in models if e.kind != "text"]
    if config.protocol == "window" and config.window is None and task_models:
        fits = min(e.model.cfg.n_ctx - e.task.max_answer_len - 1 for e in task_models)
        config = config.replace(window=min(DEFAULT_WINDOW, max(3, fits)))  # the config's least window
        line = Message.naming("window protocol: contexts of {n} characters (the longest that fits every model's n_ctx "
                              "with its answer, at most {most}; {window} sets it)", n=config.window,
                              most=DEFAULT_WINDOW)
        line.config = AblateConfig  # --window, not ModelConfig's --model-window
        emit(log, line)
    for entry in models:
        ablation_sites(config, entry.model_cfg.n_layers)  # validates before any work
        if entry.kind == "text" and config.protocol != "full":
            raise NopeInterpError.naming("{label}: protocol {value} applies to task models; a train-text model is "
                                         "ablated on held-out text windows (drop {protocol}, or ablate it apart)",
                                         label=entry.label, value=config.protocol)
        if entry.kind != "text" and config.protocol != "full":
            task, n_ctx = entry.task, entry.model.cfg.n_ctx
            length = tasks_pkg.protocol_length(task, config.protocol,
                                               config.window_used)
            if config.protocol == "window" and length < task.max_prompt_len + 1:
                err = NopeInterpError.naming(
                    "{label}: {window} {length} cannot hold a newline and the longest {task} prompt ({longest} "
                    "characters): {window} must be >= {need}", label=entry.label, length=length, task=task.name,
                    longest=task.max_prompt_len, need=task.max_prompt_len + 1)
                err.config = AblateConfig  # --window, also when it was not given (not --model-window)
                raise err
            need = length + task.max_answer_len + 1  # what greedy decoding reaches after the context
            if need > n_ctx:
                # the window every task model given can read with its answer (not only this one)
                fits = min(e.model.cfg.n_ctx - e.task.max_answer_len - 1 for e in task_models)
                least = max(e.task.max_prompt_len + 1 for e in task_models)
                span = f"{fits}" if fits == least else f"from {least} to {fits}"  # a newline and a prompt at least
                fix = ": {window} {span} fits every model given" if config.protocol == "window" and fits >= least \
                    else ""
                err = NopeInterpError.naming(
                    "{label}: n_ctx={n_ctx} is too small for {task} {protocol_name} contexts of {length} tokens and "
                    "the answer: {length} context + {answer} answer + 1 end-of-line tokens need n_ctx >= {need}" + fix,
                    label=entry.label, n_ctx=n_ctx, task=task.name, protocol_name=config.protocol, length=length,
                    answer=task.max_answer_len, need=need, span=span)
                err.config = AblateConfig  # the job's --window, not an --init model's --model-window
                raise err
        elif entry.kind != "text":
            prefix, task = eval_prefix(entry), entry.task
            need = len(prefix) + task.max_prompt_len + task.max_answer_len + 1  # what greedy decoding reaches
            if need > entry.model.cfg.n_ctx:
                after = f" after its evaluation prefix {prefix!r}" if prefix else ""
                raise NopeInterpError(
                    f"{entry.label}: n_ctx={entry.model.cfg.n_ctx} is too small for {task.name} "
                    f"({task.params()}) read{after}: {len(prefix)} prefix + {task.max_prompt_len} prompt + "
                    f"{task.max_answer_len} answer + 1 end-of-line tokens need n_ctx >= {need}")
    emit(log, f"ablating {len(models)} model(s): " + ", ".join(
        f"{text_task_name(e) if e.kind == 'text' else e.task.name}:{e.label if e.run is None else e.run.path.name}"
        for e in models))
    t0 = time.perf_counter()
    for entry in models:  # ranks against each model's input length, before any model is measured
        if entry.kind == "text":
            _check_ranks(entry, config, int(entry.source["text_window"]))
        elif config.protocol == "full":
            _check_ranks(entry, config, len(eval_prefix(entry)) + entry.task.max_prompt_len)
        else:
            _check_ranks(entry, config, tasks_pkg.protocol_length(entry.task, config.protocol, config.window_used))
    runs = tuple(ablate_model(entry, config, log=log) for entry in progress(models, "ablate", log))
    return AblateResult(config=config, runs=runs, seed_summary=seed_summary(runs),
                        wall_time_s=round(time.perf_counter() - t0, 1))


def plot_ablations(runs: Sequence[RunAblation]) -> go.Figure:
    """Per run: accuracy lost by site and ablation (bars), and the rank curve with its random band
    (mean ± std over draws) and its content line (top-r directions of h - mu removed)."""
    runs = list(runs)
    fig = make_subplots(rows=len(runs), cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=[t for r in runs for t in
                                        (f"{r.task} ({r.run_name}): {_metric_words(r.metric)} lost",
                                         f"{r.task} ({r.run_name}): rank curve at {short_label(r.rank_curve.site)}")],
                        vertical_spacing=0.4 / max(2, len(runs)))
    for i, res in enumerate(runs, start=1):
        sites = [s.site for s in res.sites]
        for kind in res.sites[0].ablations:
            fig.add_trace(go.Bar(x=[short_label(s) for s in sites], y=[res.accuracy_lost(s, kind) for s in sites],
                                 name=kind, legendgroup=kind, showlegend=(i == 1), marker_color=KIND_COLORS[kind]),
                          row=i, col=1)
        pts = res.rank_curve.points
        x = [p.rank for p in pts]
        hi = [min(1.0, p.random_mean + p.random_std) for p in pts]  # exact match lies in [0, 1]
        lo = [max(0.0, p.random_mean - p.random_std) for p in pts]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], mode="lines", fill="toself",
                                 fillcolor="rgba(120,120,120,0.25)",
                                 line={"width": 0}, name="random r removed (mean ± std)", legendgroup="band",
                                 showlegend=(i == 1)), row=i, col=2)
        fig.add_trace(go.Scatter(x=x, y=[p.random_mean for p in pts], mode=line_mode(len(x)), line={"color": "gray"},
                                 marker={"color": "gray"},
                                 showlegend=False), row=i, col=2)
        fig.add_trace(go.Scatter(x=x, y=[p.positional for p in pts], mode="lines+markers",
                                 line={"color": "#1f77b4"}, name="top-r positional removed",
                                 legendgroup="pos", showlegend=(i == 1)), row=i, col=2)
        fig.add_trace(go.Scatter(x=x, y=[p.content for p in pts], mode="lines+markers",
                                 line={"color": CONTENT_LINE_COLOR, "dash": "dot"}, marker={"symbol": "diamond"},
                                 name="top-r content removed (variance-rich control)",
                                 legendgroup="content", showlegend=(i == 1)), row=i, col=2)
        fig.update_yaxes(title_text="accuracy lost", row=i, col=1)
        fig.update_yaxes(title_text=_metric_words(res.metric), range=[-0.02, 1.02], row=i, col=2)
        fig.update_xaxes(title_text="rank r", row=i, col=2)
    ranks = {r.rank for r in runs if r.rank is not None}
    fig.update_layout(barmode="group", title="Ablating the positional structure of the residual stream"
                      + _inputs_words(runs) + (f"; project_out* bars at rank {ranks.pop()}" if len(ranks) == 1 else ""),
                      height=200 + 360 * len(runs), width=1250)
    return fig


def _inputs_words(runs: Sequence[RunAblation]) -> str:
    """`` (authors inputs)`` when every run of a task model read one protocol other than ``full``, else ``""``."""
    kinds = {(r.protocol, r.window if r.protocol == "window" else None) for r in runs if r.protocol != "text"}
    if len(kinds) != 1 or next(iter(kinds))[0] == "full":
        return ""
    protocol, window = next(iter(kinds))
    return f" ({protocol} inputs{f' of {window} characters' if window else ''})"


def _metric_words(metric: str) -> str:
    return "next-character accuracy" if metric == "next_char_accuracy" else "exact match"


def _fmt(st: SeedStats) -> str:
    if st.mean != st.mean:  # NaN: not measured in some run (e.g. a rank the content part does not span)
        return "n/a"
    text = fmt_mean_std(st.mean, st.std, st.n_seeds)  # the mean alone for one run: no spread, no interval
    return text if st.n_seeds < 2 else f"{text} [{st.ci95_low:.2f}, {st.ci95_high:.2f}]"


def seed_markdown(summaries: Sequence[TaskSeedSummary], runs: Sequence[RunAblation] = ()) -> str:
    """The seed summary as Markdown tables: per task, the accuracy lost (mean ± std [95% CI]) by site and
    ablation, the rank curve (positional vs random vs top content) and the position/content decomposition;
    with ``runs``, also each run's own exact match (clean and under every ablation) per site, which is what to
    read when the runs' clean accuracies differ a lot. A statistic that is NaN (a rank curve point not measured
    in some run) is written ``n/a``."""
    lines = ["# Ablations over seeds", "",
             "mean ± sample std [95% Student-t CI of the mean] over the runs of each task (with one run the "
             "mean alone: one value has no spread to estimate; the JSON keeps std 0.0 and CI nan); accuracy "
             "lost = clean exact match - ablated exact match (for a train-text language model, task text-*, "
             "next-character accuracy instead of exact match).", ""]
    for e in summaries:
        n = e.n_seeds
        metric = "next-character accuracy" if e.task.startswith("text-") else "exact match"
        lines += [f"## {e.group} ({n} run{'s' if n != 1 else ''}; clean {metric} {_fmt(e.clean_exact_match)})", ""]
        lines += ["runs: " + ", ".join(e.run_names), ""]
        kinds = list(e.accuracy_loss[0].by_kind) if e.accuracy_loss else []
        if e.rank is not None and any(k.startswith("project_out") for k in kinds):
            lines += [f"Accuracy lost by site; the project_out* kinds remove rank {e.rank}.", ""]
        lines += ["| site | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
        lines += [f"| {s.site} | " + " | ".join(_fmt(s.by_kind[k]) for k in kinds) + " |" for s in e.accuracy_loss]
        lines += ["", f"| rank r | {metric}, positional removed | {metric}, random removed | "
                      f"{metric}, top content removed |", "|---|---|---|---|"]
        lines += [f"| {p.rank} | {_fmt(p.positional)} | {_fmt(p.random)} | {_fmt(p.content)} |"
                  for p in e.rank_curve]
        task_runs = [r for r in runs if r.task == e.task and r.eval_prefix == e.eval_prefix
                     and r.protocol == e.protocol]
        if task_runs:
            kinds_run = list(task_runs[0].sites[0].ablations) if task_runs[0].sites else []
            lines += ["", f"{metric.capitalize()} of each run:", "",
                      "| run | site | clean | " + " | ".join(kinds_run) + " |", "|---" * (len(kinds_run) + 3) + "|"]
            for r in task_runs:
                lines += [f"| {r.run_name} | {s.site} | {r.clean.exact_match:.3f} | "
                          + " | ".join(f"{s.ablations[k].exact_match:.3f}" if k in s.ablations else ""
                                       for k in kinds_run) + " |"
                          for s in r.sites]
        if e.decomposition:
            lines += ["", "| site | " + " | ".join(DECOMPOSITION_KEYS) + " |",
                      "|---" * (len(DECOMPOSITION_KEYS) + 1) + "|"]
            lines += [f"| {d.site} | " + " | ".join(_fmt(getattr(d, k)) for k in DECOMPOSITION_KEYS) + " |"
                      for d in e.decomposition]
        lines.append("")
    return "\n".join(lines)


def plot_seed_summary(summaries: Sequence[TaskSeedSummary]) -> go.Figure:
    """Per task, over seeds: mean accuracy lost by site and ablation with 95% CI error bars; the rank
    curve (mean exact match, bars = std over seeds) for the positional, the random and the top content
    subspace; and the clean model's decomposition per site (adjacency of h, of the positional mean mu and of the content
    h - mu, and the share of variance explained by position; bars = std over seeds)."""
    summaries = list(summaries)
    titles = []
    for e in summaries:
        titles += [f"{e.group}: exact match lost ({e.n_seeds} seeds, mean, 95% CI)",
                   f"{e.group}: rank curve (mean ± std)", f"{e.group}: position vs content (clean)"]
    fig = make_subplots(rows=len(summaries), cols=3, column_widths=[0.45, 0.27, 0.28], subplot_titles=titles,
                        vertical_spacing=0.4 / max(2, len(summaries)), horizontal_spacing=0.06)
    dec_colors = dict(zip(DECOMPOSITION_KEYS, ["#9467bd", "#8c564b", "#17becf", "#bcbd22"], strict=True))
    dec_labels = dict(zip(DECOMPOSITION_KEYS, ["variance share of mu", "adjacency of h", "adjacency of mu",
                                               "adjacency of h - mu"], strict=True))
    shown: set[str] = set()

    def bar(x: list[str], st: list[SeedStats], name: str, color: str, half: str, row: int, col: int) -> None:
        err = [error_bar(s, half) for s in st]  # one seed: no bar
        fig.add_trace(go.Bar(x=x, y=[s.mean for s in st], name=name, legendgroup=name,
                             showlegend=name not in shown, marker_color=color,
                             error_y={"type": "data", "array": err, "visible": True}), row=row, col=col)
        shown.add(name)

    for i, e in enumerate(summaries, start=1):
        labels = [short_label(s.site) for s in e.accuracy_loss]
        for kind in (e.accuracy_loss[0].by_kind if e.accuracy_loss else ()):
            bar(labels, [s.by_kind[kind] for s in e.accuracy_loss], kind, KIND_COLORS[kind], "ci", i, 1)
        ranks = [p.rank for p in e.rank_curve]
        for which, color, dash in (("positional", "#1f77b4", None), ("random", "gray", "dash"),
                                   ("content", CONTENT_LINE_COLOR, "dot")):
            st = [getattr(p, which) for p in e.rank_curve]
            name = {"positional": "top-r positional out", "random": "random r out",
                    "content": "top-r content out"}[which]
            fig.add_trace(go.Scatter(x=ranks, y=[s.mean for s in st], mode="lines+markers", name=name,
                                     legendgroup=which, showlegend=name not in shown,
                                     line={"color": color, "dash": dash},
                                     error_y={"type": "data", "array": [error_bar(s) for s in st],
                                              "visible": True}),
                          row=i, col=2)
            shown.add(name)
        for key in DECOMPOSITION_KEYS if e.decomposition else ():
            bar([short_label(d.site) for d in e.decomposition], [getattr(d, key) for d in e.decomposition],
                dec_labels[key], dec_colors[key], "std", i, 3)
        fig.update_yaxes(title_text="accuracy lost", row=i, col=1)
        fig.update_yaxes(title_text="exact match", range=[-0.05, 1.05], row=i, col=2)
        fig.add_hline(y=0.5, line_dash="dot", line_color="black", row=i, col=3)  # chance adjacency
        fig.update_yaxes(title_text="score / share (dots: chance adjacency)", range=[0, 1.05], row=i, col=3)
        fig.update_xaxes(title_text="rank r", row=i, col=2)
    words = {f" ({e.protocol} inputs)" if e.protocol not in ("full", "text") else "" for e in summaries}
    ranks = {e.rank for e in summaries if e.rank is not None}
    fig.update_layout(barmode="group", title="Ablations over seeds (same recipe, other training and model seeds)"
                      + (words.pop() if len(words) == 1 else "")
                      + (f"; project_out* bars at rank {ranks.pop()}" if len(ranks) == 1 else ""),
                      height=220 + 380 * len(summaries), width=1620, legend={"font": {"size": 11}})
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: AblateResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/ablate/{ablate.json, ablate.csv, ablate_seeds.csv, ablate_seeds.md, ablate_decomposition.csv}``,
    ``figures/ablate/ablations.html`` and (when some task has 2 or more runs) ``ablations_seeds.html`` (else an older
    one is removed), with the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`); returns
    the paths. Under a protocol other than ``full`` every name ends in ``_<protocol_tag>`` (``ablate_authors.json``,
    ``ablations_seeds_window48.html``), so the outputs of two protocols or window lengths never overwrite each other;
    every CSV row starts with the inputs its model read (``protocol``, and ``window`` under the window protocol), and
    its ``run`` is the model's directory as the JSON writes it (:func:`run_path`: absolute, for task and text runs
    alike)."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, AblateResult, out_root)
    window = result.config.window_used
    tag = protocol_tag(result.config.protocol, window)

    def name(stem: str, ext: str) -> str:
        return f"{stem}_{tag}.{ext}" if tag else f"{stem}.{ext}"

    def inputs(protocol: str, window: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return with_protocol(rows, protocol, window)

    rows = [row for r in result.runs for row in inputs(r.protocol, r.window, r.table_rows())]
    seed_rows = [row for e in result.seed_summary for row in inputs(
        e.protocol, window,
        [{"task": e.task, "site": s.site, "ablation": kind, **st.to_dict(), "eval_prefix": escaped(e.eval_prefix)}
         for s in e.accuracy_loss for kind, st in s.by_kind.items()])]
    dec_rows = [row for r in result.runs for row in inputs(r.protocol, r.window, r.decomposition_rows())]
    paths = [io.write_json(res_dir / name("ablate", "json"), {**result.to_dict(), **io.provenance()}),
             io.atomic_write_text(res_dir / name("ablate", "csv"), io.to_csv(rows)),
             io.atomic_write_text(res_dir / name("ablate_seeds", "csv"), io.to_csv(seed_rows)),
             io.atomic_write_text(res_dir / name("ablate_seeds", "md"),
                                  seed_markdown(result.seed_summary, result.runs)),
             io.atomic_write_text(res_dir / name("ablate_decomposition", "csv"), io.to_csv(dec_rows)),
             save_figure(plot_ablations(result.runs), fig_dir / name("ablations", "html"))]
    multi = [e for e in result.seed_summary if e.n_seeds > 1]
    seeds_fig = fig_dir / name("ablations_seeds", "html")
    if multi:
        paths.append(save_figure(plot_seed_summary(multi), seeds_fig))
    else:
        seeds_fig.unlink(missing_ok=True)  # never leave a figure from an earlier call beside these results
    return with_plotlyjs(paths)
