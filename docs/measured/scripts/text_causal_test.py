"""The layer-0 causal test on the NoPE text model (README, "Does the paper's claim hold on real text?").

Run: .venv/bin/python docs/measured/scripts/text_causal_test.py   (needs the text extra; about 10 s)
Prints layer0_interventions (content = the letters) and the layer-0 attention entropy on 64 held-out
windows of 128 characters, for the trained text-nope model and its step-0 weights.
"""
import string

import torch

import tasks
from nope_interp.diagnostics import layer0_attention_entropy, layer0_interventions
from nope_interp.model import build_model
from nope_interp.text import text_windows
from nope_interp.text_train import load_text_run

model, model_cfg, _ = load_text_run("nope_interp/pretrained/text/text-nope")
tokens = torch.tensor([tasks.encode(w) for w in text_windows(64, 128, seed=0)])
for name, m in (("trained", model), ("step 0", build_model(model_cfg))):
    scores = layer0_interventions(m, tokens, content=string.ascii_letters)
    print(name, {k: round(v, 3) for k, v in scores.items()}, "L0 entropy", round(layer0_attention_entropy(m, tokens), 3))
