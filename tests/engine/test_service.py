"""The engine service: a compute thread, a slot pool with prefix reuse, per-request settings, cancellation
and slots that stay warm across a restart. A tiny random model with a ChatML vocabulary."""

import json
import threading

import numpy as np
import pytest

from engine.chat import ChatOptions, Conversation, Message
from engine.errors import ContextFull, StoreError
from engine.sampling import SamplerConfig
from engine.sampling.grammar import Grammar
from engine.serving.service import MIN_COPIED_PREFIX, EngineService, GenerationRequest, ServiceBusy, ServiceClosed

GREEDY = SamplerConfig()
SAMPLED = SamplerConfig(temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.models import load_model
    from tests.synthetic import write_tiny_model

    path = tmp_path_factory.mktemp("service") / "tiny.gguf"
    write_tiny_model(path, "qwen2", tokenizer=True, tied=False, seed=1)  # untied: varied replies
    return load_model(path)


@pytest.fixture
def service(tiny, tmp_path):
    svc = EngineService(tiny, slots=2, capacity=256, sidecar_dir=tmp_path / "slots")
    yield svc
    svc.close()


def ask(svc, ids, *, max_tokens=12, sampler=GREEDY, **kw):
    return svc.submit(GenerationRequest(tuple(ids), max_tokens, sampler, **kw)).wait()


def test_a_reply_is_the_plain_conversation_reply(service, tiny):
    ids = service.chat_prompt([Message("user", "hi there")])
    job = service.submit(GenerationRequest(tuple(ids), 12, GREEDY, speculation=False))
    pieces = list(job.stream())
    convo = Conversation.for_model(tiny, ChatOptions(capacity=256, max_tokens=12, sampler=GREEDY))
    expected = "".join(convo.send_tokens(ids, reuse=True))
    assert "".join(pieces) == job.result.text == expected
    assert job.result.finish_reason == convo.last_turn.finish_reason
    assert job.result.prompt_tokens == len(ids) and job.result.completion_tokens == len(convo.last_turn.token_ids)


def test_speculative_replies_equal_plain_ones(service):
    ids = service.chat_prompt([Message("user", "abc abc abc abc")])
    plain = ask(service, ids, max_tokens=30, sampler=SAMPLED, speculation=False)
    spec = ask(service, ids, max_tokens=30, sampler=SAMPLED, speculation=True)
    assert spec.text == plain.text and spec.speculation is not None and plain.speculation is None


def test_a_resent_chat_reuses_the_slot_that_holds_its_prefix(service):
    first = service.chat_prompt([Message("user", "tell me a story")])
    reply = ask(service, first)
    ask(service, service.chat_prompt([Message("user", "something else entirely")]))  # the other slot
    resent = service.chat_prompt([Message("user", "tell me a story"), Message("assistant", reply.text),
                                  Message("user", "and then?")])
    again = ask(service, resent)
    assert again.cached_tokens >= len(first)
    assert again.prompt_tokens == len(resent)


def test_slots_resume_from_their_sidecars_after_a_restart(tiny, tmp_path):
    svc = EngineService(tiny, slots=2, capacity=256, sidecar_dir=tmp_path)
    first = svc.chat_prompt([Message("user", "remember this")])
    reply = ask(svc, first)
    svc.close()
    restarted = EngineService(tiny, slots=2, capacity=256, sidecar_dir=tmp_path)
    try:
        assert max(restarted.resumed_positions) >= len(first)
        resent = restarted.chat_prompt([Message("user", "remember this"), Message("assistant", reply.text),
                                        Message("user", "well?")])
        assert ask(restarted, resent).cached_tokens >= len(first)
    finally:
        restarted.close()


def test_a_seed_reproduces_a_sampled_reply(service):
    ids = service.chat_prompt([Message("user", "pick")])
    a, b = (ask(service, ids, max_tokens=20, sampler=SAMPLED).text for _ in range(2))
    other = ask(service, ids, max_tokens=20, sampler=SamplerConfig(temperature=1.0, seed=8)).text
    assert a == b and a != other


def test_a_stop_sequence_ends_the_reply_before_it(service):
    ids = service.chat_prompt([Message("user", "go")])
    full = ask(service, ids, max_tokens=40, sampler=SAMPLED).text
    # two printable ASCII characters from the middle, first seen there (a "\ufffd" stands for no bytes)
    at = next(i for i in range(3, len(full) - 1)
              if full[i:i + 2].isascii() and full[i:i + 2].isprintable() and full.find(full[i:i + 2]) == i)
    stop = full[at:at + 2]
    cut = ask(service, ids, max_tokens=40, sampler=SAMPLED, stop=(stop,))
    assert cut.finish_reason == "stop_sequence"
    assert full.startswith(cut.text) and stop not in cut.text and len(cut.text) <= at + 1


def test_a_grammar_holds_the_reply_to_json(service):
    ids = service.chat_prompt([Message("user", "json please")])
    reply = ask(service, ids, max_tokens=60, sampler=SAMPLED, grammar=Grammar.json_object())
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.text), dict)


