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
        shipped_file = pretrained.PRETRAINED_DIR / task / "config.json"
        shipped = pretrained.parse_run_config(json.loads(shipped_file.read_text()), shipped_file)
        for path in pretrained.available_seed_runs(task):
            # compared as configs, defaults filled: a run written by a later version records more fields
            model, train = pretrained.parse_run_config(json.loads((path / "config.json").read_text()), path)
            assert path.name == f"{task}-s{model.seed}" and model.seed != shipped[0].seed
            assert {**model.to_dict(), "seed": 0} == {**shipped[0].to_dict(), "seed": 0}
            assert {**train.to_dict(), "seed": 0} == {**shipped[1].to_dict(), "seed": 0}
            assert json.loads((path / "summary.json").read_text())["n_test"] == 20_000
            found += 1
    assert found >= 2  # reversal-s1 and reversal-s2 at least
    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path / "seeds")
    dest = pretrained.ship(tiny_run, as_seed=True)
    assert dest == tmp_path / "seeds" / "addition-s0" and pretrained.available_seed_runs("addition") == [dest]
    with pytest.raises(pretrained.NopeInterpError, match="unknown task"):
        pretrained.available_seed_runs("sorting")


def _copy_run(tiny_run, tmp_path, name="bad"):
    import shutil

    dest = tmp_path / name
    shutil.copytree(tiny_run, dest)
    return dest


