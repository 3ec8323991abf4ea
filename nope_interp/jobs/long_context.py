"""``nope-interp long-context``: the adjacency score and the lag profile against sequence length.

For each model and each length ``n`` of ``lengths``, ``n_sequences`` inputs of ``n`` tokens are analysed
(:func:`nope_interp.analysis.analyze_tokens`, memory linear in ``n``): ``random`` (i.i.d. uniform token ids,
the control with no structure) and ``task`` (a window of ``n`` characters of the task's concatenated
held-out lines). Each row gives, per site, the adjacency score (row mean and pooled, mean ± std over
sequences), the lag profile c(d) for d = 1..``max_lag`` and the recency gap c(1) - c(``max_lag``), beside
the idealised curves: uniform causal averaging of i.i.d. inputs, sqrt((i - d + 1) / (i + 1)) averaged over
query positions, which tends to 1 at every fixed lag as ``n`` grows, and for sliding-window attention of
width ``w`` about max(0, 1 - d / w) whatever ``n`` (``docs/method.md``, "Lag profile").

Default models: the architecture grid at initialisation, normalisation (``LN``, ``RMS``, ``none``) x attention
(``causal`` global, ``sliding`` with ``window`` keys) x ``seeds`` seeds at the ``cpu`` preset's shape (seed
``s`` seeds the init and the inputs): does the pattern need LayerNorm, does a window bound it, how does it
decay with ``n``? With ``--run``/``--pretrained``/``--init`` the given models are analysed instead; a
trained NoPE model is run past its training context with :func:`nope_interp.model.with_context`.

Writes ``results/long_context/{long_context.json, long_context.csv, summary.csv}`` (the summary: mean, std
and 95% CI over seeds per configuration, input, length and site) and ``figures/long_context/{score_vs_n,
recency_gap_vs_n, lag_profile, grid}_<input>.html`` (one of each per input kind; ``grid`` only for the
default grid).
"""

import time
from collections import defaultdict
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import analyze_tokens
from nope_interp.averaging import attention_window
from nope_interp.config import (
    FrozenConfig,
    ModelConfig,
    check_choice,
    check_choices,
    check_int,
    check_tasks,
    describe_presets,
    opt,
    preset,
)
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import ACTIVATION_POINTS, check_points, short_label
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    emit,
    entry_from_init,
    job_models,
    locked_write,
    progress,
    random_tokens,
    refuse_default_only,
    run_path,
)
from nope_interp.model import with_context
from nope_interp.plotting import add_chance_line, line_colours, line_mode, save_figure, with_plotlyjs
from nope_interp.positional import layer_positional_types
from nope_interp.similarity import sliding_window_lag_profile, uniform_causal_lag_profile
from nope_interp.stats import error_bar, fmt_mean_std, mean_std_ci

NAME = "long-context"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
DEFAULT_ONLY = ("text_task", "seeds", "normalizations", "attentions", "window", "grid_preset")  # the default grid
TAKES_HF = True  # --hf-path: a Hugging Face model in a TransformerBridge (random inputs; layers typed)
TAKES_TEXT = True  # train-text language models: text and random inputs
DEFAULT_MODELS = "initialised models of the normalisation x attention grid at the cpu preset's shape"

#: Kinds of input sequence (``text``: Shakespeare's dialogue from held-out plays; the ``text`` extra).
INPUTS = ("random", "task", "text")
#: Normalisations and attentions of the default grid.
NORMALIZATIONS = ("LN", "RMS", "none")
ATTENTIONS = ("causal", "sliding")
#: What ``quick`` sets when the field is not given.
QUICK: dict[str, Any] = {"lengths": (32, 128, 512), "seeds": 2, "n_sequences": 2}
#: What the fields ``quick`` would set are when not given and ``quick`` is off.
FULL: dict[str, Any] = {"lengths": (32, 128, 512, 2048), "seeds": 3, "n_sequences": 4}


