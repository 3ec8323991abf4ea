import pytest
import torch


def test_batched_greedy_decoding_equals_one_prompt_at_a_time(tiny_cfg):
    """Grouping prompts by length must not change any answer (no padding enters the model)."""
    import tasks
    from nope_interp.evaluate import predict
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.5, seed=3))  # large weights: varied greedy outputs
    task = tasks.get_task("addition")
    prompts = [ex.prompt for ex in task.splits(40, 1, seed=2).train]
    assert len({len(p) for p in prompts}) > 1
    batched = predict(model, task, prompts, batch_size=7)
    for p, got in zip(prompts, batched, strict=True):
        toks = torch.tensor([tasks.encode(p)])
        for _ in range(task.max_answer_len + 1):
            with torch.no_grad():
                nxt = model(toks, return_type="logits")[0, -1].argmax()
            toks = torch.cat([toks, nxt.view(1, 1)], dim=1)
        assert got == tasks.decode(toks[0, len(p):]).split("\n")[0]
    assert len(set(batched)) > 1


def test_exact_match_counts_whole_answers(tiny_model, monkeypatch):
    import nope_interp.evaluate as E
    import tasks

    task = tasks.get_task("addition")
    exs = [tasks.Example("$1+2=", "3$"), tasks.Example("$5+5=", "01$"), tasks.Example("$9+9=", "81$")]
    monkeypatch.setattr(E, "predict", lambda model, task, prompts, batch_size=1024, prefix="": ["3$", "01", "81$"])
    assert E.exact_match_accuracy(tiny_model, task, exs) == pytest.approx(2 / 3)


def test_decode_refuses_to_overflow_n_ctx(tiny_model):
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import greedy_decode

    with pytest.raises(NopeInterpError, match="n_ctx=48 is too small"):
        greedy_decode(tiny_model, torch.zeros(1, 40, dtype=torch.long), 10)


def test_prefix_goes_before_every_prompt_and_is_not_part_of_the_answer(tiny_cfg):
    """predict(prefix="\\n") equals decoding "\\n" + prompt by hand."""
    import torch

    import tasks
    from nope_interp.evaluate import greedy_decode, predict
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(seed=9))
    task = tasks.get_task("addition", n_digits=2)
    prompts = ["$12+34=", "$5+67="]
    got = predict(model, task, prompts, prefix="\n")
    for p, g in zip(prompts, got, strict=True):
        new = greedy_decode(model, torch.tensor([tasks.encode("\n" + p)]), task.max_answer_len + 1)[0]
        assert g == tasks.decode(new).split("\n")[0]


def test_decoding_and_the_answer_loss_refuse_token_ids_outside_the_vocabulary(tiny_model):
    import pytest
    import torch

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import answer_loss, greedy_decode

    for bad in (torch.full((1, 4), -1), torch.tensor([[3, 96]]), torch.tensor([[1, 2], [700, 0]])):
        with pytest.raises(NopeInterpError, match=r"prompt_tokens must be token ids in \[0, 96\)"):
            greedy_decode(tiny_model, bad, 2)
    task = tasks.get_task("addition")
    batch = task.training_batch([task.example(p) for p in task.analysis_prompts(4)])
    assert answer_loss(tiny_model, batch).item() > 0
    for field, value, match in (("tokens", -1, r"batch.tokens must be token ids in \[0, 96\).*got -1"),
                                ("tokens", 96, r"batch.tokens .*got 96"),
                                ("targets", -5, r"batch.targets\[loss_mask\] .*got -5"),
                                ("targets", 1000, r"batch.targets\[loss_mask\] .*got 1000")):
        t = getattr(batch, field).clone()
        where = batch.loss_mask.nonzero()[0]
        t[tuple(where)] = value
        bad_batch = tasks.Batch(**{**{f: getattr(batch, f) for f in ("tokens", "targets", "loss_mask")}, field: t})
        with pytest.raises(NopeInterpError, match=match):
            answer_loss(tiny_model, bad_batch)


