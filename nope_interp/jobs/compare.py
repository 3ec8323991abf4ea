"""``nope-interp compare``: initialised vs trained over seeds, per task and recipe, under each input protocol.

The comparison the paper's trained-model claim needs. Models are grouped by task and *recipe*: every setting
but the seeds (:func:`recipe_settings`: the task trained on and analysed, the model and training configs),
labelled by :func:`recipe_of` (objective, shape, learning rate, tied embeddings, dropout); within a group
each model is one seed.
For every model the job analyses its own step-0 weights (same config and init seed, before any update:
the initialised model of that seed) and its trained weights, on the same held-out prompts, under each
input protocol (``full``: full-length prompts; ``authors``: the authors' fixed-length left-padded inputs;
see ``docs/method.md``, "Analysis inputs"). Per group, site and protocol it reports the row-mean
adjacency score as mean, std and 95% CI over seeds (:func:`nope_interp.stats.mean_std_ci`), the layer-0
diagnostics (:func:`nope_interp.diagnostics.diagnose`), each seed's test exact match, and a verdict per
claim (the claims and ranges of the demo, ``nope_interp.jobs.demo.CLAIMS``) with how many seeds fall in
the claimed range. Writes ``results/compare/<label>.{json,md,csv}`` and ``figures/compare/``: every site by group
(``<label>_<protocol>.html``) and layer 0 of every model at a glance (``<label>_l0_z_<protocol>.html``); the
label is ``--label`` (default ``compare``).
"""

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import analyze_model
from nope_interp.config import FrozenConfig, check_choices, check_int, check_name, check_used, opt
from nope_interp.diagnostics import INTERVENTIONS, diagnose, position_in_values
from nope_interp.errors import Fields, NopeInterpError
from nope_interp.evaluate import exact_match_on_inputs, off_distribution
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    draw_seed,
    emit,
    job_models,
    locked_write,
    progress,
    protocol_window,
    run_path,
    shipped_entries,
)
from nope_interp.jobs.demo import CLAIMS, FIRST_ATTENTION_SITES, claim_verdict, in_claimed_range
from nope_interp.model import build_model
from nope_interp.plotting import plot_adjacency_by_layer, save_figure, with_plotlyjs
from nope_interp.stats import fmt_fraction, fmt_mean_std, mean_std_ci
from tasks import DEFAULT_WINDOW

NAME = "compare"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
DEFAULT_MODELS = "every shipped model and its extra seeds; --with-candidates adds the candidate runs to them"
#: The default set includes the seeds, so --with-candidates alone keeps them (:func:`load_models`).
DEFAULT_WITH_SEEDS = True
#: The two models analysed per seed.
KINDS = ("initialised", "trained")
#: Test exact match the paper trains to.
TARGET_ACC = 0.99


@dataclass(frozen=True)
class CompareConfig(FrozenConfig):
    """Settings of ``compare``.

    Raises:
        NopeInterpError: counts out of range; an unknown protocol; protocols not starting with ``full``; a
            ``label`` that is not one safe file name (:func:`~nope_interp.config.check_name`).
    """

    n_prompts: int = opt(256, "analysis prompts per model (the paper used 256)")
    protocols: tuple[str, ...] = opt(("full", "authors"),
                                     f"analysis inputs, full first: {', '.join(tasks_pkg.PROTOCOLS)}")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")
    prompt_seed: int = opt(1, "seed of the prompt sampler (the same prompts for every model of a task)")
    label: str = opt("compare", "name of the output files (results/compare/<label>.json, .md, .csv and "
                                "figures/compare/<label>_<protocol>.html): another label keeps an earlier "
                                "comparison's files")

    def __post_init__(self) -> None:
        check_int("n_prompts", self.n_prompts, 2, 100_000)
        check_name("label", self.label)
        if self.label.endswith("_l0_z"):  # label a's overview figure is a_l0_z_<protocol>.html: it would collide
            raise NopeInterpError(f"label must not end in _l0_z (the suffix of the overview figures' names), "
                                  f"got {self.label!r}")
        check_choices("protocol", self.protocols, tasks_pkg.PROTOCOLS)
        if not self.protocols or self.protocols[0] != "full":
            raise NopeInterpError(f"protocols must start with full (the main table), got {self.protocols}")
        check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, "window" in self.protocols, "when {protocols} include window")
        check_int("prompt_seed", self.prompt_seed, 0, 2**63 - 1)


CONFIG = CompareConfig


def recipe_of(entry: ModelEntry) -> str:
    """The short label of the recipe a trained model belongs to, e.g. ``"answer_only, 3x128, lr 0.003"`` (plus
    ``", tied"`` and ``", dropout 0.1"`` when on). An entry without a run is ``"init, LxD"``. ``compare``
    groups models by all of :func:`recipe_settings` (models of one group differ only in seeds and in when
    they stopped early) and lengthens this label where two groups of a task would share it."""
    m = entry.model_cfg
    if entry.run is None:
        return f"init, {m.n_layers}x{m.d_model}"
    t = entry.run.train_cfg
    out = f"{t.objective}, {m.n_layers}x{m.d_model}, lr {t.lr:g}, {t.steps} steps max"
    if m.tied_embeddings:
        out += ", tied"
    if m.dropout:
        out += f", dropout {m.dropout:g}"
    return out


