"""``nope-interp analyze``: adjacency scores at every hook site of one model, with figures.

For each model given (``--run``, ``--pretrained``, ``--init`` or ``--hf-path``): ``n_prompts`` held-out
full-length prompts of its task (a ``train-text`` model: held-out text windows of its training length; a
Hugging Face model: random token sequences, and each layer's positional type measured and recorded in
``layer_types`` of scores.json; :func:`nope_interp.jobs.common.entry_tokens`; with ``--text-file``, windows of
the user's text tokenised by the model's own tokenizer, :func:`nope_interp.analysis.analyze_text`), activations
at every requested
hook site, cosine similarity matrices and both reductions
of the adjacency score, and the lag profile (mean cosine by distance, with the idealised uniform-causal
curve; ``docs/method.md``). Beside the scores of a task model: its layer-0 diagnostics and, for a trained
one, its exact match on the very inputs analysed, flagged when off its distribution
(:func:`mechanism_diagnostics`). Writes ``results/analyze/<label>/scores.json`` (``lag_profile`` among its
fields; ``diagnostics`` for a task model, ``exact_match_on_inputs`` for a trained one) and
``figures/analyze/<label>/{cosine,adjacency,lag_profile}.html``.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from torch import Tensor

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import AnalysisResult, analyze_model, analyze_tokens, decode_window, text_windows_of
from nope_interp.checks import is_real
from nope_interp.config import FrozenConfig, check_choice, check_int, check_name, check_used, opt
from nope_interp.errors import Fields, Message, NopeInterpError
from nope_interp.hooks import ACTIVATION_POINTS, activation_hook_names, check_points
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    draw_seed,
    emit,
    entry_tokens,
    job_models,
    locked_write,
    progress,
    protocol_tag,
    warn_overwriting_another_model,
)
from nope_interp.plotting import (
    plot_adjacency_by_layer,
    plot_cosine_heatmaps,
    plot_lag_profile,
    save_figure,
    with_plotlyjs,
)
from nope_interp.positional import layer_positional_types
from nope_interp.stats import fmt_mean_std
from tasks import DEFAULT_WINDOW

NAME = "analyze"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
TAKES_TEXT = True  # train-text language models: windows of held-out text of their training length
TAKES_HF = True  # --hf-path: random tokens of the model's vocabulary; layers typed (NoPE / RoPE)
DEFAULT_MODELS = "none: give --run, --pretrained or --init"


@dataclass(frozen=True)
class AnalyzeConfig(FrozenConfig):
    """Settings of ``analyze``.

    Raises:
        NopeInterpError: an empty or blank ``text_file``; ``n_prompts`` outside [1, 100000]; an unknown point; a
            negative seed; a ``label`` that is not one safe folder name (:func:`~nope_interp.config.check_name`,
            e.g. ``../x``).
    """

    n_prompts: int = opt(256, "prompts analysed (the paper used 256)")
    points: tuple[str, ...] = opt(ACTIVATION_POINTS, f"hook points: {', '.join(ACTIVATION_POINTS)}")
    prompt_seed: int = opt(1, "seed of the prompt sampler")
    label: str | None = opt(None, "output label (default from the model source)")
    protocol: str = opt("full", f"analysis inputs: {', '.join(tasks_pkg.PROTOCOLS)} (docs/method.md)")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")
    text_file: str | None = opt(None, "a UTF-8 text file analysed instead of the model's own inputs: up to "
                                      "--n-prompts consecutive windows of --text-length tokens, tokenised by "
                                      "the model's tokenizer (an --hf-path folder's own; else the 96 characters)")
    text_length: int | None = opt(None, "tokens per window of --text-file (default: 128, or the model's n_ctx "
                                        "when smaller)")

    def __post_init__(self) -> None:
        check_int("n_prompts", self.n_prompts, 1, 100_000)
        check_choice("protocol", self.protocol, tasks_pkg.PROTOCOLS)
        check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, self.protocol == "window", "with {protocol} window")
        if self.text_file is not None:  # an empty path would read as the current folder
            io.as_path(self.text_file, "text_file")
        if self.text_length is not None:
            check_int("text_length", self.text_length, 3, 1_000_000)
        check_used("text_length", self.text_length, None, self.text_file is not None, "with {text_file}")
        if self.text_file is not None and self.protocol != "full":
            raise NopeInterpError.naming("{text_file} and {protocol} {value} exclude each other: the text file is "
                                         "the input", value=self.protocol)
        check_points(self.points)
        check_int("prompt_seed", self.prompt_seed, 0, 2**63 - 1)
        check_used("prompt_seed", self.prompt_seed, 1, self.text_file is None,
                   "without {text_file} (the file is read from its start)")
        if self.label is not None:  # a folder name under results/analyze/ and figures/analyze/
            check_name("label", self.label)


CONFIG = AnalyzeConfig


@dataclass(frozen=True)
class ModelScores:
    """The analysis of one model: its output label and the adjacency analysis (with provenance in ``meta``)."""

    label: str
    analysis: AnalysisResult

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``scores.json``."""
        return self.analysis.to_dict()