@pytest.mark.parametrize("prompts,match", [
    ([""], r"prompts\[0\] is empty"),
    (["$1+2=", ""], r"prompts\[1\] is empty"),
    ("$1+2=", "single string '\\$1\\+2=' \\(write \\['\\$1\\+2='\\] for one prompt\\)"),
    ([b"$1+2="], r"prompts\[0\] must be a string, got bytes"),
    ([None], r"prompts\[0\] must be a string, got NoneType"),
    (["$1\u0662+2="], r"prompts\[0\]: character '\u0662' at index 2"),
    (["$1+2=", "$\uff11+2="], r"prompts\[1\]: character '\uff11' at index 1"),
])
def test_predict_names_the_bad_prompt(tiny_model, addition_task, prompts, match):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import predict

    with pytest.raises(NopeInterpError, match=match) as err:
        unhooked(predict)(tiny_model, addition_task, prompts)
    assert "\n" not in str(err.value)


def test_predict_and_greedy_decode_refuse_bad_sizes(tiny_model, addition_task):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import exact_match_accuracy, greedy_decode, predict

    for bs in (0, -1, 1.5, True):
        with pytest.raises(NopeInterpError, match="batch_size must be an integer >= 1"):
            unhooked(predict)(tiny_model, addition_task, ["$1+2="], batch_size=bs)
    for shape in ((1, 0), (0, 3), (3,)):
        with pytest.raises(NopeInterpError, match="prompt_tokens must be 2-D"):
            unhooked(greedy_decode)(tiny_model, torch.zeros(shape, dtype=torch.long), 2)
    for n in (-1, 2.0):
        with pytest.raises(NopeInterpError, match="max_new_tokens must be an integer >= 0"):
            unhooked(greedy_decode)(tiny_model, torch.zeros((1, 3), dtype=torch.long), n)
    for examples, match in [("$1+2=3$", "non-empty sequence"), ([], "non-empty sequence"),
                            (["$1+2="], r"examples\[0\] must be a tasks.Example")]:
        with pytest.raises(NopeInterpError, match=match):
            unhooked(exact_match_accuracy)(tiny_model, addition_task, examples)
    assert predict(tiny_model, addition_task, [""], prefix="\n")[0] is not None  # a prefix alone is one token
    assert predict(tiny_model, addition_task, []) == []


def _recomputed(model, toks, n_new):
    """Greedy decoding by rerunning the whole sequence for every new token (the reference)."""
    for _ in range(n_new):
        with torch.no_grad():
            nxt = model(toks, return_type="logits")[:, -1].argmax(-1, keepdim=True)
        toks = torch.cat([toks, nxt], dim=1)
    return toks


@pytest.mark.parametrize("changes", [{}, {"positional": "learned"}, {"positional": "rotary"},
                                     {"positional": "rotary", "nope_layers": (1,)},
                                     {"tied_embeddings": True, "dropout": 0.2}, {"normalization": "RMS"},
                                     {"normalization": "none", "biases": True},
                                     {"n_layers": 3, "n_heads": 4, "d_head": 8}])
def test_cached_decoding_equals_recomputing_the_whole_sequence(tiny_cfg, changes):
    """The key-value-cached greedy decode gives the same tokens as rerunning every prefix, for every
    positional type (NoPE, learned, rotary, a NoPE layer in a rotary model), tied embeddings with dropout
    (eval mode), every normalisation; and its last-step logits agree to float rounding."""
    import nope_interp.evaluate as E
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.4, seed=5, **changes)).eval()
    assert E.kv_cache_unsupported(model) is None
    gen = torch.Generator().manual_seed(len(changes))
    for length, n_new in ((1, 6), (7, 12), (20, 27)):
        toks = torch.randint(0, 96, (9, length), generator=gen)
        ref = _recomputed(model, toks, n_new)
        got = E.greedy_decode(model, toks, n_new)
        assert torch.equal(got, ref[:, length:])
        assert len(set(map(tuple, got.tolist()))) > 1  # varied outputs: the comparison can fail
    cache = E.TransformerLensKeyValueCache.init_cache(model.cfg, "cpu", 9)
    head, last = ref[:, :-1], ref[:, -1:]
    with torch.no_grad():
        model(head, return_type="logits", past_kv_cache=cache, attention_mask=torch.ones_like(head))
        step = model(last, return_type="logits", past_kv_cache=cache, attention_mask=torch.ones_like(last))
        full = model(ref, return_type="logits")
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-4, rtol=1e-4)


