"""Replies that follow a grammar (spec 13.6, "Constrained decoding: llguidance").

llguidance does the grammar work: it compiles JSON schemas, regexes, Lark (its variant) and GBNF, and
fills a token bitmask per step. This module is the glue:

- `Grammar`: one grammar, compiled and validated when it is made, so a bad one fails with llguidance's
  message at the moment it is set, never mid-reply.
- `grammar_vocabulary(tokenizer)`: the tokenizer bridge, every token's raw bytes with control tokens marked
  special (a grammar whose text spells "<|im_end|>" can never make the model emit the control token).
  Built once per tokenizer and shared by every processor over it.
- `GrammarProcessor`: the StructuredProcessor on the sampler's seam. The bridge's end-of-sequence id
  stands for "the grammar may end here"; each processor maps it onto its own stop token (the chat
  template's stop marker), so a finished grammar ends the turn through the normal stop handling.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Sequence

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from engine.errors import InvalidGrammar
from engine.sampling import json_schema
from engine.sampling.budget import ReplyBudget
from engine.sampling.json_schema import SchemaWarning
from engine.sampling.processor import StructuredProcessor
from engine.tokenize import Tokenizer
from engine.tokenize.vocab import CONTROL, UNKNOWN, USER_DEFINED

log = logging.getLogger(__name__)

# What a stored or typed response format may name; "gbnf" is converted to Lark when it is read.
GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "lark", "gbnf")
# JSON replies are one line with fixed separators (", " and ": ", as Python's json.dumps): every key with
# its quotes and separators is then a span the grammar forces, which drafts itself when decoding
# speculatively (the app pretty-prints JSON replies anyway). Free whitespace made each gap a choice: spans of
# one token, and a small model that wants to go on with a string cut at its maxLength could loop on
# newlines until max_tokens. A schema's own "x-guidance" still overrides it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """A reply grammar: `kind` (GRAMMAR_KINDS) and its text; `compiled` is llguidance's form of it.
    Making one raises InvalidGrammar unless llguidance accepts it."""
    kind: str
    source: str = ""
    compiled: str = field(init=False, repr=False, compare=False)
    # a JSON schema's keywords llguidance does not enforce while writing (engine.sampling.json_schema)
    unenforced: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        compiled, unenforced = _compile(self.kind, self.source)
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "unenforced", unenforced)

    def check_reply(self, text: str) -> list[SchemaWarning]:
        """The finished reply's violations of the keywords not enforced while it was written."""
        if not self.unenforced:
            return []
        return json_schema.check_reply(json.loads(self.source), text, self.unenforced)

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object."""
        return cls("json_object")

    def as_setting(self) -> dict:
        """The form a conversation's settings store (engine.history.store)."""
        return {"type": self.kind, "grammar": self.source}

    @classmethod
    def from_setting(cls, setting: dict | None) -> "Grammar | None":
        """The grammar a stored response format names; None (or type "free") is free text."""
        if not isinstance(setting, (dict, type(None))) or not isinstance((setting or {}).get("grammar", ""), str):
            raise InvalidGrammar(f"a response format is {{'type': KIND, 'grammar': TEXT}}, got {setting!r}")
        if setting is None or setting.get("type", "free") == "free":
            return None
        return cls(setting["type"], setting.get("grammar", ""))


