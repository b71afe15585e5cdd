"""Token-ID agreement with llama.cpp (through llama-cpp-python) on random strings, per starter model.

    python benchmarks/compare_tokenizers.py [--strings 2000] [--seed 0] [--pre NAME ...] [MODEL ...]

For each model: random strings (scripts, emoji, combining marks, whitespace and digit runs, any code
point, the model's own special tokens, pieces of vocabulary text) are encoded by Fucina and by
llama.cpp with special-token parsing on and BOS/EOS added, and again with both off; every token's
bytes and the end-of-generation set are compared too. `--pre` also checks other pre-tokenizers: the
Qwen2.5 vocabulary is written into a vocab-only GGUF under each given `tokenizer.ggml.pre` name.
Prints agreement rates and the first mismatches. Needs the `peer` extra (llama-cpp-python) and the
starter models downloaded.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.platform.catalog import catalog, resolve_model  # noqa: E402
from engine.gguf.reader import open_gguf  # noqa: E402
from engine.tokenize import load_tokenizer  # noqa: E402
from engine.tokenize.vocab import CONTROL, USER_DEFINED  # noqa: E402

RANGES = [
    (0x20, 0x7E), (0xC0, 0x24F), (0x300, 0x36F), (0x370, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
    (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF),
    (0x2000, 0x206F), (0x2580, 0x259F), (0xFF00, 0xFFEF),
]
SNIPPETS = ["\U0001F44D\U0001F3FD", "\U0001F1EE\U0001F1F9", "\U0001F468\u200d\U0001F4BB", "'s", "'LL", "</s>",
            "\r\n", "\u00a0", "\u3000", "def f(x):\n    return x\n", "http://x.y/z?q=1", "1,000.50", "naïve"]


def random_text(rng: random.Random, specials: list[str], vocab_texts: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(1, 24)):
        kind = rng.random()
        if kind < 0.30:
            lo, hi = rng.choice(RANGES)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
        elif kind < 0.45:
            parts.append(rng.choice(vocab_texts))
        elif kind < 0.55:
            parts.append("".join(rng.choice(" \t\n\r") for _ in range(rng.randint(1, 12))))
        elif kind < 0.62:
            parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12))))
        elif kind < 0.70:
            cp = rng.randint(0, 0x10FFFF)
            parts.append(chr(cp) if not 0xD800 <= cp < 0xE000 else "\ufffd")
        elif kind < 0.78 and specials:
            parts.append(rng.choice(specials))
        elif kind < 0.88:
            parts.append(rng.choice(SNIPPETS))
        else:
            parts.append(rng.choice([" ", "", "  "]) + rng.choice(["the", "Hello", "world", "is", "CamelCase"]))
    return "".join(parts)


def peer_piece(vocab, token: int) -> bytes:
    import llama_cpp

    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, True)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def with_pre(source: Path, pre: str, directory: str) -> Path:
    """A vocab-only GGUF with `source`'s byte-level BPE vocabulary under another pre-tokenizer name."""
    import gguf

    md = open_gguf(source).metadata
    path = Path(directory) / f"{pre}.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types(md["tokenizer.ggml.token_type"].tolist())
    w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_eos_token_id(int(md["tokenizer.ggml.eos_token_id"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def compare(name: str, path: Path, n_strings: int, seed: int, show: int) -> bool:
    import llama_cpp

    ours = load_tokenizer(open_gguf(path).metadata)
    peer = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = peer._model.vocab

    types = ours.vocab.types
    specials = [ours.vocab.tokens[i] for i in range(len(types)) if types[i] in (CONTROL, USER_DEFINED)]
    rng = random.Random(seed)
    vocab_texts = [ours.decode([rng.randrange(ours.vocab_size)]) for _ in range(2000)]
    texts = [random_text(rng, specials, vocab_texts) for _ in range(n_strings)]

    ok = True
    for add_special, parse_special in ((True, True), (False, False)):
        bad = []
        for text in texts:
            mine = ours.encode(text, add_special=add_special, parse_special=parse_special)
            theirs = peer.tokenize(text.encode(), add_bos=add_special, special=parse_special)
            if mine != theirs:
                bad.append((text, mine, theirs))
        rate = 100 * (1 - len(bad) / len(texts))
        print(f"{name}: add_special={add_special} parse_special={parse_special}: "
              f"{len(texts) - len(bad)}/{len(texts)} identical ({rate:.2f}%)")
        for text, mine, theirs in bad[:show]:
            print(f"    {text!r}\n      fucina    {mine}\n      llama.cpp {theirs}")
        ok &= not bad

    piece_bad = [i for i in range(ours.vocab_size) if ours.token_bytes(i) != peer_piece(vocab, i)]
    print(f"{name}: token bytes: {ours.vocab_size - len(piece_bad)}/{ours.vocab_size} identical"
          + (f" (first differing ids {piece_bad[:show]})" if piece_bad else ""))
    peer_eog = {i for i in range(ours.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    print(f"{name}: end-of-generation ids: fucina {sorted(ours.eog_ids)}, llama.cpp {sorted(peer_eog)}")
    return ok and not piece_bad and peer_eog == set(ours.eog_ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(catalog()))
    parser.add_argument("--strings", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="mismatches to print per model and mode")
    parser.add_argument("--pre", nargs="*", default=[], metavar="NAME",
                        help="pre-tokenizer names to check on the Qwen2.5 vocabulary (e.g. llama-bpe gpt-2)")
    args = parser.parse_args()
    results = [compare(name, resolve_model(name), args.strings, args.seed, args.show) for name in args.models]
    with tempfile.TemporaryDirectory() as directory:
        qwen = resolve_model("qwen2.5-coder-0.5b-instruct") if args.pre else None
        for pre in args.pre:
            path = with_pre(qwen, pre, directory)
            results.append(compare(f"qwen2.5 vocabulary, pre={pre}", path, args.strings, args.seed, args.show))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