def test_decoding_with_hooks_training_mode_or_local_attention_recomputes(tiny_cfg):
    """A hook attached to the model sees every position at every step (no cache); so does training mode
    and sliding-window attention (kv_cache_unsupported names why), and the tokens equal the reference."""
    import nope_interp.evaluate as E
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.4, seed=6))
    toks = torch.randint(0, 96, (4, 5), generator=torch.Generator().manual_seed(0))
    seen = []

    def record(x, hook):
        seen.append(x.shape[1])

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", record)]):
        assert "blocks.0.hook_resid_mid" in E.kv_cache_unsupported(model)
        got = E.greedy_decode(model, toks, 6)
    assert seen == [5, 6, 7, 8, 9, 10]
    assert E.kv_cache_unsupported(model) is None  # the hook is gone
    handle = model.blocks[1].register_forward_hook(lambda m, i, o: None)  # a plain torch hook counts too
    assert "blocks.1" in E.kv_cache_unsupported(model)
    handle.remove()
    model.train()
    assert E.kv_cache_unsupported(model) == "training mode"
    model.eval()
    assert torch.equal(got, E.greedy_decode(model, toks, 6))
    local = build_model(tiny_cfg.replace(init_std=0.4, attention="sliding", window=3)).eval()
    assert E.kv_cache_unsupported(local) == "local attention"
    torch.testing.assert_close(E.greedy_decode(local, toks, 6), _recomputed(local, toks, 6)[:, 5:])


def test_attached_hooks_skips_the_models_own_dropout(tiny_cfg):
    from nope_interp.fast_forward import attached_hooks
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(dropout=0.1))
    assert attached_hooks(model) == []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: x)]):  # the dropout hook's own site
        assert attached_hooks(model) == ["hook_embed"]
    assert attached_hooks(model) == []


def test_bidirectional_models_decode_without_a_cache(tiny_cfg):
    """With bidirectional attention earlier positions change as tokens are added: no cache, and the answers
    equal rerunning the whole sequence."""
    import nope_interp.evaluate as E
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(attention="bidirectional", init_std=0.4, seed=2)).eval()
    assert E.kv_cache_unsupported(model) == "bidirectional attention"
    toks = torch.randint(0, 96, (12, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(E.greedy_decode(model, toks, 8), _recomputed(model, toks, 8)[:, 6:])


def test_attached_hooks_counts_dropout_in_training_mode(tiny_cfg):
    from nope_interp.fast_forward import attached_hooks
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(dropout=0.3))
    assert attached_hooks(model.eval()) == []
    assert "hook_embed" in attached_hooks(model.train())


@pytest.mark.parametrize("prefix", ["", "\n", "\n\n$1+1=2$\n"])
def test_answer_token_loss_equals_a_one_example_at_a_time_loop(tiny_cfg, prefix):
    """The batched, right-padded loss equals -log p(answer char) summed one example and one character at a
    time with unpadded inputs, divided by the number of answer characters (the ending newline not scored)."""
    import tasks
    from nope_interp.evaluate import answer_token_loss
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.3, seed=5))
    task = tasks.get_task("addition", n_digits=2)
    examples = list(task.splits(30, 1, seed=4).train)
    assert len({len(ex.prompt + ex.answer) for ex in examples}) > 1  # padding is exercised
    total, count = 0.0, 0
    for ex in examples:
        for k in range(len(ex.answer)):
            ids = tasks.encode(prefix + ex.prompt + ex.answer[:k])
            with torch.no_grad():
                logp = model(torch.tensor([ids]), return_type="logits")[0, -1].log_softmax(-1)
            total -= float(logp[tasks.encode(ex.answer[k])[0]])
            count += 1
    for batch_size in (1, 7, 1024):
        got = answer_token_loss(model, task, examples, batch_size=batch_size, prefix=prefix)
        assert got == pytest.approx(total / count, rel=1e-5)


