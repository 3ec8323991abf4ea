"""Error messages built from what a user gave: never a format template, never an option the command lacks, the
argument's name in Python and the flag on the command line; list arguments refuse a lone string; ``shipped_entries``
refuses unknown or repeated names; ``to_csv`` refuses rows that are not dicts.

Before (a hostile review): a ``model_overrides`` key holding ``{``, ``}``, ``.`` or ``[`` raised a raw
KeyError/ValueError from ``str.format``; ``probe --hf-path x --task addition`` named ``text_file``, which probe does
not have, and ``length-gen``'s two-sources message listed ``init, hf_path``; ``load_models`` said ``--run X: no such
folder`` in Python; ``fast_activations_unsupported(model, "blocks.0.hook_z")`` and ``check_inputs_fit(..., "full",
...)`` read the string letter by letter; ``shipped_entries(["nope"])`` returned [] and ``["reversal", "reversal"]``
the models twice; ``to_csv([[1, 2]])`` raised an AttributeError.
"""

import re
import types

import pytest
from conftest import unhooked

FORMAT_KEYS = ["a{b", "a}b", "a.b", "a[0]", "x!r", "a:b", "{n_layers}", "{}", "{0}", "n_layers.x"]


def _one_line(err):
    message = str(err.value)
    assert "\n" not in message and message, message
    return message


# 1. a user's text is never a format template


@pytest.mark.parametrize("key", FORMAT_KEYS)
def test_model_overrides_keys_with_format_characters_give_the_one_line_error(key):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    for overrides in ({key: 1}, {key: 1, "d_model": 8}, {"d_model": 8, key: 1}):
        with pytest.raises(NopeInterpError) as err:
            ModelSource(model_overrides=overrides)
        message = _one_line(err)
        assert f"model_overrides[{key!r}]" in message and "shape" in message and "init model" in message, message
        assert "model_overrides['d_model']" in message or len(overrides) == 1, message
    with pytest.raises(NopeInterpError, match="unknown ModelConfig field"):  # with init: the unknown field
        ModelSource(init=True, task="reversal", model_overrides={key: 1})


def test_a_value_with_braces_is_never_read_as_a_template():
    from nope_interp.errors import NopeInterpError

    err = NopeInterpError.naming("{run}={path!r}: no such folder", path="/x/{run}/{0}.[a]")
    assert str(err) == "run='/x/{run}/{0}.[a]': no such folder"
    assert err.spelt(lambda field: "--run") == "--run='/x/{run}/{0}.[a]': no such folder"


# 2. on the command line, a model-source message names only the options the command has


def _options(command):
    from nope_interp.cli import _build_parser

    parser = _build_parser([command])
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    return {opt for action in sub._actions for opt in action.option_strings}


