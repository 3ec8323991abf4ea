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
