"""The draft-source seam (spec 13.9.1): what proposes the tokens a verify pass checks.

A source is deterministic: the same committed stream gives the same suggestions. It never decides what is
committed (the decoder samples every verified row itself), so a wrong, short, over-long or out-of-vocabulary
suggestion costs only verify work: the decoder clamps it to its budget and to the vocabulary. A source that
also defines `observe_top_k` receives per-position top-K candidates from the verify logits (the decoder
computes them only for such sources); one that defines `truncate_pending` is told when its last suggestion
was shortened before verification, so its acceptance accounting covers only what was verified. One with a
`last_forced` attribute that is true says its last suggestion is forced (a grammar leaves the model no other
tokens there): the decoder verifies it even when it is shorter than the minimum draft. One with a
`match_len()` says how many tokens of the stream its current draft would follow from a match (the cost
gate lets long matches speculate even while it is off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class TopKRow:
    """One verified position: its input token and the top-K next-token ids its logits ranked, best first."""
    token: int
    topk: tuple[int, ...]


class DraftSource(Protocol):
    def suggest(self, context: Sequence[int], budget: int) -> Sequence[int]:
        """Up to `budget` tokens that may follow `context` (the committed stream); empty for no draft."""

    def observe(self, committed: Sequence[int]) -> None:
        """Tokens just committed to the stream, in order (every one, drafted or not)."""

    # Optional: observe_top_k(rows: Sequence[TopKRow]) -> None, truncate_pending(new_len: int) -> None,
    # match_len() -> int and a `last_forced: bool` attribute.


def wants_top_k(source: DraftSource) -> bool:
    return callable(getattr(source, "observe_top_k", None))


def last_forced(source: DraftSource) -> bool:
    """Whether `source` marked its last suggestion as forced."""
    return bool(getattr(source, "last_forced", False))


def match_len(source: DraftSource) -> int:
    """The length of `source`'s current match (0 when it does not say)."""
    hook = getattr(source, "match_len", None)
    return int(hook()) if callable(hook) else 0


def truncate_pending(source: DraftSource, new_len: int) -> None:
    """Tell `source` that only the first `new_len` tokens of its last suggestion will be verified."""
    hook = getattr(source, "truncate_pending", None)
    if callable(hook):
        hook(new_len)
