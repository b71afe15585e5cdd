"""The session layer (engine.serving.session) on the real default model: stored turns, warm reopen from the sidecar,
branches that rewind the cache, deletion, and a process killed mid-reply."""

import errno
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ConversationBusy, StorageReadOnly
from engine.history.store import HistoryStore
from engine.kv import persist
from engine.serving.session import ChatSession, delete_conversation, sidecar_path

GREEDY = {"temperature": 0.0, "max_tokens": 12, "ctx": 512}
REPO = Path(__file__).parents[2]


def reply(stream) -> str:
    return "".join(stream)


def test_turns_are_stored_with_their_figures(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    text = reply(s.send("What is the capital of France?"))
    user, assistant = s.messages()
    assert (user["role"], user["content"]) == ("user", "What is the capital of France?")
    assert (assistant["role"], assistant["content"]) == ("assistant", text) and text
    meta = assistant["meta"]
    assert meta["generated_tokens"] == s.last_turn.stats.generated_tokens > 0
    assert meta["prefilled_tokens"] == s.context_used - meta["generated_tokens"] or meta["finish_reason"] == "length"
    assert store.get_conversation(s.id)["title"] == "What is the capital of France?"


def first_logits(session) -> list:
    """Filled with the logits the next reply's first token is sampled from."""
    seen, sample = [], session.convo.sampler.sample

    def spy(logits, history):
        if not seen:
            seen.append(np.array(logits))
        return sample(logits, history)

    session.convo.sampler.sample = spy
    return seen


def test_a_reopened_conversation_resumes_warm_and_continues_as_the_uninterrupted_one(smollm2, home, tmp_path):
    store, sidecars = home
    turns = ("What is the capital of France?", "And of Italy?", "Name a river there.")
    uninterrupted = ChatSession.open(store, smollm2, sidecar_dir=tmp_path / "other", sampler=GREEDY)
    expected = [reply(uninterrupted.send(t)) for t in turns[:2]]
    expected_logits = first_logits(uninterrupted)
    expected.append(reply(uninterrupted.send(turns[2])))

    first = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    assert [reply(first.send(t)) for t in turns[:2]] == expected[:2]
    held = first.context_used
    first.close()
    reopened = ChatSession(HistoryStore(store.path), smollm2, first.id, sidecar_dir=sidecars)
    assert reopened.resumed_positions == held > 30
    logits = first_logits(reopened)
    assert reply(reopened.send(turns[2])) == expected[2]
    np.testing.assert_array_equal(logits[0], expected_logits[0])  # the first new token's, bit for bit
    stats = reopened.last_turn.stats
    # nothing of the history is prefilled again: only the closing of the last reply and the new turn
    assert stats.reused_tokens >= held - 1 and stats.prefilled_tokens < 20
    assert [m["content"] for m in reopened.messages()] == [m["content"] for m in uninterrupted.messages()]


def test_regenerate_edit_and_switch_keep_alternatives(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY | {"temperature": 1.0, "seed": 7})
    reply(s.send("Tell me a word."))
    first_reply = s.messages()[-1]
    regenerated = reply(s.regenerate())
    assert s.last_turn.stats.reused_tokens > 0  # the user turn stays cached; only the reply is redone
    alternatives = store.siblings(s.messages()[-1]["id"])
    assert [m["id"] for m in alternatives][0] == first_reply["id"] and len(alternatives) == 2
    assert alternatives[1]["content"] == regenerated

    user = s.messages()[0]
    reply(s.edit(user["id"], "Tell me a colour."))
    assert s.messages()[0]["content"] == "Tell me a colour." and len(s.messages()) == 2
    assert len(store.siblings(user["id"])) == 2
    s.switch(user["id"])
    assert [m["content"] for m in s.messages()][0] == "Tell me a word."
    assert s.messages()[-1]["id"] == alternatives[1]["id"]  # the newest reply under it
    with pytest.raises(ValueError, match="user message"):
        s.edit(s.messages()[-1]["id"], "not mine")


def test_deleting_a_message_rewinds_the_cache_to_what_is_left(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hello there."))
    held_after_first = s.context_used
    reply(s.send("What is two plus two?"))
    held_after_second = s.context_used
    s.delete_message(s.messages()[2]["id"])  # the second user turn and its reply
    assert len(s.messages()) == 2
    reply(s.send("Name a colour."))
    # kept: the first turn and the frame of the next user turn, not the deleted turn's text
    assert held_after_first - 1 <= s.last_turn.stats.reused_tokens < held_after_second - 5


def test_a_new_system_prompt_reprefills_from_where_the_render_changes(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hello there."))
    s.update_settings(system_prompt="You answer in French.")
    reply(s.send("How are you?"))
    assert s.last_turn.stats.reused_tokens < 5  # the system block opens the render


def test_deleting_a_conversation_deletes_its_sidecar(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hi"))
    s.close()
    assert sidecar_path(s.id, sidecars).stat().st_size > 0
    delete_conversation(store, s.id, sidecars)
    assert not sidecar_path(s.id, sidecars).exists()
    assert all(c["id"] != s.id for c in store.list_conversations())


def test_a_lost_sidecar_is_rewritten_whole_at_the_next_turn(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hi"))
    s.close()
    sidecar_path(s.id, sidecars).unlink()
    reply(s.send("How are you?"))  # this update cannot apply: the file lost the positions it extends
    s.close()
    assert s.sidecar_error is None
    reply(s.send("Good."))
    assert s.sidecar_error and "lost" in s.sidecar_error  # reported, and this turn's save starts over
    s.close()
    reopened = ChatSession(store, smollm2, s.id, sidecar_dir=sidecars)
    assert reopened.resumed_positions == s.context_used


_KILLED_MID_REPLY = """
import sys
import time
from engine.errors import ConversationBusy, StorageReadOnly
from engine.history.store import HistoryStore
from engine.models import load_model
from engine.serving.session import ChatSession
store = HistoryStore(sys.argv[2])
s = ChatSession.open(store, load_model(sys.argv[1]), sidecar_dir=sys.argv[3],
                     sampler={"temperature": 0.0, "max_tokens": 8, "ctx": 2048})
"".join(s.send("What is the capital of France?"))
s.close()
print("committed", s.id, s.context_used, flush=True)
s.update_settings(sampler={"temperature": 0.9, "max_tokens": 1500, "ctx": 2048, "seed": 1})
for i, piece in enumerate(s.send("Write a long story about a dragon.")):
    if i == 3:
        print("streaming", flush=True)
    if i >= 3:  # a slow reader: the kill lands mid-reply however short the sampled story (at 0.3 s: ~6 pieces)
        time.sleep(0.05)
"""


def test_a_process_killed_mid_reply_keeps_the_last_turn_and_a_consistent_sidecar(smollm2, home, model_path):
    store, sidecars = home
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_REPLY, str(model_path("smollm2-135m-instruct")),
                             str(store.path), str(sidecars)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    _, cid, held = proc.stdout.readline().split()
    assert proc.stdout.readline().strip() == "streaming"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    roles = [(m["role"], m["content"]) for m in store.active_branch(cid)]
    assert roles[0] == ("user", "What is the capital of France?") and roles[1][0] == "assistant"
    assert roles[2:] == [("user", "Write a long story about a dragon.")]  # the reply never committed
    s = ChatSession(store, smollm2, cid, sidecar_dir=sidecars)
    assert s.resumed_positions == int(held)  # the committed turn's positions, not a torn reply
    reply(s.regenerate())
    assert s.last_turn.stats.reused_tokens >= int(held) - 1
    assert s.messages()[-1]["role"] == "assistant"


def test_sidecar_bytes_per_token_match_the_geometry(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hi"))
    s.close()
    size = sidecar_path(s.id, sidecars).stat().st_size
    per_token = persist.bytes_per_token(s.convo.cache)
    # a u32 token id, every layer's K and V rows in f16, a u32 CRC
    kv_heads, head_dims = smollm2.args.kv_geometry()
    assert per_token == 8 + sum(2 * heads * head_dim * 2 for heads, head_dim in zip(kv_heads, head_dims))
    assert size == persist.header_size(s.convo.cache) + s.context_used * per_token


def test_branch_tokens_follow_the_active_branch_not_the_cache(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hello there."))
    after_first = s.context_used
    assert s.branch_tokens() == after_first
    reply(s.send("What is two plus two?"))
    assert s.branch_tokens() == s.context_used > after_first
    s.delete_message(s.messages()[2]["id"])
    assert s.branch_tokens() == after_first < s.context_used  # the cache rewinds at the next reply only


def test_a_reply_the_store_refuses_stays_pending_and_is_saved_when_writes_work_again(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    first = reply(s.send("Hi"))
    stream = s.send("What is the capital of France?")
    pieces = [next(stream)]
    store.db.execute("PRAGMA query_only = 1")  # the data dir turns read-only while the reply streams
    with pytest.raises(StorageReadOnly, match="history.db"):
        pieces.extend(stream)
    shown = "".join(pieces)
    assert s.pending_reply.text == shown and shown
    assert [m["content"] for m in s.messages()] == ["Hi", first, "What is the capital of France?"]
    with pytest.raises(StorageReadOnly):  # the next turn saves the pending reply first, and still cannot
        s.send("And of Italy?")
    assert s.pending_reply.text == shown and len(s.messages()) == 3
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    store.db.execute("PRAGMA query_only = 0")
    assert s.save_pending() and s.pending_reply is None
    assert [m["content"] for m in s.messages()] == ["Hi", first, "What is the capital of France?", shown]
    assert s.messages()[-1]["meta"]["generated_tokens"] == s.last_turn.stats.generated_tokens
    assert not s.save_pending()


def test_the_next_turn_saves_a_pending_reply_before_its_own_message(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    stream = s.send("Hi")
    store.db.execute("PRAGMA query_only = 1")
    with pytest.raises(StorageReadOnly):
        reply(stream)
    store.db.execute("PRAGMA query_only = 0")
    reply(s.send("Thanks"))
    assert [m["role"] for m in s.messages()] == ["user", "assistant", "user", "assistant"]
    assert s.messages()[1]["content"] and s.pending_reply is None


def test_a_turn_on_a_conversation_streaming_elsewhere_is_refused_before_anything_is_written(smollm2, home):
    store, sidecars = home
    streaming = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    other = ChatSession(HistoryStore(store.path), smollm2, streaming.id, sidecar_dir=sidecars)
    stream = streaming.send("Hi")
    next(stream)  # a reply is being written
    with pytest.raises(ConversationBusy, match=f"conversation {streaming.id[:8]} is busy"):
        other.send("Me too")
    with pytest.raises(ConversationBusy):  # nor may a session open (and load or reset its sidecar) now
        ChatSession(HistoryStore(store.path), smollm2, streaming.id, sidecar_dir=sidecars)
    assert [m["content"] for m in streaming.messages()] == ["Hi"]
    reply(stream)
    streaming.close()
    after = ChatSession(HistoryStore(store.path), smollm2, streaming.id, sidecar_dir=sidecars)
    assert after.resumed_positions == streaming.context_used  # the lock is free once the reply is stored
    other_conversation = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    stream = streaming.send("More")
    next(stream)
    assert reply(other_conversation.send("Hi"))  # the lock is per conversation
    stream.close()


def test_a_failed_sidecar_write_is_reported(smollm2, home, monkeypatch):
    store, sidecars = home

    def disk_full(path, update):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(persist, "apply", disk_full)
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hi"))
    s.close()
    assert "No space left on device" in s.last_sidecar_failure()
    reply(s.send("Again"))
    assert "could not write the sidecar" in s.sidecar_error and "No space left" in s.sidecar_error
    assert len(s.messages()) == 4  # the chat itself is stored


def test_a_speculative_session_stores_the_plain_replies_and_reopens_warm(smollm2, home, tmp_path, monkeypatch):
    from engine.speculative import stream
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    store, sidecars = home
    turns = ("Repeat exactly: the quick brown fox jumps over the lazy dog.", "Once more, word for word.")
    plain = ChatSession.open(store, smollm2, sidecar_dir=tmp_path / "plain", sampler=GREEDY)
    expected = [reply(plain.send(t)) for t in turns]

    first = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY, speculation=True)
    assert reply(first.send(turns[0])) == expected[0] and first.last_turn.stats.spec is not None
    first.close()
    reopened = ChatSession(HistoryStore(store.path), smollm2, first.id, sidecar_dir=sidecars, speculation=True)
    assert reopened.resumed_positions > 0
    assert reply(reopened.send(turns[1])) == expected[1]
    assert reopened.convo.history == plain.convo.history
    reopened.update_settings(sampler=GREEDY)  # reopening the cache for new settings keeps speculation on
    assert reopened.convo.options.speculation


def test_speculation_switched_on_an_open_session_applies_to_the_next_reply_on_the_same_cache(smollm2, home,
                                                                                             monkeypatch):
    from engine.speculative import stream
    monkeypatch.setattr(stream, "verify_cost_table", lambda model: {m: 1.0 for m in range(1, 18)})
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Say hello."))
    assert s.last_turn.stats.spec is None
    convo = s.convo
    s.set_speculation(True)
    reply(s.send("Say it again."))
    assert s.convo is convo and s.last_turn.stats.reused_tokens > 0  # the cache stayed
    assert s.last_turn.stats.spec is not None and s.speculation
    s.set_speculation(False)
    reply(s.send("Once more."))
    assert s.last_turn.stats.spec is None


def test_a_reply_names_the_response_format_it_followed(smollm2, home):
    store, sidecars = home
    s = ChatSession.open(store, smollm2, sidecar_dir=sidecars, sampler=GREEDY)
    reply(s.send("Hi"))
    assert "response_format" not in s.messages()[-1]["meta"]
    s.update_settings(sampler={**GREEDY, "response_format": {"type": "json_object", "grammar": ""}})
    reply(s.send("Hi again"))
    assert s.messages()[-1]["meta"]["response_format"] == "json_object"
