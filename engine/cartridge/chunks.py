"""Cutting a document too long for one cartridge into chunks of at most a token budget each.

Cuts fall on paragraph boundaries (blank lines) where a chunk can hold whole paragraphs, else on line
boundaries, else between words; only a single word over the budget is cut inside (by characters). A
heading stays with the paragraph after it. The chunks, joined, are exactly the text, so nothing of the
document is lost or doubled.
"""

from __future__ import annotations

import re

from engine.tokenize import Tokenizer

# Each level keeps its separators with the piece before them, so that the pieces join back into the text.
_LEVELS = (re.compile(r".*?(?:\n[ \t]*\n\s*|\Z)", re.S),  # paragraphs
           re.compile(r".*?(?:\n|\Z)", re.S),  # lines
           re.compile(r"\S*\s*"))  # words
_TITLE_CHARS = 80
_ENDS = (".", "!", "?", ":", ";", ",", '"', "'", ")")


def split_text(text: str, tokenizer: Tokenizer, budget: int) -> list[str]:
    """The text as consecutive chunks of at most `budget` tokens each (encoded without special tokens)."""
    if budget < 1:
        raise ValueError(f"a chunk's token budget must be positive, not {budget}")

    def count(s: str) -> int:
        return len(tokenizer.encode(s, add_special=False))

    chunks: list[list[str]] = []  # each a run of pieces
    held = budget + 1  # the tokens of the last chunk's pieces, counted one by one
    for piece in _pieces(text, count, budget, 0):
        n = count(piece)
        if held + n <= budget or (chunks and count("".join(chunks[-1]) + piece) <= budget):
            chunks[-1].append(piece)
            held += n
        else:
            chunks.append([piece])
            held = n
    return [c for pieces in chunks for c in _within(pieces, count, budget)]


def _within(pieces: list[str], count, budget: int):
    """A packed run of pieces as chunks within the budget: tokens merging across a cut can make the joined
    text longer than its pieces counted apart, and then its last pieces start another chunk."""
    while pieces:
        end = len(pieces)
        while end > 1 and count("".join(pieces[:end])) > budget:
            end -= 1
        yield "".join(pieces[:end])
        pieces = pieces[end:]


def _pieces(text: str, count, budget: int, level: int):
    """The text's pieces at `level`, each within the budget (split one level finer when it is not)."""
    if count(text) <= budget:
        yield text
        return
    if level == len(_LEVELS):  # one word over the budget: cut it by characters
        yield from _by_characters(text, count, budget)
        return
    parts = [m.group(0) for m in _LEVELS[level].finditer(text) if m.group(0)]
    if level == 0:
        parts = _headings_joined(parts)
    if len(parts) == 1:  # nothing to cut at this level
        yield from _pieces(text, count, budget, level + 1)
        return
    for part in parts:
        yield from _pieces(part, count, budget, level + 1)


def _headings_joined(paragraphs: list[str]) -> list[str]:
    """A heading belongs to the paragraph after it: a chunk should not end on the title of what the next
    one is about."""
    out: list[str] = []
    for p in paragraphs:
        if out and _is_heading(out[-1]):
            out[-1] += p
        else:
            out.append(p)
    return out


def _is_heading(paragraph: str) -> bool:
    """A Markdown heading, or one short line that does not end a sentence (a plain-text title)."""
    line = paragraph.strip()
    return "\n" not in line and (line.startswith("#") or (len(line) <= _TITLE_CHARS and not line.endswith(_ENDS)))


def _by_characters(text: str, count, budget: int):
    start = 0
    while start < len(text):
        lo, hi = start + 1, len(text)  # the longest text[start:end] within the budget (one character at least)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[start: mid]) <= budget:
                lo = mid
            else:
                hi = mid - 1
        yield text[start: lo]
        start = lo
