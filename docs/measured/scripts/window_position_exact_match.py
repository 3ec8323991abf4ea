"""Exact match of a packed model by where the prompt ends in its analysis window: the numbers quoted in the README
("Faithful training") and docs/faithful-training.md for the 256-character reversal run.

For 64 `window` inputs of WINDOW characters (tasks.protocol_inputs, prompt seed 1, the training lines
excluded), the last complete prompt ending within MAX characters (nope_interp.evaluate.prompt_in_input) is
answered greedily after everything before it in the window; the table gives the exact match for several MAX, and
for the same prompts alone after one newline (how the run was evaluated while training).

Run: .venv/bin/python docs/measured/scripts/window_position_exact_match.py [RUN_DIR] [WINDOW]
     (default runs/reversal-packed-w256-drop02-s0 and 256; the run is in runs/, not in the repository: its
     config.json command retrains it; about a minute on one thread)
"""
import sys

import torch

from nope_interp.evaluate import predict, prompt_in_input
from nope_interp.pretrained import load_run
from tasks import protocol_inputs

run_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/reversal-packed-w256-drop02-s0"
window = int(sys.argv[2]) if len(sys.argv) > 2 else 256
torch.set_grad_enabled(False)
run = load_run(run_dir)
model, task = run.model, run.task
inputs = protocol_inputs(task, "window", 64, seed=1, exclude=run.train_prompts, window=window)
room = model.cfg.n_ctx - task.max_answer_len - 1  # the context and the answer must fit n_ctx
print(f"{run_dir}: 64 window inputs of {window} characters\n")
print("| last prompt ends within (characters) | prompts | exact match in the window | the same prompts alone |")
print("|---|---|---|---|")
for max_context in (60, 100, 150, 200, room):
    found = [f for f in (prompt_in_input(task, t, max_context=max_context) for t in inputs) if f]
    answers = [task.solve(prompt) for _, prompt in found]
    in_window = predict(model, task, [ctx for ctx, _ in found])
    alone = predict(model, task, [prompt for _, prompt in found], prefix="\n")
    em = sum(p == a for p, a in zip(in_window, answers, strict=True)) / len(found)
    em_alone = sum(p == a for p, a in zip(alone, answers, strict=True)) / len(found)
    print(f"| {max_context} | {len(found)} | {em:.3f} | {em_alone:.3f} |")