@dataclass(frozen=True)
class AnalyzeResult:
    """What ``analyze`` measured: one :class:`ModelScores` per model, and the wall time in seconds."""

    config: AnalyzeConfig
    models: tuple[ModelScores, ...]
    wall_time_s: float

    def to_dict(self) -> dict[str, Any]:
        """``{"config", "models": {label: scores}, "wall_time_s"}``."""
        return {"config": self.config.to_dict(), "models": {m.label: m.to_dict() for m in self.models},
                "wall_time_s": self.wall_time_s}


def default_models(config: AnalyzeConfig) -> list[ModelEntry]:
    """``analyze`` has no default model.

    Raises:
        NopeInterpError: always (the message says which options to give).
    """
    raise NopeInterpError.naming("analyze needs models: give one of {sources}",
                                 sources=Fields("run", "pretrained", "init", "hf_path"))


def run(config: AnalyzeConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> AnalyzeResult:
    """Analyse every model of ``models`` on its task (see the module docstring).

    Raises:
        NopeInterpError: no models; the prompts do not fit a model's ``n_ctx``.
    """
    models = job_models("analyze", models, lambda: default_models(config))
    if config.text_file is None:
        check_inputs_fit("analyze", models, [config.protocol], config.window)
    t0 = time.perf_counter()
    out = []
    if config.label and len(models) > 1:
        emit(log, Message.naming("{label} {value!r} names the output of one model; {n} models keep their own labels",
                                 value=config.label, n=len(models)))
    for entry in progress(models, "analyze", log):
        own_label = bool(config.label) and len(models) == 1  # --label names the output of one model only
        label = config.label if own_label else entry.label
        if config.protocol != "full" and not own_label:
            label += f"-{protocol_tag(config.protocol, config.window)}"  # never overwrites another protocol's
        activation_hook_names(entry.model.cfg.n_layers, tuple(config.points))  # validates before any work
        types: tuple[str, ...] = ()
        if config.text_file is not None:  # the user's text, tokenised by the model's own tokenizer
            if not own_label:
                label += "-textfile"  # never overwrites the analysis of the model's own inputs
            types = layer_positional_types(entry.model)
            tokenizer = None
            if entry.kind == "hf":
                from nope_interp.hf import load_hf_tokenizer

                tokenizer = load_hf_tokenizer(entry.source["hf_path"])
            n_ctx = entry.model.cfg.n_ctx
            length = config.text_length if config.text_length is not None else min(128, n_ctx)
            if length > n_ctx:
                raise NopeInterpError.naming("{text_length}={length} exceeds {label}'s n_ctx={n_ctx}: give "
                                             "{text_length} <= {n_ctx}", length=length, label=entry.label, n_ctx=n_ctx)
            windows, chars_read = _text_file_windows(config.text_file, length, config.n_prompts, tokenizer)
            if chars_read is not None:
                emit(log, f"read the first {chars_read:,} characters of {config.text_file} (enough for "
                          f"{len(windows)} windows; the rest is not read)")
            if int(windows.max()) >= entry.model.cfg.d_vocab:
                raise NopeInterpError(f"the tokenizer gives id {int(windows.max())} but {entry.label} has "
                                      f"d_vocab={entry.model.cfg.d_vocab}: not the tokenizer this model reads")
            emit(log, f"analysing {label}: {len(windows)} windows of {length} tokens of {config.text_file}"
                      + (f" (the file holds only {len(windows)} of the {config.n_prompts} asked for)"
                         if len(windows) < config.n_prompts else "") + " ...")
            res = analyze_tokens(entry.model, windows, tuple(config.points), task="text-file", protocol="text",
                                 example_prompt=[decode_window(w, tokenizer)[:200] for w in windows],
                                 meta={**entry.source, "text_file": str(Path(config.text_file).resolve()),
                                       "text_length": length, "windows_asked": config.n_prompts,
                                       "layer_types": list(types), **io.provenance()})
        elif entry.kind in ("text", "hf"):  # no task prompts: held-out text, or random tokens of its vocabulary
            if config.protocol != "full":
                raise NopeInterpError.naming(
                    "{label}: {protocol} {value} applies to task models; a {kind} model reads {reads}",
                    label=entry.label, value=config.protocol,
                    kind="train-text" if entry.kind == "text" else "Hugging Face",
                    reads="held-out text windows" if entry.kind == "text" else "random tokens")
            name, protocol, tokens = entry_tokens(entry, config.n_prompts, config.prompt_seed)
            types = layer_positional_types(entry.model)
            emit(log, f"analysing {label}: {_inputs(config.n_prompts)} ({protocol}) of {tokens.shape[1]} tokens ...")
            if entry.kind == "text":
                examples = [tasks_pkg.vocab.decode(t.tolist())[:200] for t in tokens]
            elif entry.model.tokenizer:
                examples = [entry.model.to_string(t)[:200] for t in tokens]
            else:
                examples = [""] * len(tokens)
            res = analyze_tokens(entry.model, tokens, tuple(config.points), task=name, protocol=protocol,
                                 example_prompt=examples,
                                 meta={**entry.source, "layer_types": list(types), **io.provenance()})
        else:
            emit(log, f"analysing {label}: {_inputs(config.n_prompts)} ({entry.task.name}, {config.protocol} "
                      "protocol) ...")
            beside = mechanism_diagnostics(entry, config)
            res = analyze_model(entry.model, entry.task, config.n_prompts, seed=config.prompt_seed,
                                points=tuple(config.points), exclude=entry.train_prompts,
                                meta={**entry.source, **beside, **io.provenance()}, protocol=config.protocol,
                                window=config.window)
        row = res.scores["row_mean"]
        max_lag = len(next(iter(res.lag_profile.values()))["mean"]) if res.lag_profile else 0
        for site in res.sites:
            gap = res.lag_profile[site]["recency_gap"]
            parts = site.split(".")
            kind = f" ({types[int(parts[1])]})" if types and parts[0] == "blocks" else ""
            degenerate = res.meta.get("degenerate_sequences", {}).get(site)
            score = fmt_mean_std(row[site]["mean"], row[site]["std"], row[site]["n"])  # one prompt: the mean alone
            emit(log, f"  {site + kind:34s} {score:13s}   "
                      f"recency gap c(1) - c({max_lag}) {gap['mean']:+.3f}"
                      + (f"   ({degenerate}/{res.n_prompts} degenerate inputs left out of the score: no order to score)"
                         if degenerate else ""))
        for line in _diagnostic_lines(res.meta):
            emit(log, line)
        out.append(ModelScores(label=label, analysis=res))
    return AnalyzeResult(config=config, models=tuple(out), wall_time_s=round(time.perf_counter() - t0, 1))


def mechanism_diagnostics(entry: ModelEntry, config: AnalyzeConfig) -> dict[str, Any]:
    """What ``analyze`` records beside a task model's scores, so that a reader sees which mechanism is at work
    (the diagnostics ``compare`` and ``demo`` give): ``diagnostics`` (:func:`nope_interp.diagnostics.diagnose` on
    ``n_prompts`` full-length held-out prompts: layer-0 attention entropy, the positional share of L0
    ``hook_z``, the digits' value geometry and the causal test; None for a model with positional embeddings or
    fewer than 2 prompts, where it does not apply) and, for a trained model, ``exact_match_on_inputs``
    (:func:`nope_interp.evaluate.exact_match_on_inputs` on the very inputs analysed, with ``test_acc`` from its
    summary and ``off_distribution``: :func:`nope_interp.evaluate.off_distribution`). A model analysed on
    another task or size than it was trained on (``--task``, ``--n-digits``) has no test exact match on the
    inputs' task: ``test_acc`` is then None, ``trained_task`` names what it was trained on, and nothing is
    flagged (before, its own task's test exact match was compared with the other task's).

    Raises:
        NopeInterpError: as :func:`~nope_interp.diagnostics.diagnose` and
            :func:`~nope_interp.analysis.protocol_prompts` (inputs that do not fit the model).
    """
    from nope_interp.analysis import protocol_prompts
    from nope_interp.diagnostics import diagnose
    from nope_interp.evaluate import exact_match_on_inputs, off_distribution

    out: dict[str, Any] = {"diagnostics": None}
    if entry.model_cfg is not None and entry.model_cfg.positional == "none" and config.n_prompts >= 2:
        tokens = entry.task.analysis_tokens(config.n_prompts, config.prompt_seed, entry.train_prompts)
        out["diagnostics"] = diagnose(entry.model, entry.task, tokens, seed=draw_seed(entry.label))
    if entry.kind != "init":
        inputs = protocol_prompts(entry.model, entry.task, config.n_prompts, config.prompt_seed,
                                  entry.train_prompts, config.protocol, config.window)
        em = exact_match_on_inputs(entry.model, entry.task, inputs).to_dict()
        summary = entry.run.summary if entry.run is not None and isinstance(entry.run.summary, dict) else {}
        own_task = entry.run is None or entry.run.task == entry.task
        test_acc = summary.get("test_acc") if own_task and is_real(summary.get("test_acc")) else None
        out["exact_match_on_inputs"] = {**em, "test_acc": test_acc,
                                        "off_distribution": off_distribution(em["exact_match"], test_acc)}
        if not own_task:
            t = entry.run.task
            params = ", ".join(f"{k} {v}" for k, v in t.params().items())
            out["exact_match_on_inputs"]["trained_task"] = f"{t.name}" + (f" ({params})" if params else "")
    return out


def _diagnostic_lines(meta: dict[str, Any]) -> list[str]:
    """The console lines of :func:`mechanism_diagnostics`' record (none when there is nothing)."""
    lines = []
    d = meta.get("diagnostics")
    if d:
        undone = ", ".join(f"{k.removeprefix('l0_z_score_').replace('_', ' ')} {v:.3f}" for k, v in d.items()
                           if k.startswith("l0_z_score_") and k != "l0_z_score_none")
        lines.append(f"  layer 0 (on full prompts): attention entropy {d['l0_attention_entropy']:.3f} (lowest head "
                     f"{d['l0_min_head_entropy']:.3f}), positional share of hook_z {d['l0_z_positional_share']:.3f}, "
                     f"digit value participation ratio {d['digit_value_participation_ratio']:.2f} of 9"
                     + (f"; L0 hook_z with {undone}" if undone else ""))
    em = meta.get("exact_match_on_inputs")
    if em:
        got = "none scorable" if em["exact_match"] is None else f"{em['exact_match']:.3f} ({em['n_scored']} scored)"
        lines.append(f"  exact match on these inputs {got}"
                     + (f", test set {em['test_acc']:.4f}" if is_real(em.get("test_acc")) else "")
                     + (f" (trained on {em['trained_task']}: no test exact match to compare)"
                        if em.get("trained_task") else "")
                     + (": OFF-DISTRIBUTION (more than 0.1 below the test set): the scores above are measured on "
                        "inputs it answers markedly worse than its test prompts"
                        if em["off_distribution"] else ""))
    return lines


#: --text-file reads at least this many characters, and at least TEXT_CHARS_PER_TOKEN per token asked for.
TEXT_MIN_CHARS = 2**20
TEXT_CHARS_PER_TOKEN = 16


def _text_file_windows(path: str, length: int, n_windows: int, tokenizer: Any) -> tuple[Tensor, int | None]:
    """The first ``n_windows`` windows of ``path`` (:func:`~nope_interp.analysis.text_windows_of`), reading
    only as much of the file as they need: a prefix of ``max(TEXT_MIN_CHARS, TEXT_CHARS_PER_TOKEN *
    (n_windows + 1) * length)`` characters, four times more while it holds fewer than ``n_windows + 1``
    windows (the spare window keeps the last one used clear of a token cut by the prefix's end), then the
    whole file. Returns the windows and how many characters were read (None: the whole file)."""
    limit = max(TEXT_MIN_CHARS, TEXT_CHARS_PER_TOKEN * (n_windows + 1) * length)
    while True:
        text, whole = _read_text(path, limit)
        try:
            windows = text_windows_of(text, length, n_windows if whole else n_windows + 1, tokenizer)
        except NopeInterpError as err:
            if whole or not str(err).startswith("no text has"):  # a bad character is in the file whatever is read
                raise
            windows = None  # the prefix is shorter than one window: read more
        if whole:
            return windows, None
        if windows is not None and len(windows) == n_windows + 1:
            return windows[:n_windows], len(text)
        limit *= 4


def _read_text(path: str, max_chars: int | None = None) -> tuple[str, bool]:
    """The text of ``path`` (UTF-8, a byte-order mark dropped), at most ``max_chars`` characters, and whether
    that is the whole file."""
    try:
        with Path(path).open(encoding="utf-8-sig") as f:  # a byte-order mark is not text
            text = f.read(-1 if max_chars is None else max_chars + 1)
        if max_chars is not None and len(text) > max_chars:
            return text[:max_chars], False
        return text, True
    except FileNotFoundError:
        raise NopeInterpError.naming("{text_file}={path!r} does not exist", path=str(path)) from None
    except (IsADirectoryError, UnicodeDecodeError, OSError) as err:
        raise NopeInterpError.naming("{text_file}={path!r} is not a readable UTF-8 text file ({why})", path=str(path),
                                     why=err.__class__.__name__) from None


def plot_cosine(scores: ModelScores) -> go.Figure:
    """Cosine heatmaps of the example prompt at every site (slider), from a result."""
    res = scores.analysis
    n_pos = res.example_sim.shape[-1]
    # random tokens of a foreign vocabulary have no characters to show: positions alone
    tokens = res.example_prompt if len(res.example_prompt) == n_pos else [""] * n_pos
    nth = "the first input" if res.example_index == 0 else \
        f"input {res.example_index} (0-based; the first with an order to draw, the earlier ones are degenerate)"
    what = repr(res.example_prompt) + ("" if res.example_index == 0 else f", {nth}") \
        if len(res.example_prompt) == n_pos else nth
    return plot_cosine_heatmaps(res.example_sim, res.sites, tokens,
                                f"{scores.label} ({res.protocol} inputs): cosine similarity of {what}")


def plot_scores(scores: ModelScores) -> go.Figure:
    """Adjacency score (row mean, mean ± std over prompts) by site, from a result."""
    res = scores.analysis
    return plot_adjacency_by_layer({res.task: {scores.label: res.scores["row_mean"]}},
                                   f"{scores.label}: adjacency score (row mean, mean ± std over "
                                   f"{_inputs(res.n_prompts)}) by site ({res.protocol} inputs)")


def _inputs(n: int) -> str:
    """``"1 input"``, ``"12 inputs"``."""
    return f"{n} input{'' if n == 1 else 's'}"


def plot_lags(scores: ModelScores) -> go.Figure:
    """Lag profile (mean ± std over prompts) by site with the idealised uniform-causal curve, from a result."""
    res = scores.analysis
    return plot_lag_profile(res.lag_profile, res.uniform_causal_lag_profile().tolist(),
                            f"{scores.label}: lag profile on {_inputs(res.n_prompts)} ({res.task}) of {res.n_pos} "
                            f"positions ({res.protocol} protocol)")


@locked_write(NAME.replace("-", "_"))
def write(result: AnalyzeResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/analyze/<label>/scores.json`` and ``figures/analyze/<label>/{cosine,adjacency,lag_profile}.html``
    for every model (no ``cosine.html`` for inputs longer than :data:`~nope_interp.analysis.EXAMPLE_MAX_POS` tokens),
    with the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`) in each model's folder;
    returns the paths."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, AnalyzeResult, out_root)
    paths = []
    for m in result.models:
        scores = m.to_dict()
        warn_overwriting_another_model(res_dir / m.label / "scores.json", "model_source", scores.get("model_source"),
                                       NAME, takes_label=True)
        mine = [io.write_json(res_dir / m.label / "scores.json", scores)]
        if m.analysis.example_sim is not None:  # none kept for inputs longer than EXAMPLE_MAX_POS
            mine.append(save_figure(plot_cosine(m), fig_dir / m.label / "cosine.html"))
        mine += [save_figure(plot_scores(m), fig_dir / m.label / "adjacency.html"),
                 save_figure(plot_lags(m), fig_dir / m.label / "lag_profile.html")]
        # a cosine.html of shorter inputs, not rewritten for these: removed, not left beside them
        paths += io.drop_stale(mine[0], mine, (res_dir, fig_dir))  # keyed by the model's scores.json
    return with_plotlyjs(paths)