@pytest.mark.parametrize(("argv", "words", "absent"), [
    (["length-gen", "--run", "a", "--pretrained", "reversal"],
     "give at most one of --run, --pretrained; got --run and --pretrained", ("init", "hf_path", "hf-path")),
    (["ablate", "--run", "a", "--pretrained", "reversal"],
     "give at most one of --run, --pretrained, --init; got --run and --pretrained", ("hf_path", "hf-path")),
    (["compare", "--pretrained", "reversal", "--init", "--task", "reversal"],
     "give at most one of --run, --pretrained, --init; got --pretrained and --init", ("hf_path", "hf-path")),
    (["probe", "--hf-path", "x", "--task", "addition"],
     "--task names task inputs; a Hugging Face model (--hf-path) reads random ids of its own vocabulary: drop it",
     ("text_file", "text-file", "n-digits")),
    (["long-context", "--hf-path", "x", "--n-digits", "3"],
     "--n-digits names task inputs; a Hugging Face model (--hf-path) reads random ids of its own vocabulary: drop it",
     ("text_file", "text-file", "--task")),
    (["analyze", "--hf-path", "x", "--task", "addition", "--n-digits", "3"],
     "--task and --n-digits name task inputs; a Hugging Face model (--hf-path) reads random ids of its own "
     "vocabulary (or --text-file): drop them", ()),
])
def test_model_source_messages_name_only_the_commands_own_options(tmp_path, capsys, argv, words, absent):
    from nope_interp.cli import main

    assert main([*argv, "--out-root", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not any(word in err[0] for word in absent), err[0]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", err[0]))
    assert named <= _options(argv[0]), (named - _options(argv[0]), err[0])


@pytest.mark.parametrize("command", ["ablate", "compare", "analyze"])
def test_the_init_shape_flags_help_names_only_the_commands_sources(command):
    from nope_interp.cli import _build_parser

    parser = _build_parser([command])
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[command]
    (title,) = [g.title for g in sub._action_groups if g.title.startswith("shape of an --init model")]
    named = set(re.findall(r"--[a-z][a-z0-9-]*", title))
    assert named <= _options(command), (named, title)
    assert ("--hf-path" in title) == ("--hf-path" in _options(command)), title


# 3. job-run errors: the argument in Python, the flag on the command line


def test_run_folder_errors_name_the_argument_in_python(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, load_models

    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    for run, words in ((tmp_path / "missing", "no such folder"), (tmp_path / "afile", "is a file, not a run folder"),
                       (tmp_path / "empty", "is not a run folder: it has no config.json"),
                       (tmp_path / "{0}[x]", "no such folder")):
        with pytest.raises(NopeInterpError) as err:
            load_models(ModelSource(run=(str(run),)))
        message = _one_line(err)
        assert message.startswith(f"run={str(run)!r}") and words in message and "--" not in message, message
    with pytest.raises(NopeInterpError) as err:
        load_models(ModelSource(hf_path=str(tmp_path / "empty")))
    message = _one_line(err)
    assert message.startswith("hf_path=") and "no config.json" in message and "--" not in message, message


@pytest.mark.parametrize(("argv", "words"), [
    (["analyze", "--run", "{tmp}/missing"], "--run={tmp}/missing: no such folder"),
    (["trajectory", "--run", "{tmp}/missing"], "--run={tmp}/missing: no such folder"),
    (["length-gen", "--run", "{tmp}/afile"], "--run={tmp}/afile is a file, not a run folder"),
    (["probe", "--hf-path", "{tmp}"], "--hf-path={tmp} is not a folder saved by save_pretrained"),
    (["analyze"], "analyze needs models: give one of --run, --pretrained, --init, --hf-path"),
    (["trajectory"], "trajectory needs --run with one or more run directories"),
])
def test_run_folder_errors_name_the_flag_on_the_command_line(tmp_path, capsys, argv, words):
    from nope_interp.cli import main

    (tmp_path / "afile").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--out-root", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words.replace("{tmp}", str(tmp_path)) in err[0], err


def test_job_defaults_and_checks_name_arguments_in_python():
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import trajectory

    with pytest.raises(NopeInterpError) as err:
        trajectory.default_models(trajectory.TrajectoryConfig())
    assert _one_line(err) == "trajectory needs run with one or more run directories"


# 4. a lone string where a list is expected


@pytest.mark.parametrize("names", ["blocks.0.hook_resid_post", "hook_embed", "z", b"hook_embed"])
def test_fast_activations_unsupported_refuses_a_single_string(names):
    from nope_interp.errors import NopeInterpError
    from nope_interp.fast_forward import fast_activations_unsupported
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    with pytest.raises(NopeInterpError) as err:
        unhooked(fast_activations_unsupported)(model, names)
    message = _one_line(err)
    assert "names" in message and "single string" in message, message
    assert unhooked(fast_activations_unsupported)(model, ["hook_embed"]) is None


@pytest.mark.parametrize("protocols", ["full", "window", "authors", "x"])
def test_check_inputs_fit_refuses_a_single_string(protocols):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import check_inputs_fit

    with pytest.raises(NopeInterpError) as err:
        unhooked(check_inputs_fit)("analyze", [], protocols, None)
    message = _one_line(err)
    assert "protocols" in message and "single string" in message and f"[{protocols!r}]" in message, message


def _check_site_widths(value):
    from nope_interp.activations import check_site_widths

    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_heads=2, d_head=4, d_model=8))
    return unhooked(check_site_widths)(model, value)


def _refuse_default_only(value):
    from nope_interp.jobs.common import refuse_default_only
    from nope_interp.jobs.probe import ProbeConfig

    return unhooked(refuse_default_only)("probe", ProbeConfig(), value, "the defaults", [])


def _to_csv(value):
    from nope_interp.io import to_csv

    return unhooked(to_csv)(value)


@pytest.mark.parametrize(("name", "call"), [("names", _check_site_widths), ("default_only", _refuse_default_only),
                                            ("rows", _to_csv)])
@pytest.mark.parametrize("value", ["tasks", "blocks.0.attn.hook_z", "ab"])
def test_other_list_arguments_refuse_a_single_string(name, call, value):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError) as err:
        call(value)
    message = _one_line(err)
    assert name in message and "single string" in message, message


@pytest.mark.parametrize("numbers", ["eval_acc", "loss"])
def test_read_metrics_refuses_a_single_string_of_numbers(tmp_path, numbers):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "eval_acc": 0.5, "loss": 1.0}\n')
    with pytest.raises(NopeInterpError, match="numbers .*single string"):
        unhooked(read_metrics)(path, numbers)
    assert unhooked(read_metrics)(path, (numbers,)) == [{"step": 1, "eval_acc": 0.5, "loss": 1.0}]


# 5. shipped_entries: unknown and repeated names


@pytest.mark.parametrize("names", [["nope"], ["Reversal"], [3], ["reversal", "x"], ["addition", None]])
def test_shipped_entries_refuses_an_unknown_task_listing_the_known_ones(names):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import shipped_entries
    from tasks import TASK_NAMES

    with pytest.raises(NopeInterpError) as err:
        unhooked(shipped_entries)(names)
    message = _one_line(err)
    assert "unknown task" in message and "task_names" in message and ", ".join(TASK_NAMES) in message, message


@pytest.mark.parametrize("names", [["reversal", "reversal"], ["addition", "reversal", "addition"],
                                   ("ordering", "ordering", "ordering")])
def test_shipped_entries_refuses_a_repeated_task(names):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import shipped_entries

    with pytest.raises(NopeInterpError) as err:
        unhooked(shipped_entries)(names)
    message = _one_line(err)
    assert "more than once" in message and "task_names" in message, message


# 6. to_csv: rows that are not dicts


@pytest.mark.parametrize(("rows", "index"), [([[1, 2]], 0), ([("a", 1)], 0), ([{"a": 1}, 3], 1), ([None], 0),
                                             ([{"a": 1}, {"b": 2}, "ab"], 2)])
def test_to_csv_refuses_rows_that_are_not_dicts(rows, index):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import to_csv

    with pytest.raises(NopeInterpError) as err:
        unhooked(to_csv)(rows)
    message = _one_line(err)
    assert message.startswith("to_csv: rows must be dicts") and f"row {index} " in message, message


def test_to_csv_takes_any_mapping():
    from nope_interp.io import to_csv

    assert unhooked(to_csv)([types.MappingProxyType({"a": 1}), {"b": 2}]).splitlines() == ["a,b", "1,", ",2"]