#: Training settings that do not make another recipe: the seeds, and when the trainer evaluates and saves.
_BOOKKEEPING = ("seed", "data_seed", "eval_every", "eval_n", "checkpoint_every")


def recipe_settings(entry: ModelEntry) -> dict[str, Any]:
    """Everything that makes a trained model's recipe, for grouping: the parameters of the task it is analysed
    on and the task it was trained on (with its parameters), the model config but its seed and the training
    config but :data:`_BOOKKEEPING` (all with their defaults filled in, so
    runs saved before a field existed group with newer ones). Two runs are seeds of one recipe iff these
    are equal; :func:`recipe_of` is only its short label."""
    settings = {f"task.{k}": v for k, v in entry.task.params().items()}
    settings |= {f"model.{k}": v for k, v in entry.model_cfg.to_dict().items() if k != "seed"}
    if entry.run is not None:  # the task it was trained on too: a run analysed on another task keeps its own
        settings |= {f"train.{k}": v for k, v in entry.run.train_cfg.to_dict().items()
                     if k not in _BOOKKEEPING and k not in ("task", "task_params")}
        settings["trained_on.task"] = entry.run.task.name
        settings |= {f"trained_on.{k}": v for k, v in entry.run.task.params().items()}
    return settings


def _labels(keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
    """The recipe label of each group key ``(task, label, settings JSON)``: the short label, plus the settings
    that tell apart the groups of one task that share it (``, model.positional=rotary``)."""
    out = {}
    for task, label, fp in keys:
        twins = [json.loads(f) for t, lab, f in keys if (t, lab) == (task, label)]
        if len(twins) == 1:
            out[(task, label, fp)] = label
            continue
        mine = json.loads(fp)
        differ = sorted(k for k in set().union(*twins) if len({json.dumps(t.get(k)) for t in twins}) > 1)
        out[(task, label, fp)] = label + "".join(f", {k}={mine.get(k)}" for k in differ)
    return out


@dataclass(frozen=True)
class SeedRecord:
    """One trained model of a group: ``label``, init ``seed``, ``test_acc`` (shipped summary; None if
    unknown), ``steps`` trained, ``scores[protocol][kind][site]`` (row-mean, mean over prompts),
    ``diagnostics[kind]`` (full protocol), ``authors[protocol][kind][site]``: the authors' statistics
    (:data:`AUTHORS_STATISTICS`: their rounded pooled score, mean and std over prompts, and the score of the
    prompt-averaged cosine matrix) and ``exact_match_on_inputs[protocol]``: the trained model's exact match
    on the analysed inputs (:class:`~nope_interp.evaluate.InputsExactMatch` as a dict); ``draw_seed``: the seed
    of the diagnostics' random draws (:func:`~nope_interp.jobs.common.draw_seed` of the label; None in files
    written before it was recorded, whose models all drew with seed 0); ``run``: the model's directory, absolute
    with links resolved (:func:`~nope_interp.jobs.common.run_path`; None for a model without one, and in files
    written before 2026-12-04)."""

    label: str
    seed: int
    test_acc: float | None
    steps: int | None
    scores: dict[str, dict[str, dict[str, float]]]
    diagnostics: dict[str, dict[str, float]]
    authors: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)
    exact_match_on_inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    draw_seed: int | None = None
    run: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return dict(self.__dict__)


#: The authors' statistics recorded per model, protocol, kind and site: their reported per-sequence score
#: (``pooled_rounded``) as mean and std over prompts, and the score of the prompt-averaged cosine matrix under
#: their reduction (``pooled``) and the paper's (``row_mean``).
AUTHORS_STATISTICS = ("pooled_rounded_mean", "pooled_rounded_std", "mean_matrix_pooled", "mean_matrix_row_mean")


def authors_statistics(res: Any) -> dict[str, dict[str, float]]:
    """:data:`AUTHORS_STATISTICS` at every site of an :class:`~nope_interp.analysis.AnalysisResult` (the
    prompt-averaged matrix's scores are NaN where the analysis kept none: inputs longer than
    ``nope_interp.analysis.EXAMPLE_MAX_POS``)."""
    out = {}
    for site in res.sites:
        st = res.scores["pooled_rounded"][site]
        mm = res.mean_matrix_scores
        out[site] = {"pooled_rounded_mean": st["mean"], "pooled_rounded_std": st["std"],
                     "mean_matrix_pooled": mm["pooled"][site] if mm else float("nan"),
                     "mean_matrix_row_mean": mm["row_mean"][site] if mm else float("nan")}
    return out