def test_answer_token_loss_of_a_prompt_blind_model_is_the_answers_entropy(tiny_cfg, monkeypatch):
    """A model whose logits are the log of the answers' own distribution, whatever the prompt, scores exactly
    that distribution's entropy (the baseline the docstring names), and a model sure of the answer scores 0."""
    import collections
    import math

    import tasks
    from nope_interp.evaluate import answer_token_loss
    from nope_interp.model import build_model

    task = tasks.get_task("indexing", n_digits=4)
    examples = list(task.splits(200, 1, seed=1).train)
    counts = collections.Counter(ex.answer for ex in examples)
    probs = torch.full((tiny_cfg.d_vocab,), 1e-30)
    for a, c in counts.items():
        probs[tasks.encode(a)[0]] = c / len(examples)
    entropy = -sum(c / len(examples) * math.log(c / len(examples)) for c in counts.values())
    model = build_model(tiny_cfg)
    monkeypatch.setattr(type(model), "forward", lambda self, tokens, return_type="logits": probs.log().expand(
        *tokens.shape, -1).clone())
    assert answer_token_loss(model, task, examples) == pytest.approx(entropy, rel=1e-6)

    def sure(self, tokens, return_type="logits"):  # puts all its mass on the right next token
        out = torch.full((*tokens.shape, tiny_cfg.d_vocab), -1e4)
        for ex in examples:
            ids = tasks.encode(ex.prompt + ex.answer)
            for b in range(tokens.shape[0]):
                if tokens[b, : len(ids) - 1].tolist() == ids[:-1]:
                    out[b, torch.arange(len(ids) - 1), torch.tensor(ids[1:])] = 0.0
        return out

    monkeypatch.setattr(type(model), "forward", sure)
    assert answer_token_loss(model, task, examples[:20], batch_size=1) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", ["answer_token_loss", "exact_match_accuracy"])
def test_answer_token_loss_and_exact_match_refuse_bad_examples(tiny_model, name):
    """The same examples refused by both functions that score answers (an empty answer would count as right
    whenever the model stops at once; one holding a newline could never be matched)."""
    from conftest import unhooked

    import tasks
    from nope_interp import evaluate
    from nope_interp.errors import NopeInterpError

    task = tasks.get_task("addition", n_digits=2)
    ex = [task.example("$12+34=")]
    fn = unhooked(getattr(evaluate, name))
    def E(prompt, answer):  # an Example with any fields (the test run's type checker refuses them in __init__)
        ex = object.__new__(tasks.Example)
        object.__setattr__(ex, "prompt", prompt)
        object.__setattr__(ex, "answer", answer)
        return ex

    for kwargs, match in [({"examples": []}, "non-empty sequence"), ({"examples": "$1+2="}, "non-empty sequence"),
                          ({"examples": ["$1+2="]}, r"examples\[0\] must be a tasks.Example"),
                          ({"examples": ex[0]}, "non-empty sequence"), ({"examples": iter(ex)}, "non-empty sequence"),
                          ({"examples": [E("", "64$")]}, r"examples\[0\].prompt must be a non-empty string"),
                          ({"examples": [E("$12+34=", "")]}, r"examples\[0\].answer must be a non-empty string"),
                          ({"examples": [E("$12+34=", 64)]}, r"examples\[0\].answer must be a non-empty string"),
                          ({"examples": [E(None, "64$")]}, r"examples\[0\].prompt must be a non-empty string"),
                          ({"examples": [E("$12+34=", "64$\n")]}, "holds a newline"),
                          ({"batch_size": 0}, "batch_size must be an integer >= 1"),
                          # (exact_match_accuracy hands its prefix to predict: tested there)
                          *([({"prefix": 3}, "prefix must be a string"),
                             ({"prefix": "é"}, r"examples\[0\] with prefix"),
                             ({"prefix": "\n" * 60}, "more than the model's n_ctx=48")]
                            if name == "answer_token_loss" else [])]:
        args = {"examples": ex, **kwargs}
        with pytest.raises(NopeInterpError, match=match):
            fn(tiny_model, task, args.pop("examples"), **args)