@pytest.mark.parametrize("edit,message", [
    (lambda c: {**c, "train": None}, "'train' must be a JSON object of TrainConfig fields, got null"),
    (lambda c: {**c, "train": []}, "'train' must be a JSON object of TrainConfig fields, got a list []"),
    (lambda c: {**c, "train": "addition"}, "'train' must be a JSON object of TrainConfig fields, got a string"),
    (lambda c: {**c, "model": 3}, "'model' must be a JSON object of ModelConfig fields, got a number 3"),
    (lambda c: {k: v for k, v in c.items() if k != "train"}, "the entry 'train' is missing"),
    (lambda c: [c], "expected a JSON object with 'model' and 'train', got a list"),
    (lambda c: None, "expected a JSON object with 'model' and 'train', got null"),
    (lambda c: {**c, "train": {**c["train"], "colour": 1}}, "'train': unknown TrainConfig field(s) ['colour']"),
])
def test_a_corrupt_run_config_names_the_file_and_the_entry(tiny_run, tmp_path, edit, message):
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = _copy_run(tiny_run, tmp_path)
    (run / "config.json").write_text(json.dumps(edit(json.loads((run / "config.json").read_text()))))
    with pytest.raises(NopeInterpError) as err:
        load_run(run)
    assert message in str(err.value) and str(run / "config.json") in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_run_config_reports_wrong_field_types_for_users(tiny_run):
    """Without pytest's type checker (as users run), a wrong field type is named with its entry."""
    import subprocess
    import sys

    code = f"""
import json
from nope_interp.pretrained import parse_run_config
from nope_interp.errors import NopeInterpError
config = json.load(open({str(tiny_run / "config.json")!r}))
config["train"]["beta1"] = "0.9"
try:
    parse_run_config(config, "c.json")
except NopeInterpError as err:
    print(err)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.stdout.strip() == "run config is invalid: c.json: 'train': beta1 must be a number, got str '0.9'"


def test_weights_that_do_not_fit_the_config_name_the_keys(tiny_run, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = _copy_run(tiny_run, tmp_path)
    state = load_file(run / "model.safetensors")
    state.pop("blocks.1.attn.W_V")
    state["blocks.0.mlp.W_in"] = torch.zeros(2, 2)
    save_file(state, run / "model.safetensors")
    with pytest.raises(NopeInterpError) as err:
        load_run(run)
    msg = str(err.value)
    assert msg.startswith(f"the weights {run / 'model.safetensors'} do not match the model config: ")
    assert "1 missing keys: 'blocks.1.attn.W_V'" in msg and "'blocks.0.mlp.W_in' is (2, 2) in the file" in msg
    config = json.loads((run / "config.json").read_text())  # the right weights, a config of another width
    config["model"]["d_mlp"] = 32
    (run / "config.json").write_text(json.dumps(config))
    (run / "model.safetensors").write_bytes((tiny_run / "model.safetensors").read_bytes())
    # the weights say which settings they were trained with: the field is named before any shape is compared
    with pytest.raises(NopeInterpError, match=r"config.json does not describe the weights model.safetensors: "
                                              r"model.d_mlp \(64 in the weights, 32 in the config\)"):
        load_run(run)
    save_file(load_file(run / "model.safetensors"), run / "model.safetensors")  # unstamped (older) weights
    with pytest.raises(NopeInterpError, match=r"shape mismatches: 'blocks.0.mlp.W_in' is \(32, 64\) in the file, "
                                              r"\(32, 32\) in the model"):
        load_run(run)


def test_seed_directories_count_only_ascii_digit_seeds(tmp_path, monkeypatch):
    import nope_interp.pretrained as pretrained

    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path)
    for name in ("reversal-s1", "reversal-s10", "reversal-s\u0662", "reversal-s\uff13", "reversal-s\u00b2",
                 "reversal-s4x", "reversal-s"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    assert [p.name for p in pretrained.available_seed_runs("reversal")] == ["reversal-s1", "reversal-s10"]


def test_ship_refuses_a_task_name_that_is_not_a_task(tiny_run, tmp_path, monkeypatch):
    import nope_interp.pretrained as pretrained

    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path / "pretrained")
    for bad in ("../../x", "/tmp/x", "sorting", ".."):
        with pytest.raises(pretrained.NopeInterpError, match="task must be one of addition, reversal"):
            pretrained.ship(tiny_run, task=bad)
    assert not (tmp_path / "pretrained").exists()


def test_with_seeds_warns_when_a_task_has_no_extra_seeds(tmp_path, monkeypatch):
    """A wheel install has no seeds (they stay in the repository): --with-seeds says so instead of silently
    analysing the shipped model alone; with seeds present there is no warning."""
    import warnings

    import nope_interp.pretrained as pretrained
    from nope_interp.jobs.common import ModelSource, load_models, shipped_entries

    real = pretrained.SEEDS_DIR
    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path / "no-seeds")
    for make in (lambda: load_models(ModelSource(pretrained=("reversal",), with_seeds=True)),
                 lambda: shipped_entries(["reversal"], with_seeds=True)):
        with pytest.warns(UserWarning, match="no extra seeds of reversal in .*no-seeds.*not in the wheel"):
            assert [e.label for e in make()] == ["pretrained-reversal"]
    monkeypatch.setattr(pretrained, "SEEDS_DIR", real)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [e.label for e in shipped_entries(["reversal"], with_seeds=True)] == [
            "pretrained-reversal", "reversal-s1", "reversal-s2"]


def test_half_precision_rounds_floats_keeps_the_rest_and_refuses_what_float16_cannot_hold():
    import torch

    from nope_interp.pretrained import NopeInterpError, half_precision, stored_dtype

    x = torch.tensor([1.0, -2.5, 1 / 3, 6.0e4, -1.0e-3])
    out = half_precision({"w": x, "ids": torch.arange(3), "mask": torch.ones(2, dtype=torch.bool)})
    assert out["w"].dtype == torch.float16 and out["ids"].dtype == torch.int64 and out["mask"].dtype == torch.bool
    # IEEE half: 11 significant bits, so the relative rounding error is at most 2^-11
    assert ((out["w"].float() - x).abs() <= x.abs() * 2.0**-11).all()
    assert stored_dtype(out) == "float16" and stored_dtype({"w": x}) == "float32"
    assert stored_dtype({"a": x, "b": out["w"]}) == "mixed" and stored_dtype({"ids": torch.arange(2)}) == "none"
    for bad, message in ((torch.tensor([1.0, 7.0e4]), "beyond float16"), (torch.tensor([float("nan")]), "NaN"),
                         (torch.tensor([-1.0e5]), "beyond float16")):
        with pytest.raises(NopeInterpError, match=message):
            half_precision({"blocks.0.W_Q": bad})
    with pytest.raises(NopeInterpError, match="not a tensor"):
        half_precision({"w": [1.0]})
    with pytest.raises(NopeInterpError, match="holds inf: only the IGNORE"):  # -inf is fine only in the mask
        half_precision({"blocks.0.attn.W_Q": torch.tensor([1.0, float("inf")])})
    assert half_precision({"blocks.0.attn.IGNORE": torch.tensor(-float("inf"))})["blocks.0.attn.IGNORE"] < 0
    with pytest.raises(NopeInterpError, match="meta device"):
        half_precision({"w": torch.empty(3, device="meta")})
    param = torch.nn.Parameter(torch.ones(2))
    assert not half_precision({"w": param})["w"].requires_grad
    for bad in ([1, 2], None):
        with pytest.raises(NopeInterpError, match="dict"):
            stored_dtype(bad)


def test_halve_stores_float16_in_place_and_the_loaded_model_computes_in_float32(tiny_run, tmp_path):
    import torch

    from nope_interp import io
    from nope_interp.pretrained import PRETRAINED_DIR, NopeInterpError, halve, load_run

    run_dir = _copy_run(tiny_run, tmp_path, "half")
    before = load_run(run_dir)
    size = (run_dir / "model.safetensors").stat().st_size
    assert halve(run_dir) == run_dir / "model.safetensors"
    assert (run_dir / "model.safetensors").stat().st_size < 0.6 * size
    after = load_run(run_dir)
    assert before.weights_dtype == "float32" and after.weights_dtype == "float16"
    assert all(p.dtype == torch.float32 for p in after.model.parameters())
    for name, value in after.model.state_dict().items():
        if value.is_floating_point():
            assert torch.equal(value, before.model.state_dict()[name].half().float()), name
    stored = io.load_weights(run_dir / "model.safetensors")
    halve(run_dir)  # already half: left as it is
    assert all(torch.equal(stored[k], v) for k, v in io.load_weights(run_dir / "model.safetensors").items())
    with pytest.raises(NopeInterpError, match="shipped task model"):
        halve(PRETRAINED_DIR / "reversal")


def test_halve_refuses_any_checkouts_shipped_model_and_a_locked_run_and_ship_refuses_half_weights(
        tiny_run, tmp_path, monkeypatch):
    """A shipped model of another checkout is refused by its place; a run a training holds is refused; a
    float16 run cannot become a shipped model (it can become an extra seed)."""
    import shutil

    import nope_interp.pretrained as pretrained
    from nope_interp import io

    other = tmp_path / "clone" / "nope_interp" / "pretrained" / "addition"
    shutil.copytree(tiny_run, other)
    size = (other / "model.safetensors").stat().st_size
    with pytest.raises(pretrained.NopeInterpError, match="shipped task model"):
        pretrained.halve(other)
    assert (other / "model.safetensors").stat().st_size == size
    import threading

    locked = _copy_run(tiny_run, tmp_path, "locked")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread (like another process) holds the run, as a training does
        with io.exclusive(locked, "run directory"):
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(60)
    try:
        with pytest.raises(pretrained.NopeInterpError, match="run directory"):
            pretrained.halve(locked)
    finally:
        release.set()
        holder.join()
    assert pretrained.load_run(locked).weights_dtype == "float32"
    pretrained.halve(locked)
    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path / "pkg")
    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path / "pkg" / "seeds")
    with pytest.raises(pretrained.NopeInterpError, match="stores its weights at float16; a shipped model must be"):
        pretrained.ship(locked)
    assert not (tmp_path / "pkg" / "addition").exists()
    assert pretrained.load_run(pretrained.ship(locked, as_seed=True)).weights_dtype == "float16"


def test_the_shipped_models_stay_float32():
    from nope_interp.pretrained import available_pretrained, load_pretrained

    assert {load_pretrained(t).weights_dtype for t in available_pretrained()} == {"float32"}


@pytest.mark.parametrize("task", ["addition", "reversal"])
def test_half_precision_weights_do_not_move_the_scores_or_the_answers(task):
    """The claim that lets analysed-only weights be stored at float16: on a shipped float32 model, every
    adjacency score moves by at most 0.01 and at most 1% of greedy answers change."""
    import torch

    from nope_interp.analysis import analyze_model
    from nope_interp.evaluate import predict
    from nope_interp.model import load_state
    from nope_interp.pretrained import half_precision, load_pretrained

    run = load_pretrained(task)
    prompts = [ex.prompt for ex in run.splits.test[:300]]
    results, answers = {}, {}
    for dtype in ("float32", "float16"):
        if dtype == "float16":
            load_state(run.model, half_precision(run.model.state_dict()), "half")
        assert run.model.W_Q.dtype == torch.float32
        results[dtype] = analyze_model(run.model, run.task, n_prompts=64, exclude=run.train_prompts)
        answers[dtype] = predict(run.model, run.task, prompts)
    for site in results["float32"].sites:
        for reduction in ("row_mean", "pooled"):
            a, b = (results[d].score(site, reduction).mean for d in ("float32", "float16"))
            assert abs(a - b) <= 0.01, (site, reduction, a, b)
    assert sum(a != b for a, b in zip(answers["float32"], answers["float16"], strict=True)) <= 3


def test_analysis_results_of_a_halved_run_say_how_its_weights_were_stored(tiny_run, tmp_path):
    import json

    from nope_interp.cli import main
    from nope_interp.pretrained import halve

    run_dir = _copy_run(tiny_run, tmp_path, "halfrun")
    halve(run_dir)
    assert main(["analyze", "--run", str(run_dir), "--n-prompts", "4", "--out-root", str(tmp_path / "o")]) == 0
    results = list((tmp_path / "o" / "results").rglob("*.json"))
    assert results and all(json.loads(p.read_text())["weights_dtype"] == "float16" for p in results
                           if "weights_dtype" in p.read_text())
    assert any("weights_dtype" in p.read_text() for p in results)


def _candidate_tasks_by_hand(root):
    """Independent reference: folder name -> task, read with json alone."""
    out = {}
    for path in sorted(root.iterdir()):
        if path.name != "in-progress" and (path / "model.safetensors").is_file():
            out[path.name] = json.loads((path / "config.json").read_text())["train"]["task"]
    return out


def test_candidate_runs_are_found_by_their_configs_task():
    import nope_interp.pretrained as pretrained

    by_hand = _candidate_tasks_by_hand(pretrained.CANDIDATES_DIR)
    assert len(by_hand) >= 10
    for task in pretrained.available_pretrained():
        found = pretrained.available_candidate_runs(task)
        assert [p.name for p in found] == sorted(n for n, t in by_hand.items() if t == task)
        assert all("in-progress" not in p.parts for p in found)
    assert sum(len(pretrained.available_candidate_runs(t)) for t in pretrained.available_pretrained()) == len(by_hand)
    with pytest.raises(pretrained.NopeInterpError, match="unknown task 'sorting'"):
        pretrained.available_candidate_runs("sorting")


def test_candidate_runs_skip_unfinished_folders_and_name_a_corrupt_config(tiny_run, tmp_path, monkeypatch):
    import shutil

    import nope_interp.pretrained as pretrained

    monkeypatch.setattr(pretrained, "CANDIDATES_DIR", tmp_path / "candidates")
    assert pretrained.available_candidate_runs("addition") == []  # no folder at all (a wheel install)
    shutil.copytree(tiny_run, tmp_path / "candidates" / "b-run")
    shutil.copytree(tiny_run, tmp_path / "candidates" / "in-progress" / "a-run")
    (tmp_path / "candidates" / "no-weights").mkdir()
    (tmp_path / "candidates" / "README.md").write_text("table")
    assert [p.name for p in pretrained.available_candidate_runs("addition")] == ["b-run"]
    assert pretrained.available_candidate_runs("reversal") == []
    shutil.copytree(tiny_run, tmp_path / "candidates" / "a-bad")
    (tmp_path / "candidates" / "a-bad" / "config.json").write_text('{"model": {}, "train": null}')
    with pytest.raises(pretrained.NopeInterpError, match=r"a-bad.*config.json.*'train' must be a JSON object"):
        pretrained.available_candidate_runs("addition")


def test_with_candidates_adds_the_candidate_runs_and_warns_when_there_are_none(tmp_path, monkeypatch):
    import nope_interp.pretrained as pretrained
    from nope_interp.jobs.common import ModelSource, load_models, shipped_entries

    expected = sorted(n for n, t in _candidate_tasks_by_hand(pretrained.CANDIDATES_DIR).items() if t == "reversal")
    assert expected  # the packed and paper-lr reversal runs
    entries = load_models(ModelSource(pretrained=("reversal",), with_candidates=True))
    assert [e.label for e in entries] == ["pretrained-reversal", *expected]
    assert all(e.task.name == "reversal" and e.run is not None for e in entries)
    both = load_models(ModelSource(pretrained=("reversal",), with_seeds=True, with_candidates=True))
    assert [e.label for e in both] == ["pretrained-reversal", "reversal-s1", "reversal-s2", *expected]
    monkeypatch.setattr(pretrained, "CANDIDATES_DIR", tmp_path / "none")
    for make in (lambda: load_models(ModelSource(pretrained=("reversal",), with_candidates=True)),
                 lambda: shipped_entries(["reversal"], with_candidates=True)):
        with pytest.warns(UserWarning, match="no candidate runs of reversal in .*none.*not in the wheel"):
            assert [e.label for e in make()] == ["pretrained-reversal"]


@pytest.mark.parametrize("kwargs,match", [
    # Python names the fields (the CLI the flags: test_cli)
    ({"run": ("a",), "with_candidates": True}, "^with_candidates adds repository models .* with run, list"),
    ({"init": True, "task": "addition", "with_candidates": True}, "^with_candidates adds .* with init, list"),
    ({"init": True, "task": "addition", "with_seeds": True}, "^with_seeds adds repository models .* with init,"),
    ({"hf_path": "x", "with_seeds": True}, "^with_seeds adds repository models .* with hf_path, list"),
    ({"with_candidates": True, "task": "reversal"}, "^with_candidates alone means every shipped task"),
    ({"with_candidates": True, "n_digits": 4}, "^with_candidates alone means every shipped task"),
])
def test_with_candidates_and_with_seeds_refuse_sources_they_cannot_add_to(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import ModelSource

    with pytest.raises(NopeInterpError, match=match):
        ModelSource(**kwargs)


def test_sweep_point_runs_are_labelled_by_sweep_and_key(tiny_run, tmp_path):
    """Every point of a training sweep keeps its run in a folder called `run`: --run over several points must
    not collide on that name, so each is labelled `<sweep>-<key>`; other folders keep their own name."""
    import shutil

    from nope_interp.jobs.common import ModelSource, load_models, run_label

    points = tmp_path / "sweeps" / "my-arms" / "points"
    for key in ("76dab0bf4116bbf5", "2cd8bf6ee49e9d3c"):
        shutil.copytree(tiny_run, points / key / "run")
    shutil.copytree(tiny_run, tmp_path / "elsewhere" / "run")
    runs = sorted(str(p) for p in points.glob("*/run"))
    assert [e.label for e in load_models(ModelSource(run=tuple(runs)))] == [
        "my-arms-2cd8bf6ee49e9d3c", "my-arms-76dab0bf4116bbf5"]
    assert run_label(tmp_path / "elsewhere" / "run") == "run"
    assert run_label(points / "76dab0bf4116bbf5" / "run" / ".." / "run") == "my-arms-76dab0bf4116bbf5"
    assert run_label(tiny_run) == tiny_run.name
    from nope_interp.errors import NopeInterpError

    for bad in ("with space", "ünï", ".hidden"):  # was "model label must be one folder name": say which folder
        with pytest.raises(NopeInterpError, match=f"the run folder .* names the result files.*got '{bad}': rename "
                                                  "the folder, or link it"):
            run_label(tmp_path / bad)


def test_with_candidates_alone_keeps_the_seeds_of_a_job_whose_default_has_them(tiny_run, tmp_path, monkeypatch):
    """compare's default is every shipped model and its seeds: --with-candidates alone adds the candidates to
    that set rather than replacing the seeds; for other jobs it means the shipped models and the candidates."""
    import shutil
    import warnings

    import nope_interp.pretrained as pretrained
    from nope_interp.jobs.common import ModelSource, load_models

    monkeypatch.setattr(pretrained, "SEEDS_DIR", tmp_path / "seeds")
    monkeypatch.setattr(pretrained, "CANDIDATES_DIR", tmp_path / "candidates")
    shutil.copytree(tiny_run, tmp_path / "seeds" / "addition-s7")
    shutil.copytree(tiny_run, tmp_path / "candidates" / "addition-other-recipe")
    shipped = {f"pretrained-{t}" for t in pretrained.available_pretrained()}
    source = ModelSource(with_candidates=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the other tasks have neither seeds nor candidates here
        with_default_seeds = {e.label for e in load_models(source, default_with_seeds=True)}
        alone = {e.label for e in load_models(source)}
    assert with_default_seeds == shipped | {"addition-s7", "addition-other-recipe"}
    assert alone == shipped | {"addition-other-recipe"}


def test_a_run_config_whose_task_entries_disagree_is_refused(tiny_run, tmp_path):
    """Before: 'task': {'name': 'foo'} beside a run trained on addition was analysed as addition, silently."""
    import json
    import shutil

    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    config = json.loads((run / "config.json").read_text())
    config["task"]["name"] = "reversal"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(NopeInterpError, match="inconsistent: .*'task' names 'reversal' but 'train' trained on"):
        load_run(run)


def _copy_run(tiny_run, tmp_path, name="c"):
    import shutil

    dst = tmp_path / name
    shutil.copytree(tiny_run, dst, ignore=shutil.ignore_patterns("checkpoint.pt"))
    return dst


def test_load_run_refuses_summaries_that_would_be_reported_as_the_run_s_accuracy(tiny_run, tmp_path):
    """A list, a string or 2.0 as test_acc, and a summary older than the training history (finalized, then
    trained further) were loaded; compare then crashed on them or printed the old accuracy."""
    import json

    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = _copy_run(tiny_run, tmp_path)
    good = json.loads((run / "summary.json").read_text())
    assert load_run(run).summary == good
    cases = [([1, 2], "holds a list"), ({**good, "test_acc": "0.995"}, "test_acc must be a fraction in \\[0, 1\\], "
                                                                       "got a string"),
             ({**good, "test_acc": 2.0}, "test_acc must be a fraction"), ({**good, "test_acc": True}, "test_acc must"),
             ({**good, "steps": 2.5}, "steps must be an integer >= 0"),
             ({**good, "steps": 3}, "run summary is stale: .* is for step 3, but the run trained to step 6")]
    for summary, match in cases:
        (run / "summary.json").write_text(json.dumps(summary))
        with pytest.raises(NopeInterpError, match=match):
            load_run(run)


def test_load_run_refuses_non_finite_parameters_but_not_the_attention_buffers(tiny_run, tmp_path):
    """One NaN in W_Q loaded silently (TransformerLens turns NaN scores into zero weights); the -inf IGNORE
    buffer every attention layer stores is not a parameter and stays allowed."""
    import torch
    from safetensors.torch import load_file, save_file

    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = _copy_run(tiny_run, tmp_path)
    state = load_file(str(run / "model.safetensors"))
    assert any(not bool(torch.isfinite(v).all()) for k, v in state.items() if k.endswith("IGNORE"))
    for bad in (float("nan"), float("inf")):
        broken = dict(state)
        broken["blocks.0.attn.W_Q"] = state["blocks.0.attn.W_Q"].clone()
        broken["blocks.0.attn.W_Q"][0, 0, 0] = bad
        save_file(broken, str(run / "model.safetensors"))
        with pytest.raises(NopeInterpError, match="NaN or infinite parameters: 1 parameters: 'blocks.0.attn.W_Q'"):
            load_run(run)


def test_config_task_entry_must_match_what_was_trained_and_resume_compares_effective_task_sizes(tiny_run, tmp_path):
    import json

    from nope_interp.config import ModelConfig
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run
    from nope_interp.train import TrainConfig, run_settings

    run = _copy_run(tiny_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["task"]["params"] = {"n_digits": 3}  # the weights were trained on 2 digits
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(NopeInterpError, match="'task' has params \\{'n_digits': 3\\} but 'train' trained on "
                                              "\\{'n_digits': 2\\}"):
        load_run(run)
    # {} and the task's defaults are the same task ("--n-digits 16" on reversal was refused by --resume)
    m = ModelConfig()
    a = run_settings(m, TrainConfig(task="reversal", task_params={}))
    b = run_settings(m, TrainConfig(task="reversal", task_params={"n_digits": 16}))
    c = run_settings(m, TrainConfig(task="reversal", task_params={"n_digits": 12}))
    assert a == b != c


def test_weights_carry_their_settings_and_an_edited_config_is_refused(tiny_run, tmp_path):
    """act_fn, attention, dropout or data_seed edited in config.json loaded silently: another model, or
    training prompts scored as held out. Weights now carry the settings they were trained with."""
    import json

    from safetensors.torch import load_file, save_file

    from nope_interp import io
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import halve, load_run

    run = _copy_run(tiny_run, tmp_path)
    stamp = json.loads(io.weights_metadata(run / "model.safetensors")[io.SETTINGS_KEY])
    assert stamp["model.act_fn"] == "gelu" and stamp["train.data_seed"] == 0
    assert all(io.SETTINGS_KEY in io.weights_metadata(p) for p in (run / "checkpoints").glob("*.safetensors"))
    original = (run / "config.json").read_text()
    for section, key, value in (("model", "act_fn", "relu"), ("model", "attention", "bidirectional"),
                                ("train", "data_seed", 7), ("model", "dropout", 0.2)):
        config = json.loads(original)
        config[section][key] = value
        (run / "config.json").write_text(json.dumps(config))
        with pytest.raises(NopeInterpError, match=f"does not describe the weights model.safetensors: "
                                                  f"{section}.{key} \\({stamp[f'{section}.{key}']!r} in the weights, "
                                                  f"{value!r} in the config\\)"):
            load_run(run)
    (run / "config.json").write_text(original)
    assert load_run(run).model_cfg.act_fn == "gelu"
    halve(run)  # float16 storage keeps the stamp
    assert io.weights_metadata(run / "model.safetensors")[io.SETTINGS_KEY] == json.dumps(stamp, sort_keys=True)
    # weights written before the stamp (the shipped models) load as before, unchecked
    save_file(load_file(str(run / "model.safetensors")), str(run / "model.safetensors"))
    config = json.loads(original)
    config["model"]["act_fn"] = "relu"
    (run / "config.json").write_text(json.dumps(config))
    assert load_run(run).model_cfg.act_fn == "relu"


def test_a_stamp_from_before_a_config_field_existed_still_loads(tiny_run, tmp_path):
    """A field added to the configs later was read as None from the older stamp: every stamped run would have
    stopped loading at the next schema change. Only settings both sides know are compared."""
    import json

    from safetensors.torch import load_file, save_file

    from nope_interp import io
    from nope_interp.errors import NopeInterpError
    from nope_interp.pretrained import load_run

    run = _copy_run(tiny_run, tmp_path)
    stamp = json.loads(io.weights_metadata(run / "model.safetensors")[io.SETTINGS_KEY])
    older = {k: v for k, v in stamp.items() if k != "model.dropout"}
    older["model.a_field_since_removed"] = 1
    save_file(load_file(str(run / "model.safetensors")), str(run / "model.safetensors"),
              metadata={io.SETTINGS_KEY: json.dumps(older)})
    assert load_run(run).model_cfg.dropout == 0.0
    config = json.loads((run / "config.json").read_text())
    config["model"]["act_fn"] = "relu"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(NopeInterpError, match="model.act_fn \\('gelu' in the weights, 'relu' in the config\\)"):
        load_run(run)


def test_ship_refuses_what_would_leave_a_wrong_or_half_shipped_model(tiny_run, tmp_path, monkeypatch):
    """Before: ship(addition run, task='reversal') made load_pretrained('reversal') an addition model; a run
    without metrics.jsonl was half copied (config and weights of the new run beside the old summary) with a
    traceback; a second ship overwrote without a word; a run finalised by hand mid-schedule shipped as finished."""
    import json
    import shutil

    from nope_interp import pretrained

    monkeypatch.setattr(pretrained, "PRETRAINED_DIR", tmp_path / "pkg")
    with pytest.raises(pretrained.NopeInterpError, match="trained on addition, not reversal"):
        pretrained.ship(tiny_run, task="reversal")
    dest = pretrained.ship(tiny_run)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(pretrained.NopeInterpError, match="exists: shipping .* would replace it"):
        pretrained.ship(tiny_run)
    no_metrics = _copy_run(tiny_run, tmp_path, "no_metrics")
    (no_metrics / "metrics.jsonl").unlink()
    with pytest.raises(pretrained.NopeInterpError, match="lacks metrics.jsonl"):
        pretrained.ship(no_metrics, overwrite=True)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before  # the shipped folder is untouched
    by_hand = _copy_run(tiny_run, tmp_path, "by_hand")
    summary = json.loads((by_hand / "summary.json").read_text())
    summary.update(finished_schedule=False, stopped_early=False, reached_target=False)
    (by_hand / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(pretrained.NopeInterpError, match="stopped by hand"):
        pretrained.ship(by_hand, overwrite=True)
    assert pretrained.ship(tiny_run, overwrite=True) == dest and sorted(p.name for p in dest.parent.iterdir()) == [
        "addition"]  # replaced whole: no staging or replaced folder left beside it
    shutil.rmtree(dest)
