"""Remote engines: engine.serving.remote's client and `fucina chat --remote` against `fucina serve`'s app on a
tiny random model (uvicorn in a thread, a real socket), and against stub endpoints that refuse, stall or
drop the connection mid-reply. The chat is stored locally; a cut reply is kept, marked interrupted."""

import io
import sys

import pytest

from app.cli import main as fucina
from engine.chat import Message
from engine.errors import (RemoteAuthFailed, RemoteConnectionLost, RemoteError, RemoteModelNotFound, RemoteTimeout,
                           RemoteUnreachable)
from engine.history.store import HistoryStore
from engine.serving.remote import INTERRUPTED, RemoteClient, endpoint_url
from tests.serving import free_port, serving_tiny, stub_endpoint

KEY = "remote-test-key"
HELLO = [Message("user", "hello")]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """`fucina serve`'s app on a tiny model, behind an API key: its base URL."""
    with serving_tiny(tmp_path_factory.mktemp("remote"), KEY) as url:
        yield url


def test_the_client_lists_the_model_and_streams_a_reply(endpoint):
    client = RemoteClient(endpoint, KEY)
    assert client.models() == ["tiny"] and client.choose_model() == "tiny"
    reply = client.stream_chat(HELLO, {"max_tokens": 6, "temperature": 0})
    pieces = list(reply)
    assert pieces and reply.turn.text == "".join(pieces)
    assert reply.turn.finish_reason in ("stop", "length") and reply.turn.error is None
    assert reply.turn.stats.prompt_tokens > 0 and reply.turn.stats.generated_tokens >= 1
    again = client.stream_chat(HELLO, {"max_tokens": 6, "temperature": 0})
    assert "".join(again) == reply.turn.text  # greedy: the same reply, through the server's cached prompt
    assert again.turn.stats.reused_tokens > 0


def test_a_url_without_a_path_gets_v1_and_a_bad_one_is_refused():
    assert endpoint_url("http://h:1/") == "http://h:1/v1"
    assert endpoint_url("https://h/api/v1") == "https://h/api/v1"
    for bad in ("h:1", "ftp://h/v1", "http://", "http://h:99999"):
        with pytest.raises(RemoteError, match="URL"):
            endpoint_url(bad)


@pytest.mark.parametrize("key, match", [(None, "needs an API key"), ("wrong", "check the API key")])
def test_a_missing_or_wrong_key_is_refused(endpoint, key, match):
    with pytest.raises(RemoteAuthFailed, match=match):
        RemoteClient(endpoint, key).models()


def test_an_unknown_model_is_named_with_the_ones_served(endpoint):
    with pytest.raises(RemoteModelNotFound, match="'nope'.*tiny"):
        RemoteClient(endpoint, KEY, "nope").choose_model()
    client = RemoteClient(endpoint, KEY, "tiny")
    client.model = "gone"  # listed when chosen, no longer served when asked
    with pytest.raises(RemoteModelNotFound, match="'gone'"):
        list(client.stream_chat(HELLO))


def test_a_refused_connection_and_a_silent_server_are_told_apart():
    with pytest.raises(RemoteUnreachable, match="cannot connect"):
        RemoteClient(f"http://127.0.0.1:{free_port()}/v1").models()
    with stub_endpoint(silent=True) as url:
        with pytest.raises(RemoteTimeout, match="sent nothing for 0.5 s"):
            list(RemoteClient(url, model="stub", read_timeout_s=0.5).stream_chat(HELLO))


@pytest.mark.parametrize("declared_length", [None, 10_000])  # the stream just ends / the body is cut short
def test_a_stream_cut_mid_reply_keeps_the_text_received(declared_length):
    with stub_endpoint(["Hel", "lo"], declared_length=declared_length) as url:
        reply = RemoteClient(url, model="stub").stream_chat(HELLO)
        pieces = []
        with pytest.raises(RemoteConnectionLost) as lost:
            for piece in reply:
                pieces.append(piece)
    assert pieces == ["Hel", "lo"] and lost.value.partial == "Hello"
    assert reply.turn.finish_reason == INTERRUPTED and reply.turn.text == "Hello"


def remote_chat(monkeypatch, capsys, lines, *flags):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    code = fucina(["chat", *flags, "--max-tokens", "4", "--temp", "0"])
    return code, capsys.readouterr()


def stored(home) -> tuple[dict, list[dict]]:
    with HistoryStore(home / "history.db") as store:
        (conversation,) = store.list_conversations()
        return conversation, store.active_branch(conversation["id"])


def test_fucina_chat_remote_stores_the_chat_locally(endpoint, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    code, out = remote_chat(monkeypatch, capsys, ["hello", "/stats", "more"], "--remote", endpoint, "--api-key", KEY)
    assert code == 0, out.err
    conversation, branch = stored(tmp_path)
    assert conversation["model"] == f"tiny at {endpoint}"
    assert [m["role"] for m in branch] == ["user", "assistant", "user", "assistant"]
    assert branch[0]["content"] == "hello" and branch[1]["content"] in out.out
    assert "prompt " in out.out and branch[1]["meta"]["finish_reason"] in ("stop", "length")
    # reopened by id, the endpoint answers the stored history
    code, out = remote_chat(monkeypatch, capsys, ["again"], "--remote", endpoint, "--api-key", KEY,
                            "--conversation", conversation["id"][:8])
    assert code == 0, out.err
    assert len(stored(tmp_path)[1]) == 6


def test_fucina_chat_remote_keeps_a_cut_reply_marked(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    with stub_endpoint(["Hel", "lo"]) as url:
        code, out = remote_chat(monkeypatch, capsys, ["hi"], "--remote", url)
    assert code == 0
    assert "Hello" in out.out and _cut(out.err) and "kept in the conversation" in out.err
    _, (user, reply) = stored(tmp_path)
    assert user["content"] == "hi" and reply["content"] == "Hello"
    assert reply["meta"]["finish_reason"] == INTERRUPTED and _cut(reply["meta"]["error"])


def _cut(message: str) -> bool:
    """The stub's close reaches the client as a clean end or as a reset, depending on timing: either way the
    reply was cut."""
    return "closed the connection" in message or "connection reset" in message.lower()


@pytest.mark.parametrize("flags, match", [
    (["--remote", "http://127.0.0.1:{port}/v1"], "cannot connect"),
    (["--remote", "nowhere"], "URL"),
    (["--remote", "http://127.0.0.1:{port}/v1", "smollm2-135m-instruct"], "MODEL does not apply"),
    (["--remote", "http://127.0.0.1:{port}/v1", "--regex", "a+"], "only JSON response formats"),
])
def test_fucina_chat_remote_refuses_with_one_error_line(flags, match, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FUCINA_HOME", str(tmp_path))
    code, out = remote_chat(monkeypatch, capsys, ["hi"], *[f.format(port=free_port()) for f in flags])
    assert code == 2
    assert out.err.startswith("error: ") and match in out.err and out.err.count("\n") == 1
    assert not (tmp_path / "history.db").exists() or not HistoryStore(tmp_path / "history.db").list_conversations()
