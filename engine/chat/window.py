"""Which part of a chat a reply is conditioned on, when the chat outgrows the context.

A stored chat can hold more than its model's context. The conversation's context policy decides:
`drop_oldest` keeps the system prompt and the newest turns that fit with room left for the reply (the
history keeps everything; only the prompt leaves the oldest turns out), `stop` refuses the reply. Under
both, a message that alone cannot fit is refused.

Leaving a turn out changes the start of the prompt, so the whole kept part is prefilled again. To do that
once every few turns rather than at every one, drop_oldest keeps the previous reply's start while it fits,
and when it must move on, drops down to three quarters of the room (as llama.cpp's context shift drops
half), so that the next turns fit behind it again.

The work is bounded by the context, not by the chat. A token never stands for more characters than the
vocabulary's longest token has bytes, so a text of more characters than the context times that length
cannot fit: such messages are left out (or refused) before anything renders or tokenizes them. Only a tail
that could fit is rendered, a few times at most (a binary search for where the kept turns start).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

from engine.chat.templates import Message
from engine.context_policy import POLICIES
from engine.errors import ContextFull, InvalidContextPolicy
from engine.tokenize import Tokenizer

# What chat apps do: a long chat goes on, forgetting its start, rather than stop answering.
DEFAULT_POLICY = "drop_oldest"

_LONGEST: "weakref.WeakKeyDictionary[Tokenizer, int]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ContextWindow:
    ids: list[int]           # the prompt: the kept messages rendered and tokenized
    start: int = 0           # the index of the first kept message after the system messages
    left_out: int = 0        # messages left out, the oldest ones (the system prompt is always kept)
    left_out_turns: int = 0  # the user turns among them (each with its replies)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise InvalidContextPolicy(f"context_policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def longest_token(tokenizer: Tokenizer) -> int:
    """The most bytes one token stands for (so the most characters it covers), control tokens included."""
    if tokenizer not in _LONGEST:
        _LONGEST[tokenizer] = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
    return _LONGEST[tokenizer]


def reply_room(capacity: int, max_tokens: int) -> int:
    """Positions kept free for the reply when turns are left out: its whole budget, but at most a quarter of
    the context, so that a long reply budget does not leave the history no room."""
    return max(1, min(max_tokens, capacity // 4))


def fit_context(messages: Sequence[Message], encode: Callable[[Sequence[Message]], list[int]], *,
                capacity: int, max_tokens: int, policy: str, longest: int,
                previous_start: int | None = None) -> ContextWindow:
    """The window of `messages` (system messages first, ending with the user message to answer) that the
    reply is conditioned on; `encode` renders and tokenizes a message list; `longest` is longest_token;
    `previous_start` the index in `messages` where the previous reply's window started, if it left some
    out. Raises ContextFull when the policy or the last message's size leaves no window."""
    check_policy(policy)
    pinned = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    if pinned == len(messages):
        raise ValueError("a reply follows a user message")
    # where the kept part may start: everything, or a user turn (templates expect one after the system)
    starts = [pinned] + [i for i in range(pinned + 1, len(messages)) if messages[i].role == "user"]
    floors = [-(-len(m.content.strip()) // longest) for m in messages]  # fewest tokens each can take
    floor_after = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        floor_after[i] = floor_after[i + 1] + floors[i]
    floor_pinned = sum(floors[:pinned])

    def floor(start: int) -> int:
        return floor_pinned + floor_after[start]

    def window(start: int) -> list[Message]:
        return [*messages[:pinned], *messages[start:]]

    last = starts[-1]
    if floor(last) > capacity:
        raise ContextFull(_too_long(messages[last], floor(last), capacity, exact=False))

    def alone() -> list[int]:  # the last turn with the system prompt; refused when even that cannot fit
        ids = encode(window(last))
        if len(ids) > capacity:
            raise ContextFull(_too_long(messages[last], len(ids), capacity, exact=True))
        return ids

    if policy == "stop":
        ids = encode(messages) if floor(pinned) <= capacity else None
        if ids is not None and len(ids) <= capacity:
            return ContextWindow(ids, pinned)
        alone()
        needed = floor(pinned) if ids is None else len(ids)
        raise ContextFull(f"context full: the conversation needs {'at least ' * (ids is None)}{needed:,} "
                          f"tokens but the context holds {capacity:,} (context policy: stop); start a new "
                          f"chat, delete or edit messages, raise the context length, or let the oldest "
                          f"turns drop (context policy drop_oldest)")

    room = capacity - reply_room(capacity, max_tokens)
    tried: dict[int, list[int]] = {}

    def tokens(start: int) -> int:
        if start not in tried:
            tried[start] = encode(window(start))
        return len(tried[start])

    def smallest_fitting(limit: int, among: list[int]) -> int | None:
        # fewer messages never take more tokens, so a binary search finds it
        among = [s for s in among if floor(s) <= limit]
        if not among or tokens(among[-1]) > limit:
            return None
        bad, good = -1, len(among) - 1
        while good - bad > 1:
            mid = (bad + good) // 2
            bad, good = (bad, mid) if tokens(among[mid]) <= limit else (mid, good)
        return among[good]

    if smallest_fitting(room, [pinned]) is not None:  # everything fits
        start = pinned
    elif previous_start in starts and smallest_fitting(room, [previous_start]) is not None:
        start = previous_start  # its prompt is what the cache holds
    else:
        start = smallest_fitting(room - room // 4, starts)
        if start is None:
            start = smallest_fitting(room, starts)
    if start is None:  # not even the last turn leaves the reply its room: it gets what is left
        start = last
        tried[last] = alone()
    dropped = messages[pinned:start]
    return ContextWindow(tried[start], start, len(dropped), sum(m.role == "user" for m in dropped))


def _too_long(message: Message, tokens: int, capacity: int, exact: bool) -> str:
    size = (f"needs {tokens:,} tokens" if exact else
            f"is {len(message.content):,} characters long: at least {tokens:,} tokens")
    return (f"context full: the message {size} with the system prompt, and the context holds "
            f"{capacity:,}; shorten it, or raise the context length")
