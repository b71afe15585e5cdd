"""Hostile model files: every value a kernel or the tokenizer relies on is checked when the model loads,
and each bad one is an error naming its key (never a native crash, a traceback or a silent default)."""

import numpy as np
import pytest
from gguf import GGUFValueType as V
from gguf.constants import GGMLQuantizationType as T

from engine import generate
from engine.errors import ConfigError, FucinaError, GGUFError, InvalidTokenId, NonFiniteLogits, TokenizerError
from engine.gguf.reader import open_gguf
from engine.models import load_model
from engine.models.validate import check_logits
from engine.tokenize import load_tokenizer
from tests.synthetic import CHATML_TOKENS, write_tiny_model

N_TOKENS = len(CHATML_TOKENS)


def _load(path):
    """What every command does with a model file: the model, then its tokenizer."""
    model = load_model(path)
    return model, load_tokenizer(model.file.metadata)


# (family, metadata overrides, the key the error must name); the tiny models have head size 16
KERNEL_PRECONDITIONS = [
    ("llama", {"llama.rope.dimension_count": (128, V.UINT32)}, "llama.rope.dimension_count"),  # was SIGABRT
    ("llama", {"llama.rope.dimension_count": (4096, V.UINT32)}, "llama.rope.dimension_count"),  # was SIGSEGV
    ("qwen2", {"qwen2.rope.dimension_count": (15, V.UINT32)}, "qwen2.rope.dimension_count"),
    ("llama", {"llama.rope.dimension_count": (-4, V.INT32)}, "llama.rope.dimension_count"),
    ("llama", {"llama.attention.head_count_kv": (3, V.UINT32)}, "head_count_kv 3 must divide the 4"),
    ("llama", {"llama.attention.head_count_kv": ("two", V.STRING)}, "llama.attention.head_count_kv"),
    ("llama", {"llama.attention.head_count_kv": ([2.5, 2.5], V.ARRAY)}, "llama.attention.head_count_kv"),
    ("llama", {"llama.vocab_size": ("many", V.STRING)}, "llama.vocab_size"),
    ("llama", {"llama.block_count": (2**32 - 1, V.UINT32)}, "llama.block_count"),  # was MemoryError
    ("llama", {"llama.block_count": (1, V.UINT32)}, "llama.block_count"),  # layer 1's tensors were ignored
    ("llama", {"llama.attention.layer_norm_rms_epsilon": (float("nan"), V.FLOAT32)}, "layer_norm_rms_epsilon"),
    ("qwen3", {"qwen3.rope.freq_base": (float("inf"), V.FLOAT32)}, "qwen3.rope.freq_base"),
    ("llama", {"llama.rope.freq_base": (0.0, V.FLOAT32)}, "llama.rope.freq_base"),
    ("gemma3", {"gemma3.attention.sliding_window": (-8, V.INT32)}, "gemma3.attention.sliding_window"),
    ("gemma3", {"gemma3.attention.sliding_window": ("8", V.STRING)}, "gemma3.attention.sliding_window"),
    ("gemma3", {"gemma3.attention.sliding_window_pattern": (1.5, V.FLOAT32)}, "sliding_window_pattern"),
    ("llama", {"llama.context_length": (-1, V.INT32)}, "llama.context_length"),
]


@pytest.mark.parametrize("arch, metadata, key", KERNEL_PRECONDITIONS)
def test_metadata_a_kernel_relies_on_is_validated(tmp_path, arch, metadata, key):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, arch, metadata=metadata, tokenizer=True)
    with pytest.raises(ConfigError, match=key):
        _load(path)


def test_vocabulary_must_match_the_embedding_rows(tmp_path):
    # more tokens than rows: the tokenizer could make ids the embedding has no row for;
    # fewer: the model could sample ids the tokenizer cannot decode
    for tokens in (CHATML_TOKENS + ["extra"], CHATML_TOKENS[:-3]):
        path = tmp_path / "m.gguf"
        write_tiny_model(path, "llama", tokenizer=True, metadata={
            "tokenizer.ggml.tokens": (tokens, V.ARRAY), "tokenizer.ggml.token_type": ([1] * len(tokens), V.ARRAY)})
        with pytest.raises(ConfigError, match=f"{N_TOKENS} token rows.*tokenizer.ggml.tokens has {len(tokens)}"):
            _load(path)


