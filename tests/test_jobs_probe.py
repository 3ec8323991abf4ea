"""The ``probe`` job: config, model selection and labels, run + write, the figure."""

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import assert_lists_every_file, assert_strict_json_files


@pytest.fixture
def probe_job():
    from nope_interp.jobs import probe

    return probe


@pytest.fixture
def tiny_reversal_entry(tiny_cfg):
    """A freshly initialised tiny-preset model on the reversal task, labelled as in the default set."""
    import tasks
    from nope_interp.jobs.common import entry_from_init

    return entry_from_init(tiny_cfg, tasks.get_task("reversal"), "initialised")


@pytest.fixture
def small_config(probe_job):
    """Two features, ridge only, one seed, 16 prompts: a few seconds on a tiny model."""
    return probe_job.ProbeConfig(n_prompts=16, features=("variance", "raw"), probes=("ridge",), seeds=1)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_prompts": 7}, "n_prompts"), ({"n_prompts": 100_001}, "n_prompts"), ({"seeds": 0}, "seeds"),
    ({"features": ("entropy",)}, "feature"), ({"features": ()}, "feature"), ({"probes": ("forest",)}, "probe"),
    ({"tasks": ("sorting",)}, "task"), ({"default_preset": "huge"}, "default_preset"), ({"sites": ()}, "sites"),
    ({"protocol": "padded"}, "protocol"), ({"window": 32}, "window"), ({"protocol": "window", "window": 2}, "window"),
])
def test_bad_config_names_the_field(probe_job, kwargs, field):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=field):
        probe_job.ProbeConfig(**kwargs)


def test_quick_defaults_and_explicit_values_win(probe_job):
    from nope_interp.probing import FEATURES, PROBES

    normal, quick = probe_job.ProbeConfig(), probe_job.ProbeConfig(quick=True)
    assert (normal.prompts_used, normal.seeds_used, normal.probes_used) == (64, (0, 1), PROBES)
    assert (quick.prompts_used, quick.seeds_used, quick.probes_used) == (48, (0,), ("ridge",))
    assert normal.features_used == quick.features_used == FEATURES
    given = probe_job.ProbeConfig(quick=True, n_prompts=16, seeds=3, probes=("mlp",))
    assert (given.prompts_used, given.seeds_used, given.probes_used) == (16, (0, 1, 2), ("mlp",))
    assert probe_job.ProbeConfig.from_json(given.to_json()) == given


def test_default_sites_are_full_hook_names(probe_job):
    assert probe_job.default_sites(1) == ["hook_embed", "blocks.0.attn.hook_z", "blocks.0.hook_resid_post"]
    assert probe_job.default_sites(3)[3:] == ["blocks.2.attn.hook_z", "blocks.2.hook_resid_post"]


def test_default_models_and_labels(probe_job):
    from nope_interp.config import preset
    from nope_interp.jobs.common import ModelSource, load_models

    entries = probe_job.default_models(probe_job.ProbeConfig(tasks=("reversal",), default_preset="tiny"))
    assert [(e.label, e.kind, e.task.name) for e in entries] == [
        ("initialised", "init", "reversal"), ("trained", "pretrained", "reversal")]
    assert entries[0].model_cfg == preset("tiny") and entries[1].train_prompts
    assert [probe_job.model_label(e) for e in entries] == ["initialised", "trained"]

    init = load_models(ModelSource(init=True, task="indexing", preset="tiny"))[0]
    assert probe_job.model_label(init) == "initialised (tiny)"
    tweaked = load_models(ModelSource(init=True, task="indexing", preset="tiny", model_overrides={"init_std": 0.2}))[0]
    assert probe_job.model_label(tweaked) == "initialised (tiny-init_std0.2)"
    assert probe_job.model_label(dataclasses.replace(init, kind="run", label="my-run")) == "my-run"
    # --pretrained gives kind "pretrained", label "pretrained-<task>": the row says "trained" as before
    assert probe_job.model_label(dataclasses.replace(entries[1], label="pretrained-reversal")) == "trained"