def _compile(kind: str, source: str) -> tuple[str, tuple[str, ...]]:
    """llguidance's form of a grammar, and the JSON schema keywords it leaves unenforced."""
    if kind == "json_object":
        compiled = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    elif kind == "json_schema":
        try:
            schema = json.loads(source)
        except ValueError as e:
            raise InvalidGrammar(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise InvalidGrammar(f"a JSON schema is a JSON object, got {type(schema).__name__}")
        # lenient: a keyword llguidance cannot enforce is a warning, never a refusal of the whole schema
        compiled = llguidance.LLMatcher.grammar_from_json_schema(json_schema.rewrite(schema),
                                                                 defaults=JSON_OPTIONS | {"lenient": True})
    elif kind in ("regex", "lark", "gbnf"):
        try:  # llguidance converts GBNF to its Lark itself (and raises ValueError when it cannot)
            compiled = llguidance.grammar_from(kind, source)
        except ValueError as e:
            raise InvalidGrammar(str(e)) from None
    else:
        raise InvalidGrammar(f"unknown grammar kind {kind!r}; known: {', '.join(GRAMMAR_KINDS)}")
    error, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    if error:
        raise InvalidGrammar(f"invalid {kind.replace('_', ' ')} grammar: {'; '.join(warnings).strip()}")
    return compiled, json_schema.unenforced(warnings)


# -- the tokenizer bridge -----------------------------------------------------------------------------

@dataclass(frozen=True)
class GrammarVocabulary:
    """llguidance's view of one tokenizer: `size` ids, `end_id` the id that means "end here"; `source`
    holds every token's bytes and the plain encoder (a closing's tokens)."""
    ll: llguidance.LLTokenizer
    size: int
    end_id: int
    source: "_TokenSource"

    def ids_of(self, data: bytes) -> list[int] | None:
        """Tokens whose bytes are exactly `data`: its plain encoding, else one token per byte (a closing
        that ends a character the reply began); None when neither spells it."""
        ids = _spelled(self.source, data)
        return None if ids is None else list(ids)


@functools.lru_cache(maxsize=4096)
def _spelled(source: "_TokenSource", data: bytes) -> tuple[int, ...] | None:
    """GrammarVocabulary.ids_of, remembered: a reply's closings come back (the same tail of a document after
    every token inside a value, the same shortest document at every reply) and encoding them is a BPE pass."""
    try:
        ids = source(data, strict=True)
    except UnicodeDecodeError:
        ids = None
    if ids is not None and b"".join(source.tokens[i] for i in ids) == data:
        return tuple(ids)
    singles = source.byte_ids
    return tuple(singles[b] for b in data) if all(b in singles for b in data) else None


class _TokenSource:
    """What llguidance.TokenizerWrapper reads: raw token bytes, the special ids and an encoder."""

    def __init__(self, tokenizer: Tokenizer, end_id: int):
        # weak: the bridge is the value of a weak-keyed cache on this tokenizer, and must not keep it alive
        self._tokenizer = weakref.ref(tokenizer)
        self.eos_token_id, self.bos_token_id = end_id, tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if _is_control(tokenizer, i)]
        special = set(self.special_token_ids)
        self.byte_ids = {t[0]: i for i, t in enumerate(self.tokens) if len(t) == 1 and i not in special}

    def __call__(self, text: bytes, strict: bool = False) -> list[int]:
        # llguidance hands complete UTF-8 here; plain encoding, so text never becomes a control token
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return []
        return tokenizer.encode_plain(text.decode("utf-8", "strict" if strict else "replace"))


def _is_control(tokenizer: Tokenizer, token: int) -> bool:
    """Control and unknown tokens, and user-defined ones shaped like markers (<...>), as llguidance's
    own llama.cpp bridge marks them."""
    kind = tokenizer.vocab.types[token]
    if kind in (CONTROL, UNKNOWN):
        return True
    text = tokenizer.vocab.tokens[token]
    return kind == USER_DEFINED and text.startswith("<") and text.endswith(">")


_VOCABULARIES: "weakref.WeakKeyDictionary[Tokenizer, GrammarVocabulary]" = weakref.WeakKeyDictionary()
_VOCABULARIES_LOCK = threading.Lock()


def grammar_vocabulary(tokenizer: Tokenizer) -> GrammarVocabulary:
    """The bridge for `tokenizer`, built on first use (about a second for a 150k vocabulary) and shared."""
    with _VOCABULARIES_LOCK:
        vocabulary = _VOCABULARIES.get(tokenizer)
        if vocabulary is None:
            end_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=None)
            if end_id is None:
                raise InvalidGrammar("the model's tokenizer names no end-of-sequence token, which a grammar "
                                     "needs to end a reply")
            source = _TokenSource(tokenizer, end_id)
            ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(source))
            vocabulary = _VOCABULARIES[tokenizer] = GrammarVocabulary(ll, tokenizer.vocab_size, end_id, source)
        return vocabulary


# -- the processor ------------------------------------------------------------------------------------

