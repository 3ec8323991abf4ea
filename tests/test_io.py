"""Files: atomic writes, JSON errors that name the path, job output folders, CSV."""

import pytest


def test_job_dirs(tmp_path):
    from nope_interp.io import job_dirs

    assert job_dirs(tmp_path, "ablate") == (tmp_path / "results" / "ablate", tmp_path / "figures" / "ablate")
    assert not (tmp_path / "results").exists()  # nothing is created


def test_atomic_write_leaves_no_temporary_file_and_replaces(tmp_path):
    from nope_interp.io import atomic_write_text, read_json, write_json

    path = write_json(tmp_path / "a" / "x.json", {"k": [1, 2]})
    assert read_json(path) == {"k": [1, 2]}
    atomic_write_text(path, "{}")
    assert read_json(path) == {} and sorted(p.name for p in path.parent.iterdir()) == ["x.json"]


def test_read_json_names_the_file(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import read_json

    with pytest.raises(NopeInterpError, match="run config not found"):
        read_json(tmp_path / "missing.json", "run config")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(NopeInterpError, match="corrupt.*bad.json"):
        read_json(tmp_path / "bad.json")


def test_to_csv_takes_the_union_of_columns():
    from nope_interp.io import to_csv

    assert to_csv([{"a": 1}, {"b": 2, "a": 3}]).splitlines() == ["a,b", "1,", "3,2"]


# --- exclusive locks on output directories -------------------------------------------------------------------------

_HOLD = """
import sys, time
from nope_interp import io
with io.exclusive(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def _holder(directory):
    """A real second process that takes the lock of ``directory`` and sleeps (killed by the test)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_exclusive_refuses_a_second_writer_and_a_killed_holder_never_blocks(tmp_path):
    import signal

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import exclusive, lock_path

    out = tmp_path / "runs" / "r"
    for _ in range(2):  # the second time over the stale lock file the killed holder left behind
        proc = _holder(out)
        try:
            busy = rf"being written by another nope-interp process \(pid {proc.pid}\)"
            with pytest.raises(NopeInterpError, match=busy):
                with exclusive(out):
                    pass
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        assert lock_path(out).exists()  # stale: the holder died without cleaning up
        with exclusive(out, "run directory") as lock:  # the kernel released the dead holder's lock
            assert lock == tmp_path / "runs" / ".r.lock"
            out.mkdir(exist_ok=True)


def test_exclusive_is_reentrant_and_leaves_no_trace_when_nothing_was_written(tmp_path):
    from nope_interp.io import exclusive

    out = tmp_path / "new" / "deeper" / "results" / "analyze"
    with exclusive(out):
        with exclusive(out):  # the same process may lock again (a job that trains a run)
            pass
    assert not (tmp_path / "new").exists()  # nothing written: the lock file and its folders are gone
    with exclusive(out):
        out.mkdir(parents=True)
    assert sorted(p.name for p in out.parent.iterdir()) == [".analyze.lock", "analyze"]


def test_lock_path_is_beside_the_directory_and_needs_a_name(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import lock_path

    assert lock_path(tmp_path / "runs" / "x") == tmp_path / "runs" / ".x.lock"
    assert lock_path(tmp_path / "runs" / "x" / "..") == tmp_path / ".runs.lock"
    with pytest.raises(NopeInterpError, match="needs a name"):
        lock_path("/")


# --- output locations checked before any work --------------------------------------------------------------------

def test_check_writable_dir_accepts_creatable_folders_and_writes_nothing(tmp_path):
    from nope_interp.io import check_writable_dir

    assert check_writable_dir(tmp_path) == tmp_path
    assert check_writable_dir(tmp_path / "a" / "b" / "c") == tmp_path / "a" / "b" / "c"
    assert list(tmp_path.iterdir()) == []


def test_check_writable_dir_refuses_files_and_unwritable_folders(tmp_path):
    import os
    import sys

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import check_writable_dir

    (tmp_path / "file").write_text("x")
    with pytest.raises(NopeInterpError, match=r"--out-root .*file is an existing file, not a directory"):
        check_writable_dir(tmp_path / "file", "--out-root")
    with pytest.raises(NopeInterpError, match=r"cannot be created: .*file is an existing file"):
        check_writable_dir(tmp_path / "file" / "results" / "analyze")
    if sys.platform == "linux":  # a folder no process may create files in (also as root)
        with pytest.raises(NopeInterpError, match="cannot be created in /proc/self"):
            check_writable_dir("/proc/self/nope/results")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not os.access(ro, os.W_OK):  # root may write anywhere: the /proc case above covers it
            with pytest.raises(NopeInterpError, match="is not writable"):
                check_writable_dir(ro)
            with pytest.raises(NopeInterpError, match="cannot be created in"):
                check_writable_dir(ro / "sub")
    finally:
        ro.chmod(0o755)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "ro"]


def test_writes_that_cannot_happen_are_one_line_errors(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import atomic_write_text, save_torch

    (tmp_path / "file").write_text("x")
    for write in (lambda p: atomic_write_text(p, "{}"), lambda p: save_torch(p, {"a": 1})):
        with pytest.raises(NopeInterpError, match="cannot write .*file/sub/x") as err:
            write(tmp_path / "file" / "sub" / "x")
        assert "\n" not in str(err.value)


# --- checkpoints: weights_only, every failure one line ------------------------------------------------------------

def _current_format_checkpoint(path):
    """A checkpoint exactly as the trainer writes it (model and AdamW state dicts after one step, step, wall time)."""
    import torch

    from nope_interp.config import TrainConfig, preset
    from nope_interp.io import save_torch
    from nope_interp.model import build_model
    from nope_interp.train import make_optimizer

    model = build_model(preset("tiny"))
    opt = make_optimizer(model, TrainConfig())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    save_torch(path, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3, "wall_time_s": 1.5})
    return model, opt


def test_load_checkpoint_reads_the_trainers_format_with_weights_only(tmp_path):
    import torch

    from nope_interp.io import load_checkpoint

    model, opt = _current_format_checkpoint(tmp_path / "checkpoint.pt")
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 3 and ckpt["wall_time_s"] == 1.5
    assert all(torch.equal(ckpt["model"][k], v) for k, v in model.state_dict().items())
    opt.load_state_dict(ckpt["optimizer"])  # the optimizer state round-trips


class _Planted:
    """Unpickling this creates a file: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_load_checkpoint_refuses_truncated_garbage_and_planted_files(tmp_path):
    import torch

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import load_checkpoint

    good = tmp_path / "good.pt"
    _current_format_checkpoint(good)
    marker = tmp_path / "pwned"
    cases = {
        "truncated": good.read_bytes()[: good.stat().st_size // 2],
        "random": torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                dtype=torch.uint8).numpy().tobytes(),
        "empty": b"",
    }
    for name, data in cases.items():
        (tmp_path / f"{name}.pt").write_bytes(data)
    torch.save({"model": _Planted(marker), "optimizer": {}, "step": 1, "wall_time_s": 0.0}, tmp_path / "planted.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    torch.save({"model": {}, "optimizer": {}, "step": "3", "wall_time_s": 0.0}, tmp_path / "badstep.pt")
    torch.save({"model": {}, "optimizer": {}, "step": -1, "wall_time_s": 0.0}, tmp_path / "negative.pt")
    bad = "corrupt, truncated or unsafe"
    expect = {"truncated": bad, "random": bad, "empty": bad, "planted": bad, "list": "holds a list",
              "badstep": "entry 'step'",
              "negative": "negative", "missing": "checkpoint not found"}
    for name, match in expect.items():
        with pytest.raises(NopeInterpError, match=match) as err:
            load_checkpoint(tmp_path / f"{name}.pt")
        assert "\n" not in str(err.value) and f"{name}.pt" in str(err.value)
        assert "weights_only=False" not in str(err.value)  # never advise loading an unknown file unsafely
    assert not marker.exists()  # the planted code never ran


def _strict(text):
    import json

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_write_json_writes_null_for_nan_and_infinities(tmp_path):
    import math

    from nope_interp.io import json_safe, write_json

    data = {"a": math.nan, "b": [1.0, math.inf, -math.inf, {"c": (math.nan, 2)}], "d": "NaN", "e": None,
            "f": 1e308, "g": -0.0, "h": True, "i": 3}
    text = write_json(tmp_path / "r.json", data).read_text()
    assert "NaN," not in text and "Infinity" not in text
    assert _strict(text) == {"a": None, "b": [1.0, None, None, {"c": [None, 2]}], "d": "NaN", "e": None,
                             "f": 1e308, "g": -0.0, "h": True, "i": 3}
    assert math.isnan(data["a"]) and data["b"][3]["c"][0] != data["b"][3]["c"][0]  # the input is not changed
    assert json_safe([float("nan")]) == [None] and json_safe(0.5) == 0.5
    for value in (float("nan"), float("inf"), [float("-inf")]):
        assert _strict(write_json(tmp_path / "v.json", value).read_text()) in (None, [None])


def test_write_json_still_refuses_what_json_cannot_hold(tmp_path):
    import torch

    from nope_interp.io import write_json

    for bad in ({"t": torch.tensor(1.0)}, {"s": {1, 2}}, object()):
        with pytest.raises(TypeError):
            write_json(tmp_path / "x.json", bad)
    assert not (tmp_path / "x.json").exists()


def test_every_file_of_a_run_directory_is_strict_json(tiny_run):
    from conftest import assert_strict_json_files

    names = {p.name for p in assert_strict_json_files(tiny_run, minimum=3)}
    assert {"config.json", "metrics.jsonl", "summary.json"} <= names


def test_exclusive_refuses_another_thread_of_the_same_process(tmp_path):
    import threading

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import exclusive

    errors = []

    def second():
        try:
            with exclusive(tmp_path / "out"):
                pass
        except NopeInterpError as err:
            errors.append(str(err))

    with exclusive(tmp_path / "out"):
        t = threading.Thread(target=second)
        t.start()
        t.join()
    # a review: it said "another nope-interp process (pid <this process's own>)"
    assert len(errors) == 1 and errors[0].endswith("out is being written by another thread of this process; wait "
                                                   "for it to finish, or choose another name or folder"), errors


def test_a_path_argument_that_is_not_a_path_is_one_line_naming_it(tiny_cfg):
    """Before: load_run(3), is_shipped_dir(3) and save_figure("fig", ...) failed with TypeError / AttributeError
    from pathlib, and load_run("") read the current folder."""
    from pathlib import Path

    import plotly.graph_objects as go
    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.io import as_path
    from nope_interp.model import build_model
    from nope_interp.plotting import save_figure
    from nope_interp.positional import layer_positional_types
    from nope_interp.pretrained import is_shipped_dir, load_run

    for bad in (3, None, "", "  ", b"runs/t"):
        for fn, args in ((load_run, (bad,)), (is_shipped_dir, (bad,)), (save_figure, (go.Figure(), bad))):
            with pytest.raises(NopeInterpError, match="must be a non-empty path"):
                unhooked(fn)(*args)
    with pytest.raises(NopeInterpError, match="save_figure needs a plotly Figure, got str"):
        unhooked(save_figure)("fig", "x.html")
    assert as_path("runs/t") == Path("runs/t")
    model = build_model(tiny_cfg)   # layer_positional_types checks its tokens as every analysis does
    for tokens, words in ((torch.zeros(1, 4), "integer token ids"), (torch.full((1, 4), 999), "in \\[0, 96\\)"),
                          (torch.zeros(1, 100, dtype=torch.long), "pos <= n_ctx=48")):
        with pytest.raises(NopeInterpError, match=words):
            unhooked(layer_positional_types)(model, tokens)
    with pytest.raises(NopeInterpError, match="atol must be"):
        unhooked(layer_positional_types)(model, None, float("nan"))


def test_a_symlinked_directory_and_its_target_share_one_lock(tmp_path):
    """Two trainings of one run, one through a symlinked folder, took two locks and wrote every metric twice."""
    from nope_interp import io

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r").mkdir()
    (tmp_path / "alias").mkdir()
    (tmp_path / "alias" / "r").symlink_to(tmp_path / "runs" / "r")
    assert io.lock_path(tmp_path / "alias" / "r") == io.lock_path(tmp_path / "runs" / "r") == \
        tmp_path / "runs" / ".r.lock"


def test_run_files_that_are_not_regular_files_are_refused_not_read(tmp_path):
    """A FIFO as metrics.jsonl blocked trajectory forever; a folder gave an IsADirectoryError traceback."""
    import os

    from nope_interp import io
    from nope_interp.errors import NopeInterpError

    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "dir.json").mkdir()
    for fn in (lambda: io.read_jsonl(tmp_path / "fifo.jsonl"), lambda: io.read_metrics(tmp_path / "dir.jsonl"),
               lambda: io.append_jsonl(tmp_path / "dir.jsonl", {"step": 1}),
               lambda: io.read_json(tmp_path / "dir.json", "run summary")):
        with pytest.raises(NopeInterpError, match="exists but is not a regular file"):
            fn()


@pytest.mark.parametrize("value", [1.5, -0.2])
def test_read_metrics_refuses_an_accuracy_outside_0_1(tmp_path, value):
    """trajectory wrote eval_acc 1.5 into its result, which its own reader then refused."""
    from nope_interp import io
    from nope_interp.errors import NopeInterpError

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "eval_acc": 0.5}\n' + f'{{"step": 5, "eval_acc": {value}}}\n')
    with pytest.raises(NopeInterpError, match=f"line 2: eval_acc must be a fraction in \\[0, 1\\], got {value}"):
        io.read_metrics(path)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fake home folder (``HOME``) and a separate current folder, so a literal ``./~`` would show."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    return home


def test_a_leading_tilde_is_the_home_folder_in_every_path_io_takes(home):
    """Before: every function here made Path("~/...") as it was, so writes went to a folder named ``~`` in the
    current folder (job_dirs("~/x", ...) was ~/x/results/..., relative) and reads of "~/..." found nothing."""
    from pathlib import Path

    import torch

    from nope_interp import io

    assert io.job_dirs("~/x", "j") == (home / "x" / "results" / "j", home / "x" / "figures" / "j")
    assert io.as_path("~/p", "p") == home / "p"
    assert io.check_writable_dir("~/new/deeper") == home / "new" / "deeper"
    assert io.write_json("~/a/b.json", {"k": 1}) == home / "a" / "b.json"
    assert io.read_json("~/a/b.json") == {"k": 1}
    io.atomic_write_text("~/a/t.txt", "x")
    io.append_jsonl("~/a/m.jsonl", {"step": 0})
    assert io.read_jsonl("~/a/m.jsonl") == [{"step": 0}] == io.read_metrics("~/a/m.jsonl")
    io.save_weights("~/w/model.safetensors", {"w": torch.ones(2)})
    assert torch.equal(io.load_weights("~/w/model.safetensors")["w"], torch.ones(2))
    assert io.weights_metadata("~/w/model.safetensors") == {}
    io.save_torch("~/c/checkpoint.pt", {"model": {}, "optimizer": {}, "step": 1, "wall_time_s": 0.5})
    assert io.load_checkpoint("~/c/checkpoint.pt")["step"] == 1
    with io.exclusive("~/locked") as lock:
        assert lock == home / ".locked.lock" == io.lock_path("~/locked")
    assert sorted(p.name for p in home.iterdir()) == ["a", "c", "w"]   # the lock of a folder never written: gone
    assert not (home.parent / "cwd" / "~").exists()
    assert io.user_path("~/a") == home / "a" and io.user_path("rel/~/a") == Path("rel/~/a")   # only a leading ~


def test_an_unknown_user_home_is_a_one_line_error(home):
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import job_dirs, write_json

    for call in (lambda: job_dirs("~no-such-user-nope-interp/x", "j"),
                 lambda: write_json("~no-such-user-nope-interp/a.json", {})):
        with pytest.raises(NopeInterpError, match="cannot expand '~' in the path '~no-such-user-nope-interp"):
            call()
    assert not list((home.parent / "cwd").iterdir())


def test_the_cli_out_root_expands_a_tilde(home, capsys):
    """Before: ``--out-root '~/x'`` (quoted: the shell leaves it alone) wrote ./~/x/results/... in the current
    folder. cli.py passes --out-root to io.job_dirs, which now expands it."""
    from nope_interp.cli import main

    assert main(["analyze", "--init", "--task", "addition", "--preset", "tiny", "--n-prompts", "4",
                 "--out-root", "~/x"]) == 0
    assert (home / "x" / "results" / "analyze" / "init-tiny-addition" / "scores.json").is_file()
    assert (home / "x" / "figures" / "analyze" / "init-tiny-addition" / "cosine.html").is_file()
    assert not list((home.parent / "cwd").iterdir())
    assert str(home / "x") in capsys.readouterr().out


def test_every_cli_folder_flag_expands_a_tilde(home):
    """--out-root=~/x is not expanded by the shell; the CLI's folder flags (also --runs-dir and --out-dir,
    whose own checks and printed paths read the literal string) expand it themselves."""
    from nope_interp.cli import path_arg

    assert path_arg("~/x") == str(home / "x") and path_arg("rel/x") == "rel/x"


def test_a_metrics_file_cut_short_says_where_and_how_to_recover(tmp_path):
    """Before: 'line 4: Unterminated string starting at', with no column and no hint."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.io import read_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with pytest.raises(NopeInterpError, match=r"line 2, column 13: Unterminated string.*last line, cut short.*"
                                              r"delete that line"):
        read_jsonl(path)
    path.write_text('{"step": 1, "lo\n{"step": 2, "loss": 1.0}\n')
    with pytest.raises(NopeInterpError, match=r"line 1, column 13: Unterminated string starting at$"):
        read_jsonl(path)


