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
    ({"n_layers": 0}, "n_layers"), ({"d_head": 7}, r"d_model=32 must equal n_heads=2 times d_head=7 \(14\)"),
    ({"positional": "alibi"}, "positional"),
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


# --- field values checked against their annotations --------------------------------------------------
WRONG_TYPES = [
    ("TrainConfig", {"beta1": "0.9"}, "beta1 must be a number, got str '0.9'"),
    ("TrainConfig", {"steps": 100.0}, "steps must be an integer, got float 100.0"),
    ("TrainConfig", {"lr": True}, "lr must be a number, got bool True"),
    ("TrainConfig", {"task": None}, "task must be a string, got null"),
    ("TrainConfig", {"task_params": {"n_digits": "3"}}, "task_params must be a JSON object of integers, got "
                                                         "{'n_digits': '3'} (key 'n_digits' has str '3')"),
    ("TrainConfig", {"task_params": [3]}, "task_params must be a JSON object of integers, got list [3]"),
    ("ModelConfig", {"biases": "no"}, "biases must be true or false, got str 'no'"),
    ("ModelConfig", {"biases": 0}, "biases must be true or false, got int 0"),
    ("ModelConfig", {"tied_embeddings": "false"}, "tied_embeddings must be true or false, got str 'false'"),
    ("ModelConfig", {"n_layers": "2"}, "n_layers must be an integer, got str '2'"),
    ("ModelConfig", {"act_fn": None}, "act_fn must be a string, got null"),
    ("AnalyzeConfig", {"points": "embed"}, "points must be a list of strings, got the single string 'embed' "
                                           "(write ['embed'] for a list of one)"),
    ("AnalyzeConfig", {"points": ("embed", 3)},
     "points must be a list of strings, got ['embed', 3] (entry 1 is int 3)"),
    ("AblateConfig", {"layers": "1"}, "layers must be a list of integers or null, got the single string '1'"),
    ("AblateConfig", {"ranks": [0, None]}, "ranks must be a list of integers, got [0, None] (entry 1 is null)"),
    ("ModelSource", {"run": "runs/x"}, "run must be a list of strings, got the single string 'runs/x'"),
    ("ModelSource", {"pretrained": "reversal"}, "pretrained must be a list of strings, got the single string"),
    ("DemoConfig", {"tasks": "reversal"}, "tasks must be a list of strings, got the single string 'reversal'"),
    ("InitGridConfig", {"stds": 0.02}, "stds must be a list of numbers or null, got float 0.02"),
]


def _config_class(name):
    import nope_interp.config as C
    from nope_interp.jobs import ablate, analyze, demo, init_grid
    from nope_interp.jobs.common import ModelSource

    return {"TrainConfig": C.TrainConfig, "ModelConfig": C.ModelConfig, "AnalyzeConfig": analyze.AnalyzeConfig,
            "AblateConfig": ablate.AblateConfig, "ModelSource": ModelSource, "DemoConfig": demo.DemoConfig,
            "InitGridConfig": init_grid.InitGridConfig}[name]


