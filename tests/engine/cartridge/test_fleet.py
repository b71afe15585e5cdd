"""Documents larger than the chat's budget, served as a fleet of chunk cartridges: the split, the chunk
index on disk, the cosine ranking, and a fleet answer's prefix against the real prefill of its chunks."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.cartridge import index as chunk_index
from engine.cartridge.build import prefix_ids
from engine.cartridge.cartridge import write_composed
from engine.cartridge.chunks import split_text
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.index import ChunkIndex
from engine.cartridge.ingest import Document
from engine.chat import Format, Template
from engine.errors import CartridgeRefused, DocumentTooLong
from engine.models.model import UBATCH

CHATML = Template(Format.CHATML)
# Paragraphs of several lines, one line longer than a small budget, and one "word" longer still.
TEXT = ("".join(f"Section {i}.\n" + "".join(f"Shelf {i}.{j} holds {i * j % 17} jars of honey.\n"
                                              for j in range(i % 5 + 1)) + "\n" for i in range(40))
        + "A long line " + "of words " * 40 + "ends here.\n\n" + "z" * 300 + "\n")
BIG = Document("shelves.txt", "text", TEXT)


@pytest.mark.parametrize("budget", [24, 64, 200])
def test_a_split_keeps_every_chunk_within_the_budget_and_joins_back_into_the_text(tiny, budget):
    _, tok = tiny
    chunks = split_text(TEXT, tok, budget)
    assert "".join(chunks) == TEXT
    assert max(len(tok.encode(c, add_special=False)) for c in chunks) <= budget
    assert len(chunks) >= len(tok.encode(TEXT, add_special=False)) / budget


def test_a_split_cuts_at_paragraphs_when_they_fit(tiny):
    _, tok = tiny
    chunks = split_text(TEXT, tok, 200)
    long_line = next(i for i, c in enumerate(chunks) if "A long line" in c)
    assert long_line > 10 and all(c.endswith("\n\n") for c in chunks[:long_line])
    assert any(c.endswith("of ") for c in chunks[long_line:])  # a line over the budget is cut between words


def test_a_heading_starts_the_chunk_of_its_paragraph(tiny):
    _, tok = tiny
    text = "".join(f"## Topic {i}\n\nThe body of topic {i} has one long sentence of words in it.\n\n" for i in range(8))
    chunks = split_text(text, tok, 150)  # room for two topics, or one and the next heading
    assert "".join(chunks) == text and len(chunks) == 4
    assert all(c.startswith("## Topic") and c.rstrip().endswith("in it.") for c in chunks)


def test_a_budget_below_one_token_is_refused(tiny):
    with pytest.raises(ValueError):
        split_text(TEXT, tiny[1], 0)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def planted_index(**identity):
    """Unit chunk embeddings that share one large common direction (as raw causal-LM embeddings do), each
    plus a small direction of its own."""
    rng = np.random.default_rng(3)
    common, own = 10 * rng.standard_normal(32), rng.standard_normal((5, 32))
    identity = {"fingerprint": b"\x01" * 32, "kv_dtype": "f16", "document": "ab" * 32, "chunk_budget": 100,
                "chunks": [f"{i:064x}" for i in range(5)]} | identity
    return ChunkIndex.from_embeddings(unit(common + own), **identity), common, own, rng


def test_cosine_ranking_after_centring_finds_the_chunk_a_query_is_about():
    index, common, own, rng = planted_index()
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(index.centroid, unit(common + own).mean(axis=0), rtol=1e-5)
    for target in range(5):
        query = unit(common + own[target] + 0.3 * rng.standard_normal(32))  # near the chunk, not on it
        ranking = index.ranking(query)
        assert ranking[0] == target and sorted(ranking) == list(range(5))


def test_equal_scores_rank_the_earlier_chunk_first():
    twins = unit(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]))
    index = ChunkIndex.from_embeddings(twins, fingerprint=b"", kv_dtype="f16", document="", chunk_budget=1,
                                       chunks=["a", "b", "c"])
    assert index.ranking(np.array([1.0, 0.0]))[:2] == [0, 2]


def test_an_index_saved_and_loaded_is_bitwise_and_refused_for_another_model_or_split(tmp_path):
    index, *_ = planted_index()
    path = chunk_index.save(index, tmp_path / "doc.index.safetensors")
    identity = {k: getattr(index, k) for k in ("fingerprint", "kv_dtype", "document", "chunk_budget", "chunks")}
    loaded = chunk_index.load(path, identity)
    assert loaded.vectors.tobytes() == index.vectors.tobytes()
    assert loaded.centroid.tobytes() == index.centroid.tobytes()
    for other, says in [({"fingerprint": b"\x02" * 32}, "another model"), ({"chunk_budget": 99}, "chunk budget"),
                        ({"kv_dtype": "q8_0"}, "kv dtype"), ({"chunks": identity["chunks"][::-1]}, "chunks")]:
        with pytest.raises(CartridgeRefused, match=says):
            chunk_index.load(path, identity | other)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the vectors
    path.write_bytes(bytes(data))
    with pytest.raises(CartridgeRefused, match="checksum"):
        chunk_index.load(path, identity)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CartridgeRefused, match="damaged"):
        chunk_index.load(path, identity)


SHELVES = Document("shelves.txt", "text", TEXT.split("Section 20.")[0])  # ~1,800 tokens: a dozen chunks
BUDGET = 900


def open_fleet(tiny, directory, budget=BUDGET, **kw):
    model, tok = tiny
    return FleetDocument.open(model, tok, CHATML, SHELVES, budget, directory=directory, **kw)


@pytest.fixture(scope="module")
def built(tiny_models, tmp_path_factory):
    """A folder holding SHELVES's fleet, read once for the module; copy it before changing it."""
    directory = tmp_path_factory.mktemp("fleet")
    open_fleet(tiny_models(), directory)
    return directory


