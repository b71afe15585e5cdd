"""`fucina eval` and `fucina generate`: scriptable access to the model's logits and greedy output."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from app.cli.attach import add_attach_option, attach_documents
from app.cli.common import add_model_options, open_model
from app.cli.reply_printer import ReplyPrinter
from app.cli.sampling import (add_grammar_options, add_sampler_options, grammar_from_args, print_reply_checks,
                              sampler_config)
from engine import generate
from engine.cartridge.cartridge import composed_rows
from engine.chat import ChatOptions, Conversation, Message, template_for_model
from engine.chat.model_template import stop_token_id
from engine.errors import FucinaError
from engine.model_tokenizer import tokenizer_for
from engine.sampling import Sampler
from engine.serving.session import DEFAULT_CONTEXT
from engine.speculative import Stats
from engine.sampling.grammar import grammar_processor
from engine.tokenize import StreamDecoder


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise FucinaError(f"token ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise FucinaError("no token ids given")
    return ids


def prompt_tokens(args, model, tokenizer) -> list[int]:
    """The prompt as ids: given directly, or the text encoded with the model's own tokenizer (rendered as
    a one-turn chat with the model's chat template first, with --chat)."""
    if getattr(args, "chat", False):
        if args.prompt is None:
            raise FucinaError("--chat needs the prompt as text (--prompt or --prompt-file)")
        return tokenizer.encode(template_for_model(model.file.metadata, tokenizer).render_messages(
            [Message("user", args.prompt)]))
    if args.prompt is not None:
        ids = tokenizer.encode(args.prompt)
        if not ids:
            raise FucinaError("the prompt is empty")
        return ids
    return parse_ids(args.ids)


def run_eval(args) -> int:
    model = open_model(args)
    tokenizer = tokenizer_for(model)
    ids = prompt_tokens(args, model, tokenizer)
    if args.top < 1:
        raise FucinaError("--top must be at least 1")
    rows = []
    for logits in generate.teacher_forced(model, ids, args.kv, path=args.path):
        top_ids, top_vals = generate.top_k(logits, args.top)
        rows.extend({"top_ids": i.tolist(), "top_logits": [round(float(v), 5) for v in l]}
                    for i, l in zip(top_ids, top_vals))
    if args.json:
        json.dump({"ids": ids, "positions": rows}, sys.stdout)
        print()
    else:
        for pos, (tok, row) in enumerate(zip(ids, rows)):
            pairs = " ".join(f"{i}:{v:.3f}" for i, v in zip(row["top_ids"], row["top_logits"]))
            print(f"{pos:5d} {tok:7d} {tokenizer.token_bytes(tok)!r:>14} -> {pairs}")
    return 0


