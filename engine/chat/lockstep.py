"""The lockstep batch: a turn on each of several conversations of one model, decoded together.

Each step forwards one token per live turn in a single weight pass (model.decode_batch). The batch stays
plain (no speculation); per conversation, it replies as send does.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

from engine.chat.conversation import Conversation
from engine.chat.turn import Turn, TurnRequest, TurnResult


def send_batch(conversations: Sequence[Conversation], users: Sequence[str], *,
               sinks: Sequence[Callable[[str], None]] | None = None,
               cancel: threading.Event | None = None) -> list[TurnResult]:
    """One user message on each of several conversations of one model, decoded in lockstep: each step
    forwards one token per live stream in a single weight pass (model.decode_batch). Per stream it behaves
    as send(); `sinks[i]` receives stream i's text pieces. A stream that fails (its render, context, sampler
    or sink) ends with its error recorded while the others go on; only a failing batched forward ends all."""
    return _lockstep(conversations, [c.user_request for c in conversations], users, sinks, cancel)


def send_batch_rendered(conversations: Sequence[Conversation], rendered: Sequence[str], *,
                        sinks: Sequence[Callable[[str], None]] | None = None,
                        cancel: threading.Event | None = None) -> list[TurnResult]:
    """send_batch over full-history renders, each reconciled with its conversation's cache (reuse)."""
    def request(c: Conversation) -> Callable[[str], TurnRequest]:
        return lambda text: TurnRequest(c.tokenizer.encode(text, add_special=c.prefix_rows == 0), reuse=True)

    return _lockstep(conversations, [request(c) for c in conversations], rendered, sinks, cancel)


def _lockstep(convos: Sequence[Conversation], make_requests: Sequence[Callable], prompts: Sequence,
              sinks: Sequence[Callable[[str], None]] | None, cancel: threading.Event | None) -> list[TurnResult]:
    _check_batch(convos, prompts, sinks)
    turns: list[Turn | None] = [None] * len(convos)
    failed: dict[int, TurnResult] = {}

    def advance(i: int, logits: np.ndarray) -> None:
        try:
            for piece in turns[i].accept(logits):
                if sinks is not None:
                    sinks[i](piece)
        except Exception as e:  # isolated: a sampler or sink failure ends only this stream
            if not turns[i].done:
                turns[i].end("error", e)

    for i, (convo, make_request, prompt) in enumerate(zip(convos, make_requests, prompts)):
        try:  # turn prefills run per stream
            turn = Turn(convo, make_request(prompt), cancel)
            logits = turn.prefill()
        except Exception as e:  # isolated: this stream never started
            failed[i] = TurnResult("", [], "error", error=e)
            continue
        turns[i] = turn
        if not turn.done:
            advance(i, logits)
    live = [i for i, t in enumerate(turns) if t is not None and not t.done]
    while live:
        try:
            rows = convos[0].model.decode_batch([turns[i].next_token for i in live],
                                                [convos[i].cache for i in live])
        except BaseException as e:  # shared compute: every live stream ends with it
            for i in live:
                turns[i].end("error", e)
            raise
        for i, row in zip(live, rows):
            advance(i, row)
        live = [i for i in live if not turns[i].done]
    return [failed[i] if t is None else convos[i].last_turn for i, t in enumerate(turns)]


def _check_batch(convos: Sequence[Conversation], prompts: Sequence, sinks) -> None:
    if not convos:
        raise ValueError("a batch needs at least one conversation")
    if len(prompts) != len(convos) or (sinks is not None and len(sinks) != len(convos)):
        raise ValueError("a batch needs one prompt (and one sink, when given) per conversation")
    if len({id(c) for c in convos}) != len(convos):
        raise ValueError("a conversation appears twice in the batch")
    if any(c.model is not convos[0].model for c in convos):
        raise ValueError("every conversation in a batch must use the same model")
    processors = [id(c.sampler.processor) for c in convos if c.sampler.processor is not None]
    if len(set(processors)) != len(processors):
        raise ValueError("conversations in a batch need their own logit processor (it holds one stream's state)")