def test_run_matches_the_pure_probing_functions_and_writes_files(probe_job, small_config, tiny_reversal_entry,
                                                                  tmp_path):
    from nope_interp.activations import collect_activations
    from nope_interp.probing import probe_sites

    result = probe_job.run(small_config, [tiny_reversal_entry])
    sites = probe_job.default_sites(2)
    assert len(result.rows) == len(sites) * 2 and result.n_prompts == 16 and result.seeds == (0,)
    assert [r.site for r in result.rows[::2]] == sites

    # reference: the pure functions of nope_interp.probing on the same prompts
    task = tiny_reversal_entry.task
    acts = collect_activations(tiny_reversal_entry.model, task.prompt_tokens(task.analysis_prompts(16, 1)))
    ref = probe_sites(acts.acts[[acts.labels.index(s) for s in sites]], sites, ("variance", "raw"), ("ridge",), (0,))
    got = [r.to_dict() for r in result.rows]
    stripped = [{k: v for k, v in g.items() if k not in ("task", "model", "inputs")} for g in got]
    assert json.dumps(stripped) == json.dumps(ref)  # same numbers, NaN included
    assert all(g["task"] == "reversal" and g["model"] == "initialised" and g["inputs"] == "full" for g in got)
    # every sequence has the same positions, so predicting the training mean is exactly chance
    assert all(r.mean_baseline.nrmse == pytest.approx(1.0) and math.isnan(r.mean_baseline.pearson_r)
               for r in result.rows)
    # the raw vector at the first layer's output carries position in a NoPE model; embeddings do not
    raw = {r.site: r.score.nrmse for r in result.rows if r.feature == "raw"}
    assert raw["hook_embed"] > 0.8 and raw["blocks.0.hook_resid_post"] < raw["hook_embed"]

    data = json.loads(json.dumps(result.to_dict()))
    assert set(data) >= {"n_prompts", "features", "probes", "seeds", "normaliser", "rows", "git_commit"}
    assert data["features"] == ["variance", "raw"] and len(data["rows"]) == len(result.rows)
    # what each model was probed on: its task's size and inputs, and where it came from
    (described,) = data["models"]
    assert described["task_params"] == {"n_digits": 16} and described["inputs"] == "full"
    assert described["model"] == "initialised" and "init" in described["source"]

    paths = probe_job.write(result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    names = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert names == ["figures/probe/nrmse_by_site_ridge.html", "figures/probe/plotly.min.js", "results/probe/probe.csv",
                     "results/probe/probe.json"]
    assert_lists_every_file(paths, tmp_path)  # before: the plotly.min.js the figures load was left out
    assert all(p.exists() for p in paths)
    assert (tmp_path / "results/probe/probe.csv").read_text().splitlines()[0].startswith(
        "protocol,task,model,inputs,site,feature,probe,seed,probe_nrmse,probe_pearson_r,probe_mae,mean_baseline_nrmse")
    # a rerun with another probe kind removes the figure of the kind it did not rerun (before: left beside results
    # that no longer held its numbers); a figure that is not the job's own stays
    import dataclasses

    own = tmp_path / "figures/probe/notes.html"
    own.write_text("mine")
    fake = dataclasses.replace(result, config=dataclasses.replace(result.config, probes=("mlp",)), probes=("mlp",),
                               rows=tuple(dataclasses.replace(r, probe="mlp") for r in result.rows))
    again = probe_job.write(fake, tmp_path)
    assert not (tmp_path / "figures/probe/nrmse_by_site_ridge.html").exists() and own.exists()
    assert (tmp_path / "figures/probe/nrmse_by_site_mlp.html") in again


def test_unknown_site_is_refused_before_probing(probe_job, tiny_reversal_entry):
    from nope_interp.errors import NopeInterpError

    cfg = probe_job.ProbeConfig(n_prompts=8, sites=("blocks.7.hook_resid_post",), probes=("ridge",), seeds=1)
    with pytest.raises(NopeInterpError, match="unknown site.*allowed: hook_embed"):
        probe_job.run(cfg, [tiny_reversal_entry])


def test_plot_has_a_panel_per_model_and_refuses_a_missing_probe(probe_job, small_config, tiny_reversal_entry):
    from nope_interp.errors import NopeInterpError

    other = dataclasses.replace(tiny_reversal_entry, label="my-run", kind="run")
    result = probe_job.run(small_config.replace(sites=("hook_embed", "blocks.1.hook_resid_post")),
                           [tiny_reversal_entry, other])
    fig = probe_job.plot_probe_nrmse(result, "ridge")
    assert [a.text for a in fig.layout.annotations] == ["reversal, initialised", "reversal, my-run"]
    # per panel: one line per feature and the shuffled baseline; x axes use the short site labels
    assert len(fig.data) == 2 * 3 and list(fig.data[0].x) == ["embed", "L1 resid_post"]
    assert fig.data[0].y[0] == pytest.approx(result.rows[0].score.nrmse)
    with pytest.raises(NopeInterpError, match="no rows for probe 'mlp'"):
        probe_job.plot_probe_nrmse(result, "mlp")


def test_noise_control_runs_every_feature_and_flags_a_leaking_feature(probe_job, tiny_reversal_entry, tmp_path,
                                                                      monkeypatch):
    from nope_interp import probing

    cfg = probe_job.ProbeConfig(n_prompts=24, sites=("hook_embed",), probes=("ridge",), seeds=1)
    lines: list[str] = []
    result = probe_job.run(cfg, [tiny_reversal_entry, dataclasses.replace(tiny_reversal_entry, label="other")],
                           log=lines.append)
    d_model = tiny_reversal_entry.model_cfg.d_model
    n_pos = tiny_reversal_entry.task.max_prompt_len
    # one control per task, width and length (not per model): every feature, probe and seed, on noise
    assert [(r.model, r.site, r.feature) for r in result.noise_rows] == [
        (f"noise control ({n_pos} positions x d_model {d_model})", "noise", f) for f in probing.FEATURES]
    assert all(r.score.nrmse >= probing.NOISE_MAX_NRMSE for r in result.noise_rows)
    assert result.noise_leaks() == [] and any("every feature fails on pure noise" in ln for ln in lines)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["noise_control"]["leaks"] == [] and len(data["noise_control"]["rows"]) == len(probing.FEATURES)
    probe_job.write(result, tmp_path)
    assert_strict_json_files(tmp_path)
    csv_rows = (tmp_path / "results/probe/probe.csv").read_text().splitlines()
    assert sum(",noise control (" in r for r in csv_rows) == len(probing.FEATURES)

    # the same task at another size reads inputs of another length: a control of that length too (before:
    # one control per task and width, of the first model's length)
    import tasks

    longer = dataclasses.replace(tiny_reversal_entry, label="longer", task=tasks.get_task("reversal", n_digits=12))
    assert longer.task.max_prompt_len != n_pos
    two = probe_job.run(cfg, [tiny_reversal_entry, longer])
    assert sorted({r.model for r in two.noise_rows}) == sorted(
        {f"noise control ({n} positions x d_model {d_model})" for n in (n_pos, longer.task.max_prompt_len)})

    # a feature that is 1 at the last position by construction (the old cos_last rows) is caught
    def leaky(acts, feature):
        X, y, g = probing.position_features(acts, feature)
        if feature != "cos_last":
            return X, y, g
        n = acts.shape[0]
        return (np.concatenate([X, np.ones((n, 1))]), np.concatenate([y, np.zeros(n)]),
                np.concatenate([g, np.arange(n)]))

    monkeypatch.setattr(probe_job, "position_features", leaky)
    lines.clear()
    leaked = probe_job.run(cfg.replace(features=("cos_last", "variance")), [tiny_reversal_entry], log=lines.append)
    assert [(k["feature"], k["probe"]) for k in leaked.noise_leaks()] == [("cos_last", "ridge")]
    assert leaked.noise_leaks()[0]["nrmse"] < probing.NOISE_MAX_NRMSE
    assert any(ln.startswith("WARNING: noise control") and "cos_last" in ln for ln in lines)


@pytest.mark.parametrize("protocol", ["authors", "window"])
def test_a_protocol_probes_its_inputs_and_names_its_files(probe_job, small_config, tiny_reversal_entry, tmp_path,
                                                          protocol):
    """--protocol authors / window: the probes read tasks.protocol_inputs (the same numbers as the pure functions
    on those inputs), the noise control has their length, and files and title name the protocol."""
    import tasks
    from nope_interp.activations import collect_activations
    from nope_interp.probing import probe_sites

    cfg = dataclasses.replace(small_config, protocol=protocol, **({"window": 30} if protocol == "window" else {}))
    result = probe_job.run(cfg, [tiny_reversal_entry])
    task = tiny_reversal_entry.task
    inputs = tasks.protocol_inputs(task, protocol, 16, 1, **({"window": 30} if protocol == "window" else {}))
    assert {len(x) for x in inputs} == {22 if protocol == "authors" else 30}
    acts = collect_activations(tiny_reversal_entry.model, task.prompt_tokens(inputs))
    sites = probe_job.default_sites(2)
    ref = probe_sites(acts.acts[[acts.labels.index(s) for s in sites]], sites, ("variance", "raw"), ("ridge",), (0,))
    got = [{k: v for k, v in r.to_dict().items() if k not in ("task", "model", "inputs")} for r in result.rows]
    assert json.dumps(got) == json.dumps(ref)
    assert {r.inputs for r in result.rows} == {protocol}
    assert result.to_dict()["protocol"] == protocol
    paths = probe_job.write(result, tmp_path)
    tag = "window30" if protocol == "window" else protocol  # two window lengths never share a file either
    assert sorted(p.name for p in paths) == sorted([f"probe_{tag}.json", f"probe_{tag}.csv",
                                                    f"nrmse_by_site_ridge_{tag}.html", "plotly.min.js"])
    header = next(p for p in paths if p.suffix == ".csv").read_text().splitlines()[0]
    assert header.startswith("protocol,window,task," if protocol == "window" else "protocol,task,")
    assert f"{protocol} inputs" in probe_job.plot_probe_nrmse(result, "ridge").layout.title.text


def test_a_protocol_is_refused_for_text_models_and_inputs_longer_than_n_ctx(tiny_reversal_entry):
    import dataclasses as dc

    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_tokens

    with pytest.raises(NopeInterpError, match="window inputs of 100 tokens"):
        entry_tokens(tiny_reversal_entry, 4, 1, "window", 100)
    with pytest.raises(NopeInterpError, match="applies to task models"):
        entry_tokens(dc.replace(tiny_reversal_entry, kind="text"), 4, 1, "authors")
    with pytest.raises(NopeInterpError, match="unknown protocol 'padded'"):
        entry_tokens(tiny_reversal_entry, 4, 1, "padded")


def test_inputs_too_short_for_the_probes_name_the_settings_that_lengthen_them(probe_job, tiny_cfg):
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init

    entry = entry_from_init(tiny_cfg, tasks.get_task("addition", n_digits=1), "one-digit")
    with pytest.raises(NopeInterpError, match=r"one-digit: position probes need inputs of at least 7 positions, "
                                              r"its addition full inputs have 5: use a larger n_digits, or "
                                              r"protocol='window' with window >= 8$"):
        probe_job.run(probe_job.ProbeConfig(quick=True, n_prompts=8), [entry])


def test_rows_say_whether_each_probe_converged_and_the_job_warns(probe_job, tiny_reversal_entry, monkeypatch,
                                                                 tmp_path):
    """Every row and the CSV carry probe_converged; an MLP that ran out of epochs is flagged in the log."""
    import nope_interp.probing as probing

    cfg = probe_job.ProbeConfig(n_prompts=8, features=("variance",), probes=("ridge", "mlp"), seeds=1,
                                sites=("blocks.0.hook_resid_post",))
    lines: list[str] = []
    result = probe_job.run(cfg, [tiny_reversal_entry], log=lines.append)
    assert [r.to_dict()["probe_converged"] for r in result.rows] == [True, True]
    assert not any("did not converge" in ln for ln in lines)
    monkeypatch.setattr(probing, "MLP_MAX_ITER", 2)
    lines.clear()
    result = probe_job.run(cfg, [tiny_reversal_entry], log=lines.append)
    assert [r.to_dict()["probe_converged"] for r in result.rows] == [True, False]
    (warn,) = [ln for ln in lines if "did not converge" in ln]
    assert warn.startswith("WARNING: 1 of 2 probes") and "variance mlp" in warn
    probe_job.write(result, tmp_path)
    import csv

    with open(tmp_path / "results/probe/probe.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == "initialised"]
    assert [(r["probe"], r["probe_converged"]) for r in rows] == [("ridge", "True"), ("mlp", "False")]


def test_models_whose_rows_would_share_a_key_are_refused():
    """Before: the shipped reversal model and the same model on 8-digit reversal were both rows of model
    'trained' on reversal, so the figure drew their mean (0.617) as if they were two seeds of one model."""
    import dataclasses

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import probe
    from nope_interp.jobs.common import entry_from_init
    from nope_interp.model import preset

    task = tasks.get_task("reversal")
    base = entry_from_init(preset("tiny"), task, "x")
    shipped = dataclasses.replace(base, kind="pretrained", label="pretrained-reversal")
    longer = dataclasses.replace(base, kind="pretrained", label="pretrained-reversal-on-reversal8")
    assert probe.model_label(shipped) == "trained"
    assert probe.model_label(longer) == "trained (on reversal8)"
    a = entry_from_init(preset("tiny", seed=0), task, "init-tiny-reversal")
    b = entry_from_init(preset("tiny", seed=1), task, "init-tiny")   # both read as "initialised (tiny)"
    assert probe.model_label(a) == probe.model_label(b)
    with pytest.raises(NopeInterpError, match=r"probe: the models 'init-tiny-reversal' and 'init-tiny' would both be "
                                              r"rows of model 'initialised \(tiny\)' on reversal"):
        probe.run(probe.ProbeConfig(quick=True), [a, b])


def test_the_progress_line_gives_the_best_probe_mean_over_seeds():
    """Before: the progress line said only '30 probes'; it now gives the lowest NRMSE, a mean over seeds."""
    from nope_interp.jobs import probe
    from nope_interp.probing import ProbeScore

    def row(site, feature, seed, nrmse):
        sc = ProbeScore(nrmse=nrmse, pearson_r=0.5, mae=1.0)
        return probe.ProbeRow(task="addition", model="trained", site=site, feature=feature, probe="mlp", seed=seed,
                              score=sc, mean_baseline=sc, shuffled_baseline=sc)

    rows = [row("hook_embed", "raw", 0, 0.20), row("hook_embed", "raw", 1, 0.80),          # mean 0.50
            row("blocks.0.attn.hook_z", "cos_profile", 0, 0.30), row("blocks.0.attn.hook_z", "cos_profile", 1, 0.40),
            row("blocks.0.attn.hook_z", "norm", 0, float("nan"))]
    assert probe._headline(rows) == "; best: NRMSE 0.35 (cos_profile, mlp at blocks.0.attn.hook_z; 1.0 = chance)"
    assert probe._headline([]) == ""