# 7. training errors: the argument in Python (resume=True, finalize(), run_dir, lr), the flag on the command line

TRAIN = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16", "--steps", "6",
         "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3", "--eval-n", "10",
         "--warmup-steps", "2", "--checkpoint-every", "3", "--no-progress"]


def _configs(**changes):
    from nope_interp.model import preset
    from nope_interp.train import TrainConfig

    cfg = TrainConfig(task="addition", task_params={"n_digits": 2}, n_train=100, n_test=20, steps=6, batch_size=8,
                      eval_every=3, eval_n=10, warmup_steps=2, checkpoint_every=3)
    return preset("tiny", n_ctx=16), cfg.replace(**changes)


def _cli_error(capsys, argv):
    from nope_interp.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nope-interp: error: "), err
    return err[0]


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """A finished 6-step run ("done"), the same stopped while scoring ("stopped": no summary), the same without its
    history ("no_metrics"), a run folder without a checkpoint ("no_ckpt"; "odd" with a file a run does not write)
    and a user's folder ("mine")."""
    import shutil

    from nope_interp.cli import main

    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stderr", __import__("io").StringIO())
        assert main([*TRAIN, "--runs-dir", str(root), "--name", "done"]) == 0
    shutil.copytree(root / "done", root / "stopped")
    (root / "stopped" / "summary.json").unlink()
    shutil.copytree(root / "stopped", root / "no_metrics")
    (root / "no_metrics" / "metrics.jsonl").unlink()
    (root / "no_ckpt").mkdir()
    shutil.copy(root / "done" / "config.json", root / "no_ckpt" / "config.json")
    shutil.copytree(root / "no_ckpt", root / "odd")
    (root / "odd" / "notes.txt").write_text("x")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("x")
    return root


# (run, resume, Python words, CLI words)
RUN_CASES = [
    ("done", False, "(resume=True and finalize() refuse it); analyse it, or train a new run under another run_dir",
     "(--resume and --finalize refuse it); analyse it, or train a new run under another --name"),
    ("done", True, "(resume=True and finalize() refuse it); analyse it, or train a new run under another run_dir",
     "(--resume and --finalize refuse it); analyse it, or train a new run under another --name"),
    ("stopped", False, "is not empty; use resume=True or choose another run_dir",
     "is not empty; use --resume or choose another --name"),
    ("no_ckpt", True, "resume=True given but {run} has no checkpoint (checkpoint.pt): the run stopped before its "
     "first one, so there is nothing to resume; remove the folder (rm -r {run}) and rerun without resume=True",
     "--resume given but {run} has no checkpoint (checkpoint.pt): the run stopped before its first one, so there is "
     "nothing to resume; remove the folder (rm -r {run}) and rerun without --resume"),
    ("odd", True, "resume=True given but no checkpoint in {run} (expected checkpoint.pt)",
     "--resume given but no checkpoint in {run} (expected checkpoint.pt)"),
    ("no_metrics", True, "resume=True: {run}/metrics.jsonl is missing, but the checkpoint is at step 6",
     "--resume: {run}/metrics.jsonl is missing, but the checkpoint is at step 6"),
    ("mine", False, "is not a run (it holds files a run does not write): choose another run_dir (or parent folder)",
     "is not a run (it holds files a run does not write): choose another --name (or --runs-dir)"),
]


@pytest.mark.parametrize(("run", "resume", "python", "cli"), RUN_CASES)
def test_run_directory_errors_name_the_argument_in_python(run_dirs, run, resume, python, cli):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    with pytest.raises(NopeInterpError) as err:
        train(*_configs(), run_dirs / run, resume=resume, progress=False)
    message = _one_line(err)
    assert python.replace("{run}", str(run_dirs / run)) in message and "--" not in message, message


@pytest.mark.parametrize(("run", "resume", "python", "cli"), RUN_CASES)
def test_run_directory_errors_name_the_flag_on_the_command_line(run_dirs, capsys, run, resume, python, cli):
    line = _cli_error(capsys, [*TRAIN, "--runs-dir", str(run_dirs), "--name", run, *["--resume"] * resume])
    assert cli.replace("{run}", str(run_dirs / run)) in line and "resume=True" not in line, line
    assert "run_dir" not in line, line


@pytest.mark.parametrize("changes", [{"lr": 0.5}, {"steps": 8}, {"seed": 3}])
def test_settings_differ_names_resume(run_dirs, capsys, changes):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    with pytest.raises(NopeInterpError) as err:
        train(*_configs(**changes), run_dirs / "stopped", resume=True, progress=False)
    assert _one_line(err).startswith(f"resume=True: settings differ from those stored in {run_dirs / 'stopped'}: ")
    (field, value), = changes.items()
    line = _cli_error(capsys, [*TRAIN, f"--{field}", str(value), "--runs-dir", str(run_dirs), "--name", "stopped",
                               "--resume"])
    assert f"error: --resume: settings differ from those stored in {run_dirs / 'stopped'}: train.{field}" in line, line


def test_finalize_of_a_finished_run_names_finalize(run_dirs, capsys):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import finalize

    with pytest.raises(NopeInterpError) as err:
        finalize(run_dirs / "done")
    assert _one_line(err).startswith(f"finalize(): {run_dirs / 'done'} has finished (step 6"), _one_line(err)
    line = _cli_error(capsys, ["train", "--task", "addition", "--preset", "tiny", "--runs-dir", str(run_dirs),
                               "--name", "done", "--finalize"])
    assert f"error: --finalize: {run_dirs / 'done'} has finished (step 6" in line, line


