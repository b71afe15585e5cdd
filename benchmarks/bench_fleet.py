"""A document larger than the context, served as a fleet of chunk cartridges: retrieval and answers.

    python benchmarks/bench_fleet.py [--model smollm2-135m-instruct] [--ctx 640] [--budget 480]

The document is benchmarks/fleet_document.json's guide to an invented town (one section per topic, about
3x a 640-token context on the starter models), opened as a FleetDocument for a prefix budget of --budget
tokens in a --ctx context: it is cut into chunks, every chunk becomes a cartridge, and the chunk index is
built through the model. For each question, the chunk holding its answer is the one that holds the
answer's words in the document. Reported: the retrieval hit rate (that chunk ranked first; among the first
three; among the chunks actually served within the budget), and how many greedy answers from a chat
behind the served chunks contain the expected words, against a chat behind the answer's own chunk (what
a perfect retrieval would give this model).

Reports only: nothing here asserts a figure. Prints one JSON object (each question on stderr as it goes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.cartridge.fleet import FleetDocument  # noqa: E402
from engine.cartridge.ingest import Document  # noqa: E402
from engine.platform.catalog import resolve_model  # noqa: E402
from engine.chat import ChatOptions, Conversation, template_for_model  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402

WORKLOAD = ROOT / "benchmarks" / "fleet_document.json"


def answer(model, tok, ctx: int, attached, question: str) -> str:
    c = Conversation.for_model(model, ChatOptions(capacity=ctx, max_tokens=32), tokenizer=tok)
    c.attach([a.cartridge for a in attached])
    return "".join(c.send(question))


def answer_chunk(fleet: FleetDocument, section: dict) -> int:
    """The chunk holding the answer's words within the section's text (chunks join back into the text)."""
    text = fleet.document.text.strip()
    at = text.index(section["text"]) + section["text"].index(section["answer"])
    end = 0
    for i, chunk in enumerate(fleet.chunks):
        end = text.index(chunk.text, end) + len(chunk.text)
        if at < end:
            return i
    raise AssertionError(f"no chunk holds {section['answer']!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--ctx", type=int, default=640, help="the chat's context (default 640)")
    parser.add_argument("--budget", type=int, default=480,
                        help="prefix tokens the served chunks may take (default 480)")
    parser.add_argument("--dir", default=None, help="the cartridge folder (default: a new temporary one, so "
                                                    "the fleet is read from scratch)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    args = parser.parse_args()
    workload = json.loads(WORKLOAD.read_text())
    sections = workload["sections"]
    document = Document("caldera-bay.md", "text",
                        "\n\n".join(f"## {s['title']}\n\n{s['text']}" for s in sections))
    model = load_model(resolve_model(args.model))
    tok = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tok)
    t0 = time.perf_counter()
    fleet = FleetDocument.open(model, tok, template, document, args.budget, directory=args.dir or tempfile.mkdtemp())
    open_s = time.perf_counter() - t0
    rows = []
    for s in sections[: args.limit]:
        want = answer_chunk(fleet, s)
        ranking = fleet.ranked(s["question"])
        served = fleet.fitting(ranking)
        reply = answer(model, tok, args.ctx, fleet.serve(served), s["question"])
        oracle = answer(model, tok, args.ctx, fleet.serve([want]), s["question"])
        row = {"question": s["question"], "answer_chunk": want, "ranked": ranking[:3], "served": served,
               "reply": reply, "oracle_reply": oracle, "top1": ranking[0] == want, "top3": want in ranking[:3],
               "in_served": want in served, "correct": s["answer"].lower() in reply.lower(),
               "oracle_correct": s["answer"].lower() in oracle.lower()}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    n = len(rows)
    print(json.dumps({
        "model": args.model, "ctx": args.ctx, "budget": args.budget,
        "document_tokens": len(tok.encode(document.text, add_special=False)), "chunks": len(fleet.chunks),
        "chunk_rows": [min(fleet.rows), max(fleet.rows)], "open_s": round(open_s, 1), "questions": n,
        "hit_top1": sum(r["top1"] for r in rows), "hit_top3": sum(r["top3"] for r in rows),
        "hit_served": sum(r["in_served"] for r in rows),
        "served_per_answer": round(sum(len(r["served"]) for r in rows) / n, 2),
        "correct": sum(r["correct"] for r in rows), "oracle_correct": sum(r["oracle_correct"] for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
