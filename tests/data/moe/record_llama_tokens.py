"""Record llama.cpp's tokenization of the tiny Gemma 4-style vocabulary (tests/gemma4_models.py's
write_gemma4_vocab) into gemma4-tokenizer.json beside this script, which
tests/engine/tokenize/test_gemma4_tokenizer.py compares the engine's tokenizer with.

Usage, from the repository root, with the project's Python (the options as record_llama_logits.py's):

    python tests/data/moe/record_llama_tokens.py --lib <folder of libllama.so> --binding <folder of llama_cpp>

The vocabulary is loaded vocab-only; each of GEMMA4_TOKENIZER_TEXTS is tokenized twice (with BOS and control
tokens parsed; plain), and the end-of-generation ids, BOS and its policy are stored.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))

from record_llama_logits import quiet_llama, recording_parser  # noqa: E402
from tests.gemma4_models import GEMMA4_TOKENIZER_TEXTS, write_gemma4_vocab  # noqa: E402


def tokenize(llama, vocab, text: str, special: bool) -> list[int]:
    data = text.encode()
    buf = (llama.llama_token * (len(data) + 8))()
    n = llama.llama_tokenize(vocab, data, len(data), buf, len(buf), special, special)
    if n < 0:
        raise SystemExit(f"llama_tokenize failed on {text!r}")
    return list(buf[:n])


def main() -> None:
    args = recording_parser(__doc__).parse_args()
    llama = quiet_llama(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gemma4-vocab.gguf"
        write_gemma4_vocab(path)
        params = llama.llama_model_default_params()
        params.vocab_only = True
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise SystemExit(f"llama.cpp could not load {path}")
        vocab = llama.llama_model_get_vocab(model)
        n = llama.llama_vocab_n_tokens(vocab)
        record = {"gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "llama_cpp_commit": args.commit,
                  "bos": llama.llama_vocab_bos(vocab), "add_bos": bool(llama.llama_vocab_get_add_bos(vocab)),
                  "eog": [i for i in range(n) if llama.llama_vocab_is_eog(vocab, i)],
                  "cases": [{"text": t, "ids": tokenize(llama, vocab, t, True),
                             "plain": tokenize(llama, vocab, t, False)} for t in GEMMA4_TOKENIZER_TEXTS]}
        llama.llama_model_free(model)
    out = HERE / "gemma4-tokenizer.json"
    out.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{out.name}: {len(record['cases'])} texts")


if __name__ == "__main__":
    main()
