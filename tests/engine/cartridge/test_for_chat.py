"""A document read for a chat: one cartridge when it fits half the chat's context (or the budget asked
for), else a fleet of parts."""

from engine.cartridge.build import Attached, prefix_ids
from engine.cartridge.fleet import FleetDocument
from engine.cartridge.for_chat import document_budget, read_for_chat
from engine.cartridge.ingest import Document
from engine.chat import Format, Template

CHATML = Template(Format.CHATML)
ROOMS = Document("rooms.txt", "text", "".join(f"Room {i} is painted {['red', 'blue', 'green'][i % 3]}.\n\n"
                                               for i in range(40)))


def test_a_document_may_take_half_the_chats_context():
    assert document_budget(4096) == 2048
    assert document_budget(1001) == 500


def test_a_document_within_half_the_context_is_one_cartridge_and_a_longer_one_a_fleet(tiny, tmp_path):
    model, tok = tiny
    rows = len(prefix_ids(tok, CHATML, ROOMS))
    whole = read_for_chat(model, tok, CHATML, ROOMS, 2 * rows, directory=tmp_path)
    assert isinstance(whole, Attached) and whole.cartridge.rows == rows
    parts = read_for_chat(model, tok, CHATML, ROOMS, 2 * rows - 2, directory=tmp_path)
    assert isinstance(parts, FleetDocument) and parts.budget == rows - 1 and len(parts.chunks) > 1
    asked = read_for_chat(model, tok, CHATML, ROOMS, 2 * rows - 2, budget=rows, directory=tmp_path)
    assert isinstance(asked, Attached) and not asked.built  # the budget asked for wins; read once, now loaded
