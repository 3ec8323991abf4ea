"""Largest gap, over lags 1..D, between the measured layer-0 hook_z lag profile (mean over seeds, random tokens)
and its closed form (uniform causal, or sliding window of 16), per configuration and length.

Run after `nope-interp long-context --lengths 32 128 512 1024 --n-sequences 2` in the same folder.
"""

import collections
import json

import torch

from nope_interp.similarity import sliding_window_lag_profile, uniform_causal_lag_profile

data = json.load(open("results/long_context/long_context.json"))
window = data["config"]["window"]
profiles = collections.defaultdict(list)
for row in data["rows"]:
    if row["input"] == "random":
        a = row["arch"]
        profiles[(a["normalization"], a["attention"], row["n"])].append(row["scores"]["blocks.0.attn.hook_z"]["lag_mean"])
for (norm, attention, n), rows in sorted(profiles.items()):
    got = torch.tensor(rows, dtype=torch.float64).mean(0)
    d = len(got)
    ideal = uniform_causal_lag_profile(n, d) if attention == "causal" else sliding_window_lag_profile(n, window, d)
    print(f"{norm:5s} {attention:8s} n={n:<5d} max |measured - closed form| = {float((got - ideal).abs().max()):.3f}")
