"""``nope_interp.jobs.init_grid``: config resolution and validation, run + write on a small grid, the numbers
against an independent numpy reference, the summary against ``statistics``, and the plots."""

import json
import math
import statistics

import numpy as np
import pytest
import torch
from conftest import assert_lists_every_file, assert_strict_json_files

SMALL_GRID = dict(means=(0.0,), stds=(0.02, 0.2), depths=(2,), widths=(48,), seeds=2, n_prompts=6,
                  tasks=("addition",))


@pytest.fixture(scope="module")
def J():
    from nope_interp.jobs import init_grid

    return init_grid


@pytest.fixture(scope="module")
def small_grid_result(J):
    """The init grid N(0, {0.02, 0.2}) at 6x384 and the size grid 2x48, 2 seeds, 6 addition prompts."""
    return J.run(J.InitGridConfig(**SMALL_GRID))


def test_defaults_are_the_full_grid(J):
    cfg = J.InitGridConfig()
    assert cfg.means == (0.0, 4.0, 8.0) and cfg.stds == (0.002, 0.02, 0.2)
    assert cfg.depths == (6, 12, 24) and cfg.widths == (192, 384, 768)
    assert (cfg.seeds, cfg.n_prompts, cfg.n_heads) == (5, 32, 6)
    assert len(cfg.tasks) == 4
    assert len(J.grid_points(cfg)) == 9 + 9


def test_quick_and_wide_std_fill_unset_fields_and_explicit_values_win(J):
    quick = J.InitGridConfig(quick=True)
    assert (quick.depths, quick.widths, quick.seeds, quick.n_prompts) == ((6, 12), (192, 384), 2, 16)
    assert quick.means == (0.0, 4.0, 8.0) and quick.stds == (0.002, 0.02, 0.2)
    # as the old CLI: --quick --seeds 5 keeps 5 seeds (5 is also the full grid's default)
    assert J.InitGridConfig(quick=True, seeds=5, n_prompts=32).seeds == 5
    assert J.InitGridConfig(quick=True, seeds=5, n_prompts=32).n_prompts == 32
    assert J.InitGridConfig(wide_std=True).stds == (0.0002, 0.002, 0.02, 0.2, 2.0)
    assert J.InitGridConfig(wide_std=True, stds=(0.5,)).stds == (0.5,)
    assert J.InitGridConfig(quick=True, depths=(2,)).depths == (2,)
    # a value equal to the full grid's is still a value given (before: --quick --depths 6 12 24 ran 6 12)
    assert J.InitGridConfig(quick=True, depths=(6, 12, 24), widths=(192, 384, 768)).depths == (6, 12, 24)
    assert J.InitGridConfig(quick=True, depths=(6, 12, 24), widths=(192, 384, 768)).widths == (192, 384, 768)
    assert J.InitGridConfig(wide_std=True, stds=(0.002, 0.02, 0.2)).stds == (0.002, 0.02, 0.2)
    points = J.grid_points(J.InitGridConfig(quick=True, wide_std=True))
    assert [p.grid for p in points] == ["init"] * 15 + ["size"] * 4
    assert {(p.n_layers, p.d_model) for p in points if p.grid == "init"} == {(6, 384)}
    assert {(p.init_mean, p.init_std) for p in points if p.grid == "size"} == {(0.0, 0.02)}


def test_config_round_trips_and_the_written_grid_reproduces_it(J):
    cfg = J.InitGridConfig(quick=True, wide_std=True, tasks=("reversal",), seeds=3)
    assert J.InitGridConfig.from_dict(cfg.to_dict()) == cfg
    again = J.InitGridConfig.from_dict(cfg.grid_dict())
    assert again == cfg and J.grid_points(again) == J.grid_points(cfg)
    assert (again.seeds, again.n_prompts, again.tasks) == (3, 16, ("reversal",))
    assert set(cfg.grid_dict()) == {"means", "stds", "depths", "widths", "n_heads", "tasks", "seeds", "n_prompts",
                                    "quick", "wide_std"}


@pytest.mark.parametrize("given", [{}, {"seeds": 3}, {"depths": (2,)}, {"widths": (48, 96)}, {"n_prompts": 8},
                                   {"stds": (0.5,)}, {"tasks": ("reversal",)},
                                   {"depths": (6, 12), "widths": (192, 384), "seeds": 2, "n_prompts": 16}])
