"""nope_interp: the adjacency pattern of transformers with no positional encoding, on TransformerLens.

Reproduces Zuo, Guerzhoy & Guerzhoy (COLING 2025). Import submodules directly, e.g.
``from nope_interp.model import build_model, preset``; this file has no side effects.
"""

__version__ = "0.1.0"