@pytest.mark.parametrize("text", [False, True])
def test_bidirectional_training_names_attention(tmp_path, capsys, text):
    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.text_train import train_text
    from nope_interp.train import train

    model_cfg, cfg = _configs()
    with pytest.raises(NopeInterpError) as err:
        if text:
            train_text(model_cfg.replace(attention="bidirectional", n_ctx=48), TextTrainConfig(window=24, steps=2),
                       tmp_path / "b", progress=False)
        else:
            train(model_cfg.replace(attention="bidirectional"), cfg, tmp_path / "b", progress=False)
    assert _one_line(err).startswith("attention='bidirectional' cannot be trained: "), _one_line(err)
    argv = (["train-text", "--preset", "tiny", "--window", "24"] if text else TRAIN[:-1]) + [
        "--model-attention", "bidirectional", "--runs-dir", str(tmp_path), "--no-progress"]
    line = _cli_error(capsys, argv)
    assert line.startswith("nope-interp: error: --model-attention=bidirectional cannot be trained: "), line


DIVERGING = {"lr": 10.0, "beta2": 0.0, "grad_clip": 1e9, "warmup_steps": 0, "steps": 40, "eval_every": 40}


def test_divergence_names_the_learning_rate(tmp_path, capsys):
    from nope_interp.errors import NopeInterpError
    from nope_interp.train import train

    model_cfg, cfg = _configs(**DIVERGING)
    with pytest.raises(NopeInterpError) as err:
        train(model_cfg.replace(init_std=1000.0), cfg, tmp_path / "p", progress=False)
    message = _one_line(err)
    assert "Lower lr, raise warmup_steps or lower grad_clip and train a new run" in message, message
    assert "--" not in message, message
    argv = [*TRAIN, "--model-init-std", "1000", *[a for k, v in DIVERGING.items()
                                                  for a in (f"--{k.replace('_', '-')}", str(v))],
            "--runs-dir", str(tmp_path), "--name", "c"]
    line = _cli_error(capsys, argv)
    assert "Lower --lr, raise --warmup-steps or lower --grad-clip and train a new run" in line, line


@pytest.mark.parametrize("text", [False, True])
def test_memory_advice_names_the_settings(tmp_path, capsys, monkeypatch, text):
    import nope_interp.model as model_module
    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.text_train import train_text
    from nope_interp.train import train

    monkeypatch.setattr(model_module, "available_memory_bytes", lambda device: 1)
    model_cfg, cfg = _configs()
    with pytest.raises(NopeInterpError) as err:
        if text:
            train_text(model_cfg.replace(n_ctx=48), TextTrainConfig(window=24, steps=2), tmp_path / "p",
                       device="cpu", progress=False)
        else:
            train(model_cfg, cfg, tmp_path / "p", device="cpu", progress=False)
    advice = ("lower {batch_size}, {window}, {eval_windows} or the model size" if text
              else "lower {batch_size}, {n_train}/{n_test}, {window} or the model size")
    python = advice.replace("{", "").replace("}", "")
    assert _one_line(err).endswith(python), _one_line(err)
    argv = (["train-text", "--preset", "tiny", "--window", "24", "--no-progress"] if text else TRAIN) + [
        "--runs-dir", str(tmp_path), "--device", "cpu"]
    line = _cli_error(capsys, argv)
    flags = re.sub(r"\{(\w+)\}", lambda m: "--" + m.group(1).replace("_", "-"), advice)
    assert line.endswith(flags), line


@pytest.mark.parametrize(("window", "n_ctx"), [(24, 16), (100, 64), (33, 32)])
def test_a_text_window_past_n_ctx_names_the_settings(tmp_path, capsys, window, n_ctx):
    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.text_train import train_text

    model_cfg, _ = _configs()
    with pytest.raises(NopeInterpError) as err:
        train_text(model_cfg.replace(n_ctx=n_ctx), TextTrainConfig(window=window, steps=2), tmp_path / "p",
                   progress=False)
    assert _one_line(err) == (f"window {window} exceeds the model's n_ctx {n_ctx} (raise the model's n_ctx or lower "
                              "window)")
    line = _cli_error(capsys, ["train-text", "--preset", "tiny", "--window", str(window), "--model-n-ctx", str(n_ctx),
                               "--runs-dir", str(tmp_path), "--no-progress"])
    assert line.endswith(f"--window {window} exceeds the model's n_ctx {n_ctx} (raise --model-n-ctx or lower "
                         "--window)"), line