@pytest.mark.parametrize("module", ["analyze", "compare", "ablate", "averaging", "probe", "trajectory", "long_context",
                                    "length_gen", "init_grid", "demo"])
@pytest.mark.parametrize("out_root", [None, 0, "", "   ", b"out", 1.5])
def test_every_jobs_write_refuses_an_out_root_that_is_no_path(module, out_root, tmp_path, monkeypatch):
    """Before: ``<job>.write(result, None)`` or ``write(result, 0)`` raised a raw TypeError and ``write(result, "")``
    wrote into the current folder (the configs refuse an empty path). Checked by ``io.job_dirs``, before anything
    else of ``write``."""
    import importlib

    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    job = importlib.import_module(f"nope_interp.jobs.{module}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NopeInterpError, match=r"^out_root must be a non-empty path \(a str or pathlib.Path\)") as err:
        unhooked(job.write)(object(), out_root)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


@pytest.mark.parametrize("out_root", ["out", "~/nope-out", "a/b"])
def test_job_dirs_takes_a_str_or_path(out_root):
    from pathlib import Path

    from nope_interp import io

    for given in (out_root, Path(out_root)):
        res, fig = io.job_dirs(given, "job")
        assert res == io.user_path(out_root) / "results" / "job" and fig.parent.name == "figures"


from nope_interp.errors import NopeInterpError  # noqa: E402  (the tests below)


def _unreadable_paths(tmp_path):
    """Paths the operating system refuses to read, with the words the error must use: a loop of symbolic links,
    a name too long, and a parent that is a file (permission denied: by os.access, in the test below)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return [(tmp_path / "a", "symbolic links"), (tmp_path / ("x" * 300), "too long"),
            (tmp_path / "file" / "inside", "not found")]


@pytest.mark.parametrize("reader", ["read_json", "load_weights", "weights_metadata", "load_checkpoint", "read_jsonl",
                                    "check_readable"])
def test_unreadable_paths_are_one_line_errors_that_say_why(tmp_path, monkeypatch, reader):
    """Before: a name too long or a loop of links was a raw OSError traceback, and an unreadable file read as
    "not found" or "weights are corrupt: No such file or directory"."""
    import os

    from nope_interp import io

    (tmp_path / "file").write_text("{}")
    fn = getattr(io, reader)
    for path, words in _unreadable_paths(tmp_path):
        if reader == "read_jsonl" and words in ("not found", "too long"):
            assert fn(path) == []  # no such file (a name too long cannot exist): no metrics yet, as before
            continue
        with pytest.raises(NopeInterpError, match=words):
            fn(path)
    readable = tmp_path / "file"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(readable) else real_access(p, mode))
    with pytest.raises(NopeInterpError, match="cannot read .* permission denied"):
        fn(readable)


def test_check_writable_dir_says_why_a_path_cannot_be_used(tmp_path):
    from nope_interp import io

    with pytest.raises(NopeInterpError, match="cannot be used: File name too long"):
        io.check_writable_dir(tmp_path / ("x" * 300) / "y", "--out-root")


def test_drop_stale_removes_only_what_the_last_write_of_the_same_result_wrote(tmp_path):
    from nope_interp import io

    res, fig = tmp_path / "results" / "job", tmp_path / "figures" / "job"
    res.mkdir(parents=True)
    fig.mkdir(parents=True)
    first = [io.atomic_write_text(res / "job.json", "1"), io.atomic_write_text(fig / "a.html", "a"),
             io.atomic_write_text(fig / "b.html", "b")]
    assert io.drop_stale(first[0], first, (res, fig)) == first
    mine = io.atomic_write_text(fig / "users-own.html", "kept")  # never written by the job: never removed
    other = [io.atomic_write_text(res / "other.json", "o"), io.atomic_write_text(fig / "o.html", "o")]
    io.drop_stale(other[0], other, (res, fig))  # another result's record: independent
    second = [io.atomic_write_text(res / "job.json", "2"), io.atomic_write_text(fig / "a.html", "a2")]
    io.drop_stale(second[0], second, (res, fig))
    assert not (fig / "b.html").exists()  # written by the last call of job.json, not by this one
    assert all(p.exists() for p in [*second, mine, *other])
    record = tmp_path / "results" / ".job.outputs" / "job.json.files"  # beside the results folder, not in it
    assert [line.split("\t")[0] for line in record.read_text().splitlines()] == ["../job/job.json",
                                                                                 "../../figures/job/a.html"]
    assert sorted(p.name for p in res.iterdir()) == ["job.json", "other.json"]
    # a record edited to point outside the job's folders removes nothing there
    outside = io.atomic_write_text(tmp_path / "precious.txt", "p")
    record.write_text("../../precious.txt\n../../../etc/hostname\n")
    io.drop_stale(second[0], second, (res, fig))
    assert outside.exists()


def test_drop_stale_compares_real_paths_so_a_link_cannot_point_it_at_another_folder(tmp_path):
    """A review: `--out-root link/../o` writes under the link's target, but text paths named ./o, so a rerun
    deleted ./o's figure. Real paths on both sides: the figure under ./o stays, the stale one is removed."""
    import os

    from nope_interp import io

    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    mine = tmp_path / "o" / "figures" / "job" / "b.html"  # another out-root's figure of the same name
    mine.parent.mkdir(parents=True)
    mine.write_text("keep")
    root = tmp_path / "link" / ".." / "o"  # the system reads real/o
    res, fig = root / "results" / "job", root / "figures" / "job"
    for sub in ("results", "figures"):  # made as the job's prepare_outputs makes them, through the link
        (tmp_path / "real" / "o" / sub / "job").mkdir(parents=True)
    first = [io.atomic_write_text(res / "job.json", "1"), io.atomic_write_text(fig / "b.html", "b")]
    io.drop_stale(first[0], first, (res, fig))
    second = [io.atomic_write_text(res / "job.json", "2")]
    io.drop_stale(second[0], second, (res, fig))
    assert mine.read_text() == "keep" and not (tmp_path / "real" / "o" / "figures" / "job" / "b.html").exists()
    assert os.path.isfile(tmp_path / "real" / "o" / "results" / "job" / "job.json")


def test_drop_stale_keeps_a_recorded_file_that_another_writer_replaced_since(tmp_path):
    """Two out-roots sharing one figures folder through a link: the second rewrote b.html after the first
    recorded it, so the first's rerun (no b.html this time) must not remove the second's figure. A file the
    record names unchanged is still removed, and a record written before stamps (paths alone) still works."""

    from nope_interp import io

    shared = tmp_path / "shared-figures"
    shared.mkdir()
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        (root / "results" / "job").mkdir(parents=True)
        (root / "figures").symlink_to(shared)
    (shared / "job").mkdir()

    def write(root, names):
        res, fig = root / "results" / "job", root / "figures" / "job"
        paths = [io.atomic_write_text(res / "job.json", "r"), *(io.atomic_write_text(fig / n, str(root))
                                                                 for n in names)]
        return io.drop_stale(paths[0], paths, (res, fig))

    write(roots[0], ["b.html", "c.html"])
    write(roots[1], ["b.html"])  # replaces the first out-root's b.html with its own
    write(roots[0], [])
    assert (shared / "job" / "b.html").read_text() == str(roots[1])  # the other writer's file stays
    assert not (shared / "job" / "c.html").exists()  # unchanged since the first recorded it: stale, removed
    (shared / "job" / "b.html").write_text("a user's edit")  # rewritten in place: kept too
    record = roots[1] / "results" / ".job.outputs" / "job.json.files"
    write(roots[1], [])
    assert (shared / "job" / "b.html").read_text() == "a user's edit"
    old_style = [line.split("\t")[0] for line in record.read_text().splitlines()]
    (shared / "job" / "d.html").write_text("d")
    record.write_text("".join(f"{n}\n" for n in [*old_style, "../../figures/job/d.html"]))
    write(roots[1], [])
    assert not (shared / "job" / "d.html").exists()  # a path without a stamp: removed as before stamps


@pytest.mark.parametrize("copy", ["copytree", "copy-without-times", "move"])
def test_drop_stale_still_removes_stale_files_after_the_out_root_is_copied_or_moved(tmp_path, copy):
    """A review of the first stamps (inode and mtime): a copied out-root (new inodes, new times unless kept)
    matched none of its record, so stale figures were never removed again. Contents are compared now."""
    import shutil

    from nope_interp import io

    def write(root, names):
        res, fig = root / "results" / "job", root / "figures" / "job"
        paths = [io.atomic_write_text(res / "job.json", "r"), *(io.atomic_write_text(fig / n, n) for n in names)]
        return io.drop_stale(paths[0], paths, (res, fig))

    write(tmp_path / "a", ["keep.html", "stale.html"])
    if copy == "move":
        shutil.move(tmp_path / "a", tmp_path / "b")
    else:
        shutil.copytree(tmp_path / "a", tmp_path / "b",
                        copy_function=shutil.copy if copy == "copy-without-times" else shutil.copy2)
    write(tmp_path / "b", ["keep.html"])
    assert sorted(p.name for p in (tmp_path / "b" / "figures" / "job").iterdir()) == ["keep.html"]


def test_job_write_locks_both_output_folders_against_another_process(tmp_path):
    """The reviewer's suspicion, confirmed on the old code: only the CLI locked, and only the results folder, so
    a Python caller of ``write`` beside another writer mixed their files. Every job's write now holds both."""
    import signal

    import tasks
    from nope_interp.config import preset
    from nope_interp.jobs import analyze
    from nope_interp.jobs.common import entry_from_init

    entry = entry_from_init(preset("tiny"), tasks.get_task("addition"), "init-tiny-addition")
    result = analyze.run(analyze.AnalyzeConfig(n_prompts=4, points=("embed",)), [entry])
    for folder in ("results", "figures"):
        proc = _holder(tmp_path / folder / "analyze")
        try:
            busy = rf"being written by another nope-interp process \(pid {proc.pid}\)"
            with pytest.raises(NopeInterpError, match=busy):
                analyze.write(result, tmp_path)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        assert not (tmp_path / "results" / "analyze" / "init-tiny-addition").exists()  # refused before writing
    assert analyze.write(result, tmp_path)  # the killed holders block nobody


def test_drop_stale_warns_but_keeps_the_outputs_when_its_record_cannot_be_written(tmp_path):
    from nope_interp import io
    from nope_interp.errors import NopeInterpWarning

    res, fig = tmp_path / "results" / "job", tmp_path / "figures" / "job"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / ".job.outputs").write_text("a file where the record's folder goes")
    written = [io.atomic_write_text(res / "job.json", "1")]
    with pytest.warns(NopeInterpWarning, match="every output was written, but not the record of them"):
        assert io.drop_stale(written[0], written, (res, fig)) == written


