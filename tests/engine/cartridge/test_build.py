"""Building, storing and loading cartridges: a load is bitwise the build, a second attach does no prefill,
and a foreign or damaged file is refused and built again."""

import threading

import numpy as np
import pytest

from engine.cartridge import store
from engine.cartridge.build import attach, build, prefix_ids
from engine.cartridge.ingest import Document
from engine.chat import Format, Template
from engine.errors import CartridgeCancelled, CartridgeRefused, DocumentTooLong
from engine.kv.persist import model_fingerprint
from engine.models.model import UBATCH

CHATML = Template(Format.CHATML)
# long enough that its prefill takes two UBATCH slices (the byte-level vocabulary: ~1 token per byte)
DOC = Document("facts.md", "text", "# Facts\n" + "".join(f"Item {i} weighs {i * 7 % 13} grams.\n" for i in range(22)))


def assert_same_rows(a, b):
    assert a.dtype == b.dtype and a.rows == b.rows
    np.testing.assert_array_equal(a.draft_reference, b.draft_reference)
    for x, y in zip(a.k + a.v, b.k + b.v):
        np.testing.assert_array_equal(x, y)


def test_the_document_is_wrapped_as_a_system_block_and_prefilled_into_an_empty_cache(tiny):
    model, tok = tiny
    ids = prefix_ids(tok, CHATML, DOC)
    assert tok.decode(ids).startswith("<|im_start|>system\nThe user attached") and len(ids) > UBATCH
    assert tok.decode(ids).endswith(DOC.text.strip() + "<|im_end|>\n")
    cart = build(model, tok, CHATML, DOC)
    cache = model.new_cache(len(ids))
    for s in range(0, len(ids), UBATCH):
        model.forward(ids[s: s + UBATCH], cache)
    assert cart.rows == len(ids) and cart.draft_reference.tolist() == ids
    for x, y in zip(cart.k + cart.v, cache.k + cache.v):
        np.testing.assert_array_equal(x, y[: len(ids)])


@pytest.mark.parametrize("dtype, shape", [("f16", {}), ("q8_0", {"n_head": 2, "n_head_kv": 1})])
def test_load_of_save_is_bitwise(tiny_models, cartridges, dtype, shape):
    model, tok = tiny_models(**shape)
    cart = build(model, tok, CHATML, DOC, dtype)
    path = store.save(cart)
    assert path.name == f"{cart.id}.safetensors" and cart.id.endswith(dtype)
    assert_same_rows(store.load(path, model.new_cache(1, dtype), model_fingerprint(model.file)), cart)


def test_the_file_holds_the_spec_state_dict(tiny, cartridges):
    from safetensors.numpy import load_file

    model, tok = tiny
    cart = build(model, tok, CHATML, DOC)
    tensors = load_file(store.save(cart))
    assert set(tensors) == {f"layers.{i}.{kv}" for i in range(model.n_layers) for kv in "kv"} | {"draft_reference"}
    assert tensors["layers.0.k"].dtype == np.float16 and tensors["layers.0.k"].shape == (cart.rows, 2, 16)
    assert tensors["draft_reference"].dtype == np.int64


def test_attaching_a_built_document_loads_its_rows_without_a_prefill(tiny, cartridges, monkeypatch):
    model, tok = tiny
    first = attach(model, tok, CHATML, DOC)
    assert first.built and first.refused is None
    for step in ("feed", "forward"):
        monkeypatch.setattr(model, step, lambda *a: pytest.fail("a stored cartridge was prefilled again"))
    second = attach(model, tok, CHATML, DOC)
    assert not second.built and second.path == first.path
    assert_same_rows(second.cartridge, first.cartridge)


def _damage_truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _damage_flip(path):
    data = bytearray(path.read_bytes())
    data[-200] ^= 0x40  # a row byte: the file still parses
    path.write_bytes(bytes(data))


def _damage_header(path):
    path.write_bytes(b"\xff" * 8 + path.read_bytes()[8:])


