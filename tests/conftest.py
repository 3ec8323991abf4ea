"""Shared fixtures: tiny NoPE configs and models (packages imported inside fixtures so jaxtyping's
import hook instruments them first, as TransformerLens's tests/AGENTS.md advises)."""

import os

import pytest
import torch

# The tests run tiny models, where torch's intra-op threads cost more than they give (two tests of the CLI took
# 1.8x as long with torch's default two threads on a busy 2-core machine): one thread unless the caller set
# OMP_NUM_THREADS. Subprocesses (CLI runs, notebook kernels) inherit it. `make test` sets it too, for the
# notebooks when they run without this directory.
if "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture
def tiny_cfg():
    from nope_interp.model import preset

    return preset("tiny")


@pytest.fixture
def tiny_model(tiny_cfg):
    from nope_interp.model import build_model

    return build_model(tiny_cfg)


@pytest.fixture
def addition_task():
    """The addition task at the paper's size."""
    import tasks

    return tasks.get_task("addition")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def assert_no_hooks(model) -> None:
    """No HookPoint of ``model`` has a forward or backward hook left attached."""
    from transformer_lens.hook_points import HookPoint

    for name, mod in model.named_modules():
        if isinstance(mod, HookPoint):
            assert not mod._forward_hooks, f"forward hook left on {name}"
            assert not mod._backward_hooks, f"backward hook left on {name}"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished 6-step run of a tiny addition model, trained through the CLI (runs/t)."""
    from nope_interp.cli import main

    root = tmp_path_factory.mktemp("runs")
    argv = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16",
            "--steps", "6", "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3",
            "--eval-n", "10", "--warmup-steps", "2", "--runs-dir", str(root), "--name", "t", "--no-progress"]
    assert main(argv) == 0
    return root / "t"


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def assert_lists_every_file(paths, root) -> None:
    """``paths`` (what a job's ``write`` returned) are exactly the files under ``root``, each once: no file
    written and left unlisted (before: the ``plotly.min.js`` beside the figures), none listed and not there."""
    from pathlib import Path

    paths = [Path(p) for p in paths]
    assert len(paths) == len(set(paths)), f"a path listed twice: {paths}"
    # the record of what a write wrote (io.drop_stale: results/.<job>.outputs/) and the lock files beside the
    # folders a write holds (io.lock_path: .<folder>.lock) are bookkeeping, not outputs
    on_disk = sorted(p for p in Path(root).rglob("*") if p.is_file()
                     and not (p.parent.name.startswith(".") and p.parent.name.endswith(".outputs"))
                     and not (p.name.startswith(".") and p.name.endswith(".lock")))
    assert sorted(paths) == on_disk, (f"listed but not there: {sorted(set(paths) - set(on_disk))}; "
                                      f"there but not listed: {sorted(set(on_disk) - set(paths))}")


def assert_strict_json_files(root, minimum: int = 1) -> list:
    """Every ``*.json`` and ``*.jsonl`` file under ``root`` parses as strict JSON (a bare NaN, Infinity or
    -Infinity fails); at least ``minimum`` such files exist. Returns the files checked."""
    import json
    from pathlib import Path

    files = sorted(p for p in Path(root).rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    assert len(files) >= minimum, f"expected at least {minimum} JSON files under {root}, found {files}"
    for path in files:
        text = path.read_text(encoding="utf-8")
        docs = [line for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else [text]
        for doc in docs:
            try:
                json.loads(doc, parse_constant=_refuse_constant)
            except ValueError as err:
                raise AssertionError(f"{path} is not strict JSON: {err}") from None
    return files


def unhooked(fn):
    """``fn`` without the runtime type checker that pytest's jaxtyping hook (pyproject ``addopts``) wraps
    around every annotated function of the package: users run without it, so input checks that the
    checker would pre-empt (a bytes prompt, a str for a bool field) are tested on the code users run. A job's
    ``write`` keeps its lock (``jobs.common.locked_write``), which users run too: the unhooked function is
    locked again."""
    import inspect

    folder = getattr(fn, "__nope_locked__", None)
    if folder is not None:
        from nope_interp.jobs.common import locked_write

        return locked_write(folder)(inspect.unwrap(fn))
    return inspect.unwrap(fn)


def build_unhooked(cls, **kwargs):
    """``cls(**kwargs)`` for a dataclass, through its own ``__init__`` (and ``__post_init__``) without the
    hook's type checker (see :func:`unhooked`)."""
    obj = object.__new__(cls)
    unhooked(cls.__init__)(obj, **kwargs)
    return obj


def perturbed_model(cfg):
    """A model of ``cfg`` whose weights are moved off their init (so biases, LN weights and W_pos all matter)."""
    from nope_interp.model import build_model

    model = build_model(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="session")
def packed_run(tmp_path_factory):
    """A tiny 2-digit addition run (2 steps) trained with the packed objective: evaluated after a newline."""
    from nope_interp.config import TrainConfig, preset
    from nope_interp.train import train

    path = tmp_path_factory.mktemp("packed") / "p"
    cfg = TrainConfig(task="addition", task_params={"n_digits": 2}, n_train=100, n_test=20, steps=2, batch_size=4,
                      warmup_steps=1, eval_every=2, eval_n=5, checkpoint_every=2, objective="packed", window=16)
    train(preset("tiny", n_ctx=16, init_std=0.2), cfg, path, progress=False, command="x")
    return path


def distinct_copy(run, dest):
    """A copy of the run directory ``run`` at ``dest`` whose final weights differ from ``run``'s in the last bit
    of one value: another model to the jobs, which refuse a byte-identical copy as one model given twice
    (``jobs.common.refuse_same_model_twice``). Returns ``dest``."""
    import shutil
    from pathlib import Path

    dest = Path(shutil.copytree(run, dest))
    weights = bytearray((dest / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (dest / "model.safetensors").write_bytes(bytes(weights))
    return dest