def test_cancelling_stops_a_reply_and_the_service_goes_on(service):
    ids = service.chat_prompt([Message("user", "long")])
    started = threading.Event()

    def sink(event):
        started.set()

    job = service.submit(GenerationRequest(tuple(ids), 200, SAMPLED), sink)
    assert started.wait(60)
    job.cancel()
    deadline = threading.Event()
    while job.result is None and not deadline.wait(0.01):
        pass
    assert job.result.finish_reason == "cancelled" and job.result.completion_tokens < 200
    assert ask(service, ids).finish_reason in ("stop", "length")
    assert service.status()["finished"]["cancelled"] == 1


def test_more_jobs_than_slots_all_finish(service, tiny, tmp_path):
    prompts = [service.chat_prompt([Message("user", f"question {i}")]) for i in range(5)]
    jobs = [service.submit(GenerationRequest(tuple(p), 8, GREEDY)) for p in prompts]
    results = [j.wait() for j in jobs]
    assert all(r.finish_reason in ("stop", "length") and r.completion_tokens for r in results)
    # The first two took empty slots and decoded together: each is bitwise its reply alone on an empty slot.
    # (The later ones continue a slot another prompt left; a prefill from another cached prefix may differ in
    # low bits, as prefill kernels depend on how many rows are fed at once.)
    alone = []
    for i, p in enumerate(prompts[:2]):
        fresh = EngineService(tiny, slots=1, capacity=256, sidecar_dir=tmp_path / f"alone{i}")
        try:
            alone.append(ask(fresh, p, max_tokens=8).text)
        finally:
            fresh.close()
    assert [r.text for r in results[:2]] == alone


def test_a_busy_slots_shared_prefix_is_copied_not_prefilled(service):
    system = Message("system", "You are a careful assistant. " * 4)
    long_ids = service.chat_prompt([system, Message("user", "first")])
    first_piece = threading.Event()
    busy = service.submit(GenerationRequest(tuple(long_ids), 200, SAMPLED), lambda e: first_piece.set())
    assert first_piece.wait(60)
    other = ask(service, service.chat_prompt([system, Message("user", "second")]))
    busy.cancel()
    assert other.cached_tokens >= MIN_COPIED_PREFIX
    fresh = Conversation.for_model(service.model, ChatOptions(capacity=256, max_tokens=12, sampler=GREEDY))
    assert other.text == "".join(fresh.send_tokens(service.chat_prompt([system, Message("user", "second")]),
                                                   reuse=True))


def test_a_prompt_the_context_cannot_hold_is_refused_at_submit(service):
    with pytest.raises(ContextFull, match="256"):
        service.submit(GenerationRequest(tuple([1] * 256), 4))


def test_a_closed_service_refuses_jobs(tiny, tmp_path):
    svc = EngineService(tiny, slots=1, capacity=64, sidecar_dir=tmp_path)
    svc.close()
    with pytest.raises(ServiceClosed):
        svc.submit(GenerationRequest((1, 2), 4))


