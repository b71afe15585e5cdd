"""Special-token partition: cut text into plain fragments and single special-token ids.

llama.cpp (tokenizer_st_partition) takes the special tokens longest first and, for each, splits every
still-plain fragment at its leftmost non-overlapping occurrences. Done literally that is one scan of the
text per special token (Gemma 3 has 6,400). When no two special tokens can overlap in text — a proper
suffix of one is never a proper prefix of another, runs of one repeated character aside — that order
picks exactly the occurrences a leftmost-longest scan picks, which one compiled trie regex finds in a
single pass. Vocabularies with overlapping specials take the literal path.
"""

from __future__ import annotations

import re
from typing import Iterable, Union

Fragment = Union[str, int]  # plain text, or the id of a special token


def _trie_regex(texts: Iterable[str]) -> str:
    """A regex matching any of `texts`, preferring the longest one that matches at a position."""
    root: dict = {}
    for text in texts:
        node = root
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in node.items() if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body  # greedy: try the longer token first

    return emit(root)


def _is_run(text: str) -> bool:
    return text.count(text[0]) == len(text)


def _can_overlap(texts: list[str]) -> bool:
    """Whether two specials can partially overlap in some text, other than runs of one character."""
    # proper prefix -> whether every special extending it is a run of its character
    prefixes: dict[str, bool] = {}
    for text in texts:
        for k in range(1, len(text)):
            prefix = text[:k]
            prefixes[prefix] = prefixes.get(prefix, True) and _is_run(text)
    for text in texts:
        for k in range(1, len(text)):
            only_runs = prefixes.get(text[k:])
            if only_runs is not None and not (only_runs and _is_run(text)):
                return True
    return False


class SpecialMatcher:
    """Partitions text on a fixed set of special tokens, matching llama.cpp's choice of occurrences."""

    def __init__(self, specials: dict[str, int]):
        self._ids = specials
        # llama.cpp sorts by length only; ties cannot overlap each other unless _can_overlap says so
        self._order = sorted(specials, key=lambda t: (-len(t), specials[t]))
        self._regex = None
        if specials and not _can_overlap(self._order):
            self._regex = re.compile(_trie_regex(self._order))

    def partition(self, text: str) -> list[Fragment]:
        if not self._ids or not text:
            return [text] if text else []
        if self._regex is None:
            return self._partition_by_length(text)
        out: list[Fragment] = []
        pos = 0
        for match in self._regex.finditer(text):
            start, end = match.span()
            if start > pos:
                out.append(text[pos:start])
            out.append(self._ids[match.group()])
            pos = end
        if pos < len(text):
            out.append(text[pos:])
        return out

    def _partition_by_length(self, text: str) -> list[Fragment]:
        fragments: list[Fragment] = [text] if text else []
        for special in self._order:
            if special not in text:
                continue
            token = self._ids[special]
            next_fragments: list[Fragment] = []
            for fragment in fragments:
                if isinstance(fragment, int):
                    next_fragments.append(fragment)
                    continue
                pieces = fragment.split(special)
                for i, piece in enumerate(pieces):
                    if i:
                        next_fragments.append(token)
                    if piece:
                        next_fragments.append(piece)
            fragments = next_fragments
        return fragments
