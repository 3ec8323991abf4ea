import random
import re
from pathlib import Path

import pytest
from conftest import unhooked

AUTHORS = Path(__file__).resolve().parent / "data" / "authors-data"
FILES = {"addition": ["train_3digit_1000.txt", "test_3digit_1000.txt"], "reversal": ["test_rev16_1000.txt"],
         "indexing": ["test_wherex9_1000.txt"], "ordering": ["test_order_1000.txt"]}


@pytest.fixture
def T():
    import tasks

    return tasks


def _authors_lines(name):
    files = [AUTHORS / f for f in FILES[name]]
    assert all(f.exists() for f in files), f"authors' data missing under {AUTHORS}"
    return [line for f in files for line in f.read_text().splitlines()]


@pytest.mark.parametrize("name", ["addition", "reversal", "indexing", "ordering"])
def test_checker_accepts_every_authors_line(T, name):
    task = T.get_task(name)
    lines = _authors_lines(name)
    assert len(lines) >= 1000
    rejected = [line for line in lines if not task.check_line(line)]
    assert rejected == []


@pytest.mark.parametrize("name", ["reversal", "indexing", "ordering"])
def test_generator_produces_the_authors_format(T, name):
    """Our lines and the authors' lines have the same shape: same characters classes at each place."""
    task = T.get_task(name)

    def shape(line):
        return re.sub(r"\d+", "D", line)

    authors = {shape(line) for line in _authors_lines(name)}
    ours = {shape(ex.line) for ex in task.splits(2000, 10, seed=3).train}
    assert ours == authors


def test_addition_generator_matches_the_authors_model_input(T):
    """The authors' plain a+b=c, turned into what their model saw ($a+b= and the reversed sum$)."""
    task = T.get_task("addition")
    for line in _authors_lines("addition")[:300]:
        a, b, c = re.fullmatch(r"(\d+)\+(\d+)=(\d+)", line).groups()
        ex = task.parse_line(line)
        assert ex.prompt == f"${a}+{b}=" and ex.answer == c[::-1] + "$"
        assert task.check_line(ex.line)
    ours = task.splits(500, 10, seed=1).train
    assert all(re.fullmatch(r"\$(0|[1-9]\d{0,2})\+(0|[1-9]\d{0,2})=\d+\$", ex.line) for ex in ours)


def test_answers_against_independent_solutions(T):
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randrange(1000), rng.randrange(1000)
        assert T.get_task("addition").solve(f"${a}+{b}=") == str(a + b)[::-1] + "$"
    assert T.get_task("reversal").solve("rev(5632718650825431)=") == "1345280568172365"
    assert T.get_task("indexing").solve("wherex(631023235,3)=") == "1"
    assert T.get_task("ordering").solve("order(74283,87234)=") == "30241"
    assert T.get_task("addition").solve("$123+456=") == "975$"


def test_checker_rejects_wrong_or_malformed_lines(T):
    assert not T.get_task("addition").check_line("$123+456=976$")
    assert not T.get_task("addition").check_line("$0123+456=975$")  # zero padding
    assert not T.get_task("reversal").check_line("rev(12)=12")
    assert not T.get_task("indexing").check_line("wherex(123,4)=0")  # 4 not in x
    assert not T.get_task("ordering").check_line("order(112,121)=010")  # repeated digit


@pytest.mark.parametrize("name", ["addition", "reversal", "indexing", "ordering"])
def test_splits_deterministic_disjoint_and_sized(T, name):
    task = T.get_task(name)
    a = task.splits(3000, 2000, seed=7)
    b = task.splits(3000, 2000, seed=7)
    c = task.splits(3000, 2000, seed=8)
    assert a == b and a != c
    assert len(a.train) == 3000 and len(a.test) == 2000
    train, test = {e.prompt for e in a.train}, {e.prompt for e in a.test}
    assert len(train) == 3000 and len(test) == 2000 and not (train & test)
    assert all(task.check_line(e.line) for e in a.train[:200] + a.test[:200])


