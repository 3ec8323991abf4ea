"""The demo job on one task: claims table against the scores, accuracy re-measured, files written."""

import json

import pytest
from conftest import assert_strict_json_files


@pytest.fixture(scope="module")
def reversal_demo_result():
    from nope_interp.jobs import demo

    return demo.run(demo.DemoConfig(tasks=("reversal",), n_prompts=12, eval_n=40, init_preset="tiny"))


def test_claims_follow_the_scores(reversal_demo_result):
    from nope_interp.jobs.demo import CLAIMS

    (t,) = reversal_demo_result.tasks
    assert [c.model for c in reversal_demo_result.claims][:1] == ["initialised"]
    for c in reversal_demo_result.claims:
        score = t.analyses[c.model].scores["row_mean"][c.site]["mean"]
        low, high, _ = CLAIMS["embed" if c.site == "hook_embed" else "first_attn"]
        assert c.score == score and (c.verdict == "agrees") == (low <= score <= high)
    assert 0.9 <= t.test_acc_remeasured <= 1.0 and t.n_test_remeasured == 40


def test_write_and_summary(reversal_demo_result, tmp_path):
    from nope_interp.jobs import demo

    paths = demo.write(reversal_demo_result, tmp_path)
    assert_strict_json_files(tmp_path)  # result JSON is strict: NaN/inf written as null
    summary = json.loads((tmp_path / "results" / "demo" / "summary.json").read_text())
    assert list(summary["tasks"]) == ["reversal"] and summary["n_prompts"] == 12
    assert summary["figures"] == [str(p) for p in paths[2:]]
    md = (tmp_path / "results" / "demo" / "summary.md").read_text()
    assert "| reversal | answer_only | 3x128 |" in md and "about 0.5 (chance)" in md
    assert summary["tasks"]["reversal"]["objective"] == "answer_only"
    names = {p.name for p in (tmp_path / "figures" / "demo").iterdir()}
    assert {"adjacency_by_layer.html", "cosine_reversal_initialised.html", "cosine_reversal_step0.html",
            "cosine_reversal_trained.html"} <= names


@pytest.mark.parametrize("kwargs,match", [
    ({"tasks": ("sorting",)}, "unknown task 'sorting'"), ({"init_preset": "huge"}, "init_preset"),
    ({"n_prompts": 0}, "n_prompts"), ({"eval_n": 0}, "eval_n"),
])
def test_bad_config(kwargs, match):
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.demo import DemoConfig

    with pytest.raises(NopeInterpError, match=match):
        DemoConfig(**kwargs)
