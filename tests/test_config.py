"""Frozen configs: JSON round-trip, one-line validation errors (NaN and infinities included), field help."""

import dataclasses
import json
import math

import pytest


@pytest.fixture
def C():
    import nope_interp.config as C

    return C


def _all_configs():
    """Every config class of the toolkit with a valid instance (the job configs at their defaults)."""
    from nope_interp.config import PRESETS, TrainConfig
    from nope_interp.jobs import ablate, analyze, averaging, demo, init_grid, probe, trajectory
    from nope_interp.jobs.common import ModelSource

    out = [(f"preset {name}", cfg) for name, cfg in PRESETS.items()]
    out += [("TrainConfig", TrainConfig()), ("ModelSource", ModelSource(pretrained=("reversal",)))]
    out += [(job.NAME, job.CONFIG()) for job in (analyze, demo, averaging, init_grid, probe, ablate, trajectory)]
    return out


def test_json_round_trip_of_every_config():
    for name, cfg in _all_configs():
        text = cfg.to_json()
        json.loads(text)
        assert type(cfg).from_json(text) == cfg, name
        assert type(cfg).from_dict(cfg.to_dict()) == cfg, name


def test_every_config_field_has_help_text():
    for name, cfg in _all_configs():
        missing = [f.name for f in dataclasses.fields(cfg) if not type(cfg).field_help(f.name)]
        assert missing == [], f"{name}: fields without help: {missing}"


def test_presets(C):
    paper = C.preset("paper")
    assert (paper.n_layers, paper.d_model, paper.n_heads, paper.d_mlp) == (6, 384, 6, 1536)
    assert paper.positional == "none" and paper.attention == "causal"
    assert (paper.init_mean, paper.init_std) == (0.0, 0.02)
    with pytest.raises(C.NopeInterpError, match="available presets: paper, paper-recipe, cpu, tiny"):
        C.preset("huge")
    with pytest.raises(C.NopeInterpError, match="unknown ModelConfig field"):
        C.preset("tiny", n_layer=3)


@pytest.mark.parametrize("kwargs,match", [
    ({"n_layers": 0}, "n_layers"), ({"d_head": 7}, "n_heads \\* d_head"), ({"positional": "alibi"}, "positional"),
    ({"attention": "sideways"}, "attention"), ({"init_std": -1.0}, "init_std"), ({"act_fn": "tanh"}, "act_fn"),
    ({"init_std": math.nan}, "init_std"), ({"init_std": math.inf}, "init_std"), ({"init_mean": -math.inf}, "init_mean"),
    ({"n_layers": True}, "n_layers"), ({"seed": -1}, "seed"),
])
def test_bad_model_config(C, kwargs, match):
    with pytest.raises(C.NopeInterpError, match=match):
        C.preset("tiny", **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"lr": math.nan}, "lr"), ({"lr": 1e30}, "lr"), ({"lr": 0.0}, "lr"), ({"weight_decay": math.nan}, "weight_decay"),
    ({"grad_clip": math.nan}, "grad_clip"), ({"grad_clip": 0.0}, "grad_clip"), ({"beta1": 1.5}, "beta1"),
    ({"target_acc": math.nan}, "target_acc"), ({"batch_size": 0}, "batch_size"), ({"task": "sorting"}, "sorting"),
    ({"task_params": {"n_digits": 0}}, "n_digits"), ({"warmup_steps": -1}, "warmup_steps"),
])
def test_bad_train_config(C, kwargs, match):
    from tasks import TaskError

    with pytest.raises((C.NopeInterpError, TaskError), match=match):
        C.TrainConfig(**kwargs)


def test_from_dict_and_replace_refuse_unknown_fields(C):
    with pytest.raises(C.NopeInterpError, match="unknown ModelConfig field\\(s\\) \\['depth'\\]"):
        C.ModelConfig.from_dict({"depth": 3})
    with pytest.raises(C.NopeInterpError, match="unknown TrainConfig field"):
        C.TrainConfig().replace(learning_rate=1.0)
    with pytest.raises(C.NopeInterpError, match="must be a JSON object"):
        C.ModelConfig.from_dict([1, 2])
    assert C.ModelConfig().replace(n_layers=5).n_layers == 5


def test_tuple_fields_come_back_as_tuples_from_json():
    from nope_interp.jobs.analyze import AnalyzeConfig

    cfg = AnalyzeConfig.from_dict({"points": ["embed", "z"]})
    assert cfg.points == ("embed", "z")
    assert AnalyzeConfig.from_json(cfg.to_json()) == cfg
