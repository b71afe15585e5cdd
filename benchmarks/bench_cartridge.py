"""Attached documents (KV cartridges) on a real model: time to first token, and composition vs joint prefill.

    python benchmarks/bench_cartridge.py ttft [--model qwen2.5-coder-0.5b-instruct]
    python benchmarks/bench_cartridge.py compose [--model qwen2.5-coder-0.5b-instruct]
    python benchmarks/bench_cartridge.py grounded [--model qwen2.5-coder-0.5b-instruct] [--runs 3]

ttft: a new chat over a generated ~2,800-token handbook, three ways: the cartridge built (read + stored),
the cartridge loaded (a second attach), and the document pasted into the user message. Each figure is the
setup (attach, load into the cache) plus the turn's own time to its first sampled token. Also the
cartridge's KV bytes per token and its file size.

compose: the three documents of benchmarks/cartridge_documents.json as three independently built
cartridges served together (a composition: each part keeps the rows it was built with), against one joint
prefill of the same token ids (each document then attends to the ones before it). Greedy answers to the
22 questions: how many are token-identical, and how many contain the expected answer either way.

grounded: the handbook attached as a cartridge, questions whose answers quote it (a section word for
word), greedy, speculation off and on (the attached document is a draft reference): decode tok/s of each
(medians of --runs), tokens per step and acceptance, and whether the replies are token-identical (they
must be: a difference is reported and fails the run).

Reports only: nothing here asserts a time. Prints one JSON object.
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

from engine.cartridge.build import attach, build  # noqa: E402
from engine.cartridge.cartridge import Cartridge  # noqa: E402
from engine.cartridge.ingest import Document  # noqa: E402
from engine.platform.catalog import resolve_model  # noqa: E402
from engine.chat import ChatOptions, Conversation, template_for_model  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.models.model import UBATCH  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402

WORKLOAD = ROOT / "benchmarks" / "cartridge_documents.json"


def handbook() -> Document:
    people = ["Ida Varga", "Tomas Lind", "Ama Mensah", "Kenji Ito", "Lucia Ferro", "Omar Haddad", "Sofia Berg"]
    things = ["printer paper", "spare keyboards", "archived invoices", "first-aid kits", "projector bulbs",
              "cleaning supplies", "old laptops", "visitor badges"]
    days = ["Monday", "Wednesday", "Friday"]
    text = "Facilities handbook of the Lune Street office.\n\n" + "".join(
        f"Section {i}. Storeroom {i} is on floor {i % 5 + 1} and holds {10 + i * 3} boxes of "
        f"{things[i % len(things)]}. Its key is kept by {people[i % len(people)]}, who checks the room every "
        f"{days[i % 3]}. Storeroom {i} was last repainted in {1990 + i}.\n" for i in range(1, 46))
    return Document("handbook.txt", "text", text)


def first_token(convo: Conversation, user: str) -> float:
    """Seconds from the turn's start to its first sampled token."""
    stream = convo.send(user)
    next(stream, None)
    stream.close()
    return convo.last_turn.stats.ttft_ms / 1e3


def ttft(model, tok, template) -> dict:
    doc, question = handbook(), "Who keeps the key of storeroom 17, and what does it hold?"
    directory = tempfile.mkdtemp()
    out = {}
    for mode in ("build", "load"):
        t0 = time.perf_counter()
        a = attach(model, tok, template, doc, directory=directory)
        convo = Conversation.for_model(model, ChatOptions(capacity=a.cartridge.rows + 512, max_tokens=8),
                                       tokenizer=tok)
        convo.attach([a.cartridge])
        setup = time.perf_counter() - t0
        turn = first_token(convo, question)
        out[mode] = {"built": a.built, "attach_s": round(a.seconds, 3), "turn_ttft_s": round(turn, 3),
                     "to_first_token_s": round(setup + turn, 3)}
        out |= {"tokens": a.cartridge.rows, "bytes_per_token": a.cartridge.byte_size() / a.cartridge.rows,
                "file_bytes": Path(a.path).stat().st_size}
    convo = Conversation.for_model(model, ChatOptions(capacity=out["tokens"] + 512, max_tokens=8), tokenizer=tok)
    out["pasted"] = {"to_first_token_s": round(first_token(convo, doc.text + "\n\n" + question), 3),
                     "prompt_tokens": convo.last_turn.stats.prompt_tokens}
    out["pasted_over_load"] = round(out["pasted"]["to_first_token_s"] / out["load"]["to_first_token_s"], 1)
    return out