@dataclass(frozen=True)
class Verdict:
    """One claim checked on one group: the mean over seeds against the claimed range [``low``, ``high``],
    and how many seeds fall in it."""

    task: str
    recipe: str
    protocol: str
    kind: str
    site: str
    claim: str
    mean: float
    std: float
    n_in_range: int
    n_seeds: int
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class GroupComparison:
    """Every seed of one (task, recipe), with the statistics over seeds.

    Attributes:
        stats: ``stats[protocol][kind][site]`` = :class:`~nope_interp.stats.SeedStats` as a dict.
        diagnostics: ``diagnostics[kind][name]`` = mean over seeds. n_at_target: seeds at >= 99%.
    """

    task: str
    recipe: str
    seeds: tuple[SeedRecord, ...]
    stats: dict[str, dict[str, dict[str, dict[str, float]]]]
    diagnostics: dict[str, dict[str, float]]
    n_at_target: int

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return {"task": self.task, "recipe": self.recipe, "seeds": [s.to_dict() for s in self.seeds],
                "stats": self.stats, "diagnostics": self.diagnostics, "n_at_target": self.n_at_target}


@dataclass(frozen=True)
class CompareResult:
    """The groups and the verdicts."""

    config: CompareConfig
    groups: tuple[GroupComparison, ...]
    verdicts: tuple[Verdict, ...]
    wall_time_s: float
    provenance: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``compare.json``."""
        return {"config": self.config.to_dict(), "groups": [g.to_dict() for g in self.groups],
                "verdicts": [v.to_dict() for v in self.verdicts], "wall_time_s": self.wall_time_s,
                **self.provenance}


def load_compare(path: str | Path) -> CompareResult:
    """A comparison from the ``results/compare/<label>.json`` that :func:`write` wrote, to redraw its figures
    (:func:`plot_site_summary`, :func:`plot_compare`) or render its Markdown again without analysing any model.
    Files written before a field existed get its default (``label`` ``compare``; no authors' statistics).

    Raises:
        NopeInterpError: the file is missing or corrupt, or not such a result: ``config``, ``groups`` or
            ``verdicts`` missing or of the wrong type, a group or seed field missing or unknown, a group or seed
            without a score (a number in [0, 1] or NaN) for a measured protocol, kind and site of the trained
            models' sites. Only what the figures read is checked: a hand-edited diagnostic or verdict may still
            fail :func:`render_markdown`. A file written before ``label`` was recorded loads with the label
            ``compare``, so :func:`write` of it replaces ``results/compare/compare.*``.
    """
    data = io.read_json(path, "compare result")

    def bad(what: str) -> NopeInterpError:
        return NopeInterpError(f"not a compare result (as `nope-interp compare` writes): {path}: {what}"[:500])

    if not isinstance(data, dict):
        raise bad(f"a JSON {type(data).__name__}, not an object")
    missing = [k for k in ("config", "groups", "verdicts") if k not in data]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    config = CompareConfig.from_dict(data["config"])
    if not isinstance(data["groups"], list) or not isinstance(data["verdicts"], list):
        raise bad("groups and verdicts must be lists")

    def score(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isnan(value) or 0 <= value <= 1):
            raise bad(f"{where} must be a number in [0, 1] or NaN, got {value!r}")

    def nan_for_null(tree: Any) -> Any:  # write() stores an undefined number (NaN) as null: read it back as NaN
        if isinstance(tree, dict):
            return {k: nan_for_null(v) for k, v in tree.items()}
        return math.nan if tree is None else tree

    numbers = ("scores", "diagnostics", "authors")
    groups = []
    try:
        for g in data["groups"]:
            seeds = tuple(SeedRecord(**{k: nan_for_null(v) if k in numbers else v for k, v in s.items()})
                          for s in g["seeds"])
            group = GroupComparison(task=g["task"], recipe=g["recipe"], seeds=seeds, stats=nan_for_null(g["stats"]),
                                    diagnostics=nan_for_null(g["diagnostics"]), n_at_target=g["n_at_target"])
            if not seeds or not isinstance(group.task, str) or not isinstance(group.recipe, str):
                raise bad("every group needs a task and recipe (strings) and at least one seed")
            name = f"{group.task}: {group.recipe}"
            for protocol in config.protocols:
                sites = list(group.stats[protocol]["trained"])
                for kind in KINDS:
                    for site in sites:
                        score(group.stats[protocol][kind][site]["mean"], f"{name}: {protocol} {kind} {site} mean")
                        for seed in seeds:
                            score(seed.scores[protocol][kind][site], f"{seed.label}: {protocol} {kind} {site}")
            for seed in seeds:
                known_acc = seed.test_acc is None or isinstance(seed.test_acc, int | float)
                if not isinstance(seed.label, str) or not known_acc:
                    raise bad(f"a seed of {name} has a label that is not a string or a test_acc that is not a number")
            groups.append(group)
        verdicts = tuple(Verdict(**nan_for_null(v)) for v in data["verdicts"])
    except (KeyError, TypeError, AttributeError) as err:
        raise bad(f"{type(err).__name__}: {err}") from None
    wall = data.get("wall_time_s", math.nan)
    provenance = {k: v for k, v in data.items() if k not in ("config", "groups", "verdicts", "wall_time_s", "figures")}
    return CompareResult(config=config, groups=tuple(groups), verdicts=verdicts,
                         wall_time_s=wall if isinstance(wall, int | float) else math.nan, provenance=provenance)


def default_models(config: CompareConfig) -> list[ModelEntry]:
    """Every shipped trained model and its extra seeds."""
    return shipped_entries(tasks_pkg.TASK_NAMES, with_seeds=True)


def _seed_record(entry: ModelEntry, config: CompareConfig) -> SeedRecord:
    task, n = entry.task, config.n_prompts
    models = {"initialised": build_model(entry.model_cfg), "trained": entry.model}
    scores: dict[str, dict[str, dict[str, float]]] = {}
    authors: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    on_inputs: dict[str, dict[str, Any]] = {}
    for protocol in config.protocols:
        scores[protocol], authors[protocol] = {}, {}
        for kind, model in models.items():
            res = analyze_model(model, task, n, seed=config.prompt_seed, exclude=entry.train_prompts,
                                protocol=protocol, window=protocol_window(protocol, config.window))
            scores[protocol][kind] = {s: v["mean"] for s, v in res.scores["row_mean"].items()}
            authors[protocol][kind] = authors_statistics(res)
        inputs = tasks_pkg.protocol_inputs(task, protocol, n, config.prompt_seed, entry.train_prompts,
                                           protocol_window(protocol, config.window))
        on_inputs[protocol] = exact_match_on_inputs(entry.model, task, inputs).to_dict()
    tokens = task.analysis_tokens(n, config.prompt_seed, entry.train_prompts)
    draws = draw_seed(entry.label)  # one draw per seed, shared by its initialised and trained model (paired)
    diagnostics = {kind: diagnose(model, task, tokens, seed=draws) for kind, model in models.items()}
    summary = entry.run.summary if entry.run is not None else {}
    return SeedRecord(label=entry.label, seed=entry.model_cfg.seed, test_acc=summary.get("test_acc"),
                      steps=summary.get("steps"), scores=scores, diagnostics=diagnostics, authors=authors,
                      exact_match_on_inputs=on_inputs, draw_seed=draws, run=run_path(entry))


def _group(task: str, recipe: str, seeds: list[SeedRecord], protocols: tuple[str, ...]) -> GroupComparison:
    stats = {p: {k: {site: mean_std_ci([s.scores[p][k][site] for s in seeds]).to_dict()
                     for site in seeds[0].scores[p][k]} for k in KINDS} for p in protocols}
    # the diagnostics every seed has (a sliding-window model has no intervention scores): never a KeyError
    diag = {k: {name: sum(s.diagnostics[k][name] for s in seeds) / len(seeds) for name in seeds[0].diagnostics[k]
                if all(name in s.diagnostics[k] for s in seeds)} for k in KINDS}
    n_ok = sum(1 for s in seeds if s.test_acc is not None and s.test_acc >= TARGET_ACC)
    return GroupComparison(task=task, recipe=recipe, seeds=tuple(seeds), stats=stats, diagnostics=diag,
                           n_at_target=n_ok)


def verdicts(group: GroupComparison) -> list[Verdict]:
    """The claims checked on ``group``: the token embeddings at chance, and the first causal attention
    layer's sites at 0.8-1.0, for the initialised and the trained models under every protocol. The
    verdict is on the mean over seeds (:func:`~nope_interp.jobs.demo.claim_verdict`: ``agrees`` inside the
    claimed range, ``DISAGREES`` outside, undefined for a NaN mean); ``n_in_range`` counts the seeds that are
    inside."""
    out = []
    for protocol, by_kind in group.stats.items():
        for kind in KINDS:
            checks = [("hook_embed", *CLAIMS["embed"])]
            checks += [(s, *CLAIMS["first_attn"]) for s in FIRST_ATTENTION_SITES if s in by_kind[kind]]
            for site, low, high, text in checks:
                st = by_kind[kind][site]
                inside = sum(1 for s in group.seeds if in_claimed_range(s.scores[protocol][kind][site], low, high))
                out.append(Verdict(task=group.task, recipe=group.recipe, protocol=protocol, kind=kind, site=site,
                                   claim=text, mean=st["mean"], std=st["std"], n_in_range=inside,
                                   n_seeds=len(group.seeds),
                                   verdict=claim_verdict(st["mean"], low, high)))
    return out


def run(config: CompareConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> CompareResult:
    """Analyse every model's step-0 and trained weights and aggregate over seeds per (task, recipe).

    Raises:
        NopeInterpError: an initialised model among ``models`` (give trained runs: each one's step-0
            weights are its initialised twin); a model with learned or sinusoidal positional embeddings
            (named before any work); inputs that do not fit a model's ``n_ctx``.
    """
    t0 = time.perf_counter()
    models = job_models("compare", models, lambda: default_models(config))
    check_inputs_fit("compare", models, config.protocols, config.window)
    if any(e.run is None for e in models):
        raise NopeInterpError.naming("compare takes trained runs ({sources}); each run's initialised twin is built "
                                     "from its own config", sources=Fields("run", "pretrained", "with_seeds"))
    emit(log, f"compare: {len(models)} trained models, {config.n_prompts} prompts, protocols "
              f"{', '.join(config.protocols)}")
    for entry in models:  # before any work: the layer-0 diagnostics read value vectors without positions
        why = position_in_values(entry.model)
        if why is not None:
            raise NopeInterpError(f"{entry.label}: compare takes models without positional embeddings (NoPE or "
                                  f"rotary), got {why}")
    by_group: dict[tuple[str, str, str], list[SeedRecord]] = defaultdict(list)
    for entry in progress(models, "compare", log):
        t1 = time.perf_counter()
        record = _seed_record(entry, config)
        fingerprint = json.dumps(io.json_safe(recipe_settings(entry)), sort_keys=True)
        by_group[(entry.task.name, recipe_of(entry), fingerprint)].append(record)
        z = record.scores["full"]
        site = "blocks.0.attn.hook_z"
        emit(log, f"{entry.label}: L0 hook_z {z['initialised'].get(site, float('nan')):.3f} (step 0) -> "
                  f"{z['trained'].get(site, float('nan')):.3f} (trained) ({time.perf_counter() - t1:.0f}s)")
    labels = _labels(list(by_group))
    groups = tuple(_group(key[0], labels[key], seeds, config.protocols) for key, seeds in by_group.items())
    return CompareResult(config=config, groups=groups, verdicts=tuple(v for g in groups for v in verdicts(g)),
                         wall_time_s=round(time.perf_counter() - t0, 1), provenance=io.provenance())


def _fmt(st: dict[str, Any]) -> str:
    """``mean ± std`` over seeds (a stats or verdict dict); the mean alone for one seed, whose spread is
    undefined (not 0): :func:`~nope_interp.stats.fmt_mean_std`."""
    return fmt_mean_std(st["mean"], st["std"], st.get("n_seeds"))


def render_markdown(result: dict[str, Any]) -> str:
    """The Markdown report from the ``compare.json`` dict: models per group, scores over seeds, verdicts."""
    cfg = result["config"]
    z = "blocks.0.attn.hook_z"
    lines = ["# Initialised vs trained NoPE models over seeds", "",
             f"Row-mean adjacency score, mean over {cfg['n_prompts']} held-out prompts per model, then mean ± "
             "std over the seeds of each recipe. `initialised` is each seed's own step-0 weights. Protocols: "
             f"{', '.join(cfg['protocols'])} (docs/method.md, \"Analysis inputs\").", "",
             "## Models", "", "| task | recipe | seeds: test exact match (steps) | at 99% |", "|---|---|---|---|"]
    for g in result["groups"]:
        # a run without a summary (stopped before its test set was scored) has no exact match: not "0 of 1"
        accs = ", ".join(f"{s['label']} not finished (no summary)" if s["test_acc"] is None
                         else f"{s['label']} {fmt_fraction(s['test_acc'])} ({s['steps']})" for s in g["seeds"])
        unknown = sum(s["test_acc"] is None for s in g["seeds"])
        at = f"{g['n_at_target']} of {len(g['seeds']) - unknown}" + (f" ({unknown} not finished)" if unknown else "")
        lines.append(f"| {g['task']} | {g['recipe']} | {accs} | {at} |")
    lines += ["", "## Scores at `hook_embed` and layer 0 (mean ± std over seeds)", "",
              "| task | recipe | protocol | init embed | init L0 hook_z | trained embed | trained L0 hook_z "
              "| trained L0 resid_post |", "|---|---|---|---|---|---|---|---|"]
    for g in result["groups"]:
        for p, by in g["stats"].items():
            cells = [_fmt(by[k][s]) if s in by[k] else "-" for k, s in
                     (("initialised", "hook_embed"), ("initialised", z), ("trained", "hook_embed"), ("trained", z),
                      ("trained", "blocks.0.hook_resid_post"))]
            lines.append(f"| {g['task']} | {g['recipe']} | {p} | " + " | ".join(cells) + " |")
    if any(sd.get("authors") for g in result["groups"] for sd in g["seeds"]):
        lines += ["", "## The authors' statistics at L0 `hook_z` (mean over seeds)", "",
                  "Beside our row-mean score: the authors' reported score (per prompt the pooled score rounded to "
                  "two decimals, then mean ± std over prompts), the pooled score of the prompt-averaged cosine "
                  "matrix (their heat-map titles) and the trained model's greedy exact match on the very inputs "
                  "analysed (the last complete prompt of each input, read with its padding or earlier lines; "
                  "`n` inputs scored). A score measured where that exact match is low is off the model's "
                  "distribution: marked `off-distribution` where it is more than 0.1 below the model's test exact "
                  "match (`nope_interp.evaluate.off_distribution`; with several seeds, how many).", "",
                  "| task | recipe | protocol | model | row mean (ours) | pooled, rounded (authors) | prompt-averaged "
                  "matrix, pooled | exact match on these inputs (n) |", "|---|---|---|---|---|---|---|---|"]
        for g in result["groups"]:
            seeds = [sd for sd in g["seeds"] if sd.get("authors")]
            if not seeds:
                continue
            for p in seeds[0]["authors"]:
                for kind in KINDS:
                    if z not in seeds[0]["authors"][p][kind]:
                        continue
                    a = [sd["authors"][p][kind][z] for sd in seeds]
                    row = sum(sd["scores"][p][kind][z] for sd in seeds) / len(seeds)
                    mean = sum(x["pooled_rounded_mean"] for x in a) / len(a)
                    std = sum(x["pooled_rounded_std"] for x in a) / len(a)
                    # null (NaN) where no averaged matrix was kept or it had no order to score
                    known_mm = [x["mean_matrix_pooled"] for x in a if x["mean_matrix_pooled"] is not None
                                and x["mean_matrix_pooled"] == x["mean_matrix_pooled"]]
                    mm = f"{sum(known_mm) / len(known_mm):.3f}" if known_mm else "-"
                    em = "-"
                    if kind == "trained":
                        got = [sd["exact_match_on_inputs"][p] for sd in seeds]
                        known = [x["exact_match"] for x in got if x["exact_match"] is not None]
                        em = (f"{sum(known) / len(known):.3f} ({sum(x['n_scored'] for x in got) // len(got)})"
                              if known else "none scorable")
                        off = sum(off_distribution(x["exact_match"], sd.get("test_acc")) for x, sd in zip(
                            got, seeds, strict=True))
                        if off:
                            em += ", off-distribution" + (f" in {off} of {len(seeds)} seeds" if len(seeds) > 1 else "")
                    lines.append(f"| {g['task']} | {g['recipe']} | {p} | {kind} | {row:.3f} | {mean:.2f} ± {std:.2f} "
                                 f"| {mm} | {em} |")
    lines += ["", "## Layer-0 diagnostics of the trained models (mean over seeds, full protocol)", "",
              "| task | recipe | L0 attention entropy | its lowest head's | positional share of L0 hook_z "
              "| digit value spread | delimiter / digit value norm | digit value participation ratio (of 9) |",
              "|---|---|---|---|---|---|---|---|"]
    for g in result["groups"]:
        d = g["diagnostics"]["trained"]
        pr = d.get("digit_value_participation_ratio")
        low = d.get("l0_min_head_entropy")  # None in files written before it was measured
        lines.append(f"| {g['task']} | {g['recipe']} | {d['l0_attention_entropy']:.3f} | "
                     f"{'-' if low is None else format(low, '.3f')} | {d['l0_z_positional_share']:.3f} | "
                     f"{d['digit_value_spread']:.3f} | "
                     f"{d['delimiter_value_norm_ratio']:.2f} | {'-' if pr is None else format(pr, '.2f')} |")
    if any("l0_z_score_none" in g["diagnostics"]["trained"] for g in result["groups"]):
        lines += ["", "## Which explanation holds? L0 hook_z with each one undone (full protocol)", "",
                  "Row-mean score at `blocks.0.attn.hook_z` with layer 0's attention made uniform (undoes any "
                  "non-uniform attention, collapse among others), with the delimiters' layer-0 values resampled "
                  "from the digits' (removes whatever the delimiters' values carry, a delimiter-keyed code among "
                  "others; mean of 8 draws), and both (`nope_interp.diagnostics.layer0_interventions`). "
                  "`both` is the averaging argument on the trained digit values, near the paper's range by "
                  "construction unless those values span few directions. Delimiters: every non-digit token, "
                  "the tasks' prefixes (`rev(`, `order(`) included. Control: on the initialised (step-0) models "
                  "the resampling lowers an intact pattern by about 0.02-0.04. `reading`: the single interventions "
                  "that lift the trained score by 0.05 or more, largest first. Entropy: layer-0 "
                  "attention entropy over uniform (1 = uniform). Participation ratio: how many directions the 10 "
                  "digits' layer-0 values span (at most 9; README, \"The causal test\").", "",
                  "Mean over seeds:", "",
                  "| task | recipe | model | as is | uniform attention | neutral delimiters | both |",
                  "|---|---|---|---|---|---|---|"]
        for g in result["groups"]:
            for kind in KINDS:
                d = g["diagnostics"][kind]
                if "l0_z_score_none" in d:
                    lines.append(f"| {g['task']} | {g['recipe']} | {kind} | " + " | ".join(
                        f"{d['l0_z_score_' + i]:.3f}" for i in INTERVENTIONS) + " |")
        lines += ["", "Per trained model (each seed):", "",
                  "| task | recipe | model | test exact match | L0 attention entropy | digit value participation "
                  "ratio | as is | uniform attention | neutral delimiters | both | reading |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for g in result["groups"]:
            for sd in g["seeds"]:
                d = sd["diagnostics"]["trained"]
                if "l0_z_score_none" in d:
                    acc = "n/a" if sd["test_acc"] is None else fmt_fraction(sd["test_acc"])
                    pr = d.get("digit_value_participation_ratio")
                    lines.append(f"| {g['task']} | {g['recipe']} | {sd['label']} | {acc} | "
                                 f"{d['l0_attention_entropy']:.3f} | {'-' if pr is None else format(pr, '.2f')} | "
                                 + " | ".join(f"{d['l0_z_score_' + i]:.3f}" for i in INTERVENTIONS)
                                 + f" | {reading(d)} |")
    lines += ["", "## Verdicts", "", "Verdict on the mean over seeds; `seeds in range` counts the seeds inside "
              "the claimed range.", "",
              "| task | recipe | protocol | model | site | claim | mean ± std | seeds in range | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for v in result["verdicts"]:
        lines.append(f"| {v['task']} | {v['recipe']} | {v['protocol']} | {v['kind']} | `{v['site']}` | {v['claim']} "
                     f"| {_fmt(v)} | {v['n_in_range']} of {v['n_seeds']} | {v['verdict']} |")
    lines += ["", f"Wall time: {result['wall_time_s']} s. Commit: {result.get('git_commit')}.", ""]
    return "\n".join(lines)


#: The smallest lift of the L0 ``hook_z`` score that :func:`reading` attributes to one intervention.
READING_LIFT = 0.05


def reading(diagnostics: dict[str, float]) -> str:
    """The single interventions of :func:`~nope_interp.diagnostics.layer0_interventions` that lift the score at
    ``blocks.0.attn.hook_z`` by at least :data:`READING_LIFT`, largest first, as a short phrase
    (``"attention +0.30, delimiter values +0.08"``); ``"only both together +0.27"`` when neither alone does
    but the two together do; else ``"neither"``. ``diagnostics``: a :func:`~nope_interp.diagnostics.diagnose`
    result with the intervention scores. ``"undefined"`` when a score is NaN (every input degenerate)."""
    keys = ("l0_z_score_none", "l0_z_score_uniform_attention", "l0_z_score_neutral_delimiters", "l0_z_score_both")
    if any(diagnostics[k] is None or math.isnan(diagnostics[k]) for k in keys):
        return "undefined"
    base = diagnostics["l0_z_score_none"]
    lifts = {"attention": diagnostics["l0_z_score_uniform_attention"] - base,
             "delimiter values": diagnostics["l0_z_score_neutral_delimiters"] - base}
    parts = [f"{name} +{lift:.2f}" for name, lift in sorted(lifts.items(), key=lambda kv: -kv[1])
             if lift >= READING_LIFT]
    if parts:
        return ", ".join(parts)
    together = diagnostics["l0_z_score_both"] - base
    return f"only both together +{together:.2f}" if together >= READING_LIFT else "neither"


def csv_rows(result: CompareResult) -> list[dict[str, Any]]:
    """One row per (task, recipe, protocol, kind, site): mean, std, 95% CI over seeds and n_seeds."""
    return [{"task": g.task, "recipe": g.recipe, "protocol": p, "model": k, "site": site, **st}
            for g in result.groups for p, by in g.stats.items() for k in KINDS for site, st in by[k].items()]


def plot_compare(result: CompareResult, protocol: str = "full") -> go.Figure:
    """Adjacency score by site, mean ± std over seeds: a panel per (task, recipe), titled with the recipe
    and the number of seeds, and one line per model (initialised = step 0, trained), so the legend holds
    for every panel; a one-seed panel has no error bars (its spread is undefined).

    Raises:
        NopeInterpError: ``protocol`` was not measured.
    """
    if protocol not in result.config.protocols:
        raise NopeInterpError(f"protocol {protocol!r} was not measured; measured: {', '.join(result.config.protocols)}")
    def by_site(stats: dict[str, dict[str, float]], n: int) -> dict[str, dict[str, float]]:
        # one seed: the spread is undefined, drawn without an error bar (not as a bar of 0)
        return stats if n > 1 else {site: {**st, "std": math.nan} for site, st in stats.items()}

    panels = {f"{g.task}: {g.recipe} ({len(g.seeds)} seed{'s' if len(g.seeds) != 1 else ''})":
              {("initialised (step 0)" if k == "initialised" else k): by_site(g.stats[protocol][k], len(g.seeds))
               for k in KINDS}
              for g in result.groups}
    return plot_adjacency_by_layer(panels, f"Adjacency score by site over seeds ({protocol} inputs)<br><sup>"
                                           "initialised (step 0) vs trained, mean ± std over seeds</sup>")


#: The site of the overview figure: the first causal attention layer's output, where the claim is made.
SUMMARY_SITE = "blocks.0.attn.hook_z"


def plot_site_summary(result: CompareResult, protocol: str = "full", site: str = SUMMARY_SITE) -> go.Figure:
    """Every model at one site, at a glance: a row per (task, recipe), one marker per seed for its step-0
    weights (blue) and for the trained model (red; filled when it reached 99% test exact match, open when it
    did not, grey x when unknown), the mean over the group's seeds as a vertical tick, and the claimed range of the
    first attention layer (``nope_interp.jobs.demo.CLAIMS``: 0.8-1.0) shaded, chance (0.5) dotted. Row-mean
    adjacency score in [0, 1], mean over prompts (``docs/method.md``, "Definitions"; the claim is the paper's,
    in "Claims").

    Raises:
        NopeInterpError: ``protocol`` was not measured; ``site`` was not analysed in every group.
    """
    if protocol not in result.config.protocols:
        raise NopeInterpError(f"protocol {protocol!r} was not measured; measured: {', '.join(result.config.protocols)}")
    missing = [f"{g.task}: {g.recipe}" for g in result.groups if site not in g.stats[protocol]["trained"]]
    if missing:
        raise NopeInterpError(f"{site} was not analysed for {'; '.join(missing)}")
    low, high, _ = CLAIMS["first_attn"]
    rows = [f"{g.task}: {g.recipe} ({len(g.seeds)})" for g in result.groups]
    fig = go.Figure()
    fig.add_vrect(x0=low, x1=high, fillcolor="#2ca02c", opacity=0.12, line_width=0,
                  annotation_text=f"claimed {low}-{high}", annotation_position="top left")
    fig.add_vline(x=0.5, line_dash="dot", line_color="gray", annotation_text="chance", annotation_position="top right",
                  annotation_font={"color": "gray", "size": 10})  # labelled as plotting.add_chance_line labels it
    for kind, colour in (("initialised", "#1f77b4"), ("trained", "#d62728")):
        fig.add_trace(go.Scatter(
            y=rows, x=[g.stats[protocol][kind][site]["mean"] for g in result.groups], mode="markers",
            marker={"color": colour, "symbol": "line-ns", "size": 26, "line": {"width": 3, "color": colour}},
            name=f"{'initialised (step 0)' if kind == 'initialised' else 'trained'}: mean over seeds",
            hovertemplate=f"%{{y}}<br>{'step-0' if kind == 'initialised' else 'trained'} mean over seeds %{{x:.3f}}"
                          "<extra></extra>"))
    seeds = [(row, s) for row, g in zip(rows, result.groups, strict=True) for s in g.seeds]
    marker_sets = [("initialised (step 0)", "initialised", seeds, "diamond", "#1f77b4")]
    for reached, text, symbol, colour in ((True, "trained, at 99% test exact match", "circle", "#d62728"),
                                          (False, "trained, below 99%", "circle-open", "#d62728"),
                                          (None, "trained, test exact match unknown", "x", "gray")):
        chosen = [(row, s) for row, s in seeds if (None if s.test_acc is None else s.test_acc >= TARGET_ACC) == reached]
        marker_sets.append((text, "trained", chosen, symbol, colour))
    for name, kind, chosen, symbol, colour in marker_sets:
        if not chosen:
            continue
        # a step-0 marker's hover says whose accuracy it quotes: the trained model's (before: read as the step-0's)
        accuracy = "its trained model's test exact match" if kind == "initialised" else "test exact match"
        fig.add_trace(go.Scatter(
            y=[row for row, _ in chosen], x=[s.scores[protocol][kind][site] for _, s in chosen], mode="markers",
            marker={"color": colour, "symbol": symbol, "size": 9, "line": {"width": 1.5, "color": colour}},
            name=name,
            customdata=[[s.label, "n/a" if s.test_acc is None else fmt_fraction(s.test_acc)] for _, s in chosen],
            hovertemplate=f"%{{customdata[0]}} ({'step 0' if kind == 'initialised' else 'trained'})<br>score "
                          f"%{{x:.3f}}<br>{accuracy} %{{customdata[1]}}<extra></extra>"))
    # the page's width (no fixed width: a 1300-pixel figure scrolled in a smaller window, hiding the step-0
    # markers near 1.0), a left margin as wide as the longest row label (about 6.5 pixels a character at 11 pt),
    # and the title in two short lines, clear of the toolbar
    fig.update_layout(title={"text": f"{site} adjacency score of every model ({protocol} inputs)<br><sup>step 0 vs "
                                     "trained, a row per task and recipe (number of seeds)</sup>", "yref": "container",
                             "y": 1, "yanchor": "top", "pad": {"t": 12}, "x": 0.01, "xanchor": "left"},
                      xaxis={"title": "adjacency score (row mean; 0.5 = chance)", "range": [0.3, 1.02]},
                      yaxis={"autorange": "reversed", "tickfont": {"size": 11}},
                      height=(height := 240 + 42 * len(rows)), autosize=True,
                      margin={"l": min(560, 40 + int(6.5 * max(map(len, rows), default=0))), "t": 170, "r": 30},
                      # hung below the title, so that in a narrow window its rows wrap downwards, not over the title
                      legend={"orientation": "h", "yref": "container", "yanchor": "top", "y": 1 - 72 / height,
                              "x": 0})
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: CompareResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/compare/<label>.{json,md,csv}``, ``figures/compare/<label>_<protocol>.html`` (every site, a
    panel per group) and ``figures/compare/<label>_l0_z_<protocol>.html`` (:func:`plot_site_summary`), with the
    ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`); returns the paths. The label
    is the config's (default ``compare``): a second call with the same label replaces the first one's files."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, CompareResult, out_root)
    label = result.config.label
    figures = [save_figure(plot_compare(result, p), fig_dir / f"{label}_{p}.html") for p in result.config.protocols]
    figures += [save_figure(plot_site_summary(result, p), fig_dir / f"{label}_l0_z_{p}.html")
                for p in result.config.protocols]
    data = {**result.to_dict(), "figures": io.relative_to_folder(figures, res_dir)}  # from <label>.json
    paths = [io.write_json(res_dir / f"{label}.json", data),
             io.atomic_write_text(res_dir / f"{label}.md", render_markdown(data)),
             io.atomic_write_text(res_dir / f"{label}.csv", io.to_csv(csv_rows(result))), *figures]
    return with_plotlyjs(io.drop_stale(paths[0], paths, (res_dir, fig_dir)))  # a protocol not rerun: its figures