@pytest.fixture
def fleet_dir(built, tmp_path):
    return Path(shutil.copytree(built, tmp_path / "fleet"))


def test_a_fleet_serves_the_best_chunks_that_fit_in_document_order(tiny, built):
    fleet = open_fleet(tiny, built)
    assert len(fleet.chunks) > 3
    assert "".join(c.text for c in fleet.chunks) == SHELVES.text.strip()
    served = fleet.select("How many jars of honey are on shelf 12.3?")
    assert 1 <= len(served) <= 3
    assert [a.chunk for a in served] == sorted(a.chunk for a in served)
    assert sum(a.cartridge.rows for a in served) <= BUDGET
    assert all(not a.built for a in served)  # built when the fleet was opened, loaded now
    for a in served:
        assert a.cartridge.draft_reference.tolist() == prefix_ids(tiny[1], CHATML, fleet.chunks[a.chunk])


def test_a_fleet_answers_prefix_is_bitwise_the_real_prefill_of_its_chunks(tiny, built):
    model, tok = tiny
    fleet = open_fleet(tiny, built)
    served = fleet.select("What is on shelf 7.2?")
    question = tok.encode("<|im_start|>user\nWhat is on shelf 7.2?<|im_end|>\n<|im_start|>assistant\n",
                          add_special=False)
    rows = sum(a.cartridge.rows for a in served)
    cache = model.new_cache(rows + len(question))
    write_composed([a.cartridge for a in served], cache)
    direct = model.new_cache(rows + len(question))
    for a in served:  # each chunk prefilled on its own, from position 0, then placed after the ones before it
        ids = prefix_ids(tok, CHATML, fleet.chunks[a.chunk])
        own = model.new_cache(len(ids))
        for s in range(0, len(ids), UBATCH):
            model.forward(ids[s: s + UBATCH], own)
        for dst, src in zip(direct.k + direct.v, own.k + own.v):
            dst[direct.len: direct.len + own.len] = src[: own.len]
        direct.len += own.len
    np.testing.assert_array_equal(model.forward_all(question, cache), model.forward_all(question, direct))


def test_a_reopened_fleet_reads_nothing_again_and_a_foreign_index_is_rebuilt(tiny, fleet_dir):
    seen = []
    first = open_fleet(tiny, fleet_dir, on_progress=lambda done, total: seen.append(total))
    assert set(seen) == {0}  # neither a chunk nor an embedding to compute
    [index_file] = fleet_dir.glob("*.index.safetensors")
    index_file.write_bytes(b"not an index")
    rebuilt = open_fleet(tiny, fleet_dir)
    assert rebuilt.index.vectors.tobytes() == first.index.vectors.tobytes()
    assert chunk_index.load(index_file, {k: getattr(first.index, k) for k in
                                         ("fingerprint", "kv_dtype", "document", "chunk_budget", "chunks")})


def test_an_evicted_chunk_is_read_again_when_it_is_selected(tiny, fleet_dir):
    fleet = open_fleet(tiny, fleet_dir)
    for path in fleet_dir.glob("*.safetensors"):
        if ".index." not in path.name:
            os.unlink(path)
    served = fleet.select("What is on shelf 3.1?")
    assert served and all(a.built for a in served)


def test_a_budget_too_small_for_parts_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(DocumentTooLong, match="too small"):
        open_fleet(tiny, tmp_path, budget=300)


def test_the_served_chunks_are_the_best_that_fit_the_budget_at_most_per_answer_in_document_order():
    fleet = FleetDocument(document=BIG, chunks=[], rows=[500, 500, 200, 100, 50], index=None, budget=900,
                          per_answer=3, model=None, tokenizer=None, template=CHATML, dtype=None, directory=None,
                          disk_budget=0)
    assert fleet.fitting([1, 0, 3, 2, 4]) == [1, 2, 3]  # 1, not 0 (it no longer fits), 3, 2; then three
    assert fleet.fitting([4, 3]) == [3, 4]
