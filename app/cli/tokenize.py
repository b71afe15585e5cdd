"""`fucina tokenize MODEL --text T`: a model's token ids for a text (token-ID-exact with llama.cpp)."""

from __future__ import annotations

import json
import sys

from engine.platform.catalog import resolve_model
from engine.gguf.reader import open_gguf
from engine.tokenize import load_tokenizer


def register(subparsers) -> None:
    p = subparsers.add_parser("tokenize", help="print the token ids of a text")
    p.add_argument("model", help="a starter model name or a path to a .gguf file")
    p.add_argument("--text", required=True, help="the text to tokenize ('-' reads it from stdin)")
    p.add_argument("--no-special", action="store_true",
                   help="plain text: no BOS/EOS and no matching of special tokens such as <|im_end|>")
    p.add_argument("--json", action="store_true", help="print ids and each token's text as JSON")
    p.set_defaults(func=_tokenize)


def _tokenize(args) -> None:
    tokenizer = load_tokenizer(open_gguf(resolve_model(args.model)).metadata)
    text = sys.stdin.read() if args.text == "-" else args.text
    ids = tokenizer.encode_plain(text) if args.no_special else tokenizer.encode(text)
    if args.json:
        pieces = [tokenizer.token_bytes(i).decode("utf-8", "replace") for i in ids]
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
    else:
        print(",".join(map(str, ids)))
