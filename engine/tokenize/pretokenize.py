"""Pre-tokenizers: how byte-level BPE cuts text into words before merging, per `tokenizer.ggml.pre`.

Each rule set is llama.cpp's list of regexes, applied in turn: every regex splits each piece left by
the previous one into its matches and the unmatched gaps between them. A regex that uses `\\p{..}`
classes runs on the folded text (see unicode_classes), with each class rewritten as its stand-in
character plus its ASCII members — exactly how llama.cpp runs them, collapsed categories included
(so e.g. a combining mark is not a letter for `\\p{L}`). A regex without classes runs on the real text
with non-ASCII whitespace turned into U+000B, as llama.cpp's std::wregex path does. llama.cpp's
hand-written splitters for the gpt2/llama3/qwen2/qwen35 regexes behave as those regexes do on the
folded text, so they need no code of their own here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import accumulate

from engine.tokenize.unicode_classes import (FOLDED, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, ascii_members, fold,
                                             widen)

log = logging.getLogger(__name__)

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# Qwen 3.5: combining marks join letters instead of punctuation runs.
QWEN35 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Written as escapes: several of these code points are not NFC-stable and editors silently change them.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)

_RULE_SETS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (GPT2,),
    "llama3": (LLAMA3,),
    "qwen2": (QWEN2,),
    "qwen35": (QWEN35,),
    "smollm": (r"\p{N}", GPT2),
    "gemma4": ("[^\n]+|[\n]+",),  # SentencePiece-style BPE: only newlines cut the text
    "deepseek-llm": (
        "[\r\n]",
        rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ),
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}

# `tokenizer.ggml.pre` names (as llama.cpp spells them) that share a rule set.
_ALIASES = {
    "gpt2": ("gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "roberta-bpe"),
    "llama3": ("llama-bpe", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
               "smaug-bpe", "glm4", "glm5", "chatglm-bpe"),
    "qwen2": ("deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "solar-open"),
    "smollm": ("starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
    "deepseek-v3": ("hunyuan-dense", "joyai-llm"),
}
RULES = dict(_RULE_SETS)
RULES.update({alias: _RULE_SETS[name] for name, aliases in _ALIASES.items() for alias in aliases})

_CLASSES = {"L": LETTER, "N": NUMBER, "M": MARK, "P": PUNCTUATION, "S": SYMBOL}


def _class_body(name: str) -> str:
    letter = _CLASSES[name]
    return re.escape(FOLDED[letter]) + "".join(re.escape(c) for c in ascii_members(letter))


def _translate(expr: str) -> str:
    """llama.cpp regex -> Python regex: `\\p{X}` becomes the folded-text class (its stand-in character
    plus its ASCII members) and a bare `$` (the end of the piece, in ECMAScript) becomes `\\Z`."""
    out, inside, i = [], False, 0
    while i < len(expr):
        if expr.startswith(r"\p{", i):
            end = expr.index("}", i)
            body = _class_body(expr[i + 3:end])
            out.append(body if inside else f"[{body}]")
            i = end + 1
            continue
        ch = expr[i]
        if ch == "\\":
            out.append(expr[i:i + 2])
            i += 2
            continue
        if ch == "$" and not inside:
            ch = r"\Z"
        inside = (inside or ch == "[") and ch != "]"
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Step:
    regex: re.Pattern
    folded: bool  # runs on the folded text, else on the widened real text


def _compile(expr: str) -> _Step:
    regex = re.compile(_translate(expr), re.ASCII)
    assert regex.groups == 0, expr  # findall must return whole matches
    return _Step(regex, folded=r"\p{" in expr)


class PreTokenizer:
    """Splits text into the words that BPE merges within, as llama.cpp does for one `pre` name."""

    def __init__(self, pre: str):
        self.name = pre
        self._steps = tuple(_compile(expr) for expr in RULES[pre])

    def split(self, text: str) -> list[str]:
        folded = fold(text) if any(s.folded for s in self._steps) else None
        wide = widen(text) if not all(s.folded for s in self._steps) else None
        views = [folded if step.folded else wide for step in self._steps]
        if len(self._steps) == 1 and views[0] is text:  # the common case: one regex, ASCII text
            parts = self._steps[0].regex.findall(text)
            if sum(map(len, parts)) == len(text):
                return parts
        lengths = [len(text)] if text else []
        for step, view in zip(self._steps, views):
            lengths = _refine(step.regex, view, lengths)
        bounds = list(accumulate(lengths, initial=0))
        return list(map(text.__getitem__, map(slice, bounds, bounds[1:])))


def _refine(regex: re.Pattern, view: str, lengths: list[int]) -> list[int]:
    """Split each piece (given by its length) into regex matches and the gaps between them."""
    out: list[int] = []
    start = 0
    for length in lengths:
        end = start + length
        parts = regex.findall(view, start, end)
        if sum(map(len, parts)) == length:  # the matches tile the piece: no gaps to find
            out.extend(map(len, parts))
        else:
            pos = start
            for match in regex.finditer(view, start, end):
                a, b = match.span()
                if a > pos:
                    out.append(a - pos)
                if b > a:
                    out.append(b - a)
                pos = b
            if pos < end:
                out.append(end - pos)
        start = end
    return out


def pretokenizer_for(pre: str | None) -> tuple[PreTokenizer, str | None]:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value, and the name it could not honour (if any).

    A missing value means llama.cpp's "default" rules; an unknown one falls back to the qwen2 rules
    with a warning, so encoding still works but token-ID parity is not guaranteed.
    """
    if not pre:
        return PreTokenizer("default"), None
    if pre in RULES:
        return PreTokenizer(pre), None
    log.warning("unknown pre-tokenizer %r: using the qwen2 rules; token ids may differ from llama.cpp", pre)
    return PreTokenizer("qwen2"), pre
