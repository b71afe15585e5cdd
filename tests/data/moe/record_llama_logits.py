"""Record llama.cpp's logits on the tests' tiny MoE and hybrid models (qwen3moe, gpt-oss, deepseek2 and glm4moe:
tests/moe_models.py's ORACLE_MODELS; qwen35: tests/hybrid_models.py's HYBRID_ORACLE_MODELS; gemma4:
tests/gemma4_models.py's GEMMA4_ORACLE_MODELS) into the JSON files
beside this script, which tests/engine/test_moe_oracle.py compares the
engine's forwards with.

Usage, from the repository root, with the project's Python:

    python tests/data/moe/record_llama_logits.py --lib <folder of libllama.so and libggml*.so> \\
        --binding <folder holding the llama_cpp package of llama-cpp-python> [--only NAME ...]

(or LLAMA_CPP_LIB_PATH and PYTHONPATH instead of the two options). Only the binding's ctypes module is
imported (llama_cpp.llama_cpp), not its high-level package, so no other dependency is needed. Each model is
written with the tests' own writer and seeds, fed the fixed token ids in one batch with logits for every
position (f16 KV cache, flash attention off, one sequence, 2 threads), and every position's full logits row
(the vocabulary is 259 tokens) is stored.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository root: the tests' writer

from tests.gemma4_models import GEMMA4_ORACLE_MODELS
from tests.hybrid_models import HYBRID_ORACLE_MODELS
from tests.moe_models import ORACLE_MODELS, TOKENS

ORACLE_MODELS = ORACLE_MODELS | HYBRID_ORACLE_MODELS | GEMMA4_ORACLE_MODELS
# llama.cpp's CPU weight repacking (its "extra buffer types") crashes on the quantized tiny hybrids and Gemma 4s:
# they load without it (the plain quantized kernels; the other models were recorded with it)
UNREPACKED = set(HYBRID_ORACLE_MODELS) | set(GEMMA4_ORACLE_MODELS)


def llama_ctypes(lib: str | None, binding: str | None):
    """llama-cpp-python's ctypes module over the libllama in `lib`, without its package's __init__."""
    if lib:
        os.environ["LLAMA_CPP_LIB_PATH"] = lib
    if binding:
        sys.path.insert(0, binding)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama_cpp (llama-cpp-python's package) not found: pass --binding or set PYTHONPATH")
    package = types.ModuleType("llama_cpp")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["llama_cpp"] = package
    return importlib.import_module("llama_cpp.llama_cpp")


def llama_logits(llama, path: Path, tokens: list[int], repack: bool = True) -> np.ndarray:
    """llama.cpp's logits [len(tokens), vocab] for the tokens fed in one batch from position 0."""
    model_params = llama.llama_model_default_params()
    model_params.use_extra_bufts = repack
    model = llama.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 64
    params.n_threads = params.n_threads_batch = 2
    params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.type_k = params.type_v = llama.GGML_TYPE_F16
    ctx = llama.llama_init_from_model(model, params)
    batch = llama.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(tokens)
        if llama.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed on {path}")
        n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        rows = [np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
                for i in range(len(tokens))]
        return np.stack(rows)
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(ctx)
        llama.llama_model_free(model)


def recording_parser(description: str) -> argparse.ArgumentParser:
    """The options every recording script takes: where llama.cpp is, and its commit."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="folder of libllama (default: LLAMA_CPP_LIB_PATH)")
    parser.add_argument("--binding", help="folder holding the llama_cpp package (default: PYTHONPATH)")
    parser.add_argument("--commit", default="", help="the llama.cpp commit the library was built from, to record")
    return parser


def quiet_llama(args: argparse.Namespace):
    """llama.cpp's ctypes module (recording_parser's options), its backend started and its log silenced."""
    llama = llama_ctypes(args.lib, args.binding)
    llama.quiet = llama.llama_log_callback(lambda level, text, data: None)  # kept alive: the library calls it
    llama.llama_log_set(llama.quiet, None)
    llama.llama_backend_init()
    return llama


def main() -> None:
    parser = recording_parser(__doc__)
    parser.add_argument("--only", nargs="+", choices=list(ORACLE_MODELS), help="record these models only")
    args = parser.parse_args()
    llama = quiet_llama(args)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or ORACLE_MODELS:
            path = Path(tmp) / f"{name}.gguf"
            write, _, variant = ORACLE_MODELS[name]
            write(path)
            logits = llama_logits(llama, path, TOKENS, repack=name not in UNREPACKED)
            record = {"variant": variant, "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "llama_cpp_commit": args.commit, "ids": TOKENS,
                      "logits": [[round(float(v), 5) for v in row] for row in logits]}
            out = HERE / f"{name}.json"
            out.write_text(json.dumps(record, separators=(",", ":")) + "\n")
            print(f"{out.name}: {len(TOKENS)} positions")


if __name__ == "__main__":
    main()
