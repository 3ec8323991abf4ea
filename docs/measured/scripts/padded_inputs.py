"""Do the trained models answer the inputs the authors' protocol feeds them? Exact match of the shipped
answer-only models with 0-5 leading newlines before every prompt (200 held-out prompts), the share of the
authors' inputs that are padded at all, and exact match on `window` inputs (earlier examples before the
prompt) for answer-only addition / reversal and a packed reversal model (README, "Faithful training").

Run: .venv/bin/python docs/measured/scripts/padded_inputs.py
"""
import tasks
from nope_interp.evaluate import exact_match_accuracy, exact_match_on_inputs
from nope_interp.pretrained import CANDIDATES_DIR, load_pretrained, load_run

for name in ("addition", "reversal", "ordering", "indexing"):
    r = load_pretrained(name)
    examples = [r.task.example(p) for p in r.task.analysis_prompts(200, 1, r.train_prompts)]
    by_pad = [exact_match_accuracy(r.model, r.task, examples, prefix="\n" * k) for k in (0, 1, 2, 3, 5)]
    inputs = tasks.protocol_inputs(r.task, "authors", 256, 1, r.train_prompts)
    padded = sum(x.startswith("\n") for x in inputs) / len(inputs)
    print(f"{name}: exact match with 0/1/2/3/5 leading newlines " + " / ".join(f"{a:.3f}" for a in by_pad)
          + f"; authors' inputs padded: {padded:.1%}")
for label, run in (("answer-only addition", load_pretrained("addition")),
                   ("answer-only reversal", load_pretrained("reversal")),
                   ("packed reversal (candidates/reversal-packed-s0)", load_run(CANDIDATES_DIR / "reversal-packed-s0"))):
    inputs = tasks.protocol_inputs(run.task, "window", 256, 1, run.train_prompts, 64)
    got = exact_match_on_inputs(run.model, run.task, inputs)
    print(f"{label}: exact match on window inputs {got.exact_match:.3f} ({got.n_scored} scored)")