def test_a_loop_of_links_as_out_root_is_called_a_loop(tmp_path):
    from nope_interp import io

    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    with pytest.raises(NopeInterpError, match="is a loop of symbolic links"):
        io.check_writable_dir(tmp_path / "l1", "--out-root")
    (tmp_path / "d").symlink_to(tmp_path / "nowhere")
    with pytest.raises(NopeInterpError, match="is a dangling symbolic link"):
        io.check_writable_dir(tmp_path / "d", "--out-root")


def test_check_writable_dir_probes_the_folder_the_system_finds_through_a_link(tmp_path):
    """tempfile reads ".." as text: `link/../o` was probed as ./o (missing, "not writable") though the system
    finds the link target's o, where the job then writes."""
    from nope_interp import io

    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "o").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    for out in (tmp_path / "link" / ".." / "o", tmp_path / "link" / ".." / "o" / "new"):
        assert io.check_writable_dir(out, "--out-root") == out
    assert not (tmp_path / "o").exists() and list((tmp_path / "real" / "o").iterdir()) == []


@pytest.mark.parametrize("command", sorted(__import__("nope_interp.jobs", fromlist=["JOB_HELP"]).JOB_HELP))
@pytest.mark.parametrize("folder", ["results", "figures"])
def test_every_job_write_takes_its_folders_lock_before_anything_else(command, folder, tmp_path):
    """Every job's write (a contract of the job modules, not of one job): with its results or figures folder
    locked by another thread, write is refused as busy before it even looks at its result (a wrong one here),
    and creates no folder."""
    import importlib
    import threading

    from nope_interp import io
    from nope_interp.jobs import job_module_name

    job = importlib.import_module(job_module_name(command))
    locked, release = threading.Event(), threading.Event()

    def hold():
        with io.exclusive(tmp_path / folder / command.replace("-", "_")):
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(60)
        with pytest.raises(NopeInterpError, match="is being written by another thread of this process"):
            job.write(object(), tmp_path)
    finally:
        release.set()
        holder.join(60)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the holder wrote nothing: its lock is gone too