@pytest.mark.parametrize("damage, words", [(_damage_truncate, "damaged"), (_damage_flip, "checksum"),
                                           (_damage_header, "damaged")])
def test_a_damaged_cartridge_is_refused_and_built_again(tiny, cartridges, damage, words):
    model, tok = tiny
    good = attach(model, tok, CHATML, DOC)
    damage(good.path)
    with pytest.raises(CartridgeRefused, match=words):
        store.load(good.path, model.new_cache(1), model_fingerprint(model.file))
    again = attach(model, tok, CHATML, DOC)
    assert again.built and words in again.refused
    assert_same_rows(again.cartridge, good.cartridge)
    assert_same_rows(store.load(good.path, model.new_cache(1), model_fingerprint(model.file)), good.cartridge)


def test_a_cartridge_of_another_model_or_cache_type_is_refused(tiny_models, cartridges):
    model, tok = tiny_models()
    other, _ = tiny_models(seed=1)  # same geometry, other weights
    path = store.save(build(other, tok, CHATML, DOC))
    with pytest.raises(CartridgeRefused, match="another model"):
        store.load(path, model.new_cache(1), model_fingerprint(model.file))
    with pytest.raises(CartridgeRefused, match="f16 KV cache, not q8_0"):
        store.load(path, tiny_models(n_head=2, n_head_kv=1)[0].new_cache(1, "q8_0"), model_fingerprint(other.file))
    wide, _ = tiny_models(n_head_kv=4)  # another geometry, its fingerprint forged to match
    with pytest.raises(CartridgeRefused, match="layer 0 rows"):
        store.load(path, wide.new_cache(1), model_fingerprint(other.file))


def test_progress_is_reported_per_slice_and_cancel_stops_the_build_storing_nothing(tiny, cartridges):
    model, tok = tiny
    n = len(prefix_ids(tok, CHATML, DOC))
    seen = []
    build(model, tok, CHATML, DOC, on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(s, n) for s in range(0, n, UBATCH)] + [(n, n)] and len(seen) > 2
    cancel = threading.Event()

    def stop_after_first_slice(done, total):
        if done:
            cancel.set()

    with pytest.raises(CartridgeCancelled, match="facts.md"):
        attach(model, tok, CHATML, DOC, on_progress=stop_after_first_slice, cancel=cancel)
    assert not cartridges.exists() or not list(cartridges.iterdir())


def test_a_document_longer_than_the_model_context_is_refused_before_any_prefill(tiny):
    model, tok = tiny
    long = Document("long.txt", "text", "x" * (model.args.context_length + 1))
    with pytest.raises(DocumentTooLong, match="long.txt takes"):
        build(model, tok, CHATML, long)


def test_the_library_lists_stored_cartridges(tiny, cartridges):
    model, tok = tiny
    path = attach(model, tok, CHATML, DOC).path
    (cartridges / "junk.safetensors").write_bytes(b"not one")
    [listed] = store.stored()
    assert (listed.path, listed.name, listed.kv_dtype) == (path, "facts.md", "f16")
    assert listed.rows == len(prefix_ids(tok, CHATML, DOC)) and listed.bytes == path.stat().st_size


def test_the_folder_keeps_to_its_disk_budget_evicting_the_least_recently_used(tiny, cartridges):
    import os

    model, tok = tiny
    docs = [Document(f"d{i}.txt", "text", f"Document number {i}.") for i in range(3)]
    paths = [attach(model, tok, CHATML, d).path for d in docs]
    for age, path in enumerate(paths):  # d0 used most recently, d2 longest ago
        os.utime(path, (1000 - age, 1000 - age))
    attach(model, tok, CHATML, docs[2])  # a load makes d2 the most recent
    size = paths[0].stat().st_size
    fourth = attach(model, tok, CHATML, Document("d3.txt", "text", "Document number 3."), disk_budget=3 * size)
    assert sorted(p.name for p in cartridges.glob("*.safetensors")) == sorted(
        p.name for p in [paths[0], paths[2], fourth.path])  # d1, the least recently used, went
