"""The places that rewind, copy, save or compose a conversation's memory ask it first (engine.kv.memory).

A KV cache answers yes to everything; a recurrent state cannot be cut below its length but where it kept a
copy (a hybrid family's: engine.kv.recurrent, tests/engine/test_qwen35.py). `StateLikeCache` answers as a state
that keeps none does, over a KV cache's storage, and can be neither saved nor composed, so every refusing branch
runs on a dense model: a speculative turn then goes back to
its checkpoint and feeds the kept tokens again, and still equals a plain turn bit for bit. (A hybrid's
cartridges, one snapshot each: tests/engine/cartridge/test_hybrid_cartridges.py.)
"""

import numpy as np
import pytest

from engine.cartridge.cartridge import write_composed
from engine.chat import ChatOptions, Conversation, WarmState
from engine.errors import InvalidPrefix
from engine.kv.cache import KvCache
from engine.sampling import SamplerConfig
from tests.engine.chat.conftest import Script
from tests.engine.chat.test_speculative_turns import CHATML, ECHO, SAMPLED, assert_same_state, free_verify  # noqa: F401


class StateLikeCache(KvCache):
    persistable = composable = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.restores = 0

    def can_truncate(self, keep_len: int) -> bool:
        return keep_len == 0 or keep_len >= self.len  # starting over, or keeping it all

    def truncation_point(self, n: int) -> int:
        return min(n, self.len) if self.can_truncate(n) else 0

    def restore(self, checkpoint: int) -> None:
        self.restores += 1
        super().restore(checkpoint)


def _state_like(model, capacity: int = 4096) -> StateLikeCache:
    return StateLikeCache(*model.args.kv_geometry(), capacity, backend=model.backend)


def _conversation(tiny_chat, cache=None, **options) -> Conversation:
    model, tok = tiny_chat
    warm = None if cache is None else WarmState(cache, [])
    return Conversation(model, tok, CHATML, ChatOptions(**options), warm=warm)


@pytest.mark.parametrize("sampler", [SamplerConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_speculative_turns_over_a_memory_that_cannot_rewind_equal_plain_turns(tiny_chat, sampler):
    model, tok = tiny_chat
    # the reply strays from the text it copies, so drafts of that text are cut short
    reply = tok.encode("abc abc abd abc abx abc", add_special=False)
    plain = _conversation(tiny_chat, sampler=sampler, max_tokens=40, processor=Script(reply, reply))
    state = _state_like(model, plain.cache.capacity)
    spec = _conversation(tiny_chat, state, sampler=sampler, max_tokens=40, speculation=True,
                         processor=Script(reply, reply))
    for user in ("hi " + ECHO, ECHO + " again"):
        assert "".join(spec.send(user)) == "".join(plain.send(user))
        assert_same_state(plain, spec)
    assert state.restores > 0  # drafts were rejected, and the memory went back to before their verify


def test_a_resent_chat_over_a_memory_that_cannot_rewind_is_read_again(tiny_chat):
    model, tok = tiny_chat
    ids = tok.encode("<|im_start|>user\nhi " + ECHO + "<|im_end|>\n<|im_start|>assistant\n", add_special=False)
    replies = {}
    for name, cache in (("rows", None), ("state", _state_like(model))):
        convo = _conversation(tiny_chat, cache, max_tokens=12)
        first = "".join(convo.send_tokens(ids, reuse=True))
        again = "".join(convo.send_tokens(ids, reuse=True))  # the same prompt: its prefix is cached
        replies[name] = (first, again, convo.last_turn.stats.reused_tokens)
    assert replies["state"][:2] == replies["rows"][:2]
    assert replies["rows"][2] > 0 and replies["state"][2] == 0


def test_a_memory_that_cannot_be_saved_keeps_no_sidecar(tiny_chat, tmp_path):
    convo = _conversation(tiny_chat, _state_like(tiny_chat[0]))
    assert convo.enable_persistence(tmp_path / "chat.kv") == 0
    "".join(convo.send("hi"))
    assert not (tmp_path / "chat.kv").exists()


def test_several_cartridges_are_not_composed_in_a_memory_that_cannot_compose(tiny_chat):
    with pytest.raises(InvalidPrefix, match="cannot be composed from 2 documents' cartridges"):
        write_composed([object(), object()], _state_like(tiny_chat[0]))


def test_a_prefix_is_copied_only_from_a_memory_that_can_be_cut_there(tiny_chat):
    model, _ = tiny_chat
    donors = {"rows": _conversation(tiny_chat), "state": _conversation(tiny_chat, _state_like(model))}
    for donor in donors.values():
        "".join(donor.send("hi " + ECHO))
    copies = {}
    for name, donor in donors.items():
        taker = _conversation(tiny_chat)
        taker.copy_prefix(donor, 10)
        copies[name] = taker.cache.len
    assert copies == {"rows": 10, "state": 0}
    assert np.all(donors["state"].cache.len > 10)
