"""The ``ablate`` job: config validation, one run on a tiny model checked against direct computations,
the seed summary against scipy, and the files it writes."""

import dataclasses
import json
import math
import zlib

import pytest
import torch
from conftest import assert_lists_every_file, assert_no_hooks, assert_strict_json_files, unhooked

from nope_interp.errors import NopeInterpError

KEYS = ("positional_variance_fraction", "adjacency_full", "adjacency_positional", "adjacency_content")
SITES = ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]


@pytest.fixture(scope="module")
def AJ():
    from nope_interp.jobs import ablate

    return ablate


@pytest.fixture(scope="module")
def tiny_addition_entry():
    """An initialised tiny model (2 layers; init std 0.2 so that its logits depend on the input) on 2-digit
    addition, as a ModelEntry."""
    import tasks
    from nope_interp.config import preset
    from nope_interp.jobs.common import entry_from_init

    task = tasks.get_task("addition", n_digits=2)
    return entry_from_init(preset("tiny", seed=3, init_std=0.2), task, "tiny-addition")


@pytest.fixture(scope="module")
def tiny_config(AJ):
    """Small counts; rank 0 so that the per-site ``project_out`` removes nothing."""
    return AJ.AblateConfig(kinds=("shuffle_positional", "project_out", "shuffle_vectors"), rank=0, ranks=(0, 2, 99),
                           n_random=2, n_eval=6, n_mu=16, n_analysis=4)


@pytest.fixture(scope="module")
def tiny_ablation(AJ, tiny_config, tiny_addition_entry):
    """The result of ``ablate.run`` on the tiny model."""
    lines = []
    result = AJ.run(tiny_config, [tiny_addition_entry], log=lines.append)
    return result, lines


@pytest.mark.parametrize(("field", "value"), [
    ("layers", (-1,)), ("layers", ()), ("kinds", ("zero",)), ("kinds", ()), ("rank", -1), ("ranks", ()),
    ("ranks", (0, -2)), ("n_random", 0), ("n_eval", 0), ("n_mu", 1), ("n_analysis", 0), ("protocol", "padded"),
    ("window", 4), ("window", 32), ("window", 64),
])
def test_bad_config_names_the_field(AJ, field, value):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=field) as err:
        AJ.AblateConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_config_round_trip_and_defaults(AJ):
    cfg = AJ.AblateConfig(layers=(1,), kinds=("swap_prompts",))
    assert AJ.AblateConfig.from_json(cfg.to_json()) == cfg
    default = AJ.AblateConfig()
    assert default.kinds_used == AJ.KINDS and default.ranks == (0, 1, 2, 4, 8, 16)
    assert (default.rank, default.n_random, default.n_eval, default.n_mu) == (None, 3, 200, 256)
    assert default.rank_used == AJ.DEFAULT_RANK == 4


def test_sites(AJ):
    assert AJ.default_sites(3) == ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre", "blocks.2.hook_resid_post"]
    assert AJ.default_sites(1) == ["blocks.0.hook_resid_post"]
    sites = AJ.ablation_sites(AJ.AblateConfig(layers=(0, 2)), 3)
    assert sites == ["blocks.0.hook_resid_pre", "blocks.2.hook_resid_pre"]


def test_a_layer_outside_the_model_fails_before_any_work(AJ, tiny_addition_entry):
    from nope_interp.errors import NopeInterpError

    lines = []
    with pytest.raises(NopeInterpError, match="layers lists 7, outside a model of n_layers="):
        AJ.run(AJ.AblateConfig(layers=(7,)), [tiny_addition_entry], log=lines.append)
    assert lines == []


def test_run_matches_direct_computations(AJ, tiny_ablation, tiny_config, tiny_addition_entry):
    from nope_interp.ablations import positional_decomposition
    from nope_interp.evaluate import answer_loss, exact_match_accuracy

    result, lines = tiny_ablation
    (r,) = result.runs
    model, task = tiny_addition_entry.model, tiny_addition_entry.task
    assert_no_hooks(model)
    assert r.task == "addition" and [s.site for s in r.sites] == SITES and r.run is None
    assert r.run_name == "tiny-addition" and r.model_seed == 3 and (r.n_eval, r.n_mu) == (6, 16)
    # the clean measurement, recomputed by hand on the same prompts (seed 11, no training prompts)
    examples = [task.example(p) for p in task.analysis_prompts(6, seed=11)]
    assert r.clean.exact_match == exact_match_accuracy(model, task, examples)
    with torch.no_grad():
        loss = float(answer_loss(model, task.training_batch(examples)))
    assert r.clean.answer_loss == pytest.approx(loss, rel=1e-6)
    assert set(r.clean.adjacency) >= set(SITES) and all(0.0 <= v <= 1.0 for v in r.clean.adjacency.values())
    # rank 0 removes nothing: the same loss and adjacency as the clean model; the shuffles change them
    for s in r.sites:
        same = s.ablations["project_out"]
        assert same.answer_loss == pytest.approx(r.clean.answer_loss, rel=1e-6)
        assert same.adjacency == pytest.approx(r.clean.adjacency, rel=1e-6)
        # after the last block only the last prompt position reaches the answer's logits: a shuffle that keeps it
        # in place leaves the loss exactly as it was (the drawn permutation, rebuilt from its key)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{r.draw_seed}/{s.site}/shuffle_positional".encode()))
        moves_last = int(torch.randperm(task.max_prompt_len, generator=gen)[-1]) != task.max_prompt_len - 1
        loss = s.ablations["shuffle_positional"].answer_loss
        if s.site == "blocks.1.hook_resid_post" and not moves_last:
            assert loss == pytest.approx(r.clean.answer_loss, rel=1e-6)
        else:
            assert loss != pytest.approx(r.clean.answer_loss, rel=1e-4)
        assert s.ablations["shuffle_vectors"].adjacency != pytest.approx(r.clean.adjacency, rel=1e-3)
        assert r.accuracy_lost(s.site, "shuffle_vectors") == (
            r.clean.exact_match - s.ablations["shuffle_vectors"].exact_match)
    # the decomposition: positional_decomposition of the cached activations on the mu prompts (seed 12)
    eval_prompts = frozenset(task.analysis_prompts(6, seed=11))
    mu_prompts = task.analysis_prompts(16, seed=12, exclude=eval_prompts)
    _, cache = model.run_with_cache(task.prompt_tokens(mu_prompts), names_filter=SITES[0])
    want = positional_decomposition(cache[SITES[0]])
    got = r.site(SITES[0]).decomposition
    assert got.ok and all(got.value(k) == pytest.approx(want[k], rel=1e-9) for k in KEYS)
    assert list(got.dropped_positions) == want["dropped_positions"]
    # the rank curve at the first site: rank 0 equals clean; 99 exceeds pos - 1 and is skipped
    curve = r.rank_curve
    assert curve.site == SITES[0] and [p.rank for p in curve.points] == [0, 2] and curve.skipped_ranks == (99,)
    assert curve.max_rank == task.max_prompt_len - 1
    assert curve.points[0].positional == r.clean.exact_match
    for p in curve.points:
        assert len(p.random_draws) == 2 and p.random_mean == pytest.approx(sum(p.random_draws) / 2)
    assert any("rank curve at blocks.1.hook_resid_pre, exact match left with r directions removed" in line
               for line in lines)
    # the per-site line says its numbers are what is left (the seed tables report what is lost)
    site_lines = [line for line in lines if "(clean " in line]
    assert site_lines and all("exact match left under shuffle_positional" in line for line in site_lines)