GROUNDED = ["Quote section 17 of the handbook word for word.", "Copy out what the handbook says about storeroom 8.",
            "Which storerooms does Kenji Ito keep the key of? Quote their sections.",
            "Quote the sections about storerooms 30 and 31.", "What does the handbook say about storeroom 42? Quote it."]


def grounded(model, tok, template, runs: int) -> dict:
    a = attach(model, tok, template, handbook(), directory=tempfile.mkdtemp())
    modes = {}
    for speculation in (False, True):
        tps, tokens, steps, drafted, accepted, replies = [], 0, 0, 0, 0, []
        for run in range(runs):
            times, count = 0.0, 0
            for question in GROUNDED:
                convo = Conversation.for_model(model, ChatOptions(capacity=a.cartridge.rows + 512, max_tokens=160,
                                                                  speculation=speculation), tokenizer=tok)
                convo.attach([a.cartridge])
                "".join(convo.send(question))
                s = convo.last_turn.stats
                times += s.generated_tokens / s.decode_tps if s.decode_tps else 0.0
                count += s.generated_tokens
                if run == 0:
                    replies.append(convo.last_turn.token_ids)
                    if s.spec is not None:
                        steps, drafted, accepted = steps + s.spec.steps, drafted + s.spec.drafted, accepted + s.spec.accepted
                    tokens += s.generated_tokens
            tps.append(count / times)
        modes["spec" if speculation else "plain"] = {"decode_tps": sorted(tps), "tokens": tokens,
                                                     "replies": replies,
                                                     **({"tokens_per_step": round(tokens / steps, 2),
                                                         "acceptance": round(accepted / max(1, drafted), 3)}
                                                        if speculation else {})}
    plain, spec = modes["plain"], modes["spec"]
    identical = plain.pop("replies") == spec.pop("replies")
    median = lambda v: v[len(v) // 2]  # noqa: E731
    return {"document_tokens": a.cartridge.rows, "questions": len(GROUNDED), "plain": plain, "spec": spec,
            "identical": identical, "speedup": round(median(spec["decode_tps"]) / median(plain["decode_tps"]), 2)}


def compose(model, tok, template) -> dict:
    workload = json.loads(WORKLOAD.read_text())
    parts = [build(model, tok, template, Document(n, "text", t)) for n, t in workload["documents"].items()]
    ids = list(parts[0].draft_reference)
    for p in parts[1:]:  # the same ids, less a later part's BOS
        more = list(p.draft_reference)
        ids += more[1:] if tok.add_bos and more and more[0] == tok.bos_id else more
    cache = model.new_cache(len(ids))
    for s in range(0, len(ids), UBATCH):
        model.forward(ids[s: s + UBATCH], cache)
    joint = Cartridge.from_cache(cache, ids, parts[0].fingerprint, "0" * 64)
    rows = []
    for item in workload["questions"]:
        answers = {}
        for mode, carts in (("composed", parts), ("joint", [joint])):
            c = Conversation.for_model(model, ChatOptions(capacity=joint.rows + 256, max_tokens=24), tokenizer=tok)
            c.attach(carts)
            answers[mode] = ("".join(c.send(item["question"])), c.last_turn.token_ids)
        expect = item["answer"].lower()
        rows.append({"same": answers["composed"][1] == answers["joint"][1],
                     "composed_ok": expect in answers["composed"][0].lower(),
                     "joint_ok": expect in answers["joint"][0].lower()})
        print(json.dumps({"question": item["question"], "composed": answers["composed"][0],
                          "joint": answers["joint"][0]}), file=sys.stderr, flush=True)
    return {"parts_tokens": [p.rows for p in parts], "questions": len(rows),
            "identical_answers": sum(r["same"] for r in rows),
            "composed_correct": sum(r["composed_ok"] for r in rows),
            "joint_correct": sum(r["joint_ok"] for r in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["ttft", "compose", "grounded"])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--runs", type=int, default=3, help="grounded: runs of each mode (medians)")
    args = parser.parse_args()
    model = load_model(resolve_model(args.model))
    tok = load_tokenizer(model.file.metadata)
    template = template_for_model(model.file.metadata, tok)
    if args.what == "grounded":
        result = grounded(model, tok, template, args.runs)
    else:
        result = (ttft if args.what == "ttft" else compose)(model, tok, template)
    print(json.dumps({"model": args.model, args.what: result}))
    return 0 if result.get("identical", True) else 1


if __name__ == "__main__":
    sys.exit(main())