def test_an_embedding_is_the_normalised_mean_of_the_final_hidden_states(service, tiny):
    ids = service.text_prompt("the quick brown fox")
    vector = service.embed(ids).result(60)
    hidden = tiny.hidden_states(ids, tiny.new_cache(len(ids)))
    # the hidden states are what the output matrix turns into the logits
    np.testing.assert_allclose(tiny.output(hidden), tiny.forward_all(ids, tiny.new_cache(len(ids))), rtol=1e-5, atol=1e-5)
    mean = hidden.mean(axis=0)
    np.testing.assert_allclose(vector, mean / np.linalg.norm(mean), rtol=1e-5, atol=1e-6)
    assert vector.shape == (tiny.args.n_embd,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    other = service.embed(service.text_prompt("a lazy dog sleeps")).result(60)
    assert not np.allclose(vector, other)
    with pytest.raises(ContextFull):
        service.embed([1] * 257)


def test_a_job_whose_start_fails_ends_with_its_error_and_the_service_goes_on(service, monkeypatch):
    ids = service.chat_prompt([Message("user", "hi")])

    def broken(ids):
        raise MemoryError("no room for a cache")

    monkeypatch.setattr(service, "_pick_slot", broken)
    failed = ask(service, ids)
    assert failed.finish_reason == "error" and isinstance(failed.error, MemoryError)
    monkeypatch.undo()
    assert ask(service, ids).finish_reason in ("stop", "length")


def test_a_failing_compute_thread_fails_every_job_instead_of_leaving_it_waiting(tiny, tmp_path, monkeypatch):
    svc = EngineService(tiny, slots=1, capacity=64, sidecar_dir=tmp_path)

    def bug(slot):
        raise RuntimeError("a bug in the loop")

    monkeypatch.setattr(svc, "_advance", bug)
    job = svc.submit(GenerationRequest((1, 2, 3), 4))
    assert job.wait().finish_reason == "error" and isinstance(job.result.error, RuntimeError)
    with pytest.raises(ServiceClosed):
        svc.submit(GenerationRequest((1, 2, 3), 4))
    svc.close()


def test_live_plain_replies_decode_together_and_unchanged(service, monkeypatch):
    prompts = [service.chat_prompt([Message("user", f"talk {i}")]) for i in range(2)]
    alone = [ask(service, p, max_tokens=30, sampler=SAMPLED, speculation=False).text for p in prompts]
    sizes = []
    batch = service.model.decode_batch
    monkeypatch.setattr(service.model, "decode_batch", lambda tokens, caches: sizes.append(len(tokens)) or batch(tokens, caches))
    jobs = [service.submit(GenerationRequest(tuple(p), 30, SAMPLED, speculation=False)) for p in prompts]
    assert [j.wait().text for j in jobs] == alone
    assert max(sizes) == 2


def test_a_failing_batched_forward_fails_its_jobs_and_the_service_goes_on(service, monkeypatch):
    ids = service.chat_prompt([Message("user", "hi")])

    def fail(tokens, caches):
        raise MemoryError("out of memory")

    monkeypatch.setattr(service.model, "decode_batch", fail)
    failed = ask(service, ids, max_tokens=20, speculation=False)
    assert failed.finish_reason == "error" and isinstance(failed.error, MemoryError)
    monkeypatch.undo()
    assert ask(service, ids, max_tokens=20, speculation=False).finish_reason in ("stop", "length")


def test_a_full_waiting_queue_refuses_new_jobs_until_one_ends(tiny, tmp_path):
    svc = EngineService(tiny, slots=1, capacity=64, sidecar_dir=tmp_path, max_waiting=1)
    try:
        request = GenerationRequest((1, 2, 3), 40, SAMPLED)
        jobs = [svc.submit(request), svc.submit(request)]
        with pytest.raises(ServiceBusy, match="1 slots are busy"):
            svc.submit(request)
        jobs[0].cancel()
        jobs[0].wait()
        svc.submit(request).cancel()  # a place is free again
        assert jobs[1].wait().finish_reason in ("stop", "length")
    finally:
        svc.close()


def test_a_relayed_stream_runs_on_the_compute_thread_between_the_jobs(service, tiny):
    """The app's chat session relays its reply here: the same reply as on the caller's thread, computed on
    the service's thread while a job decodes too."""
    threads = []

    def chat(convo, ids):
        for piece in convo.send_tokens(ids, reuse=True):
            threads.append(threading.current_thread().name)
            yield piece

    ids = service.chat_prompt([Message("user", "hi there")])
    options = ChatOptions(capacity=256, max_tokens=8, sampler=GREEDY)
    alone = "".join(chat(Conversation.for_model(tiny, options), ids))
    threads.clear()
    job = service.submit(GenerationRequest(tuple(ids), max_tokens=8, sampler=GREEDY))
    assert "".join(service.relay(chat(Conversation.for_model(tiny, options), ids))) == alone
    assert threads and set(threads) == {"fucina-engine"}
    assert job.wait().text == alone


def test_a_relay_closed_early_closes_its_stream_and_its_error_reaches_the_reader(service):
    closed = threading.Event()

    def endless():
        try:
            while True:
                yield "x"
        finally:
            closed.set()

    relayed = service.relay(endless())
    assert next(relayed) == "x"
    relayed.close()
    assert closed.is_set()  # closed on the compute thread before close() returned

    def failing():
        yield "a"
        raise ContextFull("too long")

    with pytest.raises(ContextFull, match="too long"):
        list(service.relay(failing()))
    service.close()
    with pytest.raises(ServiceClosed):
        next(service.relay(iter(["late"])))


def test_slots_opened_at_the_first_job_touch_the_data_dir_only_then(tiny, tmp_path):
    """The app's service relays its chat from the start but makes its slots (and their sidecars) only
    for the local server's first request; a data dir that cannot take them fails that request, not the chat."""
    directory = tmp_path / "slots"
    svc = EngineService(tiny, slots=2, capacity=256, sidecar_dir=directory, open_slots_at_first_job=True)
    try:
        assert list(svc.relay(iter(["a", "b"]))) == ["a", "b"] and not directory.exists()
        ids = svc.chat_prompt([Message("user", "hi")])
        assert svc.submit(GenerationRequest(tuple(ids), max_tokens=2)).wait().finish_reason in ("stop", "length")
        assert len(list(directory.glob("*.fkv"))) == 2
    finally:
        svc.close()
    (tmp_path / "a-file").write_text("")
    svc = EngineService(tiny, slots=1, capacity=256, sidecar_dir=tmp_path / "a-file" / "slots",
                        open_slots_at_first_job=True)
    try:
        result = svc.submit(GenerationRequest(tuple(ids), max_tokens=2)).wait()
        assert result.finish_reason == "error" and isinstance(result.error, StoreError)
        assert list(svc.relay(iter(["still"]))) == ["still"]
    finally:
        svc.close()