def test_to_dict_is_json_with_the_old_layout(AJ, tiny_ablation):
    result, _ = tiny_ablation
    data = json.loads(json.dumps(result.to_dict()))
    assert list(data) == ["results", "seed_summary", "protocol"] and data["protocol"] == "full"
    (r,) = data["results"]
    assert list(r) == ["task", "n_eval", "n_mu", "rank", "clean", "sites", "decomposition", "rank_curve", "run",
                       "model_seed", "metric", "eval_prefix", "protocol", "recipe",
                       "draw_seed"]  # added at the end: older readers work
    assert r["metric"] == "exact_match" and r["eval_prefix"] == ""
    assert list(r["sites"]) == SITES and list(r["sites"][SITES[0]]) == ["shuffle_positional", "project_out",
                                                                           "shuffle_vectors"]
    assert list(r["decomposition"][SITES[0]]) == [*KEYS, "dropped_positions", "n_prompts"]
    assert list(r["rank_curve"]["points"][0]) == ["rank", "positional", "random_mean", "random_std", "random_draws",
                                                  "content"]
    summary = data["seed_summary"]["addition"]
    assert list(summary) == ["runs", "clean_exact_match", "accuracy_loss", "rank_curve", "decomposition",
                             "eval_prefix", "protocol", "rank"]
    assert summary["protocol"] == "full" and summary["clean_exact_match"]["n_seeds"] == 1
    assert list(summary["rank_curve"]) == ["0", "2"]
    assert list(summary["rank_curve"]["2"]) == ["positional", "random", "content"]


def test_the_rank_curve_removes_the_top_content_directions_of_the_rank_site(AJ, tiny_config, tiny_addition_entry,
                                                                             monkeypatch):
    """The content control of each rank is the top-r content subspace of the first site's activations on
    mu's prompts (recomputed here from a cache), measured like the other points; rank 0 removes nothing."""
    from nope_interp.ablations import content_subspace

    calls, hooked, fired = [], [], []
    real_hook = AJ.ablation_hook

    def spy(acts, rank):
        calls.append((acts.clone(), rank))
        basis = content_subspace(acts, rank)
        calls[-1] += (basis,)
        return basis

    def hook_spy(kind, mu, **kwargs):
        built = real_hook(kind, mu, **kwargs)
        if kind != "project_out_content":
            return built
        hooked.append(kwargs["basis"])

        def where(resid, hook=None):  # records the site the content control is applied at
            fired.append(hook.name)
            return built(resid, hook)

        return where

    monkeypatch.setattr(AJ, "content_subspace", spy)
    monkeypatch.setattr(AJ, "ablation_hook", hook_spy)
    cfg = dataclasses.replace(tiny_config, kinds=("shuffle_positional",), rank=None)
    (r,) = AJ.run(cfg, [tiny_addition_entry]).runs
    model, task = tiny_addition_entry.model, tiny_addition_entry.task
    eval_prompts = frozenset(task.analysis_prompts(6, seed=11))
    mu_prompts = task.analysis_prompts(16, seed=12, exclude=eval_prompts)
    _, cache = model.run_with_cache(task.prompt_tokens(mu_prompts), names_filter=SITES[0])
    assert [c[1] for c in calls] == [0, 2]  # 99 is skipped
    for acts, _, _ in calls:
        torch.testing.assert_close(acts, cache[SITES[0]])
    # the hook projects out exactly the basis content_subspace returned, at each rank
    assert len(hooked) == 2 and all(h is c[2] for h, c in zip(hooked, calls, strict=True))
    assert fired and set(fired) == {SITES[0]}  # ... at the rank site, where its basis was taken
    points = r.rank_curve.points
    assert points[0].content == r.clean.exact_match and all(0.0 <= p.content <= 1.0 for p in points)


def test_a_rank_the_content_part_does_not_span_gives_nan_and_says_so(AJ, tiny_config, tiny_addition_entry,
                                                                     monkeypatch, tmp_path):
    from nope_interp.ablations import content_subspace
    from nope_interp.errors import NopeInterpError

    def refuse_rank_2(acts, rank):
        if rank == 2:
            raise NopeInterpError("content_subspace: the content part spans 1 direction(s)")
        return content_subspace(acts, rank)

    monkeypatch.setattr(AJ, "content_subspace", refuse_rank_2)
    lines = []
    cfg = dataclasses.replace(tiny_config, kinds=("shuffle_positional",), rank=None)
    result = AJ.run(cfg, [tiny_addition_entry], log=lines.append)
    (r,) = result.runs
    assert [p.rank for p in r.rank_curve.points] == [0, 2]
    assert not math.isnan(r.rank_curve.points[0].content) and math.isnan(r.rank_curve.points[1].content)
    assert any("r=2: no content control" in line and "spans 1 direction" in line for line in lines)
    md = AJ.seed_markdown(result.seed_summary)
    assert "top content removed" in md
    (row,) = [line for line in md.splitlines() if line.startswith("| 2 |")]
    assert row.rstrip(" |").endswith("n/a")  # the unmeasured content point, not "nan"
    AJ.write(result, tmp_path)  # the NaN is written as null: strict JSON
    (path,) = assert_strict_json_files(tmp_path / "results" / "ablate")
    assert json.loads(path.read_text())["results"][0]["rank_curve"]["points"][1]["content"] is None


