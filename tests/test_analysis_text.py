"""Analysis of human-written text with the tokenizer a model reads: windows against a naive reference, the
scores equal analyze_tokens on those windows, any tokenizer kind (none, a callable, a Hugging Face tokenizer
built locally), and one clear error per bad input."""

import pytest
import torch
from conftest import unhooked

TEXTS = ["To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
         "short",
         "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles"]


def _naive_windows(id_lists, length, n_windows):
    out = []
    for ids in id_lists:
        k = 0
        while (k + 1) * length <= len(ids):
            out.append(ids[k * length:(k + 1) * length])
            k += 1
    return out if n_windows is None else out[:n_windows]


@pytest.mark.parametrize(("length", "n_windows"), [(3, None), (7, 5), (16, None), (20, 3), (40, None), (84, 1)])
def test_windows_are_consecutive_per_text_and_never_span_two_texts(length, n_windows):
    import tasks
    from nope_interp.analysis import text_windows_of

    for tokenizer, encode in ((None, tasks.vocab.encode), (lambda s: [ord(c) % 61 for c in s],
                                                            lambda s: [ord(c) % 61 for c in s])):
        got = text_windows_of(TEXTS, length, n_windows, tokenizer)
        ref = _naive_windows([encode(t) for t in TEXTS], length, n_windows)
        assert got.dtype == torch.long and got.tolist() == ref


def test_analyze_text_equals_analyze_tokens_on_the_same_windows():
    from nope_interp.analysis import analyze_text, analyze_tokens, text_windows_of
    from nope_interp.config import preset
    from nope_interp.model import build_model

    model = build_model(preset("tiny"))
    res = analyze_text(model, TEXTS, 12, n_windows=8, points=("z", "resid_post"))
    ref = analyze_tokens(model, text_windows_of(TEXTS, 12, 8), ("z", "resid_post"))
    assert res.task == "text" and res.protocol == "text" and res.n_prompts == 8
    assert res.example_prompt == TEXTS[0][:12]
    for site in ref.sites:
        torch.testing.assert_close(res.per_sequence["row_mean"][res.sites.index(site)],
                                   ref.per_sequence["row_mean"][ref.sites.index(site)], rtol=0, atol=0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"texts": []}, "non-empty list"), ({"texts": ["ok", 3]}, "non-empty list"),
    ({"length": 2}, "length must be an integer >= 3"), ({"length": 4.0}, "length must be"),
    ({"n_windows": 0}, "n_windows must be"), ({"n_windows": True}, "n_windows must be"),
    ({"length": 500}, f"no text has 500 tokens \\(the longest has {max(map(len, TEXTS))}\\)"),
    ({"texts": ["caf\u00e9 au lait and more"]}, "not in the 96-character vocabulary.*tokenizer your model reads"),
    ({"tokenizer": 42}, "tokenizer must be None, a callable"),
    ({"tokenizer": lambda s: [0.5] * len(s)}, "integer token ids, got an element of type float"),
    # before: a path string was taken for a tokenizer (a str has .encode) and raised "got bytes"
    ({"tokenizer": "/models/tok"}, "not a path or string .*load_hf_tokenizer"),
    ({"tokenizer": lambda s: 1 / 0}, "the tokenizer failed on the text: ZeroDivisionError"),  # before: raw
    ({"tokenizer": lambda s: None}, "got NoneType"),
])
def test_bad_text_inputs_are_one_clear_error(kwargs, match):
    from nope_interp.analysis import text_windows_of
    from nope_interp.errors import NopeInterpError

    args = {"texts": TEXTS, "length": 8, "n_windows": None, "tokenizer": None, **kwargs}
    with pytest.raises(NopeInterpError, match=match):
        unhooked(text_windows_of)(**args)  # the code users run (pytest's type checker would pre-empt it)


def test_ids_outside_the_models_vocabulary_are_refused():
    from nope_interp.analysis import analyze_text
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    model = build_model(preset("tiny"))  # d_vocab 96
    with pytest.raises(NopeInterpError, match="vocab"):
        analyze_text(model, TEXTS, 8, tokenizer=lambda s: [100 + ord(c) % 5 for c in s])


