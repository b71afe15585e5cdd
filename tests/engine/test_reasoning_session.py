"""A stored chat with a reasoning model (a tiny random one with Qwen3's markers: no starter model reasons),
replies scripted: the reasoning is stored apart from the answer, past reasoning is left out of the next
prompt as the template says, and a warm reopen continues exactly as the uninterrupted chat."""

import pytest

from engine.history.store import HistoryStore
from engine.serving.session import ChatSession
from tests.engine.chat.conftest import Script
from tests.engine.chat.reasoning_model import write_reasoning_model

GREEDY = {"temperature": 0.0, "max_tokens": 40, "ctx": 512}
REPLIES = ["<think>\nFirst thought.\n</think>\n\nOne.", "<think>\nSecond thought.\n</think>\n\nTwo.",
           "<think>\nThird thought.\n</think>\n\nThree."]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    from engine.models import load_model

    return load_model(write_reasoning_model(tmp_path_factory.mktemp("think") / "thinker.gguf"))


def scripted(session, *replies):
    tok = session.convo.tokenizer
    end = tok.token_id("<|im_end|>")
    session.convo.sampler.processor = Script(*[tok.encode(r, add_special=False) + [end] for r in replies])


def send(session, text):
    pieces = list(session.send(text))
    return "".join(p for p in pieces if type(p) is str), session.last_turn.reasoning


def test_reasoning_is_stored_apart_and_a_warm_reopen_equals_the_uninterrupted_chat(thinker, tmp_path):
    store = HistoryStore(tmp_path / "history.db")
    uninterrupted = ChatSession.open(store, thinker, sidecar_dir=tmp_path / "a", sampler=GREEDY)
    scripted(uninterrupted, *REPLIES)
    expected = [send(uninterrupted, t) for t in ("hi", "and?", "more")]
    assert expected == [("One.", "First thought."), ("Two.", "Second thought."), ("Three.", "Third thought.")]
    stored = uninterrupted.messages()[1]
    assert (stored["content"], stored["reasoning"]) == ("One.", "First thought.")
    assert stored["meta"]["reasoning_tokens"] > 0 and stored["meta"]["reasoning_ms"] >= 0
    # the third prompt carries no past reasoning (Qwen3's rule for replies before the last user message)
    prompt = uninterrupted.convo.tokenizer.decode(uninterrupted.last_window.ids)
    assert "thought" not in prompt and "One." in prompt and "Two." in prompt

    first = ChatSession.open(store, thinker, sidecar_dir=tmp_path / "b", sampler=GREEDY)
    scripted(first, *REPLIES[:2])
    assert [send(first, t) for t in ("hi", "and?")] == expected[:2]
    held = first.context_used
    first.close()
    reopened = ChatSession(HistoryStore(store.path), thinker, first.id, sidecar_dir=tmp_path / "b")
    assert reopened.resumed_positions == held
    assert [m["reasoning"] for m in reopened.messages()] == ["", "First thought.", "", "Second thought."]
    scripted(reopened, REPLIES[2])
    assert send(reopened, "more") == expected[2]
    assert reopened.last_window.ids == uninterrupted.last_window.ids
    assert reopened.convo.history == uninterrupted.convo.history


def test_a_reply_stopped_while_the_model_reasons_keeps_its_reasoning(thinker, tmp_path):
    store = HistoryStore(tmp_path / "history.db")
    session = ChatSession.open(store, thinker, sidecar_dir=tmp_path / "s", sampler=GREEDY)
    scripted(session, REPLIES[0])
    stream = session.send("hi")
    shown = ""
    for piece in stream:
        shown += piece
        if len(shown) >= 5:
            break
    stream.close()  # the user stopped it: the reasoning shown so far is kept
    reply = session.messages()[-1]
    assert reply["role"] == "assistant" and reply["meta"]["finish_reason"] == "cancelled"
    assert reply["content"] == "" and reply["reasoning"] and "First thought.".startswith(reply["reasoning"])
