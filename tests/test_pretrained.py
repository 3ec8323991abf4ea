"""Shipped models and seeds: loading by name, recipes, shipping a run."""

import json

import pytest


def test_shipped_models_load_in_one_call_and_by_name():
    from nope_interp.pretrained import available_pretrained, load_pretrained

    assert available_pretrained() == ["addition", "reversal", "indexing", "ordering"]
    for name in available_pretrained():
        run = load_pretrained(name)
        assert run.task.name == name and run.command.startswith("nope-interp train --task " + name)
        assert (run.path / "model.safetensors").stat().st_size <= 10 * 2**20
        assert 0 <= run.summary["test_acc"] <= 1 and run.summary["n_test"] == 20_000


def test_shipped_seeds_share_the_shipped_recipe_and_ship_as_seed(tiny_run, tmp_path, monkeypatch):
    """Every extra seed differs from its task's shipped model only in --seed/--model-seed."""
    import nope_interp.pretrained as pretrained

    found = 0
    for task in pretrained.available_pretrained():
        shipped = json.loads((pretrained.PRETRAINED_DIR / task / "config.json").read_text())
        for path in pretrained.available_seed_runs(task):
            cfg = json.loads((path / "config.json").read_text())
            seed = cfg["model"]["seed"]
            assert path.name == f"{task}-s{seed}" and seed != shipped["model"]["seed"]
            assert {**cfg["model"], "seed": 0} == {**shipped["model"], "seed": 0}
            assert {**cfg["train"], "seed": 0} == {**shipped["train"], "seed": 0}
            assert json.loads((path / "summary.json").read_text())["n_test"] == 20_000
            found += 1
    assert found >= 2  # reversal-s1 and reversal-s2 at least
    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path / "seeds")
    dest = pretrained.ship(tiny_run, as_seed=True)
    assert dest == tmp_path / "seeds" / "addition-s0" and pretrained.available_seed_runs("addition") == [dest]
    with pytest.raises(pretrained.NopeInterpError, match="unknown task"):
        pretrained.available_seed_runs("sorting")