@pytest.mark.parametrize("cls,kwargs,message", WRONG_TYPES, ids=[f"{c}-{next(iter(k))}" for c, k, _ in WRONG_TYPES])
def test_a_value_of_the_wrong_type_names_the_field_and_the_expected_type(cls, kwargs, message):
    from conftest import build_unhooked

    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError) as err:
        build_unhooked(_config_class(cls), **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_type_checks_run_for_users_without_the_test_type_checker():
    """The same checks in a plain interpreter (no jaxtyping hook), through the constructor and from_dict."""
    import subprocess
    import sys

    code = """
import json
from nope_interp.config import ModelConfig, TrainConfig
from nope_interp.jobs.analyze import AnalyzeConfig
from nope_interp.errors import NopeInterpError
out = []
for make in (lambda: TrainConfig(beta1="0.9"), lambda: ModelConfig(biases="no"),
             lambda: AnalyzeConfig(points="embed"), lambda: TrainConfig.from_dict({"steps": "5"}),
             lambda: ModelConfig.from_json('{"biases": "no"}')):
    try:
        make()
        out.append(None)
    except NopeInterpError as err:
        out.append(str(err))
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == [
        "beta1 must be a number, got str '0.9'", "biases must be true or false, got str 'no'",
        "points must be a list of strings, got the single string 'embed' (write ['embed'] for a list of one)",
        "steps must be an integer, got str '5'", "biases must be true or false, got str 'no'"]


def test_lists_become_tuples_and_integers_are_numbers(C):
    from conftest import build_unhooked

    from nope_interp.jobs.ablate import AblateConfig
    from nope_interp.jobs.analyze import AnalyzeConfig

    assert build_unhooked(AnalyzeConfig, points=["embed", "z"]).points == ("embed", "z")
    assert build_unhooked(AblateConfig, layers=[1], ranks=[0, 2]).ranks == (0, 2)
    assert build_unhooked(C.TrainConfig, lr=1, beta1=0).lr == 1  # JSON may write 1 for 1.0
    assert C.TrainConfig(task_params={"n_digits": 2}).task_params == {"n_digits": 2}
    cfg = C.TrainConfig()
    assert C.TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_check_choices_refuses_a_single_string(C):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    for bad in ("embed", "z"):
        with pytest.raises(NopeInterpError, match=f"got the single string '{bad}'; allowed: embed, z"):
            unhooked(C.check_choices)("points", bad, ("embed", "z"))
    C.check_choices("points", ("z",), ("embed", "z"))


@pytest.mark.parametrize("cls,kwargs,match", [
    ("ModelConfig", {"init_std": 1e39}, r"init_std must be a finite number in \(0.0, 1000.0\], got 1e\+39"),
    ("ModelConfig", {"init_std": math.inf}, "init_std"), ("ModelConfig", {"init_mean": 1e300}, "init_mean"),
    ("ModelConfig", {"init_mean": -math.inf}, "init_mean"), ("ModelConfig", {"dropout": math.nan}, "dropout"),
    ("TrainConfig", {"beta1": 1.0}, r"beta1 must be in \[0, 1\)"), ("TrainConfig", {"beta2": 1.0}, "beta2"),
    ("TrainConfig", {"beta2": math.nan}, "beta2"), ("TrainConfig", {"min_lr_ratio": math.inf}, "min_lr_ratio"),
    ("TrainConfig", {"lr": 1.0, "weight_decay": 2.0}, r"lr=1.0 times weight_decay=2.0 must be at most 1"),
    ("TrainConfig", {"weight_decay": -0.1}, "weight_decay"), ("TrainConfig", {"grad_clip": math.inf}, "grad_clip"),
])
def test_every_float_field_is_finite_and_in_range(C, cls, kwargs, match):
    with pytest.raises(C.NopeInterpError, match=match):
        getattr(C, cls)(**kwargs)


def test_init_grid_means_and_stds_are_finite_and_in_range(C):
    from nope_interp.jobs.init_grid import InitGridConfig

    for kwargs in ({"stds": (0.02, 1e39)}, {"stds": (math.nan,)}, {"means": (0.0, 1e300)}, {"means": (-math.inf,)}):
        with pytest.raises(C.NopeInterpError, match="must be a finite number"):
            InitGridConfig(**kwargs)
    assert InitGridConfig(means=(-1000.0, 1000.0), stds=(1000.0,)).stds == (1000.0,)


def test_check_name_takes_one_safe_path_component(C):
    for good in ("t", "addition-cpu-s0", "init-paper-reversal-init_mean-1.0", "a.b+c_d", "_x", "0" * 200):
        C.check_name("label", good)
    for bad in ("", ".", "..", "../x", "a/b", "a\\b", ".hidden", "-rf", "a b", "x\n", "\u0661", "caf\u00e9",
                "0" * 201, None, 3):
        with pytest.raises(C.NopeInterpError, match="label must be one folder name"):
            C.check_name("label", bad)


def test_analyze_label_is_one_safe_path_component(C):
    from nope_interp.jobs.analyze import AnalyzeConfig

    assert AnalyzeConfig(label="my-model").label == "my-model"
    for bad in ("../../x", "/abs", "a/b", ".."):
        with pytest.raises(C.NopeInterpError, match="label must be one folder name"):
            AnalyzeConfig(label=bad)


@pytest.mark.parametrize("overrides,match", [
    ({"attention": "sliding", "window": 0}, r"window must be an integer in \[1, 1000000\], got 0"),
    ({"attention": "sliding", "window": -3}, r"window must be an integer in \[1, 1000000\], got -3"),
    ({"attention": "sliding"}, r"window must be an integer >= 1 .* attention='sliding', got None"),
    ({"window": 4}, r"window needs attention='sliding' .*, got window=4 with attention='causal'"),
    ({"attention": "bidirectional", "window": 4}, r"window needs attention='sliding' .* attention='bidirectional'"),
    ({"attention": "sliding", "window": 2.5}, r"window must be an integer or null, got float 2.5"),
    ({"attention": "sliding", "window": True}, r"window must be an integer or null, got bool True"),
    ({"normalization": "batch"}, r"normalization must be one of LN, LNPre, RMS, RMSPre, none, got 'batch'"),
    ({"normalization": None}, r"normalization must be a string, got null"),
    ({"attention": "local"}, r"attention must be one of causal, bidirectional, sliding, got 'local'"),
])
def test_model_config_refuses_bad_window_and_normalization_in_one_line(C, overrides, match):
    from conftest import build_unhooked  # users run without the test type checker

    with pytest.raises(C.NopeInterpError, match=match) as err:
        build_unhooked(C.ModelConfig, **{**C.preset("tiny").to_dict(), **overrides})
    assert "\n" not in str(err.value)
    if "must be an integer or null" not in match and "must be a string" not in match:  # right types: hooked too
        with pytest.raises(C.NopeInterpError, match=match):
            C.ModelConfig.from_dict({**C.preset("tiny").to_dict(), **overrides})


def test_model_config_window_and_normalization_none_round_trip_and_old_configs_load(C):
    cfg = C.preset("tiny", attention="sliding", window=4, normalization="none")
    assert C.ModelConfig.from_json(cfg.to_json()) == cfg
    assert cfg.to_dict()["window"] == 4 and cfg.to_dict()["normalization"] == "none"
    old = C.preset("cpu").to_dict()
    del old["window"]  # a run config written before the field existed
    loaded = C.ModelConfig.from_dict(old)
    assert loaded.window is None and loaded == C.preset("cpu")


def test_describe_presets_names_every_preset_with_its_own_shape(monkeypatch):
    """The help texts' preset list is built from PRESETS, so a changed or added preset shows its real shape
    (a dropout without tied embeddings was dropped from the text before)."""
    from nope_interp import config

    text = config.describe_presets()
    for name, cfg in config.PRESETS.items():
        assert f"{name} ({cfg.n_layers} layers x d_model {cfg.d_model}, n_ctx {cfg.n_ctx}" in text
    assert "paper-recipe (6 layers x d_model 384, n_ctx 256, tied embeddings, dropout 0.2)" in text
    monkeypatch.setitem(config.PRESETS, "drop", config.ModelConfig(n_layers=1, d_model=32, n_heads=2, d_head=16,
                                                                   d_mlp=64, n_ctx=8, dropout=0.1))
    assert "drop (1 layers x d_model 32, n_ctx 8, dropout 0.1)" in config.describe_presets()


@pytest.mark.parametrize("values,words", [
    ("addition", "must be a list of names .* got the single string 'addition'"),
    (("addition", "addition"), "task names 'addition' more than once"),
    (["reversal", "addition", "reversal"], "task names 'reversal' more than once"),
])
def test_check_tasks_refuses_a_bare_string_and_a_task_named_twice(values, words):
    """Before: check_tasks("addition") said "unknown task 'a'" and a task named twice was accepted (run twice)."""
    from nope_interp.config import check_choices, check_tasks
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=words):
        check_tasks(values)
    with pytest.raises(NopeInterpError, match=words.replace("task ", "protocol ")):
        check_choices("protocol", values, ("addition", "reversal"))