def test_prompt_in_input_finds_the_last_complete_prompt_and_its_context():
    import tasks
    from nope_interp.evaluate import prompt_in_input

    add = tasks.get_task("addition")
    rev = tasks.get_task("reversal")
    cases = [(add, "$123+456=", ("$123+456=", "$123+456=")),
             (add, "\n\n\n$12+4=", ("\n\n\n$12+4=", "$12+4=")),  # the authors' left padding is context
             (add, "$1+2=3$\n$45+6=15$\n$7+", ("$1+2=3$\n$45+6=", "$45+6=")),  # a window: the last whole prompt
             (add, "+2=3$\n$45+6", None),  # a window cut before any complete prompt
             (add, "$123+45", None),
             (rev, "\n\nrev(123)=321", ("\n\nrev(123)=", "rev(123)=")),  # answer characters after it dropped
             (rev, "rev(12=3)=", None)]  # '=' inside the operand: no valid prompt ends at either '='
    for task, text, expected in cases:
        assert prompt_in_input(task, text) == expected, text


def test_exact_match_on_inputs_equals_a_greedy_loop_on_each_context(tiny_cfg):
    """Against a hand-written greedy loop on the context of each input; inputs with no complete prompt or
    too long for n_ctx are counted but not scored."""
    import tasks
    from nope_interp.evaluate import exact_match_on_inputs, prompt_in_input
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.5, seed=3))  # n_ctx 48
    task = tasks.get_task("addition", n_digits=2)
    inputs = ["$12+34=", "\n\n$1+2=", "$5+6=11$\n$7+8=", "$12+3", "\n" * 44 + "$1+2="]
    got = exact_match_on_inputs(model, task, inputs)
    assert (got.n_scored, got.n_inputs) == (3, 5)
    right = 0
    for text in inputs[:3]:
        ctx, prompt = prompt_in_input(task, text)
        toks = torch.tensor([tasks.encode(ctx)])
        for _ in range(task.max_answer_len + 1):
            with torch.no_grad():
                nxt = model(toks, return_type="logits")[0, -1].argmax()
            toks = torch.cat([toks, nxt.view(1, 1)], dim=1)
        right += tasks.decode(toks[0, len(ctx):]).split("\n")[0] == task.solve(prompt)
    assert got.exact_match == pytest.approx(right / 3)
    # a model that always answers right scores 1 on every protocol's inputs; none scorable gives None
    import nope_interp.evaluate as E

    real = E.predict
    try:
        E.predict = lambda model, task, prompts, batch_size=1024, prefix="": [
            task.solve(prompt_in_input(task, p)[1]) for p in prompts]
        for protocol in ("full", "authors", "window"):
            inputs = tasks.protocol_inputs(task, protocol, 20, seed=1, window=30 if protocol == "window" else 64)
            r = exact_match_on_inputs(model, task, inputs)
            assert r.exact_match == 1.0 and 0 < r.n_scored <= r.n_inputs == 20
    finally:
        E.predict = real
    assert exact_match_on_inputs(model, task, ["$12+3"]).to_dict() == {"exact_match": None, "n_scored": 0,
                                                                       "n_inputs": 1}


def test_exact_match_on_inputs_refuses_bad_input(tiny_model):
    from conftest import unhooked

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import exact_match_on_inputs

    fn = unhooked(exact_match_on_inputs)
    task = tasks.get_task("addition", n_digits=2)
    for inputs, match in [("$1+2=", "sequence of input strings"), (["$1+2=", 3], r"inputs\[1\] must be a string"),
                          (["\né\n$1+2="], "vocabulary|not in"), ({"$1+2="}, "sequence of input strings")]:
        with pytest.raises(NopeInterpError, match=match):
            fn(tiny_model, task, inputs)
    with pytest.raises(NopeInterpError, match="task must be a tasks.Task"):
        fn(tiny_model, "addition", ["$1+2="])