def test_an_unknown_keyword_is_one_clear_error_before_any_work(monkeypatch):
    """Before: ``analyze_text(model, texts, 8, bogus=1)`` cut the text into windows and then failed with Python's
    raw TypeError from analyze_tokens. The allowed names are analyze_tokens' keyword-only parameters."""
    import inspect

    import nope_interp.analysis as A
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    params = inspect.signature(inspect.unwrap(A.analyze_tokens)).parameters.values()
    assert A.ANALYZE_TEXT_KWARGS == tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    cut = []
    monkeypatch.setattr(A, "text_windows_of", lambda *a, **k: cut.append(a) or 1 / 0)
    model = build_model(preset("tiny"))
    for bad in ({"bogus": 1}, {"max_lag": 2, "n_window": 4}, {"tokens": None}):
        with pytest.raises(NopeInterpError, match=f"unknown keyword argument.*{sorted(set(bad) - {'max_lag'})[0]}"):
            A.analyze_text(model, TEXTS, 8, **bad)
    assert cut == []


def _word_tokenizer(tmp_path):
    """A word-level Hugging Face tokenizer built and saved locally (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in TEXTS for w in t.replace("\n", " ").split()})
    vocab = {"<unk>": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    fast.save_pretrained(tmp_path / "tok")
    return fast, vocab


def test_a_hugging_face_tokenizer_and_a_bridge(tmp_path):
    """Word-level ids, no BOS inside windows; a bridge around a tiny mixed SmolLM3 analysed on them equals
    analyze_tokens on the same ids; the example text is decoded by the tokenizer."""
    pytest.importorskip("transformers")
    from nope_interp.analysis import analyze_text, analyze_tokens
    from nope_interp.hf import bridge_from_hf, tiny_hf_model

    fast, vocab = _word_tokenizer(tmp_path)
    from nope_interp.analysis import text_windows_of

    got = text_windows_of(TEXTS, 4, None, fast)
    ref = _naive_windows([[vocab[w] for w in t.replace("\n", " ").split()] for t in TEXTS], 4, None)
    assert got.tolist() == ref and vocab["<s>"] not in got.flatten().tolist()
    bridge = bridge_from_hf(tiny_hf_model("smollm3-mixed", seed=0))
    res = analyze_text(bridge, TEXTS, 4, tokenizer=fast, points=("z",))
    base = analyze_tokens(bridge, got, ("z",))
    torch.testing.assert_close(res.per_sequence["row_mean"], base.per_sequence["row_mean"])
    assert res.example_prompt == "To be, or not"
    # without its tokenizer the bridge would be fed the character vocabulary's ids: refused, not analysed
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="analyze_text: give the model's own tokenizer"):
        analyze_text(bridge, TEXTS, 4, points=("z",))


def test_cli_analyze_reads_a_text_file_with_the_models_own_tokenizer(tmp_path, tiny_run, capsys):
    """--text-file: a task model reads it through the 96-character vocabulary, a Hugging Face folder through
    the tokenizer saved in it; the scores equal analyze_text on the same file; outputs say where they went."""
    import json

    pytest.importorskip("transformers")
    from nope_interp.analysis import analyze_text
    from nope_interp.cli import main
    from nope_interp.hf import load_hf, tiny_hf_model
    from nope_interp.pretrained import load_run

    text = tmp_path / "speech.txt"
    text.write_text("\n".join(TEXTS * 3), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["analyze", "--run", str(tiny_run), "--text-file", str(text), "--text-length", "16",
                 "--n-prompts", "5", "--points", "z", "--out-root", str(out)]) == 0
    label = f"{tiny_run.name}-textfile"
    scores = json.loads((out / "results" / "analyze" / label / "scores.json").read_text())
    assert scores["task"] == "text-file" and scores["n_prompts"] == 5
    assert scores["text_file"] == str(text.resolve()) and scores["text_length"] == 16
    assert str(out / "figures" / "analyze" / label) in capsys.readouterr().out
    model = load_run(tiny_run).model
    ref = analyze_text(model, text.read_text(), 16, 5, points=("z",))
    for site, value in ref.scores["row_mean"].items():
        assert scores["scores"]["row_mean"][site]["mean"] == pytest.approx(value["mean"], abs=1e-9)

    fast, _ = _word_tokenizer(tmp_path)
    tiny_hf_model("smollm3-mixed", seed=0).save_pretrained(tmp_path / "tok")  # model and tokenizer together
    assert main(["analyze", "--hf-path", str(tmp_path / "tok"), "--text-file", str(text), "--text-length", "4",
                 "--n-prompts", "6", "--points", "z", "--out-root", str(out)]) == 0
    scores = json.loads((out / "results" / "analyze" / "hf-tok-textfile" / "scores.json").read_text())
    ref = analyze_text(load_hf(tmp_path / "tok"), text.read_text(), 4, 6, fast, points=("z",))
    assert scores["layer_types"] == ["rope", "rope", "rope", "nope"] and scores["n_prompts"] == 6
    for site, value in ref.scores["row_mean"].items():
        assert scores["scores"]["row_mean"][site]["mean"] == pytest.approx(value["mean"], abs=1e-6)


@pytest.mark.parametrize("case", ["missing file", "directory", "not utf-8", "with a protocol", "no tokenizer",
                                  "too short", "bad length", "over n_ctx", "outside the vocabulary"])
def test_cli_text_file_errors_are_one_line_exit_2_nothing_written(tmp_path, tiny_run, capsys, case):
    from nope_interp.cli import main

    text = tmp_path / "t.txt"
    text.write_text(TEXTS[0], encoding="utf-8")
    args = ["analyze", "--run", str(tiny_run), "--text-file", str(text), "--text-length", "8"]
    if case == "missing file":
        args[4] = str(tmp_path / "none.txt")
    elif case == "directory":
        args[4] = str(tmp_path)
    elif case == "not utf-8":
        text.write_bytes(b"\xff\xfe bad bytes \xff" * 10)
    elif case == "with a protocol":
        args += ["--protocol", "authors"]
    elif case == "no tokenizer":
        pytest.importorskip("transformers")
        from nope_interp.hf import tiny_hf_model

        tiny_hf_model("llama", seed=0).save_pretrained(tmp_path / "bare")
        args[1:3] = ["--hf-path", str(tmp_path / "bare")]
    elif case == "too short":
        text.write_text("short", encoding="utf-8")
    elif case == "over n_ctx":
        args[-1] = "500"
    elif case == "outside the vocabulary":
        text.write_text("fine line\n" * 2000 + "caf\u00e9 \u00e9t\u00e9\n", encoding="utf-8")
    elif case == "bad length":
        args[-1] = "2"
    out = tmp_path / "out"
    assert main([*args, "--out-root", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' own progress bars
    assert err.startswith("nope-interp: error:"), err
    expected = {"missing file": "does not exist", "directory": "not a readable UTF-8", "not utf-8": "not a readable",
                "with a protocol": "exclude each other", "no tokenizer": "no tokenizer in",
                "too short": "no text has 8 tokens", "bad length": "--text-length",
                "over n_ctx": "--text-length=500 exceeds", "outside the vocabulary":
                "line 2001, column 4: character '\u00e9' is not in the 96-character vocabulary"}[case]
    assert expected in err and len(err) < 400, err  # never the file's text
    assert not (out / "results").exists()


def test_cli_text_file_bom_short_file_and_labels(tmp_path, tiny_run, capsys):
    """A byte-order mark is not text; a file with fewer windows than asked says so; --label with two models
    keeps each model's own label and suffix (never overwriting their own analyses); two runs of one folder
    name are refused before any work."""
    import json
    import shutil

    from nope_interp.cli import main

    text = tmp_path / "t.txt"
    text.write_bytes("\ufeff".encode() + ("To be, or not to be\n" * 3).encode())
    out = tmp_path / "out"
    assert main(["analyze", "--run", str(tiny_run), "--text-file", str(text), "--text-length", "10",
                 "--n-prompts", "50", "--points", "z", "--out-root", str(out)]) == 0
    printed = capsys.readouterr()
    assert "the file holds only 6 of the 50 asked for" in printed.err + printed.out
    scores = json.loads((out / "results/analyze" / f"{tiny_run.name}-textfile" / "scores.json").read_text())
    assert scores["example_prompt"] == "To be, or " and scores["n_prompts"] == 6 and scores["windows_asked"] == 50
    from conftest import distinct_copy

    other = distinct_copy(tiny_run, tmp_path / "other")  # a byte-identical copy would be one model twice
    assert main(["analyze", "--run", str(tiny_run), str(other), "--label", "mine", "--text-file", str(text),
                 "--text-length", "10", "--points", "z", "--out-root", str(out)]) == 0
    assert not (out / "results/analyze/mine").exists()
    assert (out / "results/analyze/other-textfile/scores.json").is_file()
    twin = tmp_path / "x" / tiny_run.name
    shutil.copytree(tiny_run, twin)
    capsys.readouterr()
    assert main(["analyze", "--run", str(tiny_run), str(twin), "--points", "z",
                 "--out-root", str(tmp_path / "o2")]) == 2
    assert "share the label" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("ids", ["numpy", "numpy-int32", "tensor", "list of numpy"])
def test_tokenizers_returning_array_types_are_read_as_ids(ids):
    import numpy as np

    from nope_interp.analysis import text_windows_of

    def encode(s):
        raw = [ord(c) % 61 for c in s]
        return {"numpy": np.array(raw), "numpy-int32": np.array(raw, dtype=np.int32), "tensor": torch.tensor(raw),
                "list of numpy": [np.int64(i) for i in raw]}[ids]

    got = text_windows_of(TEXTS, 8, None, encode)
    assert got.tolist() == _naive_windows([[ord(c) % 61 for c in t] for t in TEXTS], 8, None)


@pytest.mark.parametrize(("tokenizer", "texts", "match"), [
    (lambda s: [[1, 2, 3]] * len(s), TEXTS, "flat sequence"), (lambda s: None, TEXTS, "flat sequence"),
    (lambda s: 7, TEXTS, "flat sequence"), (lambda s: [-1] * len(s), TEXTS, "token ids are >= 0"),
    (None, (t for t in TEXTS), "list or tuple"), (None, set(TEXTS), "list or tuple")])
def test_bad_tokenizer_outputs_and_text_containers(tokenizer, texts, match):
    from nope_interp.analysis import text_windows_of
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=match):
        unhooked(text_windows_of)(texts, 8, None, tokenizer)


@pytest.mark.parametrize(("n_windows", "length", "limit", "per_token", "chars"),
                         [(3, 8, 64, 1, 64), (3, 8, 10_000, 1, None), (2, 5, 4, 0, 16), (20, 8, 8, 0, 512),
                          (200, 8, 64, 1, None), (200, 8, 8, 0, None)])
def test_text_file_reads_only_the_prefix_its_windows_need(tmp_path, monkeypatch, n_windows, length, limit, per_token,
                                                           chars):
    """A big --text-file is not read whole: the windows from a prefix equal the windows of the whole file;
    a prefix too short for one window, or for the windows asked, reads more (x4), up to the whole file."""
    from nope_interp.analysis import text_windows_of
    from nope_interp.jobs import analyze as job

    text = "".join(f"line {i}: to be or not to be.\n" for i in range(40))  # 1,160 characters
    path = tmp_path / "t.txt"
    path.write_text("\ufeff" + text, encoding="utf-8")
    monkeypatch.setattr(job, "TEXT_MIN_CHARS", limit)
    monkeypatch.setattr(job, "TEXT_CHARS_PER_TOKEN", per_token)
    windows, chars_read = job._text_file_windows(str(path), length, n_windows, None)
    assert torch.equal(windows, text_windows_of(text, length, n_windows))
    assert chars_read == chars  # None: the whole file


def test_text_helpers_refuse_wrong_types_in_one_line():
    """Before: raw TypeError / ValueError / ZeroDivisionError, and text_windows took seed="abc" or 1.5 as is."""
    from nope_interp import text
    from nope_interp.config import TextTrainConfig, preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model
    from nope_interp.text_train import bits_per_char, encode_text, load_text_run, train_text

    model = build_model(preset("tiny"))
    windows = encode_text("to be or not")[None]
    bpc, enc, load, tt, windows_of = (unhooked(f) for f in (bits_per_char, encode_text, load_text_run, train_text,
                                                            text.text_windows))
    cases = [
        *[(lambda b=b: bpc(model, windows, batch_size=b), "batch_size must be") for b in (0, -1, 1.5)],
        *[(lambda v=v: enc(v), "encode_text needs a str") for v in (5, b"ab", None)],
        *[(lambda v=v: load(v), "run_dir must be a non-empty path") for v in (None, 123, "")],
        (lambda: tt(preset("tiny"), {"steps": 2}, "/tmp/x-never"), "cfg must be a TextTrainConfig"),
        (lambda: tt(None, TextTrainConfig(), "/tmp/x-never"), "model_cfg must be a ModelConfig"),
        (lambda: unhooked(text.corpus)(["train"]), "unknown split"),
        *[(lambda s=s: windows_of(2, 16, seed=s), "seed must be an integer >= 0") for s in ([1], "abc", 1.5, -1)],
    ]
    for call, words in cases:
        with pytest.raises(NopeInterpError, match=words):
            call()
    assert bits_per_char(model, windows, batch_size=1) == pytest.approx(bits_per_char(model, windows))
