"""How much Markdown markup the Shakespeare dialogue filter (``nope_interp.text.dialogue``) leaves in each split:
lines starting or ending with ``_`` (stage directions that wrap over several lines) and lines with a backslash
(Markdown escapes). Needs the ``text`` extra.

Run: .venv/bin/python docs/measured/scripts/corpus_markup.py
"""

from nope_interp import text

for split in ("held_out", "train"):
    corpus = text.corpus(split)
    lines = corpus.splitlines()
    stage = [line for line in lines if line.startswith("_") or line.endswith("_")]
    escaped = [line for line in lines if "\\" in line]
    chars = sum(len(line) + 1 for line in stage)
    print(f"{split}: {len(corpus):,} characters, {len(lines):,} lines; starting or ending with '_': "
          f"{len(stage)} lines, {chars:,} characters ({100 * chars / len(corpus):.2f}%); with a backslash: "
          f"{len(escaped)} lines")