TOKENIZER_METADATA = [
    ({"tokenizer.ggml.bos_token_id": ("1", V.STRING)}, TokenizerError, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer.ggml.eos_token_id": (float("nan"), V.FLOAT32)}, TokenizerError, "tokenizer.ggml.eos_token_id"),
    ({"tokenizer.ggml.padding_token_id": ([0], V.ARRAY)}, TokenizerError, "tokenizer.ggml.padding_token_id"),
    ({"tokenizer.ggml.tokens": (list(range(N_TOKENS)), V.ARRAY)}, ConfigError, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": ([["h", "i"]], V.ARRAY)}, TokenizerError, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.token_type": (["normal"] * N_TOKENS, V.ARRAY)}, TokenizerError, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.token_type": ([6] * N_TOKENS, V.ARRAY)}, TokenizerError, "as a byte token"),
    ({"tokenizer.ggml.add_bos_token": ("yes", V.STRING)}, TokenizerError, "tokenizer.ggml.add_bos_token"),
    ({"tokenizer.ggml.model": ([1, 2], V.ARRAY)}, TokenizerError, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.pre": (7, V.UINT32)}, TokenizerError, "tokenizer.ggml.pre"),
]


@pytest.mark.parametrize("metadata, error, key", TOKENIZER_METADATA)
def test_wrong_typed_tokenizer_metadata_names_the_key(tmp_path, metadata, error, key):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", metadata=metadata, tokenizer=True)
    with pytest.raises(error, match=key):
        _load(path)


def test_wrong_typed_scores(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, metadata={
        "tokenizer.ggml.model": ("llama", V.STRING), "tokenizer.ggml.scores": (["high"] * N_TOKENS, V.ARRAY)})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores"):
        _load(path)


def test_out_of_vocabulary_ids_are_refused_before_any_compute(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True)
    model, _ = _load(path)
    for ids, bad in (([1, 60000], "token id 60000 at position 1"), ([-5], "token id -5 at position 0")):
        with pytest.raises(InvalidTokenId, match=bad):
            next(generate.teacher_forced(model, ids))
        with pytest.raises(InvalidTokenId, match=bad):
            next(generate.greedy(model, ids, 4))


# finite weights whose activations overflow float32 before the output matrix: NaN logits
OVERFLOWS = {"output_norm.weight": 3e38}


@pytest.mark.parametrize("qtype", [T.Q8_0, T.F16])
def test_non_finite_logits_fail_generation_and_scoring(tmp_path, qtype):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, qtype=qtype, fill=OVERFLOWS)
    model, _ = _load(path)
    with pytest.raises(NonFiniteLogits, match="non-finite logits at position 2"):
        list(generate.greedy(model, [5, 6, 7], 4))
    with pytest.raises(NonFiniteLogits, match="non-finite logits at position 0"):
        list(generate.teacher_forced(model, [5, 6, 7]))


def test_check_logits_names_the_first_bad_row():
    rows = np.zeros((4, 10), np.float32)
    check_logits(rows, 0)
    rows[2, 3] = np.inf
    rows[3, 0] = np.nan
    with pytest.raises(NonFiniteLogits, match="at position 12"):
        check_logits(rows, 10)
    with pytest.raises(NonFiniteLogits, match="at position 7"):
        check_logits(rows[3], 7)
    assert issubclass(NonFiniteLogits, FucinaError)


def _session(tmp_path, model):
    from engine.history.store import HistoryStore
    from engine.serving.session import ChatSession

    store = HistoryStore(tmp_path / "history.db")
    return ChatSession.open(store, model, sidecar_dir=tmp_path / "sidecars",
                            sampler={"temperature": 0.0, "max_tokens": 6, "ctx": 128})


def test_a_chat_turn_on_non_finite_logits_fails_and_stores_no_reply(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, fill=OVERFLOWS)
    session = _session(tmp_path, load_model(path))
    with pytest.raises(NonFiniteLogits, match="non-finite logits at position"):
        "".join(session.send("hi"))
    assert session.last_turn.finish_reason == "error"
    assert [m["role"] for m in session.messages()] == ["user"]


class _BreaksAfter:
    """A model whose logits turn NaN from its `n`-th forward on: a reply that goes bad mid-way."""

    def __init__(self, model, n):
        self._model, self._left = model, n

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, tokens, cache):
        logits = self._model.forward(tokens, cache)
        self._left -= 1
        return logits if self._left > 0 else np.full_like(logits, np.nan)


def test_a_reply_that_turns_non_finite_mid_way_stores_nothing(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True)
    session = _session(tmp_path, load_model(path))
    session.convo.model = _BreaksAfter(session.model, 3)  # prefill and two decoded tokens are fine
    pieces = []
    with pytest.raises(NonFiniteLogits) as failed:
        for piece in session.send("hi"):
            pieces.append(piece)
    position = session.convo.cache.len - 1
    assert f"at position {position}" in str(failed.value) and "".join(pieces)  # text was shown, then the error
    assert [m["role"] for m in session.messages()] == ["user"]
    session.convo.model = session.model  # the conversation stays usable: the message is answered again
    text = "".join(session.regenerate())
    assert [(m["role"], m["content"]) for m in session.messages()][1:] == [("assistant", text)]


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                                   T.IQ1_S, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS,
                                   T.TQ1_0, T.TQ2_0])
