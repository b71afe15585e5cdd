"""What a conversation's model memory promises: the `Memory` protocol.

A model keeps per-conversation memory of what it has read: attention keeps a row per position (KvCache),
and a recurrent mixer (a hybrid family's) keeps a state it overwrites. Rewinding, copying a prefix, saving
to a sidecar and composing cartridges are free for rows and impossible, or costly, for a state, so the code
that does them asks the memory first instead of assuming (as llama.cpp's memory kinds answer seq_rm):

- `can_truncate(n)`: whether it can keep just its first n positions; `truncation_point(n)`: the most of the
  first n it can keep (a state: its last mark at or before n), so a caller keeps that and reads the rest. The speculative verifier rewinds
  rejected drafts this way, or else goes back to a `checkpoint()` from before the verify and feeds the kept
  tokens again; a conversation keeps the prompt it shares with a resent request, or else reads it again;
  a slot copies another's prompt prefix only where that one can be cut there.
- `persistable`: whether its positions can be saved to a sidecar and loaded back (a conversation without
  it reopens by reading its chat again).
- `composable`: whether rows made elsewhere (documents' cartridges) can be placed in it one after another; a
  memory that cannot takes one cartridge, a snapshot of the whole prefix (engine.cartridge.cartridge).
"""

from __future__ import annotations

from typing import Protocol


class Memory(Protocol):
    len: int  # positions it holds
    capacity: int  # positions it can hold
    persistable: bool
    composable: bool

    def can_truncate(self, n: int) -> bool:
        """Whether truncate(n) keeps exactly the first n positions (n = 0, starting over, always can)."""

    def truncation_point(self, n: int) -> int:
        """The largest m <= n (and <= len) that truncate(m) keeps exactly."""

    def truncate(self, n: int) -> None:
        """Keep the first n positions (at or above len: no-op)."""

    def mark(self) -> None:
        """Remember this position as one to come back to (a turn's end): a memory that cannot be cut anywhere
        keeps a copy of itself here."""

    def feeding(self, m: int, row_wise: bool) -> None:
        """The model is about to feed m rows (row-wise or a prefill) at len."""

    def checkpoint(self) -> object:
        """A mark of what it holds now, for restore()."""

    def restore(self, checkpoint: object) -> None:
        """Back to what it held at checkpoint() (positions written since are dropped)."""

    def copy_prefix(self, src: "Memory", n: int) -> None:
        """Start over from `src`'s first n positions (src.can_truncate(n) must hold)."""