def test_cached_splits_equal_freshly_built_ones_and_never_mix_keys(T, monkeypatch):
    """Splits are built once per (task, parameters, counts, seed): each key gives what distinct_prompts +
    example build by hand, another parameter, count or seed never gets another key's splits, and the cache
    keeps at most its size."""
    import tasks.base as B

    def by_hand(task, n_train, n_test, seed):
        examples = tuple(task.example(p) for p in task.distinct_prompts(n_train + n_test, seed))
        return B.Splits(train=examples[:n_train], test=examples[n_train:])

    monkeypatch.setattr(B, "_SPLITS_CACHE", B.OrderedDict())
    keys = [("addition", {"n_digits": 2}, 50, 20, 0), ("addition", {"n_digits": 3}, 50, 20, 0),
            ("addition", {"n_digits": 2}, 50, 20, 1), ("addition", {"n_digits": 2}, 40, 30, 0),
            ("reversal", {"n_digits": 2}, 50, 20, 0)]
    for _ in range(2):  # built, then from the cache
        for name, params, n_train, n_test, seed in keys:
            task = T.get_task(name, **params)  # a new Task object: the key is its parameters, not its identity
            got = task.splits(n_train, n_test, seed)
            assert got == by_hand(task, n_train, n_test, seed), (name, params, n_train, n_test, seed)
    assert len(B._SPLITS_CACHE) == len(keys)

    monkeypatch.setattr(B, "_SPLITS_CACHE_SIZE", 2)
    T.get_task("indexing").splits(10, 10, 0)
    assert len(B._SPLITS_CACHE) == 2


def test_default_split_sizes_are_the_papers(T):
    s = T.get_task("addition").splits()
    assert (len(s.train), len(s.test)) == (20_000, 20_000)


@pytest.mark.parametrize("name,params", [("addition", {"n_digits": 1}), ("reversal", {"n_digits": 2}),
                                         ("indexing", {"n_digits": 2}),
                                         pytest.param("ordering", {"n_digits": 3}, marks=pytest.mark.slow)])  # 17 s
def test_distinct_prompt_count_by_brute_force(T, name, params):
    """n_distinct_prompts against an independent count: sample until nothing new appears, on tiny spaces."""
    task = T.get_task(name, **params)
    rng = random.Random(0)
    seen = {task.sample(rng) for _ in range(200_000)}
    assert len(seen) == task.n_distinct_prompts()
    assert len(set(task.all_prompts())) == task.n_distinct_prompts()
    everything = task.splits(task.n_distinct_prompts() - 5, 5, seed=0)
    assert len({e.prompt for e in everything.train + everything.test}) == task.n_distinct_prompts()


def test_too_many_examples_is_a_clear_error(T):
    task = T.get_task("addition", n_digits=1)
    with pytest.raises(T.TaskError, match="allow only 100"):
        task.splits(80, 21)


@pytest.mark.parametrize("name,params,match", [
    ("addition", {"n_digits": 0}, "n_digits"), ("ordering", {"n_digits": 11}, "n_digits"),
    ("indexing", {"n_digits": 11}, "n_digits"), ("reversal", {"n_digits": "3"}, "n_digits"),
    ("addition", {"digits": 3}, "unknown parameter 'digits'"), ("sorting", {}, "available tasks"),
])
def test_bad_task_parameters(T, name, params, match):
    with pytest.raises(T.TaskError, match=match):
        T.get_task(name, **params)


def test_vocab_round_trip_and_unknown_character(T):
    assert T.D_VOCAB == 96 and len(set(T.VOCAB)) == 96
    text = "".join(T.VOCAB)
    assert T.decode(T.encode(text)) == text
    with pytest.raises(T.UnknownCharacterError, match="'é' at index 3"):
        T.encode("abcé")


def test_training_batch_targets_and_mask_line_up(T):
    task = T.get_task("addition")
    exs = [T.Example("$1+2=", "3$"), T.Example("$123+456=", "975$")]
    b = task.training_batch(exs)
    for row, ex in enumerate(exs):
        line = ex.prompt + ex.answer + "\n"
        n = len(line) - 1
        assert T.decode(b.tokens[row, :n]) == line[:-1]
        assert T.decode(b.targets[row, :n]) == line[1:]
        masked = T.decode(b.targets[row][b.loss_mask[row]])
        assert masked == ex.answer + "\n"