@pytest.mark.parametrize("flag", ["quick", "wide_std"])
def test_replace_of_quick_or_wide_std_recomputes_what_they_filled(J, given, flag):
    """Before: ``InitGridConfig(quick=True).replace(quick=False)`` kept the quick grid (2 seeds, depths 6 12, ...)
    while recording ``quick=False``; the same for ``wide_std`` and its stds."""
    on = J.InitGridConfig(**{flag: True}, **given)
    off = on.replace(**{flag: False})
    assert off == J.InitGridConfig(**given) and getattr(off, flag) is False
    assert off.replace(**{flag: True}) == on
    assert on.replace(means=(1.0,)) == J.InitGridConfig(**{flag: True}, means=(1.0,), **given)


@pytest.mark.parametrize("given", [{}, {"seeds": 3}, {"stds": (0.5,)},
                                   {"depths": (6, 12), "widths": (192, 384), "seeds": 2, "n_prompts": 16}])
@pytest.mark.parametrize("flag", ["quick", "wide_std"])
def test_dataclasses_replace_of_quick_or_wide_std_fills_anew_or_refuses(J, given, flag):
    """Before: ``dataclasses.replace(InitGridConfig(quick=True), quick=False)`` kept the quick grid while recording
    ``quick=False``, and a copy with any other change forgot what was filled (its ``.replace`` kept it too)."""
    import dataclasses

    from nope_interp.errors import NopeInterpError

    on = J.InitGridConfig(**{flag: True}, **given)
    copy = dataclasses.replace(on, means=(1.0,))
    assert copy == on.replace(means=(1.0,)) and copy.filled_fields() == on.filled_fields()
    assert copy.replace(**{flag: False}) == J.InitGridConfig(means=(1.0,), **given)
    refilled = {"quick": ("depths", "widths", "seeds", "n_prompts"), "wide_std": ("stds",)}[flag]
    stale = [name for name in refilled if name in on.filled_fields()]
    if stale:  # what the flag filled, carried into a config without it: refused, not kept
        with pytest.raises(NopeInterpError, match=rf"^dataclasses.replace cannot tell whether {stale[0]}="):
            dataclasses.replace(on, **{flag: False})
    else:
        assert dataclasses.replace(on, **{flag: False}) == on.replace(**{flag: False})


@pytest.mark.parametrize("given", [{}, {"seeds": 3}, {"depths": (2,)}, {"widths": (48, 96)}, {"n_prompts": 8},
                                   {"stds": (0.5,)}, {"tasks": ("reversal",)},
                                   {"depths": (6, 12), "widths": (192, 384), "seeds": 2, "n_prompts": 16}])
@pytest.mark.parametrize("flag", ["quick", "wide_std"])
def test_replace_after_from_dict_fills_anew_what_the_flags_fill(J, given, flag):
    """Before: ``InitGridConfig.from_dict(InitGridConfig(quick=True).to_dict())`` took the quick grid it read back as
    given, so ``.replace(quick=False)`` and ``dataclasses.replace(..., quick=False)`` kept it while recording
    ``quick=False`` (the same for ``wide_std`` and its stds). A value read back equal to what the settings fill now
    counts as filled: ``.replace`` fills it anew and ``dataclasses.replace`` refuses, as for a config just built."""
    import dataclasses

    from nope_interp.errors import NopeInterpError

    on = J.InitGridConfig(**{flag: True}, **given)
    fill = {**(J.QUICK_GRID if flag == "quick" else J.FULL_GRID),
            "stds": J.WIDE_STDS if flag == "wide_std" else J.DEFAULT_STDS}
    kept = {k: v for k, v in given.items() if fill.get(k, object()) != v}  # equal to the filled: filled
    for back in (J.InitGridConfig.from_dict(on.to_dict()), J.InitGridConfig.from_dict(on.grid_dict()),
                 J.InitGridConfig.from_json(on.to_json())):
        assert back == on and back.filled_fields() == set(fill) - set(kept)
        assert back.replace(**{flag: False}) == J.InitGridConfig(**kept)
        assert back.replace(means=(1.0,)) == J.InitGridConfig(**{flag: True}, means=(1.0,), **kept)
        refilled = {"quick": ("depths", "widths", "seeds", "n_prompts"), "wide_std": ("stds",)}[flag]
        if any(name not in kept for name in refilled):
            with pytest.raises(NopeInterpError, match=r"^dataclasses.replace cannot tell whether "):
                dataclasses.replace(back, **{flag: False})
        else:
            assert dataclasses.replace(back, **{flag: False}) == J.InitGridConfig(**kept)