@dataclass(frozen=True)
class LongContextConfig(FrozenConfig):
    """Settings of ``long-context``.

    ``lengths``, ``seeds`` and ``n_sequences`` left at None are filled by ``__post_init__`` from :data:`QUICK`
    with ``quick``, else from :data:`FULL`, so that after construction they hold what is run. A value given
    explicitly always wins, even one equal to a full default (before: ``quick=True, seeds=3`` ran 2 seeds), and
    :meth:`replace` fills anew what was not given (``replace(quick=False)`` gives the full defaults).
    ``dataclasses.replace`` does too, but refuses ``quick=False`` while the quick values are carried over (a copy
    cannot tell them from values given; :meth:`~nope_interp.config.FrozenConfig._fill_unset`). A config read back by
    :meth:`~nope_interp.config.FrozenConfig.from_dict` counts a value equal to what ``quick`` fills as filled, so the
    two do the same for it (before: both kept the quick values).

    Raises:
        NopeInterpError: a length outside [max(3, ``max_lag`` + 1), 65536] (a repeated length is refused;
            order kept sorted); ``n_sequences`` outside [1, 10000]; ``seeds`` outside [1, 100]; ``max_lag`` outside
            [1, 4096]; ``window`` outside [1, 65536]; an unknown input kind, point, normalisation,
            attention, task or preset; empty lists.
    """

    lengths: tuple[int, ...] | None = opt(None, "sequence lengths n in tokens, up to 65536 (unset: 32 128 512 2048; "
                                                "--quick: 32 128 512)")
    inputs: tuple[str, ...] = opt(("random", "task"), f"input kinds: {', '.join(INPUTS)} (task: windows of task "
                                                      "text; text: Shakespeare, needs the text extra)")
    text_task: str = opt("reversal", "task whose text the default grid's task inputs are (a model given by "
                                     "--run/--pretrained/--init reads its own task's text)")
    n_sequences: int | None = opt(None, "sequences per model, input and length (unset: 4; --quick: 2)")
    max_lag: int = opt(31, "largest lag D of the lag profile and the recency gap c(1) - c(D)")
    points: tuple[str, ...] = opt(("z", "resid_post"), f"hook points: {', '.join(ACTIVATION_POINTS)}")
    seeds: int | None = opt(None, "seeds of the default grid, init and inputs (unset: 3; --quick: 2)")
    normalizations: tuple[str, ...] = opt(NORMALIZATIONS, "normalisations of the default grid")
    attentions: tuple[str, ...] = opt(ATTENTIONS, "attentions of the default grid (sliding uses --window)")
    window: int = opt(16, "keys per query of sliding-window attention in the default grid")
    grid_preset: str = opt("cpu", f"model shape of the default grid: {describe_presets()}")
    quick: bool = opt(False, "lengths 32 128 512, 2 seeds, 2 sequences (explicit flags win)")
    _filled: InitVar[dict[str, Any] | None] = None  # what dataclasses.replace carries over (FrozenConfig._fill_unset)

    def __post_init__(self, _filled: dict[str, Any] | None = None) -> None:
        if not isinstance(self.quick, bool):
            raise NopeInterpError(f"quick must be true or false, got {self.quick!r}")
        for name in ("lengths", "inputs", "points", "normalizations", "attentions"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        self._fill_unset(QUICK if self.quick else FULL, _filled)
        check_int("max_lag", self.max_lag, 1, 4096)
        if not self.lengths:
            raise NopeInterpError("lengths must not be empty")
        for n in self.lengths:
            check_int("lengths", n, max(3, self.max_lag + 1), 65536)  # the adjacency score needs 3 positions
        object.__setattr__(self, "lengths", tuple(sorted(set(self.lengths))))
        check_int("n_sequences", self.n_sequences, 1, 10_000)
        check_int("seeds", self.seeds, 1, 100)
        check_int("window", self.window, 1, 65536)
        check_points(self.points)
        for name, allowed in (("inputs", INPUTS), ("normalizations", NORMALIZATIONS), ("attentions", ATTENTIONS)):
            if not getattr(self, name):
                raise NopeInterpError(f"{name} must not be empty")
            check_choices(name[:-1], getattr(self, name), allowed)
        check_tasks((self.text_task,))
        check_choice("grid_preset", self.grid_preset, ("paper", "cpu", "tiny"))


CONFIG = LongContextConfig


@dataclass(frozen=True)
class LongContextRow:
    """One model, input kind and length: per site the score, the recency gap and the lag profile.

    Attributes:
        model: label. arch: ``{"normalization", "attention", "window"}`` of the model. seed: its grid seed
            (None for a given model). input: ``random`` or ``task``. n: tokens per sequence.
        input_seed: the seed the input sequences were drawn with (the grid seed; 0 for a given model), so a
            row can be redrawn; None in rows built before it was recorded.
        sites: hook names. scores: ``scores[site] = {"row_mean": {mean, std, n}, "pooled": {...},
        "recency_gap": {...}, "lag_mean": [c(1..D)]}``; scores in [0, 1], cosines in [-1, 1].
        seconds: wall time of this row's analysis. run: the model's directory, absolute with links resolved
            (:func:`~nope_interp.jobs.common.run_path`); None for an initialised or Hugging Face model, and in rows
            built before 2026-12-04.
    """

    model: str
    arch: dict[str, Any]
    seed: int | None
    input: str
    n: int
    sites: tuple[str, ...]
    scores: dict[str, dict[str, Any]]
    seconds: float
    layer_types: tuple[str, ...] = ()
    input_seed: int | None = None
    run: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return {"model": self.model, "arch": self.arch, "seed": self.seed, "input_seed": self.input_seed,
                "input": self.input, "n": self.n,
                "sites": list(self.sites), "layer_types": list(self.layer_types), "scores": self.scores,
                "seconds": self.seconds, "run": self.run}


@dataclass(frozen=True)
class LongContextResult:
    """Every row, the idealised curves per length, and the wall time (seconds)."""

    config: LongContextConfig
    rows: tuple[LongContextRow, ...]
    wall_time_s: float

    def idealised(self, n: int, window: int | None = None) -> list[float]:
        """The idealised lag profile c(1..D) at length ``n``: uniform causal, or sliding with ``window``."""
        d = min(self.config.max_lag, n - 1)
        if window is None:
            return uniform_causal_lag_profile(n, d).tolist()
        return sliding_window_lag_profile(n, window, d).tolist()

    def summary(self) -> list[dict[str, Any]]:
        """Mean, std and 95% CI over seeds of the row-mean score and the recency gap, per (arch, input, n,
        site); given models (no seed) count as one seed each under their own label."""
        groups: dict[tuple, list[LongContextRow]] = defaultdict(list)
        for r in self.rows:
            key = (arch_label(r.arch) if r.seed is not None else r.model, r.input, r.n)
            groups[key].append(r)
        out = []
        for (arch, kind, n), rows in groups.items():
            for site in rows[0].sites:
                score = mean_std_ci([r.scores[site]["row_mean"]["mean"] for r in rows])
                gap = mean_std_ci([r.scores[site]["recency_gap"]["mean"] for r in rows])
                out.append({"config": arch, "input": kind, "n": n, "site": site,
                            **{f"score_{k}": v for k, v in score.to_dict().items()},
                            **{f"gap_{k}": v for k, v in gap.to_dict().items() if k != "n_seeds"}})
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{"config", "rows", "summary", "idealised": {n: {"uniform_causal", "sliding"}}, "wall_time_s"}``."""
        return {"config": self.config.to_dict(), "rows": [r.to_dict() for r in self.rows],
                "summary": self.summary(),
                "idealised": {str(n): {"uniform_causal": self.idealised(n),
                                       "sliding": self.idealised(n, self.config.window)}
                              for n in self.config.lengths},
                "wall_time_s": self.wall_time_s}


def arch_label(arch: dict[str, Any]) -> str:
    """``LN causal`` or ``RMS sliding w16``: the configuration of the default grid a row belongs to."""
    w = f" w{arch['window']}" if arch["attention"] == "sliding" else ""
    return f"{arch['normalization']} {arch['attention']}{w}"


def _arch(cfg: ModelConfig | None, model: Any = None) -> dict[str, Any]:
    if cfg is None:  # a Hugging Face model: no ModelConfig; its layer-0 window from the bridge's config, if any
        return {"normalization": None, "attention": "hf",
                "window": None if model is None else attention_window(model.cfg, 0)}
    return {"normalization": cfg.normalization, "attention": cfg.attention,
            "window": cfg.window if cfg.attention == "sliding" else None}


def default_models(config: LongContextConfig) -> list[ModelEntry]:
    """The default grid: one initialised model per normalisation, attention and seed, with n_ctx = the
    longest length."""
    task = tasks_pkg.get_task(config.text_task)
    out = []
    for norm in config.normalizations:
        for attn in config.attentions:
            for seed in range(config.seeds):
                extra = {"window": config.window} if attn == "sliding" else {}
                cfg = preset(config.grid_preset, normalization=norm, attention=attn, seed=seed,
                             n_ctx=max(config.lengths), **extra)
                label = f"init-{config.grid_preset}-{norm}-{attn}{'-w' + str(config.window) if extra else ''}-s{seed}"
                out.append(entry_from_init(cfg, task, label))
    return out


def inputs(kind: str, task: tasks_pkg.Task, d_vocab: int, n_sequences: int, n: int, seed: int,
           exclude: frozenset[str] = frozenset()) -> tuple[torch.Tensor, str]:
    """``n_sequences`` token sequences of ``n`` tokens of ``kind`` (:data:`INPUTS`), and the first one as text
    (empty for random tokens).

    ``random``: ids i.i.d. uniform in [0, ``d_vocab``) from a generator seeded with ``seed``; ``task``: windows
    of ``task``'s concatenated held-out lines (:func:`tasks.window_inputs`), none of ``exclude``; ``text``:
    windows of Shakespeare's dialogue from held-out plays (:func:`nope_interp.text.text_windows`).

    Raises:
        NopeInterpError: an unknown kind.
    """
    if kind == "random":
        gen = torch.Generator().manual_seed(int(seed))  # torch refuses numpy seeds
        return torch.randint(0, d_vocab, (n_sequences, n), generator=gen), ""
    if kind == "task":
        texts = tasks_pkg.window_inputs(task, n_sequences, n, seed, exclude)
        return task.prompt_tokens(texts), texts[0]
    if kind == "text":
        from nope_interp.text import text_windows

        texts = text_windows(n_sequences, n, seed)
        return task.prompt_tokens(texts), texts[0]
    raise NopeInterpError(f"unknown input kind {kind!r}; allowed: {', '.join(INPUTS)}")


def why_no_inputs(entry: ModelEntry, kind: str) -> str | None:
    """Why ``entry`` cannot read inputs of ``kind`` (one of :data:`INPUTS`), or None when it can: a Hugging
    Face model's vocabulary is not the tasks' characters (random inputs only); a train-text language model
    has no task."""
    if kind in ("task", "text") and entry.model_cfg is None:
        return f"{entry.label}'s vocabulary is not the tasks' characters"
    if kind == "task" and entry.kind == "text":
        return f"{entry.label} is a train-text language model, with no task; it reads text and random"
    return None


def run(config: LongContextConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> LongContextResult:
    """Analyse every model at every length and input kind (see the module docstring).

    Raises:
        NopeInterpError: a given model that cannot be run at the longest length (learned positions); inputs
            that none of the models reads, so no row would be measured (:func:`why_no_inputs`; a model that
            cannot read one of several kinds is skipped for that kind, with a line in the log); non-finite or near-zero
            activations (the message names the site); with ``models`` given, a field of :data:`DEFAULT_ONLY`
            set (it shapes the default grid only: :func:`~nope_interp.jobs.common.refuse_default_only`).
    """
    given = models is not None
    models = job_models("long-context", models, lambda: default_models(config))
    if given:
        refuse_default_only(NAME, config, DEFAULT_ONLY, DEFAULT_MODELS, models)
    if all(why_no_inputs(entry, kind) is not None for entry in models for kind in config.inputs):
        reasons = sorted({why_no_inputs(entry, kind) or "" for entry in models for kind in config.inputs})
        raise NopeInterpError.naming("{inputs} {given}: no model here reads them ({reasons}); inputs the models "
                                     "read: {read}", given=" ".join(config.inputs), reasons="; ".join(reasons),
                                     read=", ".join(k for k in INPUTS if any(why_no_inputs(e, k) is None
                                                                             for e in models)) or "none")
    t0 = time.perf_counter()
    rows = []
    total = len(models) * len(config.lengths) * len(config.inputs)
    emit(log, f"long-context: {len(models)} models x {len(config.lengths)} lengths x {len(config.inputs)} inputs, "
              f"{config.n_sequences} sequences each")
    bar = progress(range(total), "long-context", log)
    for m_idx, entry in enumerate(models):
        if entry.model_cfg is None:  # a TransformerBridge: its own context, its own vocabulary
            model, cfg = entry.model, None
            if max(config.lengths) > model.cfg.n_ctx:
                raise NopeInterpError(f"{entry.label}: lengths up to {max(config.lengths)} exceed its n_ctx "
                                      f"({model.cfg.n_ctx})")
        else:
            model, cfg = with_context(entry.model, entry.model_cfg, max(config.lengths))
        types = layer_positional_types(model)
        seed = None if given else int(entry.model_cfg.seed)
        in_seed = 0 if seed is None else seed
        for n in config.lengths:
            for kind in config.inputs:
                next(bar, None)
                why = why_no_inputs(entry, kind)
                if why is not None:
                    emit(log, f"  {entry.label}: no {kind} inputs ({why})")
                    continue
                t1 = time.perf_counter()
                if kind == "random" and entry.kind == "hf":  # a foreign vocabulary may hold a zero (padding) embedding
                    toks, text = random_tokens(model, config.n_sequences, n, in_seed), ""
                else:
                    toks, text = inputs(kind, entry.task, model.cfg.d_vocab, config.n_sequences, n, in_seed,
                                        entry.train_prompts)
                res = analyze_tokens(model, toks, tuple(config.points), max_lag=min(config.max_lag, n - 1),
                                     task=entry.task.name, example_prompt=text[:200], protocol=kind)
                scores = {site: {"row_mean": res.scores["row_mean"][site], "pooled": res.scores["pooled"][site],
                                 "recency_gap": res.lag_profile[site]["recency_gap"],
                                 "lag_mean": res.lag_profile[site]["mean"]} for site in res.sites}
                rows.append(LongContextRow(model=entry.label, arch=_arch(cfg, model), seed=seed, input=kind, n=n,
                                           sites=res.sites, scores=scores, seconds=round(time.perf_counter() - t1, 2),
                                           layer_types=types, input_seed=in_seed, run=run_path(entry)))
                emit(log, f"  {entry.label:34s} {kind:6s} n={n:<6d} "
                          + "; ".join(f"{site_title(site, types)} {scores[site]['row_mean']['mean']:.3f}  gap "
                                      f"{scores[site]['recency_gap']['mean']:+.3f}"
                                      for site in console_sites(res.sites, types))
                          + f"  ({rows[-1].seconds:.1f} s)")
        del model
        if m_idx == len(models) - 1:
            list(bar)
    return LongContextResult(config=config, rows=tuple(rows), wall_time_s=round(time.perf_counter() - t0, 1))


def _metric_vs_n(result: LongContextResult, metric: str, kind: str, title: str, y_title: str) -> go.Figure:
    """One panel per site (three to a row) for the ``kind`` inputs; one line per configuration, mean over
    seeds ± std."""
    rows_of_kind = [r for r in result.rows if r.input == kind]
    if not rows_of_kind:
        raise NopeInterpError(f"no row has {kind} inputs (inputs: "
                              f"{', '.join(dict.fromkeys(r.input for r in result.rows)) or 'none'})")
    sites = list(dict.fromkeys(s for r in rows_of_kind for s in r.sites))
    types_of = {_config_of(r): r.layer_types for r in rows_of_kind}
    shared_types = next(iter(types_of.values())) if len(set(types_of.values())) == 1 else ()
    cols = min(3, len(sites))
    n_rows = -(-len(sites) // cols)
    fig = make_subplots(rows=n_rows, cols=cols, shared_yaxes=True,
                        subplot_titles=[site_title(s, shared_types) for s in sites],
                        vertical_spacing=0.3 / max(1, n_rows - 1)
                        if n_rows > 1 else 0.1)
    configs = list(dict.fromkeys(_config_of(r) for r in result.rows))
    palette = line_colours(len(configs))
    groups: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in result.rows:
        if r.input != kind:
            continue
        for site in r.sites:
            value = (r.scores[site]["row_mean"]["mean"] if metric == "score"
                     else r.scores[site]["recency_gap"]["mean"])
            groups[(_config_of(r), site)][r.n].append(value)
    for ci, cfg in enumerate(configs):
        colour = palette[ci]
        for si, site in enumerate(sites):
            by_n = groups.get((cfg, site))
            if not by_n:
                continue
            ns = sorted(by_n)
            stats = [mean_std_ci(by_n[n]) for n in ns]
            name = cfg if shared_types or not types_of[cfg] else f"{cfg} [{layer_type_letters(types_of[cfg])}]"
            where = site_title(site, types_of[cfg])
            fig.add_trace(go.Scatter(
                x=ns, y=[s.mean for s in stats], mode="lines+markers", name=name, legendgroup=cfg,
                showlegend=not any(t.legendgroup == cfg for t in fig.data),
                line={"color": colour, "dash": "dot" if "sliding" in cfg else "solid"},
                error_y={"type": "data", "array": [error_bar(s) for s in stats], "visible": True},
                hovertemplate=f"{cfg}<br>{where}<br>n=%{{x}}<br>{y_title} %{{y:.3f}}<extra></extra>"),
                row=si // cols + 1, col=si % cols + 1)
    measured = sorted({r.n for r in rows_of_kind})  # ticks at the lengths measured, not log minor ticks
    fig.update_xaxes(type="log", title_text="sequence length n (tokens)", tickvals=measured,
                     ticktext=[str(n) for n in measured])
    fig.update_yaxes(title_text=y_title, col=1)
    if metric == "score":
        add_chance_line(fig, row="all", col="all")
    legend_title = "configuration<br>(mean ± std over seeds)"
    if not shared_types and any(types_of.values()):
        legend_title += "<br>[layer types by layer:<br>N NoPE, R RoPE, L learned]"
    fig.update_layout(title=f"{title} ({kind} inputs)", height=330 * n_rows + 130, width=1150,
                      legend={"title": legend_title})
    return fig


def console_sites(sites: tuple[str, ...], layer_types: tuple[str, ...]) -> list[str]:
    """The sites a console line shows: the first, and in a model with layers of more than one positional type
    the first site of each other type's first layer at the same hook (a hybrid NoPE/RoPE model's first NoPE
    layer beside its RoPE layer 0; before, only layer 0 was printed, whatever its type). ``layer_types``: one of
    ``nope``, ``rope``, ``learned``, ... per layer (empty when unknown: the first site alone). Raises nothing."""
    first = sites[0]
    shown = [first]
    parts = first.split(".")
    if not (layer_types and len(set(layer_types)) > 1 and parts[0] == "blocks" and parts[1].isdigit()):
        return shown
    seen = {layer_types[int(parts[1])]}
    for site in sites:
        p = site.split(".")
        if p[0] == "blocks" and p[1].isdigit() and p[2:] == parts[2:] and layer_types[int(p[1])] not in seen:
            seen.add(layer_types[int(p[1])])
            shown.append(site)
    return shown


def site_title(site: str, layer_types: tuple[str, ...]) -> str:
    """``L3 z (NoPE)``: the short site label with its layer's measured positional type when it is known and
    the model has more than one kind of layer or any non-NoPE layer (so hybrid models show which is which)."""
    label = short_label(site)
    parts = site.split(".")
    if layer_types and set(layer_types) != {"nope"} and parts[0] == "blocks" and parts[1].isdigit():
        names = {"nope": "NoPE", "rope": "RoPE", "learned": "learned"}
        label += f" ({names.get(layer_types[int(parts[1])], layer_types[int(parts[1])])})"
    return label


def layer_type_letters(layer_types: tuple[str, ...]) -> str:
    """``"NNNR"``: one letter per layer (N NoPE, R RoPE, L learned, ? anything else), for legends where
    the models of one figure differ in their layers' positional types."""
    letters = {"nope": "N", "rope": "R", "learned": "L"}
    return "".join(letters.get(t, "?") for t in layer_types)