@pytest.mark.parametrize("name,length", [("addition", 9), ("reversal", 22), ("indexing", 20), ("ordering", 19)])
def test_analysis_prompts_have_the_full_prompt_length(T, name, length):
    task = T.get_task(name)
    prompts = task.analysis_prompts(64, seed=0)
    assert len(set(prompts)) == 64 and {len(p) for p in prompts} == {length} == {task.max_prompt_len}
    assert task.prompt_tokens(prompts).shape == (64, length)
    toks = task.analysis_tokens(64, seed=0, exclude=frozenset(prompts[:3]))  # the same sampler, encoded
    assert [T.decode(row) for row in toks] == task.analysis_prompts(64, seed=0, exclude=frozenset(prompts[:3]))
    assert not {T.decode(row) for row in toks} & set(prompts[:3])
    with pytest.raises(T.TaskError, match="one length"):
        task.prompt_tokens(["$1+2=", "$12+3="])


def test_authors_inputs_are_cut_left_padded_and_filtered():
    import tasks

    for name, length in tasks.AUTHORS_LENGTH.items():
        task = tasks.get_task(name)
        inputs = tasks.authors_inputs(task, 40, seed=3)
        assert len(inputs) == 40 and {len(x) for x in inputs} == {length}
        for x in inputs:
            body = x.lstrip("\n")
            assert len(body) >= length // 4 and "\n" not in body   # one line, padded on the left only
            if name == "addition":
                assert body.startswith("$")
    small = tasks.get_task("reversal", n_digits=4)
    assert tasks.authors_length(small) == small.max_prompt_len


def test_window_inputs_are_windows_of_held_out_lines():
    import tasks

    task = tasks.get_task("addition")
    train = frozenset(ex.prompt for ex in task.splits(200, 0, 0).train)
    windows = tasks.window_inputs(task, 5, 40, seed=1, exclude=train)
    assert [len(w) for w in windows] == [40] * 5
    for w in windows:
        for line in w.split("\n")[1:-1]:   # whole lines inside the window
            ex = task.parse_line(line)
            assert ex.prompt not in train


def test_protocol_inputs_dispatch_and_errors():
    import pytest

    import tasks

    task = tasks.get_task("ordering")
    assert tasks.protocol_inputs(task, "full", 3, seed=1) == task.analysis_prompts(3, 1)
    with pytest.raises(tasks.TaskError, match="unknown protocol 'padded'; allowed: full, authors, window"):
        tasks.protocol_inputs(task, "padded", 3)


@pytest.mark.parametrize("name", ["addition", "reversal", "indexing", "ordering"])
@pytest.mark.parametrize(("protocol", "window"), [("full", 64), ("authors", 64), ("window", 48), ("window", 60)])
def test_protocol_examples_are_contexts_of_the_protocol_length_ending_in_a_held_out_prompt(name, protocol, window):
    """Every context has the protocol's length and ends with a complete prompt whose answer is the example's
    answer (the task's solver, parsed back from the text); the final prompts are distinct held-out prompts;
    under ``authors`` only newlines come before the prompt; under ``window`` a newline does, and every whole
    line before it is a correct held-out line."""
    import tasks

    task = tasks.get_task(name)
    train = frozenset(ex.prompt for ex in task.splits(300, 0, 0).train)
    exs = tasks.protocol_examples(task, protocol, 30, seed=5, exclude=train, window=window)
    length = tasks.protocol_length(task, protocol, window)
    assert len(exs) == 30 and {len(ex.prompt) for ex in exs} == {length}
    finals = []
    for ex in exs:
        before, _, prompt = ex.prompt.rpartition("\n")
        assert task.solve(prompt) == ex.answer and prompt not in train
        finals.append(prompt)
        if protocol == "full":
            assert before == "" and len(prompt) == task.max_prompt_len
        elif protocol == "authors":
            assert set(before) <= {"\n"} and ex.prompt == prompt.rjust(length, "\n")
        else:
            assert ex.prompt[-len(prompt) - 1] == "\n"
            for line in before.split("\n")[1:]:  # whole lines (the first may be cut)
                assert task.parse_line(line).prompt not in train | {prompt}
    assert len(set(finals)) == 30
    assert tasks.protocol_examples(task, protocol, 30, seed=5, exclude=train, window=window) == exs
    if protocol != "full":
        assert tasks.protocol_examples(task, protocol, 30, seed=6, exclude=train, window=window) != exs