def test_the_grid_records_wide_std_and_quick_even_when_explicit_values_win(J):
    """Before: ``--wide-std --stds 0.5`` ran 0.5 (explicit wins, as documented) and the JSON did not say that
    ``wide_std`` had been asked for (``grid_dict`` left it and ``quick`` out)."""
    cfg = J.InitGridConfig(wide_std=True, stds=(0.5,), quick=True, depths=(6,), widths=(192,), seeds=3, n_prompts=8)
    d = json.loads(json.dumps(cfg.grid_dict()))
    assert d["wide_std"] is True and d["quick"] is True and d["stds"] == [0.5]
    assert (d["depths"], d["widths"], d["seeds"], d["n_prompts"]) == ([6], [192], 3, 8)  # what ran
    assert J.InitGridConfig.from_dict(d) == cfg  # the flags fill nothing more: the same grid
    assert J.InitGridConfig().grid_dict()["wide_std"] is False


@pytest.mark.parametrize("field, value", [
    ("seeds", 0), ("n_prompts", 0), ("n_heads", 0), ("stds", (0.0,)), ("stds", (-0.02,)),
    ("means", (float("nan"),)), ("depths", (0,)), ("depths", ()), ("widths", (50,)), ("tasks", ("sorting",)),
    ("n_heads", 5),
])
def test_bad_config_names_the_field(J, field, value):
    from nope_interp.errors import NopeInterpError

    word = {"tasks": "task", "n_heads": "n_heads"}.get(field, field)
    with pytest.raises(NopeInterpError, match=word):
        J.InitGridConfig(**{field: value})


def test_an_n_heads_error_names_each_width_once(J):
    """Before: ``--n-heads 5`` said ``got [192, 384, 768, 384]`` (384, the init grid's width, also a default
    size width, was listed twice)."""
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError) as info:
        J.InitGridConfig(n_heads=5)
    assert str(info.value).endswith("n_heads=5, got [192, 384, 768]"), str(info.value)
    with pytest.raises(NopeInterpError) as info:
        J.InitGridConfig(n_heads=5, widths=(200, 384))
    assert str(info.value).endswith("n_heads=5, got [384]"), str(info.value)


def test_run_rejects_models(J, tiny_cfg):
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    entry = entry_from_init(tiny_cfg, tasks.get_task("addition"), "tiny")
    with pytest.raises(NopeInterpError, match="builds its own models"):
        J.run(J.InitGridConfig(**SMALL_GRID), [entry])
    assert J.default_models(J.InitGridConfig()) == []


def test_rows_cover_every_point_seed_and_task_with_full_hook_names(J, small_grid_result):
    res = small_grid_result
    assert len(res.rows) == (2 + 1) * 2  # (init points + size points) x seeds x 1 task
    assert [(r.grid, r.init_std, r.seed) for r in res.rows[:4]] == [("init", 0.02, 0), ("init", 0.02, 1),
                                                                    ("init", 0.2, 0), ("init", 0.2, 1)]
    init_row, size_row = res.rows[0], res.rows[-1]
    assert init_row.sites[:2] == ("blocks.0.attn.hook_z", "blocks.0.hook_resid_post") and len(init_row.sites) == 12
    assert size_row.sites == ("blocks.0.attn.hook_z", "blocks.0.hook_resid_post",
                              "blocks.1.attn.hook_z", "blocks.1.hook_resid_post")
    assert all(0 <= s.score <= 1 for r in res.rows for s in r.scores)
    assert all(0 <= r.l0_relative_entropy <= 1 for r in res.rows)
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="blocks.5.attn.hook_z"):
        size_row.score("blocks.5.attn.hook_z")


def test_init_std_controls_the_first_layer_entropy_and_the_pattern(J, small_grid_result):
    """N(0, 0.02): nearly uniform layer-0 attention and a strong pattern at hook_z; N(0, 0.2): peaked
    attention and a score near chance (as measured by the authors' grid)."""
    rows = {(r.init_std, r.seed): r for r in small_grid_result.rows if r.grid == "init"}
    for seed in (0, 1):
        small, large = rows[(0.02, seed)], rows[(0.2, seed)]
        assert small.l0_relative_entropy > 0.95 and large.l0_relative_entropy < 0.5
        assert small.score("blocks.0.attn.hook_z") > 0.9
        assert abs(large.score("blocks.0.attn.hook_z") - 0.5) < 0.15