def test_answer_token_loss_does_not_depend_on_batching_whatever_the_attention(tiny_cfg):
    """Lines are grouped by length, never padded: a bidirectional model (where right padding would change
    every position) gives the same loss for any batch size."""
    import tasks
    from nope_interp.evaluate import answer_token_loss
    from nope_interp.model import build_model

    task = tasks.get_task("addition", n_digits=3)
    examples = [task.example(p) for p in ("$1+2=", "$123+456=", "$12+3=", "$999+1=", "$5+55=")]
    for attention in ("causal", "bidirectional"):
        model = build_model(tiny_cfg.replace(attention=attention, init_std=0.3, seed=2))
        got = [answer_token_loss(model, task, examples, batch_size=b) for b in (1, 2, 1024)]
        assert max(got) - min(got) < 1e-6, (attention, got)


def test_prompt_in_input_checks_its_arguments_and_is_linear(tiny_model, monkeypatch):
    from conftest import unhooked

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import exact_match_on_inputs, prompt_in_input

    rev = tasks.get_task("reversal")
    fn = unhooked(prompt_in_input)
    for args, match in [((rev, b"rev(1)="), "text must be a string"), ((rev, None), "text must be a string"),
                        (("reversal", "rev(1)="), "task must be a tasks.Task"),
                        ((rev, "rev(1)=", 0), "max_context must be None or an integer >= 1")]:
        with pytest.raises(NopeInterpError, match=match):
            fn(*args)
    assert prompt_in_input(rev, "rev(12)=21\nrev(345)=", max_context=12) == ("rev(12)=", "rev(12)=")
    # linear: only candidates no longer than a prompt are parsed (it parsed every '=', each over the whole text
    # before it: 6.5 s for 100,000 '='); counted, not timed
    calls = []
    real = type(rev).solve
    monkeypatch.setattr(type(rev), "solve", lambda self, prompt: (calls.append(len(prompt)), real(self, prompt))[1])
    assert prompt_in_input(rev, "=" * 200_000) is None and prompt_in_input(rev, "rev(1" + "=1" * 100_000) is None
    assert len(calls) <= 2 * rev.max_prompt_len and max(calls) <= rev.max_prompt_len
    monkeypatch.undo()
    em = unhooked(exact_match_on_inputs)
    task = tasks.get_task("addition", n_digits=2)
    with pytest.raises(NopeInterpError, match=r"inputs\[2\]: .*'é'"):
        em(tiny_model, task, ["hello", "$1+", "é\n$12+34="])
    for inputs, kwargs, match in [([], {}, "non-empty sequence"), (["hello"], {"batch_size": 0}, "batch_size")]:
        with pytest.raises(NopeInterpError, match=match):
            em(tiny_model, task, inputs, **kwargs)


def test_exact_match_refuses_answers_no_greedy_answer_can_equal(tiny_model):
    """An answer with a character outside the vocabulary, or longer than what predict generates for the task,
    could only ever score 0: refused, naming the example, instead of a silent 0.0."""
    from conftest import unhooked

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import exact_match_accuracy

    task = tasks.get_task("addition", n_digits=2)  # answers of at most 4 characters ("123$")
    ok = task.example("$12+34=")

    def E(prompt, answer):
        ex = object.__new__(tasks.Example)
        object.__setattr__(ex, "prompt", prompt)
        object.__setattr__(ex, "answer", answer)
        return ex

    fn = unhooked(exact_match_accuracy)
    for bad, match in [(E("$1+2=", "é"), r"examples\[1\].answer: .*not in the vocabulary"),
                       (E("$1+2=", "1" * 40), r"examples\[1\].answer has 40 characters, more than the 4 of 'addition'"),
                       (E("$1+2=", "12345"), r"examples\[1\].answer has 5 characters")]:
        with pytest.raises(NopeInterpError, match=match):
            fn(tiny_model, task, [ok, bad])
    assert 0.0 <= fn(tiny_model, task, [ok, E("$1+2=", "3$")]) <= 1.0  # up to max_answer_len: scored
    with pytest.raises(NopeInterpError, match="exact_match_accuracy: task must be a tasks.Task"):
        fn(tiny_model, "addition", [ok])