def test_too_many_analysis_prompts_fail_at_once():
    import time

    import tasks

    small = tasks.get_task("addition", n_digits=1)  # 100 prompts of any length
    t0 = time.perf_counter()
    with pytest.raises(tasks.TaskError, match="could not find 1000000 distinct full-length addition prompts: "
                                              "the parameters .* allow 100 prompts of any length; lower n"):
        small.analysis_prompts(10**6)
    assert time.perf_counter() - t0 < 5  # the old bound sampled 50 n prompts first (over a minute)
    assert len(small.analysis_prompts(20)) == 20


def test_protocol_examples_errors():
    import tasks

    task = tasks.get_task("reversal")
    with pytest.raises(tasks.TaskError, match="window=20 cannot hold a newline and the longest reversal prompt "
                                              r"\(22 characters\): window must be >= 23"):
        tasks.protocol_examples(task, "window", 3, window=20)
    with pytest.raises(tasks.TaskError, match="unknown protocol 'padded'"):
        tasks.protocol_examples(task, "padded", 3)
    with pytest.raises(tasks.TaskError, match="window=40 is only used with protocol 'window'"):
        tasks.protocol_examples(task, "authors", 3, window=40)
    for kwargs, match in [({"n": 0}, "n must be"), ({"seed": -1}, "seed must be")]:
        with pytest.raises(tasks.TaskError, match=match):
            tasks.protocol_examples(task, "authors", **{"n": 3, **kwargs})
    small = tasks.get_task("addition", n_digits=1)  # 100 prompts
    everything = frozenset(small.all_prompts())
    with pytest.raises(tasks.TaskError, match="only 4 held-out addition prompts .* 5 needed"):
        tasks.protocol_examples(small, "authors", 5, exclude=everything - set(sorted(everything)[:4]))


# --- only the vocabulary's ASCII digits ---------------------------------------------------------------
#: Zeros of digit scripts that Python's str.isdigit, int() and the regex class \d accept as digits.
FOREIGN_ZEROS = {"arabic-indic": 0x0660, "extended-arabic-indic": 0x06F0, "devanagari": 0x0966,
                 "bengali": 0x09E6, "fullwidth": 0xFF10, "mathematical-bold": 0x1D7CE}


def _foreign(digits: str, zero: int) -> str:
    return "".join(chr(zero + int(d)) for d in digits)


def _lines_with_foreign_digits(zero: int) -> list[tuple[str, str]]:
    """(task, line): correct lines once the foreign digits are read as their values; the first digit of each
    number stays ASCII so that only the digit class is tested."""
    f = lambda s: _foreign(s, zero)  # noqa: E731
    return [
        ("addition", f"$1{f('23')}+456=975$"),
        ("addition", f"1{f('23')}+456=579"),  # the authors' plain format
        ("addition", f"123+456=5{f('79')}"),
        ("reversal", f"rev(1{f('23')})={f('32')}1"),
        ("indexing", f"wherex(6{f('31023235')},{f('3')})=1"),
        ("indexing", f"wherex(631023235,3)={f('1')}"),
        ("ordering", f"order(7{f('4283')},{f('8')}7{f('234')})=30241"),
        ("ordering", f"order(74283,87234)=3{f('0241')}"),
    ]


@pytest.mark.parametrize("script", FOREIGN_ZEROS)
def test_check_line_and_parse_line_refuse_digits_outside_the_vocabulary(T, script):
    for name, line in _lines_with_foreign_digits(FOREIGN_ZEROS[script]):
        task = T.get_task(name)
        assert not task.check_line(line), (name, line)
        assert not task.check_line(line + "\n")
        assert re.fullmatch(task.line_pattern, line) is None
        with pytest.raises(T.TaskError, match="not a correct"):
            task.parse_line(line)
        ascii_line = "".join(str(int(c)) if c.isdigit() else c for c in line)  # the same line in ASCII is correct
        assert task.check_line(ascii_line), ascii_line