def _row_mean_adjacency(x: np.ndarray) -> float:
    """Independent reference: per prompt, the cosine matrix and, for every row k >= 2, the fraction of pairs
    i < j < k with cos(k, i) < cos(k, j); mean over rows, then over prompts."""
    scores = []
    for seq in x:
        unit = seq / np.linalg.norm(seq, axis=-1, keepdims=True)
        c = unit @ unit.T
        rows = []
        for k in range(2, len(seq)):
            hits = [c[k, i] < c[k, j] for i in range(k) for j in range(i + 1, k)]
            rows.append(sum(hits) / len(hits))
        scores.append(np.mean(rows))
    return float(np.mean(scores))


def test_scores_and_entropy_match_an_independent_reference(J, small_grid_result):
    import tasks
    from nope_interp.model import build_model

    row = small_grid_result.rows[-1]  # size grid 2x48, seed 1
    point = J.GridPoint("size", row.n_layers, row.d_model, row.init_mean, row.init_std)
    model = build_model(point.model_config(6, row.seed))
    task = tasks.get_task("addition")
    tokens = task.prompt_tokens(task.analysis_prompts(6, row.seed))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        z = cache[f"blocks.{layer}.attn.hook_z"].double().numpy()
        z = z.reshape(*z.shape[:2], -1)
        assert row.score(f"blocks.{layer}.attn.hook_z") == pytest.approx(_row_mean_adjacency(z), abs=1e-12)
        resid = cache[f"blocks.{layer}.hook_resid_post"].double().numpy()
        assert row.score(f"blocks.{layer}.hook_resid_post") == pytest.approx(_row_mean_adjacency(resid), abs=1e-12)
    p = cache["blocks.0.attn.hook_pattern"].double().numpy()  # batch head q k
    ent = -(p * np.log(np.clip(p, 1e-300, None))).sum(-1)
    rel = ent[..., 1:] / np.log(np.arange(2, p.shape[-1] + 1))
    assert row.l0_relative_entropy == pytest.approx(float(rel.mean()), abs=1e-9)


def test_summary_is_mean_and_sample_std_over_seeds(J, small_grid_result):
    res = small_grid_result
    assert len(res.summary) == 3 and {s.n_seeds for s in res.summary} == {2}
    for s in res.summary:
        rs = [r for r in res.rows if (r.grid, r.init_std, r.n_layers) == (s.grid, s.init_std, s.n_layers)]
        assert len(rs) == 2
        for site in rs[0].sites:
            vals = [r.score(site) for r in rs]
            st = s.stats(site)
            assert st.mean == pytest.approx(statistics.mean(vals), abs=1e-15)
            assert st.std == pytest.approx(statistics.stdev(vals), abs=1e-15)
            assert st.ci95_low <= st.mean <= st.ci95_high
        ent = [r.l0_relative_entropy for r in rs]
        assert s.l0_relative_entropy.mean == pytest.approx(statistics.mean(ent), abs=1e-15)
    assert res.summary[-1].stats("blocks.2.attn.hook_z") is None


def test_to_dict_is_json_with_full_hook_name_keys(J, small_grid_result):
    d = json.loads(json.dumps(small_grid_result.to_dict()))
    assert set(d) >= {"config", "summary", "rows", "wall_time_s", "git_commit", "nope_interp_version"}
    assert d["config"]["tasks"] == ["addition"] and d["config"]["quick"] is False
    assert d["rows"][0]["blocks.0.attn.hook_z"] == small_grid_result.rows[0].score("blocks.0.attn.hook_z")
    summary_keys = list(d["summary"][-1])
    assert summary_keys[:9] == ["grid", "task", "n_layers", "d_model", "init_mean", "init_std", "n_seeds",
                                "l0_relative_entropy_mean", "l0_relative_entropy_std"]
    assert summary_keys[9:] == [f"blocks.{lay}.{pt}_{st}" for lay in range(2)
                                for pt in ("attn.hook_z", "hook_resid_post") for st in ("mean", "std")]


