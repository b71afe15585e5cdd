"""The shortest way to finish a grammar from where a reply is (budget-aware closing).

A reply with a token limit must end as a valid document, so at every step the grammar processor needs the
fewest bytes that complete the grammar from its current state. llguidance has no such query, so a
`Closer` keeps a twin of the reply's matcher over a 257-token byte vocabulary (every byte, plus one end
token): the same compiled grammar, fed the same bytes. On it a mask costs microseconds, so a closing is
found by walking the grammar byte by byte:

a greedy walk that takes the grammar's forced bytes whole (a key, a separator) and at a choice the first
allowed byte of a preference list that ends what is open (inside a JSON string its quote; outside it the
closing brackets, then the shortest values). A string the walk cannot end with its quote (a key among
several, a pattern, a format such as an e-mail address or a date) is ended by each of its few shortest
endings, found breadth-first over representative bytes, the walk going on from each; the shortest whole
closing wins. Short, not provably shortest: a preference can miss a shorter path the grammar allows.

The closing is in bytes; its token count is its model tokenization's (at most its byte count, as every
byte is a token in the vocabularies the engine reads).
"""

from __future__ import annotations

import collections

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

END = 256  # the byte vocabulary's end token ("the grammar may end here")
GREEDY_LIMIT = 1024  # bytes a walk may write: longer closings are not looked for
SEARCH_NODES = 2000  # states a string's search may open
STRING_ENDINGS = 4  # a string's shortest endings the walk tries
FEW = 4  # a byte class with at most this many allowed members is searched member by member
CONTEXT = 32  # bytes before a string that, with its mask, name the string in the memo of endings


class _ByteSource:
    """What llguidance.TokenizerWrapper reads: one token per byte and an end token."""
    eos_token_id, bos_token_id = END, None
    tokens = [bytes([b]) for b in range(256)] + [b"<end>"]
    special_token_ids = [END]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteSource()))

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# Greedy preferences: the bytes that end what is open first, then the shortest ways to fill a value.
_IN_STRING = b'"a1A -.'
_ESCAPED = b'n"\\'
_OUTSIDE = b'}])>,1"[{tfn-: '
# The search's representatives of a byte class whose members a grammar rarely tells apart.
# Digits from 1: a date, a time or an address of ones is valid where zeros may not be (year 0000).
_CLASSES = [range(ord("a"), ord("z") + 1), range(ord("A"), ord("Z") + 1), [*range(ord("1"), ord("9") + 1), ord("0")],
            range(0x80, 0x100)]
_CLASSED = np.zeros(256, dtype=bool)
for _members in _CLASSES:
    _CLASSED[list(_members)] = True


class Closer:
    """A byte-level twin of one reply's grammar matcher. `feed` the bytes the reply commits; `closing()`
    is the shortest completion found from there (None when the grammar has none within the limits)."""

    def __init__(self, compiled: str):
        self._matcher = llguidance.LLMatcher(_BYTES, compiled, log_level=0)
        self._bitmask = llg_numpy.allocate_token_bitmask(1, END + 1)
        self._in_string = self._escaped = False  # JSON lexical state, for the greedy preferences only
        self._tail = b""  # the last CONTEXT bytes fed: what a string's ending is remembered by
        self._memo: dict[bytes, list[bytes]] = {}  # string endings found, shared with clones (_Walker)

    def clone(self) -> "Closer":
        """A twin in this state sharing this one's memo of string endings (one reply's twins)."""
        twin = object.__new__(Closer)
        twin._matcher = self._matcher.deep_copy()
        twin._bitmask = llg_numpy.allocate_token_bitmask(1, END + 1)
        twin._in_string, twin._escaped, twin._tail = self._in_string, self._escaped, self._tail
        twin._memo = self._memo
        return twin

    def fork(self) -> "Closer":
        """A twin in this state with a copy of the memo: another reply's, which what this one finds later
        does not reach (a reply is a pure function of its grammar, its limit and its draws)."""
        twin = self.clone()
        twin._memo = {key: list(endings) for key, endings in self._memo.items()}
        return twin

    def feed(self, data: bytes) -> bool:
        """Advance over `data`; False when the grammar rejects a byte (the twin is then unusable)."""
        if not self._matcher.consume_tokens(list(data)):
            return False
        for b in data:
            self._in_string, self._escaped = _lex(b, self._in_string, self._escaped)
        self._tail = (self._tail + data)[-CONTEXT:]
        return True

    def completes(self, closing: bytes) -> bool:
        """Whether `closing` completes the grammar from here (the twin stays where it is)."""
        return self._matcher.validate_tokens([*closing, END]) == len(closing) + 1

    @property
    def done(self) -> bool:
        """The grammar may end here."""
        return self._matcher.is_accepting()

    def closing(self) -> bytes | None:
        """The bytes that complete the grammar from here (b"" when it may end now)."""
        walker = _Walker(self._bitmask, self._memo)
        walked = walker.walk(self._matcher.deep_copy(), self._in_string, self._escaped, self._tail)
        return walked if walked is not None else walker.search(self._matcher.deep_copy())