@pytest.mark.parametrize("script", FOREIGN_ZEROS)
def test_solve_refuses_prompts_with_digits_outside_the_vocabulary(T, script):
    f = lambda s: _foreign(s, FOREIGN_ZEROS[script])  # noqa: E731
    prompts = {"addition": [f"$1{f('23')}+456=", f"$123+4{f('5')}6="], "reversal": [f"rev(5{f('632718650825431')})="],
               "indexing": [f"wherex(6{f('31023235')},{f('3')})=", f"wherex(631023235,{f('3')})="],
               "ordering": [f"order(7{f('4283')},{f('8')}7{f('234')})=", f"order({f('74283')},{f('87234')})="]}
    for name, ps in prompts.items():
        task = T.get_task(name)
        for p in ps:
            with pytest.raises(T.TaskError, match="not an? .*prompt"):
                task.solve(p)
            with pytest.raises(T.TaskError):
                task.example(p)
            with pytest.raises(T.TaskError):
                task.is_correct(p, "1")


@pytest.mark.parametrize("text", ["$1²+1=2$", "rev(1²)=²1", "wherex(1³,³)=1", "order(1¹,¹1)=10", "$١+1=2$",
                                  "rev(１)=１", "rev(1\u200b)=1"])
def test_other_non_vocabulary_characters_are_refused_by_every_task(T, text):
    for name in T.TASK_NAMES:
        task = T.get_task(name)
        assert not task.check_line(text) and not task.check_line("rev(1)=1\u200b")
        with pytest.raises(T.TaskError):
            task.solve(text.split("=")[0] + "=")


@pytest.mark.parametrize("value", [None, b"rev(12)=21", 12, ["rev(12)=21"]])
def test_checkers_refuse_a_line_that_is_not_a_string_with_a_task_error(T, value):
    for name in T.TASK_NAMES:
        task = T.get_task(name)
        with pytest.raises(T.TaskError, match="must be a str"):
            unhooked(type(task).check_line)(task, value)
        with pytest.raises(T.TaskError, match="must be a str"):
            unhooked(type(task).solve)(task, value)


# --- a single string where a sequence is expected -----------------------------------------------------
def test_sequence_arguments_refuse_a_single_string_and_empty_prompts(T):
    task = T.get_task("addition")
    prompt_tokens, training_batch = unhooked(T.Task.prompt_tokens), unhooked(T.Task.training_batch)
    for bad, match in [("$1+2=", "single string"), ([], "at least one prompt"), ([""], "no empty prompt"),
                       (["$1+2=", 5], r"prompts\[1\] must be a str")]:
        with pytest.raises(T.TaskError, match=match):
            prompt_tokens(task, bad)
    ex = task.example("$1+2=")
    for bad, match in [("$1+2=3$", "single string"), (["$1+2=3$"], r"examples\[0\] must be an Example"),
                       ([ex, ("$1+2=", "3$")], r"examples\[1\]")]:
        with pytest.raises(T.TaskError, match=match):
            training_batch(task, bad)
        with pytest.raises(T.TaskError, match=match):
            unhooked(T.packed_stream)(bad, 0)
    calls = (lambda e: unhooked(T.Task.analysis_prompts)(task, 4, exclude=e),
             lambda e: unhooked(T.held_out_lines)(task, 4, 0, exclude=e),
             lambda e: unhooked(T.protocol_inputs)(task, "authors", 4, exclude=e),
             lambda e: unhooked(T.protocol_inputs)(task, "window", 4, exclude=e),
             lambda e: unhooked(T.protocol_examples)(task, "authors", 4, exclude=e),
             lambda e: unhooked(T.protocol_examples)(task, "window", 4, exclude=e))
    for call in calls:
        with pytest.raises(T.TaskError, match="exclude must be a sequence of prompts.*single string"):
            call("$123+456=")
    # sets, lists and frozensets still work
    assert len(task.analysis_prompts(4, exclude=frozenset(["$123+456="]))) == 4
    assert len(unhooked(T.Task.analysis_prompts)(task, 4, exclude=["$123+456="])) == 4


