"""The vocabulary part of a GGUF's tokenizer metadata, with llama.cpp's defaults and fix-ups.

Shared by both tokenizer kinds: the token strings and types, the special ids, the BOS/EOS policy and
the end-of-generation set. Where metadata is silent or wrong this does what llama.cpp does: per-kind
default ids (dropped when out of range), control-looking tokens promoted to CONTROL, and the EOG set
built from eos/eot/eom, the FIM pad/repo/separator tokens and the well-known end-marker strings.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np

from engine.errors import TokenizerError
from engine.gguf.meta import meta_value

log = logging.getLogger(__name__)

# tokenizer.ggml.token_type values (llama.cpp's LLAMA_TOKEN_TYPE_*).
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)

# Auto-detected by text when metadata has no id for them; found ones become CONTROL.
_BY_TEXT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Tokens that end generation wherever they appear in a vocabulary.
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)
_MARKER_SHAPE = re.compile(r"<\|.+\|>")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # what a BYTE token's text must be: decoding parses it


@dataclass
class Vocab:
    tokens: list[str]
    types: np.ndarray  # int32 token types, one per token
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    # eot/eom/fim_* ids named by metadata; the others are looked up by their usual text
    marker_ids: dict[str, int | None] = field(default_factory=dict, repr=False)
    ids: dict[str, int] = field(init=False, repr=False)  # token text -> id (lowest id on duplicates)
    eog_ids: frozenset[int] = field(init=False)

    def __post_init__(self):
        self.ids = {}
        for i, text in enumerate(self.tokens):
            self.ids.setdefault(text, i)
        self.eog_ids = _end_of_generation(self)

    def __len__(self) -> int:
        return len(self.tokens)

    def specials(self, *, parse_special: bool) -> dict[str, int]:
        """Tokens matched whole before pre-tokenization (llama.cpp: CONTROL, USER_DEFINED, UNKNOWN);
        without `parse_special` only USER_DEFINED ones, as llama.cpp does."""
        kinds = [CONTROL, USER_DEFINED, UNKNOWN] if parse_special else [USER_DEFINED]
        return {self.tokens[i]: int(i) for i in np.flatnonzero(np.isin(self.types, kinds))}


def token_types(tokens: list[str], types) -> np.ndarray:
    """Token types as given, or - when a vocabulary has none - NORMAL with `<|...|>` markers CONTROL."""
    if types is None:
        out = np.full(len(tokens), NORMAL, dtype=np.int32)
        out[[i for i, t in enumerate(tokens) if _MARKER_SHAPE.fullmatch(t)]] = CONTROL
        return out
    if len(types) < len(tokens):
        raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    out = np.array(types[: len(tokens)], dtype=np.int32)
    for i in np.flatnonzero(out == BYTE):
        if not _BYTE_TOKEN.fullmatch(tokens[i]):
            raise TokenizerError(f"tokenizer.ggml.token_type marks token {i} {tokens[i]!r} as a byte token, "
                                 "but its text is not of the form <0xXX>")
    return out


def read_vocab(metadata: dict, *, bos: int | None, eos: int | None, unk: int | None, add_bos: bool) -> Vocab:
    """The vocabulary of `metadata`, with llama.cpp's defaults for this tokenizer kind where it is silent."""
    def get(key: str, kind: str):
        return meta_value(metadata, f"tokenizer.ggml.{key}", kind, TokenizerError)

    tokens = get("tokens", "strings")
    if not tokens:
        raise TokenizerError("the model has no tokenizer vocabulary (tokenizer.ggml.tokens is missing or empty)")
    # llama.cpp renames empty tokens so every token text stays distinct
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    types = token_types(tokens, get("token_type", "integers"))
    n = len(tokens)

    def special_id(key: str, default: int | None) -> int | None:
        if default is not None and default >= n:
            default = None
        value = get(f"{key}_token_id", "integer")
        if value is None:
            return default
        if not 0 <= value < n:
            log.warning("tokenizer.ggml.%s_token_id = %s is outside the vocabulary; using %s", key, value, default)
            return default
        return value

    def flag(key: str, default: bool) -> bool:
        value = get(key, "bool")
        return default if value is None else value

    return Vocab(
        tokens, types,
        bos_id=special_id("bos", bos), eos_id=special_id("eos", eos), unk_id=special_id("unknown", unk),
        pad_id=special_id("padding", None),
        add_bos=flag("add_bos_token", add_bos), add_eos=flag("add_eos_token", False),
        marker_ids={key: special_id(key, None) for key in _BY_TEXT},
    )


def _end_of_generation(vocab: Vocab) -> frozenset[int]:
    """llama.cpp's EOG set; tokens it recognises by their text become CONTROL, as there."""

    def promote(i: int):
        if vocab.types[i] != CONTROL:
            log.debug("token %d %r looks like a control token; treating it as one", i, vocab.tokens[i])
            vocab.types[i] = CONTROL

    found = {key: vocab.marker_ids.get(key) for key in _BY_TEXT}
    for key, texts in _BY_TEXT.items():
        if found[key] is None:
            ids = [vocab.ids[t] for t in texts if t in vocab.ids]
            if ids:
                found[key] = min(ids)
                promote(found[key])
    eog = {found[k] for k in ("fim_pad", "fim_rep", "fim_sep", "eot", "eom")}
    for text in _EOG_TEXTS:
        if text in vocab.ids:
            eog.add(vocab.ids[text])
            promote(vocab.ids[text])
    eog.add(vocab.eos_id)
    # gpt-oss's harmony format (llama.cpp's workaround): where <|return|> and <|call|> end a reply, <|end|>
    # ends only one of its messages (the reasoning's analysis channel, before the final answer)
    if "<|return|>" in vocab.ids and "<|call|>" in vocab.ids and vocab.ids.get("<|end|>") != vocab.eos_id:
        eog.discard(vocab.ids.get("<|end|>"))
    # Gemma 4's (and PLaMo's) "</s>" is a normal token: where their own end markers are, it ends nothing
    eog.discard(None)
    end_s = vocab.ids.get("</s>")
    if end_s in eog and any(vocab.ids.get(t) in eog for t in ("<|tool_response>", "<|plamo:eos|>")):
        eog.discard(end_s)
        vocab.types[end_s] = NORMAL
    return frozenset(eog)