def test_a_job_write_from_python_refuses_a_bad_out_root_in_one_line_and_creates_nothing(tmp_path):
    """A review of the write lock: a name too long raised a raw OSError from the lock (Path.exists re-raises
    it), and a dangling link as figures/ was followed and its target created (the lock resolves links). Both
    are one-line errors now, checked as the CLI checks --out-root, before any lock or file."""
    from nope_interp.jobs import analyze

    with pytest.raises(NopeInterpError, match="cannot be used: File name too long"):
        analyze.write(object(), tmp_path / ("x" * 300))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "figures").symlink_to(tmp_path / "unmounted" / "figs")
    with pytest.raises(NopeInterpError, match=r"output folder .*figures/analyze cannot be created: .*figures is a "
                                              r"dangling symbolic link"):
        analyze.write(object(), tmp_path / "out")
    assert not (tmp_path / "unmounted").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["figures"]


def test_the_toolkits_write_warnings_name_the_callers_line_however_deep_the_call(tmp_path):
    """A review: the warnings of drop_stale and of a job's write had fixed stack levels, right for one call path
    only (drop_stale called directly named a frame above the caller; adding the write lock moved them). They name
    the first frame outside the package now (errors.user_stacklevel)."""
    import dataclasses
    import warnings

    from conftest import unhooked

    from nope_interp import io
    from nope_interp.jobs import trajectory
    from nope_interp.jobs.trajectory import RunTrajectory

    res, fig = tmp_path / "results" / "job", tmp_path / "figures" / "job"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / ".job.outputs").write_text("a file where the record's folder goes")
    written = [io.atomic_write_text(res / "job.json", "1")]
    run = RunTrajectory(label="s0", task="addition", objective="packed", steps=(0, 25),
                        sites=("hook_embed", "blocks.0.attn.hook_z"),
                        scores={"hook_embed": (0.5, 0.5), "blocks.0.attn.hook_z": (0.99, 0.9)},
                        eval_steps=(25,), eval_acc=(0.1,), run="/somewhere/a/s0")
    first = trajectory.TrajectoryResult(config=trajectory.TrajectoryConfig(), runs=(run,), wall_time_s=0.0)
    second = dataclasses.replace(first, runs=(dataclasses.replace(run, run="/elsewhere/b/s0"),))
    write = unhooked(trajectory.write)  # as users run it: the lock, not pytest's type checker
    write(first, tmp_path / "o")
    for call in (lambda: unhooked(io.drop_stale)(written[0], written, (res, fig)),
                 lambda: write(second, tmp_path / "o")):  # the same folder name, another run: warned
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert caught and all(w.filename == __file__ for w in caught), [(w.filename, w.lineno) for w in caught]