def read_prompt_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise FucinaError(f"cannot read the prompt file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise FucinaError(f"the prompt file {path} is not UTF-8 text") from None


def run_generate(args) -> int:
    if args.max_tokens < 1:
        raise FucinaError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.prompt_file is not None:
        args.prompt = read_prompt_file(args.prompt_file)
    grammar = grammar_from_args(args)
    if grammar is not None and args.no_stop:
        raise FucinaError("--no-stop cannot be combined with a reply grammar: a finished grammar ends the reply "
                          "with the stop token")
    if args.attach and not args.chat:
        raise FucinaError("--attach serves a chat: add --chat (the prompt is the user's question)")
    if args.attach and args.no_stop:
        raise FucinaError("--no-stop cannot be combined with --attach: a chat reply ends on its stop token")
    model = open_model(args)
    if args.attach:
        return generate_attached(args, model, grammar)
    tokenizer = tokenizer_for(model)
    prompt = prompt_tokens(args, model, tokenizer)
    stops = () if args.no_stop else tokenizer.eog_ids
    processor = None
    if grammar is not None:  # a chat reply ends on its template's stop marker, plain text on EOS
        stop = stop_token_id(tokenizer, template_for_model(model.file.metadata, tokenizer)) if args.chat else None
        processor = grammar_processor(grammar, tokenizer, stop)
    sampler = Sampler(sampler_config(args), processor)
    spec = Stats() if args.spec else None
    tokens = (generate.sample_speculative(model, prompt, args.max_tokens, sampler, stops, args.kv, stats=spec)
              if args.spec else generate.sample(model, prompt, args.max_tokens, sampler, stops, args.kv))
    stream = StreamDecoder(tokenizer)
    out, times, finish = [], [], "length"
    for tok in tokens:
        times.append(time.perf_counter())
        if tok in stops:
            finish = "stop"
            break
        out.append(tok)
        if not args.json:
            print(stream.push(tok), end="", flush=True)
    # sampled tokens per second after the first (the first waits for the prefill), as a chat turn counts
    decode_tps = (len(times) - 1) / max(times[-1] - times[0], 1e-9) if len(times) > 1 else 0.0
    if len(out) < args.max_tokens and finish == "length":
        finish = "context"
    if processor is not None and processor.closed_early:
        finish = "length_closed"
    text = tokenizer.decode(out)
    warnings = [str(w) for w in grammar.check_reply(text)] if grammar is not None else []
    if args.json:
        json.dump({"prompt_ids": prompt, "ids": out, "text": text, "decode_tps": decode_tps,
                   "finish_reason": finish, "schema_warnings": warnings,
                   "spec": None if spec is None else spec_stats(spec)}, sys.stdout)
    elif spec is not None:
        print(f"\n[{decode_tps:.1f} tok/s; speculation: {spec.summary()}]", end="", file=sys.stderr)
    print()
    if not args.json:
        print_reply_checks(finish, warnings)
    return 0


def generate_attached(args, model, grammar) -> int:
    """One chat turn behind the attached documents' cartridges (app.cli.attach)."""
    # served as to a chat of the default context (the turn's own context is sized to fit what is served)
    attached = attach_documents(model, args.attach, args.kv, DEFAULT_CONTEXT, budget=args.doc_budget,
                                question=lambda: args.prompt)
    prefix = composed_rows([a.cartridge for a in attached])
    tokenizer = tokenizer_for(model)
    # room for the prefix, the question in its template and the reply
    capacity = prefix + len(tokenizer.encode(args.prompt, add_special=False)) + 64 + args.max_tokens
    convo = Conversation.for_model(model, ChatOptions(
        capacity=capacity, kv_dtype=args.kv, max_tokens=args.max_tokens, sampler=sampler_config(args),
        speculation=args.spec, grammar=grammar), tokenizer=tokenizer)
    convo.attach([a.cartridge for a in attached])
    show = ReplyPrinter()
    for piece in convo.send(args.prompt):
        if not args.json:
            show(piece)
    show.end_reasoning()
    turn = convo.last_turn
    if turn.finish_reason == "error":
        raise turn.error
    if args.json:
        json.dump({"prompt_ids": convo.history[: len(convo.history) - len(turn.token_ids)], "ids": turn.token_ids,
                   "text": turn.text, "reasoning": turn.reasoning, "decode_tps": turn.stats.decode_tps,
                   "ttft_ms": turn.stats.ttft_ms,
                   "finish_reason": turn.finish_reason, "schema_warnings": list(turn.schema_warnings),
                   "spec": None if turn.stats.spec is None else spec_stats(turn.stats.spec),
                   "attachments": [{"name": a.cartridge.name, "id": a.cartridge.id, "tokens": a.cartridge.rows,
                                    "built": a.built, "seconds": round(a.seconds, 3),
                                    "bytes": a.cartridge.byte_size(), "chunk": a.chunk} for a in attached]}, sys.stdout)
    elif turn.stats.spec is not None:
        print(f"\n[{turn.stats.decode_tps:.1f} tok/s; speculation: {turn.stats.spec.summary()}]", end="",
              file=sys.stderr)
    print()
    if not args.json:
        print_reply_checks(turn.finish_reason, turn.schema_warnings)
    return 0


def spec_stats(stats: Stats) -> dict:
    """The speculative decoder's counts, with the two rates a report reads."""
    return dataclasses.asdict(stats) | {"tokens_per_step": stats.tokens_per_step(),
                                        "acceptance": stats.acceptance_rate()}


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="teacher-forced top-k logits at every position")
    add_model_options(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", help="comma-separated token ids")
    source.add_argument("--prompt", help="text, encoded with the model's tokenizer")
    p.add_argument("--top", type=int, default=10, help="how many logits per position (default 10)")
    p.add_argument("--path", choices=generate.PATHS, default="prefill",
                   help="prefill: the prompt path (default); rows: one row-wise call, as speculative verification "
                        "runs; decode: one token at a time. rows and decode print identical numbers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run_eval)

    p = subparsers.add_parser("generate", help="continuation of a prompt (greedy unless sampling is asked for)")
    add_model_options(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt-ids", dest="ids", help="comma-separated prompt token ids")
    source.add_argument("--prompt", help="prompt text, encoded with the model's tokenizer")
    source.add_argument("--prompt-file", help="a UTF-8 file holding the prompt text")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--no-stop", action="store_true", help="do not stop at an end-of-generation token")
    p.add_argument("--chat", action="store_true", help="render the prompt as a one-turn chat with the model's template")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--spec", action="store_true",
                   help="speculative decoding (drafts from the prompt and the output, verified): the same ids")
    add_attach_option(p)
    add_sampler_options(p)
    add_grammar_options(p)
    p.set_defaults(func=run_generate)