@pytest.mark.parametrize("rows", ["ab", "a,b\n1,2", "", b"ab", {"a": 1}, {}])
def test_to_csv_refuses_a_lone_string_or_dict_saying_rows_are_dicts(rows):
    """Before: in_order's generic "write ['ab'] for a list of one" (a list of strings is no CSV either), and a lone
    dict wrote its keys as rows."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import to_csv

    with pytest.raises(NopeInterpError) as err:
        unhooked(to_csv)(rows)
    message = _one_line(err)
    assert message.startswith("to_csv: rows must be a list of dicts (column name -> value), one per row, not "), message
    assert "write [" not in message and ("single string" in message) == (not isinstance(rows, dict)), message


# 8. sweep errors: the argument in Python (ray_address, executor, out_dir), the flag on the command line

SWEEP_SPEC = """
[sweep]
name = "{name}"
kind = "init"
[base]
preset = "tiny"
task = "reversal"
n_prompts = 4
[axes]
seed = [0]
"""


def _sweep_spec(tmp_path, name="t"):
    from nope_interp.sweep import load_spec

    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP_SPEC.format(name=name))
    return load_spec(path), path


@pytest.mark.parametrize("address", ["127.0.0.1:6379", "nonsense", "{0}[x]:1"])
def test_ray_address_without_ray_names_the_arguments(tmp_path, capsys, address):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import run_sweep

    spec, path = _sweep_spec(tmp_path)
    with pytest.raises(NopeInterpError) as err:
        run_sweep(spec, tmp_path / "o", executor="local", ray_address=address, progress=False)
    assert _one_line(err) == "ray_address needs executor='ray' (got executor='local', which would ignore it)"
    line = _cli_error(capsys, ["sweep", str(path), "--ray-address", address, "--out-dir", str(tmp_path / "o")])
    assert line == "nope-interp: error: --ray-address needs --executor=ray (got --executor=local, which would " \
                   "ignore it)", line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:0", "127.0.0.1:99999", "a b:1", "{0}[x]:x"])
def test_a_bad_ray_address_names_the_argument(tmp_path, capsys, address):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import run_sweep

    spec, path = _sweep_spec(tmp_path)
    why = f"must be host:port (the head's GCS port, e.g. 127.0.0.1:6379), got {address!r}"
    with pytest.raises(NopeInterpError) as err:
        run_sweep(spec, tmp_path / "o", executor="ray", ray_address=address, progress=False)
    assert _one_line(err) == f"ray_address {why}"
    line = _cli_error(capsys, ["sweep", str(path), "--executor", "ray", "--ray-address", address, "--out-dir",
                               str(tmp_path / "o")])
    assert line == f"nope-interp: error: --ray-address {why}", line


def _shown(flag, path):
    """``--flag=path`` as the CLI writes it: unquoted when the path has no blank or quote."""
    return f"{flag}={path}" if not any(c in str(path) for c in " '\"") else f"{flag}={str(path)!r}"


@pytest.mark.parametrize("folder", ["o", "a b", "{0}[x]"])
@pytest.mark.parametrize("readable", [True, False])
def test_an_out_dir_of_another_sweep_names_out_dir(tmp_path, capsys, folder, readable):
    from nope_interp.errors import NopeInterpError
    from nope_interp.sweep import report, run_sweep

    spec, path = _sweep_spec(tmp_path, "u")
    out = tmp_path / folder
    out.mkdir()
    (out / "spec.toml").write_text(SWEEP_SPEC.format(name="t") if readable else "[[[ not toml")
    what = ("holds another sweep's spec ('t', kind 'init'; this is 'u', kind 'init'): " if readable
            else "holds a spec.toml that is not a readable sweep spec; ")
    for call, advice in ((lambda: run_sweep(spec, out, progress=False), "give another {out_dir}"),
                         (lambda: report(spec, out), "give the {out_dir} that 'u' was run into")):
        with pytest.raises(NopeInterpError) as err:
            call()
        assert _one_line(err) == f"out_dir={str(out)!r} {what}{advice.format(out_dir='out_dir')}", _one_line(err)
    for argv, advice in ((["sweep", str(path)], "give another {out_dir}"),
                         (["sweep-report", str(path), "--out-root", str(tmp_path / "r")],
                          "give the {out_dir} that 'u' was run into")):
        line = _cli_error(capsys, [*argv, "--out-dir", str(out)])
        assert line == f"nope-interp: error: {_shown('--out-dir', out)} {what}{advice.format(out_dir='--out-dir')}", \
            line


# 9. job checks: n_digits and window in Python, --n-digits and --window on the command line (also when --window was
# not given beside an --init model's --model-window)


@pytest.mark.parametrize(("task", "n_digits"), [("addition", 99), ("addition", 0), ("reversal", 999)])
def test_an_n_digits_outside_the_tasks_range_names_n_digits(tmp_path, capsys, task, n_digits):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    for source in ({"init": True, "task": task}, {"pretrained": (task,)}):
        with pytest.raises(NopeInterpError) as err:
            ModelSource(n_digits=n_digits, **source)
        message = _one_line(err)
        assert message.startswith(f"n_digits={n_digits} does not fit task {task}: "), message
        assert "--" not in message, message
    for source in (["--init", "--task", task, "--preset", "tiny"], ["--pretrained", task]):
        line = _cli_error(capsys, ["analyze", *source, "--n-digits", str(n_digits), "--out-root", str(tmp_path)])
        assert line.startswith(f"nope-interp: error: --n-digits={n_digits} does not fit task {task}: "), line


@pytest.mark.parametrize(("n_ctx", "window"), [(16, None), (16, 20), (40, 64), (40, None)])
@pytest.mark.parametrize("job", ["analyze", "probe"])
def test_inputs_too_long_name_window(tmp_path, capsys, job, n_ctx, window):
    import importlib

    from nope_interp.analysis import protocol_prompts
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource, load_models
    from nope_interp.model import build_model, preset

    mod = importlib.import_module(f"nope_interp.jobs.{job}")
    length = 64 if window is None else window
    why = f"n_ctx={n_ctx} is too small for 'addition' window inputs of {length} tokens: "
    models = load_models(ModelSource(init=True, task="addition", preset="tiny", model_overrides={"n_ctx": n_ctx}))
    with pytest.raises(NopeInterpError) as err:
        mod.run(mod.CONFIG(protocol="window", **({} if window is None else {"window": window})), models)
    assert _one_line(err) == f"{why}window {n_ctx} or less fits", _one_line(err)
    with pytest.raises(NopeInterpError) as err:
        protocol_prompts(build_model(preset("tiny", n_ctx=n_ctx)), models[0].task, 2, 1, frozenset(), "window", length)
    assert _one_line(err) == f"{why}window {n_ctx} or less fits", _one_line(err)
    argv = [job, "--init", "--task", "addition", "--preset", "tiny", "--model-n-ctx", str(n_ctx), "--protocol",
            "window", *([] if window is None else ["--window", str(window)]), "--out-root", str(tmp_path)]
    # on the command line both are flags: the model's n_ctx that --model-n-ctx gave, and the job's --window
    flagged = why.replace("n_ctx", "--model-n-ctx", 1)
    assert _cli_error(capsys, argv) == f"nope-interp: error: {flagged}--window {n_ctx} or less fits"


def test_inputs_of_several_models_too_long_name_window(tmp_path, capsys):
    import tasks
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import check_inputs_fit, entry_from_init

    task = tasks.get_task("reversal")
    models = [entry_from_init(preset("tiny", n_ctx=64), task, "wide"),
              entry_from_init(preset("tiny", n_ctx=40, seed=1), task, "narrow")]
    for job in ("analyze", "probe", "mine"):
        with pytest.raises(NopeInterpError) as err:
            check_inputs_fit(job, models, ["window"], 80)
        message = _one_line(err)
        assert message.startswith(f"{job}: the window inputs do not fit 2 of 2 models: wide (n_ctx=64 "), message
        assert message.endswith("; window 40 or less fits every model given") and "--" not in message, message
    for window in ("100", "70"):
        line = _cli_error(capsys, ["analyze", "--pretrained", "reversal", "addition", "--protocol", "window",
                                   "--window", window, "--out-root", str(tmp_path)])
        assert line.startswith("nope-interp: error: analyze: the window inputs do not fit "), line
        assert line.endswith("; --window 64 or less fits every model given"), line


@pytest.mark.parametrize(("n_ctx", "window", "words"), [
    (24, "20", "n_ctx=24 is too small for addition window contexts of 20 tokens and the answer: 20 context + 5 "
               "answer + 1 end-of-line tokens need n_ctx >= 26: {window} from 10 to 18 fits every model given"),
    (48, "4", "{window} 4 cannot hold a newline and the longest addition prompt (9 characters): {window} must be "
              ">= 10"),
    (14, None, "{window} 8 cannot hold a newline and the longest addition prompt (9 characters): {window} must be "
               ">= 10"),
])
def test_ablate_window_errors_name_window(tmp_path, capsys, n_ctx, window, words):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import ablate
    from nope_interp.jobs.common import ModelSource, load_models

    models = load_models(ModelSource(init=True, task="addition", preset="tiny", model_overrides={"n_ctx": n_ctx}))
    label = models[0].label
    with pytest.raises(NopeInterpError) as err:
        ablate.run(ablate.AblateConfig(protocol="window", **({} if window is None else {"window": int(window)})),
                   models)
    assert _one_line(err) == f"{label}: {words.format(window='window')}", _one_line(err)
    argv = ["ablate", "--init", "--task", "addition", "--preset", "tiny", "--model-n-ctx", str(n_ctx), "--protocol",
            "window", *([] if window is None else ["--window", window]), "--out-root", str(tmp_path)]
    assert _cli_error(capsys, argv) == f"nope-interp: error: {label}: {words.format(window='--window')}"


@pytest.mark.parametrize("n_prompts", [8, 16])
def test_inputs_too_short_for_the_probes_name_the_settings(tmp_path, capsys, n_prompts):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import probe
    from nope_interp.jobs.common import ModelSource, load_models

    task = "addition"
    models = load_models(ModelSource(init=True, task=task, n_digits=1, preset="tiny"))
    with pytest.raises(NopeInterpError) as err:
        probe.run(probe.ProbeConfig(quick=True, n_prompts=n_prompts), models)
    message = _one_line(err)
    assert message.startswith(f"{models[0].label}: position probes need inputs of at least 7 positions, its "), message
    assert message.endswith(": use a larger n_digits, or protocol='window' with window >= 8"), message
    line = _cli_error(capsys, ["probe", "--init", "--task", task, "--n-digits", "1", "--preset", "tiny", "--quick",
                               "--n-prompts", str(n_prompts), "--out-root", str(tmp_path)])
    assert line.endswith(": use a larger --n-digits, or --protocol=window with --window >= 8"), line


# 10. train-text --resume with another context: the CLI's 2 x --window note on the command line only


@pytest.mark.parametrize(("old", "new", "python", "cli"), [
    ((60, 24), (48, 24), "model.n_ctx (stored 60, given 48)",
     "model.n_ctx (stored 60, given 48: --window 24 sets it to 2 x the window unless --model-n-ctx is given; give "
     "--model-n-ctx 60)"),
    ((48, 24), (64, 32), "model.n_ctx (stored 48, given 64), train.window (stored 24, given 32)",
     "model.n_ctx (stored 48, given 64: it follows --window, 2 x the window), train.window (stored 24, given 32: "
     "give --window 24)"),
    ((60, 24), (50, 24), "model.n_ctx (stored 60, given 50)", "model.n_ctx (stored 60, given 50)"),
])
def test_a_text_resume_with_another_context_notes_the_cli_rule_on_the_cli_only(tmp_path, old, new, python, cli):
    from nope_interp.cli import _build_parser, flag_named, spelt_as_flags
    from nope_interp.config import TextTrainConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import preset
    from nope_interp.text_train import check_same_text_settings

    with pytest.raises(NopeInterpError) as err:
        check_same_text_settings(preset("tiny", n_ctx=old[0]), TextTrainConfig(window=old[1]),
                                 preset("tiny", n_ctx=new[0]), TextTrainConfig(window=new[1]), tmp_path / "{x}")
    message = _one_line(err)
    assert message == f"resume=True: settings differ from those stored in {tmp_path / '{x}'}: {python}", message
    for given in ([], ["--window", str(new[1])], ["--model-window", "4"]):  # --window, given or not
        args = _build_parser(["train-text"]).parse_args(["train-text", "--resume", *given])
        line = flag_named(spelt_as_flags(err.value, args, err.value.config), args, err.value.config)
        assert line == f"--resume: settings differ from those stored in {tmp_path / '{x}'}: {cli}", line


def test_command_line_only_text_is_nothing_in_python():
    from nope_interp.errors import CommandLineOnly, NopeInterpError

    err = NopeInterpError.naming("{lr} too high{note}", note=CommandLineOnly(" (lower {lr} below {v}, not {w!r})",
                                                                              v="{0}", w="a}b"))
    assert str(err) == "lr too high"
    assert err.spelt(lambda field: "--lr") == "--lr too high (lower --lr below {0}, not 'a}b')"
    assert err.spelt(lambda field: None) == "lr too high (lower lr below {0}, not 'a}b')"


@pytest.mark.parametrize("where", ["addition initialised", "run {0} [x]", "a.b{c}"])
def test_a_prefixed_error_keeps_its_fields_and_config(where):
    """Before: a job put the model's label before a message by making a plain error of the text, so the CLI could
    no longer spell its fields (``window 48 or less fits`` stayed ``window`` on the command line)."""
    from nope_interp.config import ModelConfig
    from nope_interp.errors import NopeInterpError

    err = NopeInterpError.naming("{window} {value} or less fits", value=48)
    err.config = ModelConfig
    out = err.prefixed(where)
    assert str(out) == f"{where}: window 48 or less fits" and out.config is ModelConfig
    assert out.spelt(lambda field: "--window" if field == "window" else None) == f"{where}: --window 48 or less fits"
    clash = NopeInterpError.naming("{where} and {where_}={value}", value=3).prefixed(where)  # fields named like the key
    assert str(clash) == f"{where}: where and where_=3"
    assert clash.spelt(lambda field: f"--{field}") == f"{where}: --where and --where_=3"
    plain = NopeInterpError("no fields here").prefixed(where)
    assert str(plain) == f"{where}: no fields here" and plain.spelt(lambda field: "--x") == str(plain)


def test_averaging_names_the_window_flag_of_a_model_whose_inputs_do_not_fit(tmp_path, capsys):
    """The shipped addition model (n_ctx 64) and 100-character windows: the label before the message, the flag in
    it (before: ``window 64 or less fits (--window 64)`` in Python too)."""
    argv = ["averaging", "--tasks", "addition", "--protocol", "window", "--window", "100", "--n-prompts", "3",
            "--eval-n", "2", "--out-root", str(tmp_path)]
    message = _cli_error(capsys, argv)
    assert message == ("nope-interp: error: averaging: the window inputs do not fit 1 of 3 models: addition trained "
                       "(n_ctx=64 is too small for addition inputs of 100 tokens); --window 64 or less fits every "
                       "model given"), message
    assert not (tmp_path / "results").exists()


# 6. warnings and log lines: Python's names in Python, the command's flags on the command line
# Before: the short-schedule warning said "pass --warmup-steps below --steps" to a Python caller of train(); the
# sweep report's overwrite warning "give another --out-root"; the analyze, averaging and ablate log lines
# "--label", "--eval-n" and "--window sets it"; load_hf's errors "path (--hf-path)"; the memory advice
# "--model-* sizes"; a stale summary "--finalize it again".


def _args(command, *argv):
    from nope_interp.cli import _build_parser

    return _build_parser([command]).parse_args([command, *argv])


@pytest.mark.parametrize("kind", ["Message", "NopeInterpWarning", "NopeInterpError"])
def test_named_text_reads_as_python_names_and_is_spelt_as_flags(kind):
    import nope_interp.errors as errors

    made = getattr(errors, kind).naming("{warmup_steps}={w} >= {steps}={s}; {sources}", w=5, s=3,
                                        sources=errors.Fields("run", "hf_path", sep=" or "))
    assert str(made) == "warmup_steps=5 >= steps=3; run or hf_path"
    assert made.spelt(lambda f: None if f == "hf_path" else "--" + f.replace("_", "-")) == \
        "--warmup-steps=5 >= --steps=3; --run"
    if kind == "Message":
        assert isinstance(made, str) and made == "warmup_steps=5 >= steps=3; run or hf_path"


@pytest.mark.parametrize(("steps", "warmup"), [(2, 4), (3, 3), (1, 500)])
def test_short_schedule_warning_names_fields_in_python_and_flags_on_the_cli(tmp_path, capsys, steps, warmup):
    from nope_interp.cli import main
    from nope_interp.errors import ScheduleWarning
    from nope_interp.train import warn_short_schedule

    _, cfg = _configs(steps=steps, warmup_steps=warmup)
    with pytest.warns(ScheduleWarning) as caught:
        warn_short_schedule(cfg)
    text = str(caught[0].message)
    assert text.startswith(f"warmup_steps={warmup} >= steps={steps}: ") and "--" not in text, text
    assert text.endswith("pass warmup_steps below steps"), text
    argv = [a for a in TRAIN]
    argv[argv.index("--steps") + 1], argv[argv.index("--warmup-steps") + 1] = str(steps), str(warmup)
    argv[argv.index("--eval-every") + 1] = argv[argv.index("--checkpoint-every") + 1] = "1"
    assert main([*argv, "--runs-dir", str(tmp_path), "--name", "w"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"nope-interp: warning: --warmup-steps={warmup} >= --steps={steps}: "), lines
    assert lines[0].endswith("pass --warmup-steps below --steps"), lines


def test_averaging_eval_n_line_is_spelt_as_the_flag(tiny_run):
    from nope_interp.cli import as_flags
    from nope_interp.jobs import averaging as job
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    lines = []
    job._eval_examples(entry_from_run(load_run(tiny_run), "tiny-run"), 10**6, lines.append)
    assert "(eval_n 1000000 asked for more)" in lines[0] and "--" not in lines[0]
    assert "(--eval-n 1000000 asked for more)" in as_flags(lines[0], _args("averaging"))


@pytest.mark.parametrize("label", ["x", "a.b-1"])
def test_analyze_label_line_names_label_in_python_and_the_flag_on_the_cli(tmp_path, capsys, label):
    from nope_interp.cli import main
    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import shipped_entries

    lines = []
    analyze.run(analyze.AnalyzeConfig(label=label, n_prompts=2), shipped_entries(["addition", "reversal"]),
                log=lines.append)
    assert f"label {label!r} names the output of one model; 2 models keep their own labels" in lines, lines
    argv = ["analyze", "--pretrained", "addition", "reversal", "--label", label, "--n-prompts", "2",
            "--out-root", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"--label {label!r} names the output of one model" in out, out


def test_ablate_window_line_names_window(tiny_run):
    from nope_interp.cli import as_flags
    from nope_interp.jobs import ablate
    from nope_interp.jobs.common import entry_from_run
    from nope_interp.pretrained import load_run

    lines = []
    ablate.run(ablate.AblateConfig(protocol="window", kinds=("mean_positional",), ranks=(0,), n_random=1, n_eval=4,
                                   n_mu=4, n_analysis=2), [entry_from_run(load_run(tiny_run), "t")], log=lines.append)
    line = next(x for x in lines if x.startswith("window protocol"))
    assert line.endswith("; window sets it)") and "--" not in line, line
    assert as_flags(line, _args("ablate")).endswith("; --window sets it)")


def test_sweep_report_overwrite_warning_names_out_root():
    from nope_interp.cli import as_flags
    from nope_interp.errors import NopeInterpWarning

    made = NopeInterpWarning.naming("... (give another {out_root} to keep both)")
    assert str(made).endswith("(give another out_root to keep both)")
    assert as_flags(made, _args("sweep-report", "trained-seeds")).endswith("(give another --out-root to keep both)")


def test_load_hf_names_its_argument(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.hf import load_hf

    with pytest.raises(NopeInterpError) as err:
        load_hf(tmp_path)
    assert _one_line(err).startswith(f"path {tmp_path} is not a folder saved by save_pretrained"), _one_line(err)


HELP_CALLS = {"opt", "add_argument"}
#: Texts outside the CLI that name a flag on purpose (a command to run, or both spellings side by side), each
#: the whole string constant, so that a flag added to one of them is caught too.
FLAGS_ON_PURPOSE = {
    ("config.py", " or a larger model n_ctx (--window, --model-n-ctx; in a sweep TOML window, model_n_ctx)"),
    ("jobs/demo.py", " (retrained by nope-interp demo --retrain)"),
    ("jobs/demo.py", " --out-dir "),
    ("sweep.py", " (is `ray start --head` running there?)"),
    ("train.py", "{attention}={value!r} cannot be trained: its inputs hold the next tokens it is trained to predict; "
                 "train a causal or sliding model (the bidirectional control is for initialised models: the analysis "
                 "commands' --init, ModelSource(init=True) in Python)"),
    ("train.py", "--resume"),
    ("train.py", " --resume"),
    ("pretrained.py", "): its weights are not the ones scored; resume the run to its end, or finalize it again "
                      "(nope_interp.train.finalize; nope-interp train --finalize)"),
}


def _texts_naming_flags():
    import ast
    from pathlib import Path

    import nope_interp

    root = Path(nope_interp.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.name == "cli.py":
            continue
        tree = ast.parse(path.read_text())
        skip = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and body and \
                    isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))  # docstrings
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                helps = [node] if name in HELP_CALLS else [k.value for k in node.keywords if k.arg == "help"]
                skip.update(id(sub) for h in helps for sub in ast.walk(h))  # --help texts
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DEFAULT_MODELS" for t in node.targets):
                skip.update(id(sub) for sub in ast.walk(node.value))  # the jobs' --help epilogue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip \
                    and re.search(r"(?<![\w-])--[a-z]", node.value):
                yield path.relative_to(root).as_posix(), node.value


def test_messages_outside_the_cli_name_flags_only_on_purpose():
    """Every text in the library that a Python user can see (errors, warnings, log lines, figure titles) names
    arguments, not flags; the CLI spells them as flags (``naming``). The few that name a flag on purpose are
    listed, and each listed one must still exist."""
    found = set(_texts_naming_flags())
    assert not found - FLAGS_ON_PURPOSE, found - FLAGS_ON_PURPOSE
    assert not FLAGS_ON_PURPOSE - found, FLAGS_ON_PURPOSE - found


def test_a_default_only_refusal_names_fields_not_the_help_texts_flags():
    """Before: ``probe.run(ProbeConfig(default_preset="cpu"), models)`` said "(for each of --tasks, an initialised
    model of --default-preset ...)": the job's --help text, flags and all, in a Python error."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import probe
    from nope_interp.jobs.common import shipped_entries

    with pytest.raises(NopeInterpError) as err:
        probe.run(probe.ProbeConfig(default_preset="cpu"), shipped_entries(["addition"]))
    message = _one_line(err)
    assert "--" not in message and "for each of tasks, an initialised model of default_preset" in message, message