def test_every_kind_of_toolkit_warning_names_the_callers_line(tiny_cfg):
    """The same fault as drop_stale's, fixed as a kind: every warning of the package had a fixed stack level
    (2, 3 or 4), right for one call path. Several paths, each called as users call it (the type checker
    stripped), each warning named at this file: a degenerate matrix given to adjacency_score, degenerate
    activations inside analyze_model's with-block (a warning given as the block ends), the same through
    analyze_tokens, and a too-short training schedule."""
    import warnings

    import torch
    from conftest import unhooked

    import tasks
    from nope_interp.analysis import analyze_model, analyze_tokens
    from nope_interp.model import build_model
    from nope_interp.similarity import adjacency_score
    from nope_interp.train import TrainConfig, warn_short_schedule

    model = build_model(tiny_cfg.replace(seed=4))
    with torch.no_grad():  # every token the same vector: constant cosines at every site
        model.embed.W_E[:] = model.embed.W_E[tasks.encode("7")[0]]
    task = tasks.get_task("addition")
    calls = {
        "adjacency_score": lambda: unhooked(adjacency_score)(torch.ones(2, 5, 5)),
        "analyze_model": lambda: unhooked(analyze_model)(model, task, 4, points=("embed",)),
        "analyze_tokens": lambda: unhooked(analyze_tokens)(model, task.analysis_tokens(4, 0), ("embed",)),
        "warn_short_schedule": lambda: unhooked(warn_short_schedule)(TrainConfig(task="addition", steps=5,
                                                                                  warmup_steps=10)),
    }
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert caught, name
        assert all(w.filename == __file__ for w in caught), (name, [(w.filename, w.lineno) for w in caught])