class _Walker:
    """One closing's search: the mask buffer, and the memo of string endings it reads and fills (a
    required date or address far ahead is ended the same way at every step; the endings are found once
    and replayed, each checked as it is consumed)."""

    def __init__(self, bitmask: np.ndarray, memo: dict[bytes, list[bytes]]):
        self.bitmask, self.memo = bitmask, memo

    def walk(self, matcher: llguidance.LLMatcher, in_string: bool, escaped: bool, before: bytes,
             choose: bool = True) -> bytes | None:
        """The greedy walk from `matcher` (which it advances; `before`: the bytes that led there). A string it
        cannot end with its quote (a key among several, a pattern, a format) is ended by the one of its few
        shortest endings whose walk on (`choose`: each tried with the first ending at every later string)
        closes soonest."""
        out = bytearray()
        while len(out) < GREEDY_LIMIT:
            if matcher.is_accepting():
                return bytes(out)
            step = matcher.compute_ff_bytes()  # forced bytes (a key, a separator) in one go
            if not step:
                allowed = self.allowed(matcher)
                if in_string and not escaped and not allowed[_QUOTE]:
                    context = before + out
                    endings = self.string_endings(matcher, context)
                    if choose and len(endings) > 1:  # stable: ties keep the shorter ending
                        endings.sort(key=lambda ending: self.length_after(ending, context))
                    if not endings:
                        return None
                    ending, matcher = endings[0]
                    out += ending
                    in_string = escaped = False
                    continue
                prefs = _ESCAPED if escaped else _IN_STRING if in_string else _OUTSIDE
                byte = next((b for b in prefs if allowed[b]), None)
                if byte is None:
                    choices = np.flatnonzero(allowed)
                    if not choices.size:
                        return None
                    byte = int(choices[0])
                step = bytes([byte])
            for b in step:
                if not matcher.consume_token(b):
                    return None
                in_string, escaped = _lex(b, in_string, escaped)
            out += step
        return None

    def length_after(self, ending: tuple[bytes, llguidance.LLMatcher], before: bytes) -> float:
        rest = self.walk(ending[1].deep_copy(), False, False, before + ending[0], choose=False)
        return float("inf") if rest is None else len(ending[0]) + len(rest)

    def string_endings(self, matcher: llguidance.LLMatcher, context: bytes
                       ) -> list[tuple[bytes, llguidance.LLMatcher]]:
        """Up to STRING_ENDINGS shortest ways to end the string `matcher` is inside of (through its closing
        quote), with the matcher after each; from the memo when a string with this mask after the same
        bytes (its key, in JSON) was ended before (each replayed ending checked), else searched."""
        self.allowed(matcher)
        key = self.bitmask.tobytes() + bytes(context[-CONTEXT:])
        endings = []
        for ending in self.memo.get(key, ()):
            child = matcher.deep_copy()
            if child.consume_tokens(list(ending)):
                endings.append((ending, child))
        if not endings:
            endings = list(self._search_endings(matcher))
            self.memo[key] = [ending for ending, _ in endings]
        return endings

    def _search_endings(self, matcher: llguidance.LLMatcher):
        """Breadth-first over representative bytes, the states of one length merged by their mask (a counted
        repeat, [A-Z]{3}, keeps one mask over states of different lengths)."""
        queue = collections.deque([(matcher, b"", False)])
        seen: set[bytes] = set()
        found = opened = 0
        while queue and opened < SEARCH_NODES and found < STRING_ENDINGS:
            matcher, out, escaped = queue.popleft()
            allowed = self.allowed(matcher)
            key = self.bitmask.tobytes() + bytes([escaped]) + len(out).to_bytes(4, "little")
            if key in seen:
                continue
            seen.add(key)
            opened += 1
            for byte in _representatives(allowed):
                child = matcher.deep_copy()
                if not child.consume_token(byte):
                    continue
                if byte == _QUOTE and not escaped:
                    found += 1
                    yield out + b'"', child
                else:
                    queue.append((child, out + bytes([byte]), not escaped and byte == _BACKSLASH))

    def search(self, matcher: llguidance.LLMatcher) -> bytes | None:
        """Where the walk's preferences go round in circles (a grammar unlike JSON, whose list goes on while
        its closing bracket waits): breadth-first over representative bytes to the first place it may end."""
        queue = collections.deque([(matcher, b"")])
        seen: set[bytes] = set()
        while queue and len(seen) < SEARCH_NODES:
            matcher, out = queue.popleft()
            if matcher.is_accepting():
                return out
            allowed = self.allowed(matcher)
            key = self.bitmask.tobytes() + len(out).to_bytes(4, "little")
            if key in seen:
                continue
            seen.add(key)
            for byte in _representatives(allowed):
                child = matcher.deep_copy()
                if child.consume_token(byte):
                    queue.append((child, out + bytes([byte])))
        return None

    def allowed(self, matcher: llguidance.LLMatcher) -> np.ndarray:
        llg_numpy.fill_next_token_bitmask(matcher, self.bitmask)
        return np.unpackbits(self.bitmask.view(np.uint8), count=256, bitorder="little").view(bool)


def _representatives(allowed: np.ndarray) -> list[int]:
    """Every allowed byte outside the classes; of a class, every allowed member when few are (the first
    letters of a key's names), else its first (a free string's letters all lead to the same place)."""
    picks = [int(b) for b in np.flatnonzero(allowed & ~_CLASSED)]
    for members in _CLASSES:
        inside = [b for b in members if allowed[b]]
        picks += inside if len(inside) <= FEW else inside[:1]
    return picks


def _lex(byte: int, in_string: bool, escaped: bool) -> tuple[bool, bool]:
    """JSON's string state after one byte."""
    if escaped:
        return in_string, False
    if in_string and byte == _BACKSLASH:
        return True, True
    if byte == _QUOTE:
        return not in_string, False
    return in_string, False