def test_write_produces_the_result_files_and_figures(J, small_grid_result, tmp_path):
    paths = J.write(small_grid_result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    res, figs = tmp_path / "results" / "init_grid", tmp_path / "figures" / "init_grid"
    expected = [res / "init_grid.json", res / "init_grid.csv", res / "init_grid_summary.csv",
                *(figs / f"{g}_grid_{s}.html" for g in ("init", "size") for s in ("z_L0", "resid_post_L0")),
                figs / "entropy_vs_score.html", figs / "plotly.min.js"]
    # every file written is listed (before: the plotly.min.js the figures load was left out of the outputs)
    assert paths == expected and all(p.exists() for p in expected)
    assert_lists_every_file(paths, tmp_path)  # and nothing else (the lock files beside the folders aside)
    assert sorted(p.name for p in tmp_path.rglob(".*.lock")) == [".init_grid.lock"] * 2  # both folders locked
    header = (res / "init_grid.csv").read_text().splitlines()[0].split(",")
    assert header[:10] == ["grid", "task", "n_layers", "d_model", "init_mean", "init_std", "seed",
                           "l0_relative_entropy", "blocks.0.attn.hook_z", "blocks.0.hook_resid_post"]
    assert len((res / "init_grid.csv").read_text().splitlines()) == 1 + len(small_grid_result.rows)
    assert "blocks.1.hook_resid_post_std" in (res / "init_grid_summary.csv").read_text().splitlines()[0]
    assert json.loads((res / "init_grid.json").read_text())["config"]["seeds"] == 2


def test_plots_take_the_result(J, small_grid_result):
    from nope_interp.errors import NopeInterpError

    fig = J.plot_grid(small_grid_result, "init")
    assert len(fig.data) == 1
    z = fig.data[0].z  # rows: stds 0.02, 0.2; one mean column
    want = [s.stats("blocks.0.attn.hook_z").mean for s in small_grid_result.summary if s.grid == "init"]
    assert [row[0] for row in z] == want
    missing = J.plot_grid(small_grid_result, "size", "blocks.3.attn.hook_z")
    assert missing.data[0].z[0][0] is None
    with pytest.raises(NopeInterpError, match="grid"):
        J.plot_grid(small_grid_result, "depth")
    scatter = J.plot_entropy_vs_score(small_grid_result, "blocks.1.attn.hook_z")
    assert [len(t.x) for t in scatter.data] == [4, 2]
    assert all(math.isfinite(v) for t in scatter.data for v in t.y)


def test_one_seed_shows_the_mean_alone(J, small_grid_result):
    """Before: a one-seed grid showed every cell as ``0.97±0.00`` and titled it "mean ± std over seeds"; with
    one seed the spread is undefined, so the mean alone is shown (as ``compare``'s tables do)."""
    res = small_grid_result
    rows = tuple(r for r in res.rows if r.seed == 0)
    one = J.InitGridResult(config=res.config, rows=rows, summary=J.summarize(rows), provenance=res.provenance,
                           wall_time_s=0.0)
    fig = J.plot_grid(one, "init")
    want = [f"{r.score('blocks.0.attn.hook_z'):.2f}" for r in rows if r.grid == "init"]
    assert [row[0] for row in fig.data[0].text] == want
    assert "±" not in fig.layout.title.text and "one seed" in fig.layout.title.text
    two = J.plot_grid(res, "init")  # two seeds: mean±std
    st = [s.stats("blocks.0.attn.hook_z") for s in res.summary if s.grid == "init"]
    assert [row[0] for row in two.data[0].text] == [f"{s.mean:.2f}±{s.std:.2f}" for s in st]
    assert "mean ± std over seeds" in two.layout.title.text
    from nope_interp.stats import mean_std_ci

    assert J.fmt_seed_stats(mean_std_ci([0.5])) == "0.50" and J.fmt_seed_stats(mean_std_ci([0.5, 0.7]), 3) == \
        "0.600±0.141"


def test_cli_flags_build_the_config_as_the_old_command_did(J):
    """Only the flags the user gives reach the config: --quick --seeds 5 keeps 5 seeds and quick's prompts."""
    import argparse

    from nope_interp.cli import add_config_flags, config_kwargs

    parser = argparse.ArgumentParser()
    add_config_flags(parser, J.InitGridConfig)

    def parse(*argv: str):
        return J.InitGridConfig(**config_kwargs(parser.parse_args(argv), J.InitGridConfig))

    cfg = parse("--quick", "--seeds", "5", "--tasks", "reversal", "--wide-std")
    assert (cfg.seeds, cfg.n_prompts, cfg.depths, cfg.tasks) == (5, 16, (6, 12), ("reversal",))
    assert cfg.stds == J.WIDE_STDS
    assert parse("--n-prompts", "8") == J.InitGridConfig(n_prompts=8)
    assert parse().seeds == 5 and parse("--quick").seeds == 2