def _config_of(r: LongContextRow) -> str:
    """The line a row belongs to: its grid configuration, or a given model's label."""
    return arch_label(r.arch) if r.seed is not None else r.model


def plot_score_vs_n(result: LongContextResult, kind: str = "random") -> go.Figure:
    """Adjacency score (row mean) against sequence length, per site, for the ``kind`` inputs.

    Raises:
        NopeInterpError: no row has ``kind`` inputs.
    """
    return _metric_vs_n(result, "score", kind, "Adjacency score against sequence length", "adjacency score")


def plot_gap_vs_n(result: LongContextResult, kind: str = "random") -> go.Figure:
    """Recency gap c(1) - c(D) against sequence length, per site, for the ``kind`` inputs.

    Raises:
        NopeInterpError: no row has ``kind`` inputs.
    """
    d = result.config.max_lag
    return _metric_vs_n(result, "gap", kind, f"Recency gap c(1) - c({d}) against sequence length",
                        f"c(1) - c({d})")


def plot_lag_profiles(result: LongContextResult, site: str | None = None, kind: str | None = None) -> go.Figure:
    """Lag profile c(d) at one site (default: the first analysed) for every length (a slider), one line per
    configuration (mean over seeds), with the idealised uniform-causal (wide long-dashed black) and sliding-window
    (wide dash-dotted grey) curves of that length; a configuration keeps its colour at every length.

    Raises:
        NopeInterpError: no row has ``kind`` inputs analysed at ``site``.
    """
    site = site or result.rows[0].sites[0]
    kind = kind or result.rows[0].input
    if not any(r.input == kind and site in r.scores for r in result.rows):
        raise NopeInterpError(f"no row has {kind} inputs analysed at {site} (inputs: "
                              f"{', '.join(dict.fromkeys(r.input for r in result.rows))}; sites: "
                              f"{', '.join(dict.fromkeys(s for r in result.rows for s in r.sites))})")
    lengths = sorted({r.n for r in result.rows})
    configs = list(dict.fromkeys(_config_of(r) for r in result.rows))
    colour = dict(zip(configs, line_colours(len(configs)), strict=True))  # same at every n
    fig = go.Figure()
    traces_per_n = []
    for n in lengths:
        start = len(fig.data)
        for cfg in configs:
            profs = [r.scores[site]["lag_mean"] for r in result.rows
                     if r.n == n and r.input == kind and _config_of(r) == cfg and site in r.scores]
            if not profs:
                continue
            mean = torch.tensor(profs, dtype=torch.float64).mean(0).tolist()
            fig.add_trace(go.Scatter(x=list(range(1, len(mean) + 1)), y=mean, mode=line_mode(len(mean)), name=cfg,
                                     line={"color": colour[cfg], "dash": "dot" if "sliding" in cfg else "solid"},
                                     visible=n == lengths[0]))
        n_lags = min(result.config.max_lag, n - 1)
        fig.add_trace(go.Scatter(x=list(range(1, n_lags + 1)), y=result.idealised(n),
                                 mode=line_mode(n_lags), name="idealised: uniform causal", visible=n == lengths[0],
                                 line={"color": "black", "dash": "longdash", "width": 3}, opacity=0.5))
        fig.add_trace(go.Scatter(x=list(range(1, n_lags + 1)),
                                 y=result.idealised(n, result.config.window), mode=line_mode(n_lags),
                                 name=f"idealised: sliding window w={result.config.window}", visible=n == lengths[0],
                                 line={"color": "grey", "dash": "dashdot", "width": 3}, opacity=0.6))
        traces_per_n.append(range(start, len(fig.data)))
    steps = []
    for i, n in enumerate(lengths):
        visible = [False] * len(fig.data)
        for t in traces_per_n[i]:
            visible[t] = True
        steps.append({"method": "update", "label": str(n), "args": [{"visible": visible}]})
    fig.update_layout(title=f"Lag profile at {site} ({kind} inputs): mean cosine at distance d, by length n",
                      xaxis_title="lag d (positions)", yaxis_title="c(d) (mean cosine)",
                      sliders=[{"active": 0, "currentvalue": {"prefix": "n = "}, "steps": steps}],
                      height=560, width=900)
    return fig