def test_a_nan_anywhere_it_reaches_the_weights_is_found(qtype):
    """all_finite flags a NaN written at a block position exactly when it dequantizes to NaN weights."""
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES

    from engine.gguf.finite import all_finite

    block_bytes = GGML_QUANT_SIZES[qtype][1]
    clean = np.zeros((1, 2 * block_bytes), np.uint8)
    assert all_finite(qtype, clean)
    for offset in range(block_bytes, 2 * block_bytes, 2):  # in the second block
        raw = clean.copy()
        raw[0, offset : offset + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        assert all_finite(qtype, raw) == np.isfinite(quants.dequantize(raw, qtype)).all(), offset


# bytes of a non-finite value at the start of a tensor: there the first block's f16 scale of Q4_0/Q8_0
_POISON = {T.F32: np.float32(np.inf).tobytes(), T.BF16: b"\xc0\x7f", T.F16: np.float16(np.inf).tobytes(),
           T.Q4_0: np.float16(np.nan).tobytes(), T.Q8_0: np.float16(np.nan).tobytes()}


def _poison(path, tensor: str) -> None:
    with open_gguf(path) as f:
        info = f.tensor(tensor)
    with open(path, "r+b") as out:
        out.seek(info.offset)
        out.write(_POISON[info.ggml_type])


@pytest.mark.parametrize("qtype, tensor", [
    (T.Q8_0, "blk.1.ffn_down.weight"),
    (T.Q4_0, "token_embd.weight"),
    (T.F16, "blk.0.attn_q.weight"),
    (T.BF16, "blk.0.attn_v.weight"),
    (T.Q8_0, "blk.1.attn_norm.weight"),  # F32
])
def test_weights_holding_nan_or_inf_are_refused_at_load(tmp_path, qtype, tensor):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, qtype=qtype)
    _poison(path, tensor)
    with pytest.raises(GGUFError, match=f"tensor '{tensor}' holds NaN or Inf"):
        load_model(path)


def test_a_nan_norm_is_refused_not_an_empty_reply(tmp_path):
    """The int8 activations of a Q8_0 matvec hid it: zero logits, token 0, often an immediate end-of-text."""
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, fill={"output_norm.weight": np.nan})
    with pytest.raises(GGUFError, match="tensor 'output_norm.weight' holds NaN or Inf"):
        load_model(path)


def test_gemma3_sliding_pattern_as_a_period_or_per_layer_flags(tmp_path):
    """A per-layer array (llama.cpp reads either form) is not mistaken for a bad period."""
    windows = []
    for pattern in ((6, V.UINT32), ([True] * 5 + [False], V.ARRAY)):
        path = tmp_path / "m.gguf"
        write_tiny_model(path, "gemma3", n_layers=6, tokenizer=True,
                         metadata={"gemma3.attention.sliding_window_pattern": pattern})
        windows.append([layer.mixer.window for layer in load_model(path).args.layers])
    assert windows == [[8, 8, 8, 8, 8, 0]] * 2
    write_tiny_model(path, "gemma3", n_layers=6, tokenizer=True,
                     metadata={"gemma3.attention.sliding_window_pattern": ([1.5] * 6, V.ARRAY)})
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        load_model(path)


def test_a_file_that_passed_is_not_scanned_again_until_it_changes(tmp_path, monkeypatch):
    """The NaN scan reads the whole file (minutes for a 17 GB model from disk): a version of a file that
    passed is remembered, and a file changed in place is scanned again and refused."""
    from engine.models import validate

    monkeypatch.setenv("FUCINA_HOME", str(tmp_path / "home"))
    scans = []
    scan = validate.first_non_finite
    monkeypatch.setattr(validate, "first_non_finite", lambda file: scans.append(file.path) or scan(file))
    path = tmp_path / "m.gguf"
    write_tiny_model(path, "llama", tokenizer=True, qtype=T.Q8_0)
    load_model(path).file.close()
    load_model(path).file.close()
    assert len(scans) == 1
    _poison(path, "blk.1.ffn_down.weight")  # same size; written in place
    with pytest.raises(GGUFError, match="tensor 'blk.1.ffn_down.weight' holds NaN or Inf"):
        load_model(path)
    with pytest.raises(GGUFError, match="holds NaN or Inf"):  # a refused file is never remembered as passed
        load_model(path)
    assert len(scans) == 3