@pytest.mark.parametrize("name", ["addition", "reversal", "indexing", "ordering"])
@pytest.mark.parametrize("protocol", ["full", "authors", "window"])
def test_full_training_lines_in_exclude_exclude_their_prompts(T, name, protocol):
    """Before: exclude held prompts only, so a training file's full lines ('$964+494=8541$') matched nothing and
    the held-out guarantee was lost without a word. Now a line excludes its prompt (the same inputs as excluding
    the prompts)."""
    import tasks

    task = tasks.get_task(name)
    # the prompts each protocol would draw first, so that excluding them changes its inputs
    prompts = (task.analysis_prompts(40, seed=3) if protocol == "full"
               else [line.partition("=")[0] + "=" for line in tasks.held_out_lines(task, 40, 3)])
    lines = [task.example(p).line for p in prompts]
    by_prompt = tasks.protocol_inputs(task, protocol, 8, seed=3, exclude=frozenset(prompts))
    by_line = tasks.protocol_inputs(task, protocol, 8, seed=3, exclude=frozenset(lines))
    assert by_line == by_prompt
    assert by_line != tasks.protocol_inputs(task, protocol, 8, seed=3)
    with_newline = tasks.protocol_inputs(task, protocol, 8, seed=3, exclude=frozenset(x + "\n" for x in lines))
    assert with_newline == by_prompt
    # what is not a line of this task excludes nothing (another size's training prompts are passed on purpose)
    unexcluded = tasks.protocol_inputs(task, protocol, 8, seed=3)
    assert tasks.protocol_inputs(task, protocol, 8, seed=3, exclude=frozenset(["hello", "x=y", "$1+2=9"])) \
        == unexcluded


def test_decode_reads_only_integer_ids(T):
    import numpy as np
    import torch

    assert T.decode([2, 3]) == T.decode(torch.tensor([2, 3])) == unhooked(T.decode)([np.int64(2), 3]) == "01"
    for bad, match in [(["3"], "must be integers, got str '3'"), (["\u0663"], "must be integers, got str"),
                       ([2.0], "must be integers, got float"), ([True], "must be integers, got bool"),
                       ([96], "outside the vocabulary range"), ([-1], "outside the vocabulary range")]:
        with pytest.raises(ValueError, match=match):
            unhooked(T.decode)(bad)
    for bad in ("ab", torch.zeros(2, 2, dtype=torch.long), torch.zeros(2)):
        with pytest.raises(ValueError, match="ids must be"):
            unhooked(T.decode)(bad)


def test_get_task_refuses_a_name_that_is_not_a_string(T):
    for bad in (["addition"], None, 3):
        with pytest.raises(T.TaskError, match="unknown task .*; available tasks: addition"):
            unhooked(T.get_task)(bad)


def test_a_window_is_refused_with_the_protocols_that_would_ignore_it():
    """``protocol_inputs(task, "full", n, window=30)`` returned full-length prompts, the window silently dropped."""
    from conftest import unhooked

    import tasks

    task = tasks.get_task("addition")
    for protocol in ("full", "authors"):
        for window in (30, 8, 200, 64.0, "64"):  # (users run without the test hook's type checker)
            for fn, args in ((unhooked(tasks.protocol_inputs), (task, protocol, 4, 1, frozenset(), window)),
                             (unhooked(tasks.protocol_length), (task, protocol, window))):
                with pytest.raises(tasks.TaskError, match=f"window={window!r} is only used with protocol 'window'; "
                                                          f"with protocol '{protocol}' it would be ignored"):
                    fn(*args)
        import numpy as np

        with pytest.raises(tasks.TaskError, match="is only used with protocol 'window'"):  # not "ambiguous"
            unhooked(tasks.protocol_inputs)(task, protocol, 4, 1, window=np.array([64, 64]))
        # the default is accepted, and the inputs are those of no window at all
        assert tasks.protocol_inputs(task, protocol, 4, 1, window=64) == tasks.protocol_inputs(task, protocol, 4, 1)
        assert tasks.protocol_length(task, protocol, 64) == tasks.protocol_length(task, protocol)
    assert tasks.protocol_length(task, "window", 30) == 30