def plot_grid(result: LongContextResult, site: str | None = None, kind: str | None = None) -> go.Figure:
    """Normalisation x attention heatmap of the score (mean over seeds) at one site and the longest length; each
    cell reads mean ± std over seeds, the mean alone for one seed (:func:`~nope_interp.stats.fmt_mean_std`).

    Raises:
        NopeInterpError: the result has no rows of the default grid (given models only).
    """
    grid_rows = [r for r in result.rows if r.seed is not None]
    if not grid_rows:
        raise NopeInterpError("plot_grid needs the default normalisation x attention grid (no rows of it)")
    site = site or grid_rows[0].sites[0]
    kind = kind or grid_rows[0].input
    n = max(r.n for r in grid_rows)
    norms = list(dict.fromkeys(r.arch["normalization"] for r in grid_rows))
    attns = list(dict.fromkeys(r.arch["attention"] for r in grid_rows))
    z, text, seeds = [], [], set()
    for norm in norms:
        zr, tr = [], []
        for attn in attns:
            vals = [r.scores[site]["row_mean"]["mean"] for r in grid_rows
                    if r.n == n and r.input == kind and r.arch["normalization"] == norm and r.arch["attention"] == attn]
            s = mean_std_ci(vals) if vals else None
            zr.append(None if s is None else s.mean)
            tr.append("" if s is None else fmt_mean_std(s.mean, s.std, s.n_seeds))  # mean alone: one seed
            seeds.add(None if s is None else s.n_seeds)
        z.append(zr)
        text.append(tr)
    fig = go.Figure(go.Heatmap(z=z, x=attns, y=norms, text=text, texttemplate="%{text}", zmin=0, zmax=1,
                               colorscale="Viridis", colorbar={"title": "score"}))
    spread = "one seed" if seeds - {None} == {1} else "mean ± std over seeds"
    fig.update_layout(title=f"Adjacency score at {site}, n = {n}, {kind} inputs ({spread})",
                      xaxis_title="attention", yaxis_title="normalisation", height=480, width=720)
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: LongContextResult, out_root: str | Path = ".") -> list[Path]:
    """Write the result JSON, the row and summary CSVs and the figures, with the ``plotly.min.js`` the figures load
    (:func:`~nope_interp.plotting.with_plotlyjs`); returns the paths."""
    res_dir, fig_dir = io.prepare_outputs(NAME.replace("-", "_"), result, LongContextResult, out_root)
    flat = []
    for r in result.rows:
        for site in r.sites:
            s = r.scores[site]
            parts = site.split(".")
            layer_type = (r.layer_types[int(parts[1])] if r.layer_types and parts[0] == "blocks" else "")
            flat.append({"model": r.model, "normalization": r.arch["normalization"], "attention": r.arch["attention"],
                         "window": r.arch["window"], "seed": r.seed, "input_seed": r.input_seed, "input": r.input,
                         "n": r.n, "site": site,
                         "layer_type": layer_type,
                         "score_row_mean": s["row_mean"]["mean"], "score_row_mean_std": s["row_mean"]["std"],
                         "score_pooled": s["pooled"]["mean"], "recency_gap": s["recency_gap"]["mean"],
                         "c1": s["lag_mean"][0], "cD": s["lag_mean"][-1], "sequences": s["row_mean"]["n"],
                         "seconds": r.seconds})
    paths = [io.write_json(res_dir / "long_context.json", result.to_dict()),
             io.atomic_write_text(res_dir / "long_context.csv", io.to_csv(flat)),
             io.atomic_write_text(res_dir / "summary.csv", io.to_csv(result.summary()))]
    for kind in dict.fromkeys(r.input for r in result.rows):
        paths += [save_figure(plot_score_vs_n(result, kind), fig_dir / f"score_vs_n_{kind}.html"),
                  save_figure(plot_gap_vs_n(result, kind), fig_dir / f"recency_gap_vs_n_{kind}.html"),
                  save_figure(plot_lag_profiles(result, kind=kind), fig_dir / f"lag_profile_{kind}.html")]
        if any(r.seed is not None for r in result.rows):
            paths.append(save_figure(plot_grid(result, kind=kind), fig_dir / f"grid_{kind}.html"))
    return with_plotlyjs(io.drop_stale(paths[0], paths, (res_dir, fig_dir)))  # an input kind not rerun: its figures