def test_write_files_and_the_seed_figure(AJ, tiny_ablation, tmp_path):
    result, _ = tiny_ablation
    paths = AJ.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # one seed: the CI is undefined, written as null
    one_seed = json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())["seed_summary"]["addition"]
    assert one_seed["clean_exact_match"]["ci95_low"] is None and one_seed["clean_exact_match"]["n_seeds"] == 1
    res_dir, fig_dir = tmp_path / "results" / "ablate", tmp_path / "figures" / "ablate"
    names = ("ablate.json", "ablate.csv", "ablate_seeds.csv", "ablate_seeds.md", "ablate_decomposition.csv")
    assert paths == [res_dir / n for n in names] + [fig_dir / "ablations.html", fig_dir / "plotly.min.js"]
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    assert all(p.stat().st_size > 0 for p in paths)
    saved = json.loads((res_dir / "ablate.json").read_text())
    assert "nope_interp_version" in saved and saved["results"][0]["clean"] == result.runs[0].clean.to_dict()
    csv_text = (res_dir / "ablate.csv").read_text().splitlines()
    assert csv_text[0] == ("protocol,run,task,site,ablation,exact_match,accuracy_loss,answer_loss,loss_increase,"
                           "eval_prefix,metric,draw_seed")
    assert len(csv_text) == 1 + 1 + 2 * 3
    # every row names the seed of its run's random draws (before: only the JSON did)
    assert {line.rsplit(",", 1)[1] for line in csv_text[1:]} == {str(result.runs[0].draw_seed)}
    assert result.runs[0].draw_seed == AJ.draw_seed(result.runs[0].label)
    dec = (res_dir / "ablate_decomposition.csv").read_text().splitlines()
    assert "adjacency_content" in dec[0] and dec[0].endswith(",draw_seed")
    assert {line.rsplit(",", 1)[1] for line in dec[1:]} == {str(result.runs[0].draw_seed)}
    assert not (fig_dir / "ablations_seeds.html").exists()
    # the same run twice counts as two seeds (zero spread): seed figure, ± in the Markdown, one row per run
    runs = result.runs * 2
    twice = AJ.AblateResult(config=result.config, runs=runs, seed_summary=AJ.seed_summary(runs), wall_time_s=0.0)
    paths = AJ.write(twice, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    assert fig_dir / "ablations_seeds.html" in paths and (fig_dir / "ablations_seeds.html").exists()
    assert_lists_every_file(paths, tmp_path)
    (summary,) = twice.seed_summary
    assert summary.n_seeds == 2 and summary.clean_exact_match.std == 0.0
    assert {d.site for d in summary.decomposition} == set(SITES)
    md = (res_dir / "ablate_seeds.md").read_text()
    clean = f"{result.runs[0].clean.exact_match:.3f}"
    assert "## addition (2 runs" in md and "| blocks.1.hook_resid_pre | " in md and "± 0.000" in md
    assert md.count(f"| tiny-addition | blocks.1.hook_resid_pre | {clean} | ") == 2
    # back to one run: the stale seed figure is removed
    AJ.write(result, tmp_path)
    assert not (fig_dir / "ablations_seeds.html").exists()


def _fake_run(AJ, clean, ablated, pos, decs=None):
    """A RunAblation of task "t" with site "s" (and "u" when ``decs`` is given: ``{site: value or error}``)."""
    decs = decs or {"s": None}
    sites = tuple(
        AJ.SiteAblation(site=site, decomposition=(AJ.Decomposition(site=site, error=value) if isinstance(value, str)
                                                   else AJ.Decomposition(site=site, **dict.fromkeys(KEYS, value or 0.5),
                                                                         n_prompts=2)),
                        ablations={"project_out": AJ.Measurement(exact_match=ablated, answer_loss=1.0)})
        for site, value in decs.items())
    curve = AJ.RankCurve(site="s", points=(AJ.RankPoint(rank=1, positional=pos, random_mean=0.9, random_std=0.0,
                                                        random_draws=(0.9,)),), max_rank=3, skipped_ranks=())
    return AJ.RunAblation(label="x", run="runs/x", run_name="x", model_seed=0, task="t", n_eval=10, n_mu=10, rank=1,
                          clean=AJ.Measurement(exact_match=clean, answer_loss=0.5), sites=sites, rank_curve=curve)


def test_seed_summary_against_scipy(AJ):
    from scipy import stats

    (out,) = AJ.seed_summary([_fake_run(AJ, 1.0, 0.2, 0.1), _fake_run(AJ, 0.9, 0.3, 0.0),
                              _fake_run(AJ, 1.0, 0.0, 0.2)])
    losses = [0.8, 0.6, 1.0]
    s = out.accuracy_loss[0].by_kind["project_out"]
    m, se = sum(losses) / 3, stats.sem(losses)
    lo, hi = stats.t.interval(0.95, 2, loc=m, scale=se)
    assert s.mean == pytest.approx(m) and s.ci95_low == pytest.approx(lo) and s.ci95_high == pytest.approx(hi)
    assert s.n_seeds == 3 and out.rank_curve[0].positional.mean == pytest.approx(0.1)
    assert out.rank_curve[0].positional.std == pytest.approx(0.1)
    # decomposition: averaged over seeds where every run has it; a run that reported an error drops the site
    runs = [_fake_run(AJ, 1.0, 0.2, 0.1, {"s": 0.8, "u": 0.5}),
            _fake_run(AJ, 0.9, 0.3, 0.0, {"s": 0.6, "u": "fewer than 3 positions"})]
    (two,) = AJ.seed_summary(runs)
    assert [d.site for d in two.decomposition] == ["s"]
    assert two.decomposition[0].adjacency_positional.mean == pytest.approx(0.7)
    assert list(two.to_dict()["decomposition"]) == ["s"]
    assert two.to_dict()["rank_curve"]["1"]["random"]["mean"] == pytest.approx(0.9)
    # one run: no interval
    (one,) = AJ.seed_summary(runs[:1])
    assert one.clean_exact_match.std == 0.0 and math.isnan(one.clean_exact_match.ci95_low)
    assert AJ.seed_markdown([one]).count("1 run;") == 1


def test_default_models_are_the_shipped_ones(AJ):
    from nope_interp.pretrained import available_pretrained

    entries = AJ.default_models(AJ.AblateConfig())
    assert [e.label for e in entries] == [f"pretrained-{t}" for t in available_pretrained()]
    assert all(e.run is not None and e.run.name == "shipped" and e.train_prompts for e in entries)


def test_a_packed_run_is_ablated_after_its_newline(AJ, packed_run):
    """A packed model reads every prompt after the newline it was evaluated with in training: the clean exact
    match, answer loss, positional means and adjacency scores are those of the prefixed prompts, computed here
    with a naive loop over examples."""
    import torch.nn.functional as F

    import tasks
    from nope_interp.analysis import analyze_tokens
    from nope_interp.evaluate import exact_match_accuracy
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    assert AJ.eval_prefix(entry) == "\n" and entry.run.train_cfg.objective == "packed"
    config = AJ.AblateConfig(kinds=("project_out",), rank=0, ranks=(0, 99), n_random=1, n_eval=6, n_mu=16,
                             n_analysis=4)
    (r,) = AJ.run(config, [entry]).runs
    model, task = entry.model, entry.task
    assert_no_hooks(model)
    assert r.eval_prefix == "\n" and r.to_dict()["eval_prefix"] == "\n"
    eval_prompts = task.analysis_prompts(6, seed=AJ.EVAL_SEED, exclude=entry.train_prompts)
    examples = [task.example(p) for p in eval_prompts]
    assert r.clean.exact_match == exact_match_accuracy(model, task, examples, prefix="\n")
    nll, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([tasks.encode("\n" + ex.prompt + ex.answer + "\n")])
            logits = model(ids[:, :-1])[0].double()
            first = 1 + len(ex.prompt) - 1
            nll += float(F.cross_entropy(logits[first:], ids[0, first + 1 :], reduction="sum"))
            count += ids.shape[1] - 1 - first
    assert r.clean.answer_loss == pytest.approx(nll / count, rel=1e-5)
    # the newline is one more prompt position: the rank curve's bound is pos - 1 with pos = 1 + prompt length
    assert r.rank_curve.max_rank == task.max_prompt_len and r.rank_curve.skipped_ranks == (99,)
    # position 0 (the newline, the same vector in every prompt) has no content part
    assert 0 in r.site(SITES[0]).decomposition.dropped_positions
    # rank 0 removes nothing: scores equal those of the prefixed analysis prompts
    prompts = task.analysis_prompts(4, seed=AJ.ANALYSIS_SEED, exclude=entry.train_prompts)
    want = analyze_tokens(model, task.prompt_tokens(["\n" + p for p in prompts])).scores["row_mean"]
    assert r.clean.adjacency == pytest.approx({s: v["mean"] for s, v in want.items()}, rel=1e-9)
    assert r.site(SITES[0]).ablations["project_out"].exact_match == r.clean.exact_match


def test_the_adjacency_scores_of_a_trained_model_leave_out_its_training_prompts(AJ, tiny_config, tiny_addition_entry):
    """Every prompt ablate reads excludes the model's training prompts, the adjacency scores' included: with
    the analysis prompts of the clean run declared as training prompts, the scores are analyze_model's on
    the next held-out prompts."""
    import dataclasses

    from nope_interp.analysis import analyze_model

    task = tiny_addition_entry.task
    train = frozenset(task.analysis_prompts(4, seed=AJ.ANALYSIS_SEED))
    entry = dataclasses.replace(tiny_addition_entry, train_prompts=train)
    cfg = tiny_config.replace(kinds=("shuffle_positional",), rank=None, ranks=(0,), n_random=1)
    (r,) = AJ.run(cfg, [entry]).runs
    want = analyze_model(entry.model, task, 4, seed=AJ.ANALYSIS_SEED, exclude=train).scores["row_mean"]
    unexcluded = analyze_model(entry.model, task, 4, seed=AJ.ANALYSIS_SEED).scores["row_mean"]
    assert r.clean.adjacency == pytest.approx({s: v["mean"] for s, v in want.items()}, rel=1e-9)
    assert r.clean.adjacency != pytest.approx({s: v["mean"] for s, v in unexcluded.items()}, rel=1e-6)


def test_the_seed_summary_matches_rank_curve_points_by_rank(AJ):
    """Runs whose rank curves hold different ranks (a packed run has one more position, so a higher rank fits;
    unsorted --ranks) are summarised at every rank all of them have, matched by value, not by list index."""
    a = _fake_run(AJ, 1.0, 0.2, 0.1)
    b = _fake_run(AJ, 1.0, 0.2, 0.3)
    pts = (AJ.RankPoint(rank=7, positional=0.5, random_mean=0.9, random_std=0.0, random_draws=(0.9,)),
           AJ.RankPoint(rank=1, positional=0.3, random_mean=0.8, random_std=0.0, random_draws=(0.8,)))
    b = dataclasses.replace(b, rank_curve=AJ.RankCurve(site="s", points=pts, max_rank=9, skipped_ranks=()))
    (out,) = AJ.seed_summary([b, a])
    assert [p.rank for p in out.rank_curve] == [1]
    assert out.rank_curve[0].positional.mean == pytest.approx(0.2)
    assert out.rank_curve[0].random.mean == pytest.approx(0.85)


def test_runs_of_one_task_read_after_different_prefixes_are_summarised_apart(AJ):
    """A packed run (prompts after a newline: one more position) and an answer-only run of the same task are two
    groups, named apart in the JSON, the Markdown, the CSVs and the figure."""
    bare = [_fake_run(AJ, 1.0, 0.2, 0.1), _fake_run(AJ, 0.9, 0.3, 0.0)]
    packed = [dataclasses.replace(r, eval_prefix="\n", run_name="p") for r in bare]
    groups = AJ.seed_summary([bare[0], packed[0], bare[1], packed[1]])
    assert [(g.task, g.eval_prefix, g.n_seeds) for g in groups] == [("t", "", 2), ("t", "\n", 2)]
    assert [g.group for g in groups] == ["t", "t (prompts after '\\n')"]
    result = AJ.AblateResult(config=AJ.AblateConfig(), runs=tuple(bare + packed), seed_summary=groups,
                             wall_time_s=0.0)
    data = json.loads(json.dumps(result.to_dict()))
    assert list(data["seed_summary"]) == ["t", "t (prompts after '\\n')"]
    assert data["seed_summary"]["t (prompts after '\\n')"]["eval_prefix"] == "\n"
    md = AJ.seed_markdown(groups, result.runs)
    assert "## t (2 runs" in md and "## t (prompts after '\\n') (2 runs" in md
    first, second = md.split("## t (prompts after")
    assert "| p | s |" not in first and "| x | s |" not in second  # each group lists its own runs
    assert AJ.escaped("\n") == "\\n" and AJ.escaped("") == ""
    assert {row["eval_prefix"] for r in packed for row in r.table_rows()} == {"\\n"}
    # every CSV row says what its exact_match column holds (a text model's is next-character accuracy)
    text = dataclasses.replace(packed[0], metric="next_char_accuracy")
    assert {row["metric"] for row in text.table_rows()} == {"next_char_accuracy"}
    assert {row["metric"] for row in packed[1].table_rows()} == {"exact_match"}


def test_every_exact_match_of_a_packed_run_reads_its_newline(AJ, packed_run, monkeypatch):
    """Clean, ablated and rank-curve exact matches all read the prompts after the run's newline."""
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    seen = []
    real = AJ.exact_match_accuracy

    def spy(*args, **kwargs):
        seen.append(kwargs.get("prefix"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AJ, "exact_match_accuracy", spy)
    config = AJ.AblateConfig(layers=(1,), kinds=("mean_positional",), ranks=(0, 1), n_random=1, n_eval=4,
                             n_mu=8, n_analysis=3)
    AJ.run(config, [entry])
    assert len(seen) == 1 + 1 + 2 * 3 and set(seen) == {"\n"}  # clean, one kind, (positional, random, content) x 2


def test_a_model_whose_n_ctx_cannot_hold_the_prefix_is_named_before_any_work(AJ, packed_run):
    """A 16-position packed model asked about 4-digit additions: the message names the model, the prefix and
    the count, and nothing is measured."""
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, entry_from_run, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    big = entry_from_run(entry.run, entry.label, task=tasks.get_task("addition", n_digits=4))
    lines = []
    with pytest.raises(NopeInterpError, match=r"after its evaluation prefix '\\n'.*need n_ctx >= 19") as err:
        AJ.run(AJ.AblateConfig(layers=(1,)), [big], log=lines.append)
    assert big.label in str(err.value) and lines == []


# --- input protocols -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def window_ablation(AJ, tiny_addition_entry):
    config = AJ.AblateConfig(layers=(1,), kinds=("project_out", "mean_positional"), rank=0, ranks=(0, 1, 99),
                             n_random=1, n_eval=6, n_mu=16, n_analysis=4, protocol="window", window=12)
    return config, AJ.run(config, [tiny_addition_entry])


def test_a_window_protocol_run_matches_direct_computations(AJ, tiny_addition_entry, window_ablation):
    """Under the window protocol: the clean exact match and answer loss are those of the window contexts ending
    in a held-out prompt (loss by a naive loop over examples), mu and the decomposition come from window inputs
    that leave out the contexts' final prompts, every context position is ablated (mean_positional, applied
    here by hand), and the adjacency scores are those of the protocol's inputs."""
    import torch.nn.functional as F

    import tasks
    from nope_interp.ablations import ablation_hook, positional_decomposition, positional_means
    from nope_interp.analysis import analyze_tokens
    from nope_interp.evaluate import exact_match_accuracy

    config, result = window_ablation
    (r,) = result.runs
    model, task = tiny_addition_entry.model, tiny_addition_entry.task
    site = "blocks.1.hook_resid_pre"
    assert_no_hooks(model)
    assert (r.protocol, r.window, r.eval_prefix) == ("window", 12, "")
    examples = tasks.protocol_examples(task, "window", 6, AJ.EVAL_SEED, frozenset(), 12)
    assert {len(ex.prompt) for ex in examples} == {12}

    def naive_loss(hooks):
        nll, count = 0.0, 0
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            for ex in examples:
                ids = torch.tensor([tasks.encode(ex.prompt + ex.answer + "\n")])
                logits = model(ids[:, :-1])[0].double()
                first = len(ex.prompt) - 1
                nll += float(F.cross_entropy(logits[first:], ids[0, first + 1:], reduction="sum"))
                count += ids.shape[1] - 1 - first
        return nll / count

    assert r.clean.exact_match == exact_match_accuracy(model, task, examples)
    assert r.clean.answer_loss == pytest.approx(naive_loss([]), rel=1e-5)
    finals = frozenset(ex.prompt.rsplit("\n", 1)[-1] for ex in examples)
    mu_inputs = tasks.protocol_inputs(task, "window", 16, AJ.MU_SEED, finals, 12)
    _, cache = model.run_with_cache(task.prompt_tokens(mu_inputs), names_filter=site)
    want = positional_decomposition(cache[site])
    got = r.site(site).decomposition
    assert got.ok and all(got.value(k) == pytest.approx(want[k], rel=1e-9) for k in KEYS)
    hook = ablation_hook("mean_positional", positional_means(cache[site]))
    with model.hooks(fwd_hooks=[(site, hook)]):
        ablated = exact_match_accuracy(model, task, examples)
    assert r.site(site).ablations["mean_positional"].exact_match == ablated
    assert r.site(site).ablations["mean_positional"].answer_loss == pytest.approx(naive_loss([(site, hook)]),
                                                                                   rel=1e-5)
    assert r.site(site).ablations["mean_positional"].answer_loss != pytest.approx(r.clean.answer_loss, rel=1e-4)
    scores = analyze_tokens(model, task.prompt_tokens(tasks.protocol_inputs(task, "window", 4, AJ.ANALYSIS_SEED,
                                                                            frozenset(), 12))).scores["row_mean"]
    assert r.clean.adjacency == pytest.approx({s: v["mean"] for s, v in scores.items()}, rel=1e-9)
    # the rank curve's bound is pos - 1 with pos = the window
    assert r.rank_curve.max_rank == 11 and r.rank_curve.skipped_ranks == (99,)
    data = json.loads(json.dumps(result.to_dict()))
    assert (data["protocol"], data["window"]) == ("window", 12)
    assert (data["results"][0]["protocol"], data["results"][0]["window"]) == ("window", 12)
    assert list(data["seed_summary"]) == ["addition (window inputs of 12 characters)"]


def test_the_inputs_for_mu_leave_out_the_final_prompts_of_the_evaluation_contexts(AJ, tiny_addition_entry,
                                                                                   monkeypatch):
    import tasks

    calls = []
    real = AJ.protocol_prompts

    def spy(model, task, n, seed, exclude=frozenset(), protocol="full", window=64):
        calls.append((seed, exclude, protocol, window))
        return real(model, task, n, seed, exclude, protocol, window)

    monkeypatch.setattr(AJ, "protocol_prompts", spy)
    for protocol, window in (("window", 12), ("authors", 64), ("full", 64)):
        calls.clear()
        config = AJ.AblateConfig(layers=(1,), kinds=("mean_positional",), ranks=(0,), n_random=1, n_eval=5,
                                 n_mu=8, n_analysis=3, protocol=protocol,
                                 window=window if protocol == "window" else None)
        AJ.run(config, [tiny_addition_entry])
        task = tiny_addition_entry.task
        finals = {ex.prompt.lstrip("\n")[-task.max_prompt_len:].rsplit("\n", 1)[-1]
                  for ex in tasks.protocol_examples(task, protocol, 5, AJ.EVAL_SEED, frozenset(), window)}
        mu_calls = [c for c in calls if c[0] == AJ.MU_SEED]
        assert len(mu_calls) == 1 and finals <= mu_calls[0][1] and mu_calls[0][2:] == (protocol, window)
        assert {c[2:] for c in calls} == {(protocol, window)}  # the adjacency scores read the same protocol


def test_protocol_outputs_never_overwrite_the_full_ones(AJ, tiny_ablation, window_ablation, tmp_path):
    import csv

    full = {p.name for p in AJ.write(tiny_ablation[0], tmp_path)}
    window = {p.name for p in AJ.write(window_ablation[1], tmp_path)}
    # only the plotly.min.js the figures load is shared (the installed plotly's own file, the same for both)
    assert "ablate.json" in full and full & window == {"plotly.min.js"}
    assert window == {"ablate_window12.json", "ablate_window12.csv", "ablate_seeds_window12.csv",
                      "ablate_seeds_window12.md", "ablate_decomposition_window12.csv", "ablations_window12.html",
                      "plotly.min.js"}
    with open(tmp_path / "results" / "ablate" / "ablate_window12.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(row["protocol"], row["window"]) for row in rows} == {("window", "12")}
    with open(tmp_path / "results" / "ablate" / "ablate.csv") as f:
        assert {row["protocol"] for row in csv.DictReader(f)} == {"full"}
    html = (tmp_path / "figures" / "ablate" / "ablations_window12.html").read_text()
    assert "window inputs of 12 characters" in html
    assert json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())["protocol"] == "full"


def test_a_packed_run_under_the_authors_protocol_reads_no_prefix(AJ, packed_run, monkeypatch):
    """The authors' contexts are newline-padded prompts: no evaluation newline is added before them, in any
    exact match, and the run records it."""
    import tasks
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    seen = []
    real = AJ.exact_match_accuracy

    def spy(model, task, examples, *args, **kwargs):
        seen.append((kwargs.get("prefix"), frozenset(len(ex.prompt) for ex in examples)))
        return real(model, task, examples, *args, **kwargs)

    monkeypatch.setattr(AJ, "exact_match_accuracy", spy)
    config = AJ.AblateConfig(layers=(1,), kinds=("mean_positional",), ranks=(0,), n_random=1, n_eval=4,
                             n_mu=8, n_analysis=3, protocol="authors")
    (r,) = AJ.run(config, [entry]).runs
    length = tasks.authors_length(entry.task)
    assert set(seen) == {("", frozenset({length}))} and len(seen) == 1 + 1 + 3  # clean, kind, rank 0 x 3
    assert (r.protocol, r.eval_prefix) == ("authors", "") and "window" not in r.to_dict()


def test_a_protocol_context_that_does_not_fit_n_ctx_is_named_before_any_work(AJ, packed_run, tiny_addition_entry):
    """The window and the answer must fit n_ctx (the message says which window does); a train-text model has no
    task inputs to take a protocol."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, load_models

    (entry,) = load_models(ModelSource(run=(str(packed_run),)))
    lines = []
    with pytest.raises(NopeInterpError, match=r"n_ctx=16 is too small for addition window contexts of 12 tokens.*"
                                              r"need n_ctx >= 17: window (from \d+ to )?11 fits every model "
                                              r"given") as err:
        AJ.run(AJ.AblateConfig(layers=(1,), protocol="window", window=12), [entry], log=lines.append)
    assert entry.label in str(err.value) and lines == []
    text = dataclasses.replace(tiny_addition_entry, kind="text")
    with pytest.raises(NopeInterpError, match="protocol authors applies to task models"):
        AJ.run(AJ.AblateConfig(protocol="authors"), [text], log=lines.append)
    assert lines == []


def test_the_default_window_is_the_longest_every_model_reads_with_its_answer(AJ, tiny_addition_entry):
    """n_ctx 48 and 2-digit addition's 4-character answer: 43 characters (at most 64), in the result and its
    outputs' names."""
    lines = []
    config = AJ.AblateConfig(layers=(1,), kinds=("mean_positional",), ranks=(0,), n_random=1, n_eval=3,
                             n_mu=4, n_analysis=2, protocol="window")
    result = AJ.run(config, [tiny_addition_entry], log=lines.append)
    assert config.window is None and result.config.window == 43 and result.runs[0].window == 43
    assert result.to_dict()["window"] == 43
    assert any("contexts of 43 characters" in line for line in lines)


def test_a_window_too_short_for_some_task_fails_before_any_work(AJ, tiny_addition_entry):
    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    reversal = entry_from_init(preset("tiny", seed=1), tasks.get_task("reversal", n_digits=8), "tiny-reversal")
    lines = []
    with pytest.raises(NopeInterpError, match=r"tiny-reversal: window 10 cannot hold a newline and the longest "
                                              r"reversal prompt \(14 characters\): window must be >= 15"):
        AJ.run(AJ.AblateConfig(protocol="window", window=10), [tiny_addition_entry, reversal], log=lines.append)
    assert lines == []


def test_too_few_prompts_name_the_setting_that_asks_for_them(AJ):
    """A 1-digit addition model (100 prompts): all of them for evaluation leave none for the positional means."""
    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    entry = entry_from_init(preset("tiny", seed=1), tasks.get_task("addition", n_digits=1), "tiny-1digit")
    base = dict(layers=(1,), kinds=("mean_positional",), ranks=(0,), n_random=1, n_mu=4, n_analysis=2)
    with pytest.raises(NopeInterpError, match=r"tiny-1digit: the 4 inputs for the positional means \(n_mu\), drawn "
                                              r"outside the 100 evaluation prompts \(n_eval\)"):
        AJ.run(AJ.AblateConfig(**base, n_eval=100, protocol="authors"), [entry])
    with pytest.raises(NopeInterpError, match=r"tiny-1digit: the 500 evaluation prompts \(n_eval\): only 100"):
        AJ.run(AJ.AblateConfig(**base, n_eval=500, protocol="window", window=12), [entry])
    # before: "... lower n", without the flag
    with pytest.raises(NopeInterpError, match=r"the 200 prompts for the adjacency scores \(n_analysis\)"):
        AJ.run(AJ.AblateConfig(**{**base, "n_analysis": 200}, n_eval=4), [entry])


def test_the_content_control_removes_the_top_directions_of_h_minus_mu_on_the_mu_prompts(AJ, tiny_addition_entry):
    from nope_interp.ablations import ablation_hook, content_subspace, positional_means, positional_subspace
    from nope_interp.evaluate import answer_loss

    config = AJ.AblateConfig(layers=(1,), kinds=("project_out_content", "project_out"), rank=1, ranks=(0,),
                             n_random=1, n_eval=6, n_mu=16, n_analysis=2)
    (r,) = AJ.run(config, [tiny_addition_entry]).runs
    model, task, site = tiny_addition_entry.model, tiny_addition_entry.task, "blocks.1.hook_resid_pre"
    eval_prompts = task.analysis_prompts(6, seed=AJ.EVAL_SEED)
    mu_prompts = task.analysis_prompts(16, seed=AJ.MU_SEED, exclude=frozenset(eval_prompts))
    _, cache = model.run_with_cache(task.prompt_tokens(mu_prompts), names_filter=site)
    acts = cache[site]
    batch = task.training_batch([task.example(p) for p in eval_prompts])
    losses = {}
    for kind, basis in (("project_out_content", content_subspace(acts, 1)),
                        ("project_out", positional_subspace(positional_means(acts), 1))):
        with torch.no_grad(), model.hooks(fwd_hooks=[(site, ablation_hook(kind, positional_means(acts), basis=basis))]):
            losses[kind] = float(answer_loss(model, batch))
        assert r.site(site).ablations[kind].answer_loss == pytest.approx(losses[kind], rel=1e-6)
    assert losses["project_out_content"] != pytest.approx(losses["project_out"], rel=1e-4)


def test_each_model_gets_its_own_random_draws_the_same_in_any_company(AJ, tiny_addition_entry, monkeypatch):
    """Before: every model of a call used seed 0, so the random-subspace control of three seeds was one subspace
    (and one permutation, one swap order) repeated."""
    import dataclasses

    bases = []
    real = AJ.random_subspace
    monkeypatch.setattr(AJ, "random_subspace", lambda *a, **k: bases.append(real(*a, **k)) or bases[-1])
    cfg = AJ.AblateConfig(layers=(1,), kinds=("project_out_random",), rank=2, ranks=(1,), n_random=1, n_eval=4,
                          n_mu=8, n_analysis=2)
    other = dataclasses.replace(tiny_addition_entry, label="tiny-addition-2")
    both = AJ.run(cfg, [tiny_addition_entry, other])
    assert [r.draw_seed for r in both.runs] == [AJ.model_draw_seed(e) for e in (tiny_addition_entry, other)]
    assert both.runs[0].draw_seed != both.runs[1].draw_seed
    first, second = bases[:2], bases[2:4]  # per model: the site's rank-2 subspace, then the rank curve's rank 1
    assert not torch.allclose(first[0], second[0])
    bases.clear()
    alone = AJ.run(cfg, [other])
    assert alone.runs[0].draw_seed == both.runs[1].draw_seed and torch.equal(bases[0], second[0])


def test_a_kinds_draw_does_not_depend_on_the_other_kinds_sites_and_ranks_requested(AJ, tiny_addition_entry,
                                                                                    monkeypatch):
    """Before: one generator ran through every site and kind in order (and then the rank curve), so
    ``--kinds shuffle_positional`` alone and the default kinds gave one model two different shuffles, and the
    rank curve's random subspaces changed with the sites and kinds measured before it. Now each draw has its
    own generator keyed by (model seed, site, kind) or (model seed, site, "rank_curve", rank); the permutation is
    also rebuilt here by hand from that key (CRC-32 of "seed/site/kind")."""

    from nope_interp.ablations import ablation_hook, positional_means
    from nope_interp.evaluate import answer_loss

    bases = []
    real = AJ.random_subspace
    monkeypatch.setattr(AJ, "random_subspace", lambda *a, **k: bases.append(real(*a, **k)) or bases[-1])
    site = "blocks.1.hook_resid_pre"
    small = AJ.AblateConfig(layers=(1,), kinds=("shuffle_positional", "project_out_random"), rank=2, ranks=(2,),
                            n_random=2, n_eval=6, n_mu=16, n_analysis=2)
    big = dataclasses.replace(small, layers=(0, 1), ranks=(1, 2, 4),
                              kinds=("swap_prompts", "shuffle_vectors", "project_out_random", "shuffle_positional"))
    (a,) = AJ.run(small, [tiny_addition_entry]).runs
    small_bases, bases[:] = list(bases), []
    (b,) = AJ.run(big, [tiny_addition_entry]).runs
    assert a.draw_seed == b.draw_seed
    for kind in small.kinds:
        assert a.site(site).ablations[kind] == b.site(site).ablations[kind], kind
    # small: the site's subspace, then rank 2's two draws; big at its first site (layer 0) draws other ones
    assert torch.equal(small_bases[0], bases[1])  # big: layer 0's subspace, then layer 1's
    assert not torch.allclose(bases[0], bases[1])
    # the rank curve runs at the first site, which differs (layer 1 vs layer 0), so compare on one site: rank 2
    same_site = dataclasses.replace(big, layers=(1,))
    bases.clear()
    (c,) = AJ.run(same_site, [tiny_addition_entry]).runs
    assert [p.rank for p in c.rank_curve.points] == [1, 2, 4]
    assert c.rank_curve.points[1].random_draws == a.rank_curve.points[0].random_draws
    assert torch.equal(bases[3], small_bases[1]) and torch.equal(bases[4], small_bases[2])  # rank 2's two draws
    # the shuffle, rebuilt by hand: randperm from the generator seeded with CRC-32 of "seed/site/kind"
    model, task = tiny_addition_entry.model, tiny_addition_entry.task
    eval_prompts = task.analysis_prompts(6, seed=AJ.EVAL_SEED)
    mu_prompts = task.analysis_prompts(16, seed=AJ.MU_SEED, exclude=frozenset(eval_prompts))
    _, cache = model.run_with_cache(task.prompt_tokens(mu_prompts), names_filter=site)
    mu = positional_means(cache[site])
    gen = torch.Generator().manual_seed(zlib.crc32(f"{a.draw_seed}/{site}/shuffle_positional".encode()))
    perm = torch.randperm(mu.shape[0], generator=gen)
    batch = task.training_batch([task.example(p) for p in eval_prompts])
    with torch.no_grad(), model.hooks(fwd_hooks=[(site, ablation_hook("shuffle_positional", mu, perm=perm))]):
        loss = float(answer_loss(model, batch))
    assert a.site(site).ablations["shuffle_positional"].answer_loss == pytest.approx(loss, rel=1e-6)


def test_keyed_generator():
    """Its seed is the CRC-32 of "seed/key/..." (checked by hand), keys change the draw, bad input is refused."""

    from nope_interp.jobs.common import keyed_generator

    for seed, keys in ((0, ()), (7, ("blocks.1.hook_resid_pre", "swap_prompts")), (2**40, ("a", "rank_curve", "3"))):
        want = torch.Generator().manual_seed(zlib.crc32("/".join((str(seed), *keys)).encode()))
        assert torch.equal(torch.rand(5, generator=keyed_generator(seed, *keys)), torch.rand(5, generator=want))
    draws = {tuple(torch.rand(3, generator=keyed_generator(1, k)).tolist()) for k in ("a", "b", "c")}
    assert len(draws) == 3
    with pytest.raises(NopeInterpError, match="seed"):
        keyed_generator(-1, "a")
    with pytest.raises(NopeInterpError, match="keys must be strings"):
        unhooked(keyed_generator)(1, 2)


def test_runs_of_other_recipes_are_not_pooled_as_seeds(AJ):
    """Before: runs were grouped by task (and inputs) alone, so a 3-layer and a 6-layer indexing model, or two
    learning rates, were summarised as seeds of one recipe."""
    import dataclasses

    a, b, c = (_fake_run(AJ, 1.0, x, 0.1) for x in (0.2, 0.3, 0.4))
    a, b = (dataclasses.replace(r, recipe='{"model.n_layers": 3}') for r in (a, b))
    c = dataclasses.replace(c, recipe='{"model.n_layers": 6}')
    groups = AJ.seed_summary([a, c, b])
    assert [g.n_seeds for g in groups] == [2, 1]


def test_ranks_above_what_the_inputs_span_and_empty_model_lists_fail_before_any_work(AJ, tiny_addition_entry,
                                                                                    monkeypatch):
    """Before: --rank 100 failed after the clean measurement naming an internal function; --ranks all too large
    wrote an empty rank curve with exit 0; an empty model list ablated the shipped models."""
    from nope_interp.errors import NopeInterpError

    monkeypatch.setattr(AJ, "ablate_model", lambda *a, **k: pytest.fail("measured before refusing"))
    n_pos = tiny_addition_entry.task.max_prompt_len  # 2-digit addition: 7 positions, so 6 directions at most
    small = dict(n_eval=4, n_mu=8, n_analysis=2, layers=(1,))
    with pytest.raises(NopeInterpError, match=rf": rank 100 is above the {n_pos - 1} positional directions.*"
                                              rf": rank {n_pos - 1} or less$"):
        AJ.run(AJ.AblateConfig(rank=100, kinds=("project_out",), **small), [tiny_addition_entry])
    with pytest.raises(NopeInterpError, match="rank=100 is only used with a project_out"):  # ignored otherwise
        AJ.AblateConfig(rank=100, kinds=("shuffle_positional",), **small)
    with pytest.raises(NopeInterpError, match=r"every ranks value \(50, 60\) is above"):
        AJ.run(AJ.AblateConfig(rank=1, ranks=(50, 60), **small), [tiny_addition_entry])
    with pytest.raises(NopeInterpError, match="models is an empty list"):
        AJ.run(AJ.AblateConfig(**small), [])


def test_swap_prompts_needs_two_prompts(AJ):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="swap_prompts.*n_eval and n_analysis >= 2"):
        AJ.AblateConfig(n_eval=1)
    with pytest.raises(NopeInterpError, match="got 200 and 1; raise them or leave swap_prompts out of kinds$"):
        AJ.AblateConfig(n_analysis=1, kinds=("swap_prompts",))
    AJ.AblateConfig(n_eval=1, kinds=("shuffle_positional",))  # fine without swap_prompts


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A finished 2-step character-level language model of ``train-text`` (tiny preset, window 24), named lm."""
    from nope_interp.cli import main

    root = tmp_path_factory.mktemp("text_runs")
    assert main(["train-text", "--preset", "tiny", "--steps", "2", "--batch-size", "4", "--window", "24",
                 "--eval-every", "2", "--eval-windows", "4", "--checkpoint-every", "2", "--warmup-steps", "1",
                 "--no-progress", "--runs-dir", str(root), "--name", "lm"]) == 0
    return root / "lm"


@pytest.fixture(scope="module")
def text_config(AJ):
    """Small counts and no project-out kind (so no ``rank`` applies)."""
    return AJ.AblateConfig(kinds=("shuffle_positional",), ranks=(0, 1), n_random=1, n_eval=6, n_mu=16, n_analysis=4,
                           layers=(1,))


@pytest.fixture(scope="module")
def mixed_ablation(AJ, text_config, text_run, packed_run):
    """``ablate.run`` on a text run and a task run (the packed one), both given as paths relative to the working
    folder, as ``--run runs/lm runs/p`` would."""
    import os

    from nope_interp.jobs.common import ModelSource, load_models

    text_rel, task_rel = os.path.relpath(text_run), os.path.relpath(packed_run)
    assert not os.path.isabs(text_rel) and not os.path.isabs(task_rel)
    entries = load_models(ModelSource(run=(text_rel, task_rel)))
    assert [e.kind for e in entries] == ["text", "run"]
    return AJ.run(text_config, entries)


def test_task_and_text_runs_write_one_run_path_convention(AJ, mixed_ablation, text_run, packed_run,
                                                        tiny_addition_entry, tmp_path):
    """Before: a text run's ``run`` was the path as given (relative for ``--run runs/lm``) while a task run's was
    its loaded path (absolute for a shipped model), in the JSON and every CSV. Now both kinds write the absolute
    resolved directory, and the CSVs the same string as the JSON."""
    import csv
    from pathlib import Path

    want = {"text-nope": str(Path(text_run).resolve()), "addition": str(Path(packed_run).resolve())}
    assert all(Path(p).is_absolute() for p in want.values())
    assert {r.task: r.run for r in mixed_ablation.runs} == want
    AJ.write(mixed_ablation, tmp_path)
    res_dir = tmp_path / "results" / "ablate"
    data = json.loads((res_dir / "ablate.json").read_text())
    assert {r["task"]: r["run"] for r in data["results"]} == want
    assert {g: s["runs"] for g, s in data["seed_summary"].items()} == {
        "text-nope": [want["text-nope"]], "addition (prompts after '\\n')": [want["addition"]]}
    for name in ("ablate.csv", "ablate_decomposition.csv"):
        with (res_dir / name).open() as f:
            rows = list(csv.DictReader(f))
        assert {row["task"] for row in rows} == set(want)
        seeds = {r.task: str(r.draw_seed) for r in mixed_ablation.runs}
        assert len(set(seeds.values())) == 2  # two models, two draws: each row names its own
        for row in rows:
            assert row["run"] == want[row["task"]], (name, row)
            assert row["draw_seed"] == seeds[row["task"]], (name, row)
    # an initialised model has no directory: no path at all
    assert AJ.run_path(tiny_addition_entry) is None
    # nor a text entry built by hand without model_source (was a KeyError in every job's same-model check)
    for source in ({}, {"model_source": None}, {"text_window": 8}):
        hand = dataclasses.replace(tiny_addition_entry, kind="text", source=source)
        assert AJ.run_path(hand) is None


def test_a_text_only_ablate_json_names_text_inputs_not_a_task_protocol(AJ, mixed_ablation, text_config, text_run,
                                                                       tmp_path):
    """Before: ``ablate.json`` of text models alone said ``"protocol": "full"``, a task protocol that applies to no
    model there; now ``text``, as each text result says. With a task model the task models' protocol stays."""
    from nope_interp.jobs.common import ModelSource, load_models

    assert mixed_ablation.to_dict()["protocol"] == "full"  # the task model read full prompts
    assert [r["protocol"] for r in mixed_ablation.to_dict()["results"]] == ["text", "full"]
    (entry,) = load_models(ModelSource(run=(str(text_run),)))
    text_only = AJ.run(text_config, [entry])
    AJ.write(text_only, tmp_path)  # plain file names: the config's protocol is still full
    data = json.loads((tmp_path / "results" / "ablate" / "ablate.json").read_text())
    assert data["protocol"] == "text" and "window" not in data
    assert [r["protocol"] for r in data["results"]] == ["text"]
    assert [s["protocol"] for s in data["seed_summary"].values()] == ["text"]
    with (tmp_path / "results" / "ablate" / "ablate.csv").open() as f:
        assert {row.split(",", 1)[0] for row in f.read().splitlines()[1:]} == {"text"}
    assert text_only.protocol == "text" and text_only.config.protocol == "full"


def test_rank_is_written_only_when_a_project_out_kind_ran(AJ, tiny_ablation, mixed_ablation, tmp_path):
    """Before: ``"rank": 4`` (the default) was written for every run, also when no ``project_out*`` kind ran and
    the rank applied to nothing; now it is null then, and the rank of the kinds when one ran."""
    # applies: tiny_config runs project_out at rank 0
    result, _ = tiny_ablation
    assert result.runs[0].rank == 0 and result.to_dict()["results"][0]["rank"] == 0
    # and the outputs say so (before: neither ablate_seeds.md nor the figures named the table's rank, so rank 0,
    # which removes nothing, read as "project_out leaves 1.000")
    (summary,) = result.seed_summary
    assert summary.rank == 0 and summary.to_dict()["rank"] == 0
    assert "the project_out* kinds remove rank 0." in AJ.seed_markdown(result.seed_summary, result.runs)
    assert AJ.plot_seed_summary(result.seed_summary).layout.title.text.endswith("; project_out* bars at rank 0")
    assert AJ.plot_ablations(result.runs).layout.title.text.endswith("; project_out* bars at rank 0")
    # does not apply: shuffle_positional alone, for a text and a task model alike
    assert [r.rank for r in mixed_ablation.runs] == [None, None]
    AJ.write(mixed_ablation, tmp_path)
    res_dir = tmp_path / "results" / "ablate"
    data = json.loads((res_dir / "ablate.json").read_text())
    assert [r["rank"] for r in data["results"]] == [None, None]
    assert list(data["results"][0])[:4] == ["task", "n_eval", "n_mu", "rank"]  # the key stays: older readers work
    for name in ("ablate.csv", "ablate_seeds.csv", "ablate_decomposition.csv"):
        assert "rank" not in (res_dir / name).read_text().splitlines()[0].split(","), name
    # which kinds use the rank: those whose name starts with project_out
    assert AJ.AblateConfig().rank_used == 4  # every kind, project_out among them
    assert AJ.AblateConfig(rank=2, kinds=("project_out_random",)).rank_used == 2
    assert AJ.AblateConfig(rank=2, kinds=("project_out_content", "shuffle_vectors")).rank_used == 2
    assert AJ.AblateConfig(kinds=("shuffle_positional", "mean_positional", "swap_prompts")).rank_used is None
    assert AJ.AblateConfig(kinds=("project_out_random",)).rank_used == 4  # the default rank


@pytest.mark.parametrize("kinds", [("shuffle_positional",), ("mean_positional", "swap_prompts"), ("shuffle_vectors",)])
@pytest.mark.parametrize("rank", [0, 2, 4])
def test_a_rank_without_a_project_out_kind_is_refused(AJ, kinds, rank):
    """Before: ``rank`` had the default 4, so ``--rank 2 --kinds shuffle_positional`` was silently ignored (the
    rank applies only to the project_out* kinds); now any rank given there is refused, the default 4 too."""
    with pytest.raises(NopeInterpError, match=r"rank=\d is only used with a project_out\* ablation"):
        AJ.AblateConfig(rank=rank, kinds=kinds)
    assert AJ.AblateConfig(kinds=kinds).rank_used is None  # not given: fine
    for kind in ("project_out", "project_out_random", "project_out_content"):
        assert AJ.AblateConfig(rank=rank, kinds=kinds + (kind,)).rank_used == rank


def test_a_bad_draw_seed_is_refused_before_any_work(AJ, tiny_addition_entry, monkeypatch):
    """ablate_model(seed=) went straight into torch.Generator: bool/str/float/huge gave raw torch errors and -1
    was written to ablate.json as a seed."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    called = []
    monkeypatch.setattr(AJ, "_task_inputs", lambda *a, **k: called.append(1))
    cfg = AJ.AblateConfig(layers=(1,), kinds=("shuffle_positional",), n_eval=4, n_mu=8, n_analysis=2)
    for bad in (True, "5", 5.0, 2**64, -1):
        with pytest.raises(NopeInterpError, match="seed must be an integer"):
            unhooked(AJ.ablate_model)(tiny_addition_entry, cfg, seed=bad)
    assert called == []


def test_the_window_a_too_long_context_error_suggests_fits_every_model_given(AJ):
    """Two addition models, the second with a smaller n_ctx: the suggested --window is the one both read with
    their answers (before: the one that fitted the failing model only)."""
    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    task = tasks.get_task("addition")
    extra = task.max_answer_len + 1  # the answer and its end of line follow the context
    least = task.max_prompt_len + 1
    wide = entry_from_init(preset("tiny", n_ctx=least + extra + 10), task, "wide")
    narrow = entry_from_init(preset("tiny", n_ctx=least + extra + 2, seed=1), task, "narrow")
    fits = rf": window from {least} to {least + 2} fits every model given$"
    with pytest.raises(NopeInterpError, match=rf"^narrow: .*{fits}"):
        AJ.run(AJ.AblateConfig(layers=(1,), protocol="window", window=least + 5), [narrow, wide])
    with pytest.raises(NopeInterpError, match=rf"^narrow: .*{fits}"):
        AJ.run(AJ.AblateConfig(layers=(1,), protocol="window", window=least + 5), [wide, narrow])
    tight = entry_from_init(preset("tiny", n_ctx=least + extra, seed=2), task, "tight")  # the bounds meet
    with pytest.raises(NopeInterpError, match=rf"^tight: .*: window {least} fits every model given$"):
        AJ.run(AJ.AblateConfig(layers=(1,), protocol="window", window=least + 5), [wide, tight])