def test_protocol_inputs_and_lengths_refuse_seeds_and_windows_that_are_not_integers():
    """A None seed drew new inputs on every call, a negative one repeated another seed's inputs."""
    from conftest import unhooked

    import tasks

    task = tasks.get_task("reversal")
    inputs, length = unhooked(tasks.protocol_inputs), unhooked(tasks.protocol_length)
    for protocol in tasks.PROTOCOLS:
        window = 30 if protocol == "window" else 64
        for seed in (None, -1, "1", 1.5, True):
            with pytest.raises(tasks.TaskError, match="seed must be an integer"):
                inputs(task, protocol, 4, seed, window=window)
        assert tasks.protocol_inputs(task, protocol, 4, 3, window=window) == tasks.protocol_inputs(
            task, protocol, 4, 3, window=window)
    for window in (0, -5, "64", None, 64.5, True):
        with pytest.raises(tasks.TaskError, match="window must be an integer"):
            length(task, "window", window)
    with pytest.raises(tasks.TaskError, match="task must be a tasks.Task"):
        length("reversal", "full")
    assert [tasks.protocol_length(task, p, 30 if p == "window" else 64) for p in tasks.PROTOCOLS] == [22, 22, 30]


def test_too_few_prompts_says_whether_the_exclusion_is_why(T):
    """When the excluded prompts leave too few, the message says so (lowering n alone may not help)."""
    task = T.get_task("addition", n_digits=1)  # 100 full-length prompts in all
    every = frozenset(task.analysis_prompts(100, seed=0))
    with pytest.raises(T.TaskError, match=r"outside the 100 excluded ones \(found 0\); lower n or exclude fewer"):
        task.analysis_prompts(4, seed=0, exclude=every)
    with pytest.raises(T.TaskError, match=r"could not find 101 distinct full-length addition prompts: the "
                                          r"parameters .* allow 100 prompts of any length; lower n$"):
        task.analysis_prompts(101, seed=0)


def test_every_protocol_taking_api_defaults_to_the_one_window_the_others_accept():
    """The default window was the literal 64 in eleven signatures, and the protocols other than ``window``
    accept only that value: a default changed in one place would make the others refuse their own default."""
    import dataclasses
    import inspect

    import tasks
    from nope_interp import analysis, averaging_checks
    from nope_interp.jobs import analyze, averaging, common, compare, demo, probe, trajectory

    functions = [tasks.protocol_length, tasks.protocol_inputs, analysis.protocol_prompts, common.protocol_tag,
                 common.with_protocol, averaging_checks.cosine_example]
    functions += [getattr(mod, name) for mod in (analysis, averaging_checks, common)
                  for name, obj in vars(mod).items() if inspect.isfunction(obj) and obj.__module__ == mod.__name__
                  and "window" in inspect.signature(obj).parameters and obj not in functions]
    seen = 0
    for fn in functions:
        param = inspect.signature(fn).parameters["window"]
        if param.default is not inspect.Parameter.empty:
            assert param.default == tasks.DEFAULT_WINDOW, fn.__qualname__
            seen += 1
    configs = [obj for mod in (analyze, averaging, compare, demo, probe, trajectory) for obj in vars(mod).values()
               if dataclasses.is_dataclass(obj) and "window" in {f.name for f in dataclasses.fields(obj)}
               and {"protocol", "protocols"} & {f.name for f in dataclasses.fields(obj)}]
    for cfg in configs:
        assert {f.name: f.default for f in dataclasses.fields(cfg)}["window"] == tasks.DEFAULT_WINDOW, cfg
    assert seen >= 8 and len(set(configs)) >= 6
    for protocol in ("full", "authors"):  # the default is what they accept
        assert tasks.protocol_length(tasks.get_task("ordering"), protocol, tasks.DEFAULT_WINDOW) > 0