class GrammarProcessor(StructuredProcessor):
    """Masks every token the grammar does not allow next and follows the committed tokens. When the
    grammar may end, `stop_id` is allowed; once it is complete, only `stop_id`. A matcher failure mid-reply
    (llguidance's limits, a token it rejects) is logged and degrades to that forced stop. One per decode
    stream: `clone()` gives another stream its own state over the same compiled grammar and bridge."""

    def __init__(self, grammar: Grammar, vocabulary: GrammarVocabulary, stop_id: int):
        self.grammar, self.vocabulary, self.stop_id = grammar, vocabulary, int(stop_id)
        if not 0 <= self.stop_id < vocabulary.size:
            raise ValueError(f"stop token {stop_id} is outside the vocabulary (size {vocabulary.size})")
        initial = llguidance.LLMatcher(vocabulary.ll, grammar.compiled, log_level=0)
        if initial.is_error():  # e.g. a lexer limit that only the tokenizer reveals
            raise InvalidGrammar(f"invalid {grammar.kind.replace('_', ' ')} grammar: {initial.get_error()}")
        self._initial = initial  # never advanced: reset and error recovery copy it
        self._start(initial.deep_copy())

    def _start(self, matcher: llguidance.LLMatcher, failure: str | None = None,
               budget: ReplyBudget | None = None) -> None:
        self._matcher = matcher
        self._bitmask = llg_numpy.allocate_token_bitmask(1, self.vocabulary.size)
        self.failure = failure  # why the matcher gave up this turn (the reply is then forced to stop)
        self.budget = budget  # the reply's token limit, kept closable (None: no limit set)

    def clone(self) -> "GrammarProcessor":
        """An independent processor in this one's current state (no vocabulary rebuild or recompile)."""
        twin = object.__new__(GrammarProcessor)
        twin.grammar, twin.vocabulary, twin.stop_id = self.grammar, self.vocabulary, self.stop_id
        twin._initial = self._initial
        twin._start(self._matcher.deep_copy(), self.failure, self.budget and self.budget.clone())
        return twin

    def reset(self) -> None:
        # a copy of the untouched matcher, not LLMatcher.reset(): an errored matcher stays errored, and a
        # rolled-back one that had stopped rejects the end-of-sequence token once its grammar completes again
        self._start(self._initial.deep_copy())

    def set_budget(self, tokens: int | None) -> None:
        """Replies from here end as whole documents within `tokens` tokens; ReplyBudgetTooSmall when the
        grammar's shortest document needs more (before any token is sampled)."""
        self.budget = None if tokens is None else ReplyBudget(self.grammar.compiled, self.vocabulary, tokens)

    @property
    def closed_early(self) -> bool:
        """The reply was closed to fit its token limit."""
        return self.budget is not None and self.budget.closed_early

    # -- the seam -------------------------------------------------------------------------------------
    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        if self.failure is None:
            llg_numpy.fill_next_token_bitmask(self._matcher, self._bitmask)  # in llguidance, GIL released
            if self._matcher.is_error():
                self._fail(self._matcher.get_error())
        if self.failure is not None:  # the forced stop: the only token left
            _only(logits, self.stop_id)
            return
        closing = self.budget.forcing() if self.budget is not None else []
        if closing:  # the budget's end: the closing's next token is the only one left
            _only(logits, closing[0])
            return
        allowed = self.allowed()
        n = min(allowed.size, logits.size)
        logits[:n][~allowed[:n]] = -np.inf
        logits[n:] = -np.inf  # output rows past the tokenizer's vocabulary (padding) are never tokens

    def vet(self, token: int) -> int | None:
        if self.budget is None or self.failure is not None or token == self.stop_id:
            return token
        return self.budget.vet(token)

    def allowed(self) -> np.ndarray:
        """The last mask as one bool per tokenizer id, "may end" mapped onto stop_id."""
        allowed = np.unpackbits(self._bitmask.view(np.uint8), count=self.vocabulary.size,
                                bitorder="little").view(bool)
        end = self.vocabulary.end_id
        if end != self.stop_id:
            allowed[self.stop_id], allowed[end] = allowed[end], False
        return allowed

    def commit(self, token: int) -> None:
        if self.failure is not None:
            return
        if not self._matcher.consume_token(self._grammar_id(token)):
            self._fail(self._matcher.get_error() or f"token {token} was not allowed")
        elif self.budget is not None and token != self.stop_id:
            self.budget.commit(token)

    def _grammar_id(self, token: int) -> int:
        return self.vocabulary.end_id if token == self.stop_id else int(token)

    def _fail(self, reason: str) -> None:
        log.warning("the reply grammar failed mid-reply (%s); ending the reply", reason)
        self.failure = reason or "the grammar matcher failed"

    # -- structural hooks -----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """The grammar is complete (or failed): only the stop token can follow."""
        return self.failure is not None or self._matcher.is_stopped()

    def forced_tokens(self) -> list[int]:
        if self.finished:
            return [self.stop_id]
        if self.budget is not None and self.budget.forcing():
            return list(self.budget.forced)  # the closing at the budget's end drafts itself
        return list(self._matcher.compute_ff_tokens())

    def valid_prefix_len(self, tokens: Sequence[int]) -> int:
        if self.finished:
            return 1 if len(tokens) and tokens[0] == self.stop_id else 0
        ids = []
        for token in tokens:
            # padding rows are never valid, nor the bridge's end id under its own name (the mask moves
            # "may end" onto stop_id)
            if not 0 <= token < self.vocabulary.size or token == self.vocabulary.end_id != self.stop_id:
                break
            ids.append(self._grammar_id(token))
        return int(self._matcher.validate_tokens(ids))


def _only(logits: np.ndarray, token: int) -> None:
    """Leave `token` the row's one choice."""
    logits[:] = -np.inf
    logits[token] = 0.0


def grammar_processor(grammar: Grammar, tokenizer: Tokenizer, stop_id: int | None = None) -> GrammarProcessor:
    """A processor for `grammar` over `tokenizer`'s shared bridge, ending replies with `stop_id` (default:
    the tokenizer's end-of-sequence token)."""
    vocabulary = grammar_vocabulary(tokenizer)
    return GrammarProcessor(grammar, vocabulary, vocabulary.end_id if stop_id is None else stop_id)