def test_protocol_prompts_refuses_what_is_not_a_model():
    from conftest import unhooked

    import tasks
    from nope_interp.analysis import protocol_prompts
    from nope_interp.errors import NopeInterpError

    for bad in (None, "tiny", 3):
        with pytest.raises(NopeInterpError, match="model must be a TransformerLens model"):
            unhooked(protocol_prompts)(bad, tasks.get_task("addition"), 4, 0)


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning")
def test_answer_loss_refuses_batches_it_would_average_wrongly_or_crash_on(tiny_model):
    """An all-False loss_mask returned NaN; 0/1 integer masks, masks and targets of another shape, a plain tuple
    and too many positions failed deep in torch / TransformerLens. Each is now one line naming the field."""
    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import answer_loss
    from tasks import Batch

    def Batch_(tokens, targets, loss_mask):  # noqa: N802 - a Batch past the test hook's type checker
        batch = Batch.__new__(Batch)
        for name, value in (("tokens", tokens), ("targets", targets), ("loss_mask", loss_mask)):
            object.__setattr__(batch, name, value)
        return batch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 96, (2, 6), generator=g)
    targets = torch.randint(0, 96, (2, 6), generator=g)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 3:] = True
    ref = answer_loss(tiny_model, Batch(tokens, targets, mask))
    # independent reference: -log softmax at each selected position, averaged by hand
    with torch.no_grad():
        logp = torch.log_softmax(tiny_model(tokens, return_type="logits").double(), -1)
    naive = -sum(float(logp[b, p, targets[b, p]]) for b in range(2) for p in range(3, 6)) / 6
    assert float(ref.detach()) == pytest.approx(naive, rel=1e-5)
    for fast in (False, True):  # 0/1 integers are the boolean mask
        got = unhooked(answer_loss)(tiny_model, Batch_(tokens, targets, mask.long()), fast=fast)
        assert float(got) == pytest.approx(float(ref), rel=1e-5)
    n_ctx = tiny_model.cfg.n_ctx
    long = torch.zeros(1, n_ctx + 1, dtype=torch.long)
    cases = [
        (Batch_(tokens, targets, torch.zeros_like(mask)), "selects no position"),
        (Batch_(tokens, targets, mask.long() * 2), "must be boolean"),
        (Batch_(tokens, targets, mask.float()), "must be boolean"),
        (Batch_(tokens, targets, mask[:, :4]), r"batch.loss_mask must be a tensor of the tokens' shape \(2, 6\)"),
        (Batch_(tokens, targets[:1], mask), r"batch.targets must be a tensor of the tokens' shape"),
        ((tokens, targets, mask), "batch must be a tasks.Batch"),
        (Batch_(long, long, torch.ones_like(long, dtype=torch.bool)), f"more than the model's n_ctx={n_ctx}"),
    ]
    for batch, match in cases:
        for fast in (False, True):
            with pytest.raises(NopeInterpError, match=match):
                unhooked(answer_loss)(tiny_model, batch, fast=fast)


@pytest.mark.parametrize(("on_inputs", "test_acc", "flagged"), [
    (0.004, 0.5896, True),   # the 256-character reversal model late in its windows
    (0.504, 0.5896, False),  # 0.086 below: within the margin
    (0.88, 0.99, True), (0.89, 0.99, False), (1.0, 0.99, False),
    (None, 0.99, False), (0.5, None, False), (float("nan"), 0.99, False), (0.5, float("nan"), False)])
def test_off_distribution_is_more_than_the_margin_below_the_test_exact_match(on_inputs, test_acc, flagged):
    from nope_interp.evaluate import OFF_DISTRIBUTION_MARGIN, off_distribution

    assert OFF_DISTRIBUTION_MARGIN == 0.1
    assert off_distribution(on_inputs, test_acc) is flagged
    assert off_distribution(on_inputs, test_acc, margin=0.0) is (on_inputs is not None and test_acc is not None
                                                                  and on_inputs == on_inputs and test_acc == test_acc
                                                                  and on_inputs < test_acc)
