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
