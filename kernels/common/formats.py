"""Kernels compiled for the weight formats a model uses, not for all thirteen.

A product or decoder kernel picks its per-format code by the GGML type id at run time (a model's layers may
mix formats: Qwen2.5 alternates Q4_K and Q6_K down projections). With every format's code behind that
choice, each kernel compiled the code of all of them, and Numba compiles a callee's code again into every
caller (it links and re-optimizes it), so the first run spent most of its time on formats the model never
reads. A `FormatSet` argument names the formats a call can meet; its Numba type carries them, so a kernel
is compiled (and cached) per set, with only their code.

`switch(cases, params)` makes the choice: `select(formats, qtype, *params)` calls `cases[qtype](*params)`,
with branches for the formats of the set only (a type id outside it gets the set's last format's kernel:
callers make the set from the types they pass).

A set also says whether its kernels carry the vector-lane code for many rows (row_lanes, attention_lanes:
`lanes`). A one-row decode never runs that code, and compiling it made the first token wait twice as long,
so the decode forward is compiled for a set without it first and the verify forward's set with it after
(kernels.cpu.row_variants). A case of `switch` that differs between the two is a `ByLanes`.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable, NamedTuple

from numba import types
from numba.extending import NativeValue, models, overload, register_model, typeof_impl, unbox


class FormatSetType(types.Type):
    def __init__(self, qtypes: tuple[int, ...], lanes: bool):
        self.qtypes = qtypes
        self.lanes = lanes
        super().__init__(name=f"FormatSet{list(qtypes)}{'' if lanes else 'NoLanes'}")


class FormatSet:
    """GGML type ids a kernel call may meet, and whether it has the lanes for many rows (make them with `of`)."""

    def __init__(self, qtypes: tuple[int, ...], lanes: bool):
        self.qtypes = qtypes
        self.lanes = lanes
        # Numba's dispatcher reads this attribute in C; without it every kernel call typed the set in Python
        # (typeof_pyval, for each of a Qwen3.5-shape decode token's 440 kernel calls: about 2% of its time)
        self._numba_type_ = FormatSetType(qtypes, lanes)

    def __repr__(self) -> str:
        return f"FormatSet{self.qtypes}{'' if self.lanes else ', no lanes'}"


class ByLanes(NamedTuple):
    """A case of `switch` with a kernel for sets without the lanes and one for sets with them."""
    plain: Callable
    lanes: Callable


@functools.cache
def _of(qtypes: tuple[int, ...], lanes: bool) -> FormatSet:
    return FormatSet(qtypes, lanes)


def of(qtypes: Iterable[int], lanes: bool = True) -> FormatSet:
    return _of(tuple(sorted({int(q) for q in qtypes})), lanes)


@typeof_impl.register(FormatSet)
def _typeof(value: FormatSet, context) -> FormatSetType:
    return value._numba_type_


register_model(FormatSetType)(models.OpaqueModel)  # all it holds is in its type


@unbox(FormatSetType)
def _unbox(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


def switch(cases: dict, params: tuple[str, ...]):
    """A function select(formats, qtype, *params) for kernels, returning cases[qtype](*params); cases maps a
    GGML type id to a kernel (inlined where it is chosen)."""
    args = ", ".join(params)
    # Numba wants the parameters spelled out, in the stub it sees and in the function typing a call
    namespace = {"__name__": __name__, "branches": lambda qtypes, lanes: _branches(cases, args, qtypes, lanes)}
    exec(f"def select(formats, qtype, {args}):\n    raise NotImplementedError\n"
         f"def typing(formats, qtype, {args}):\n    return branches(formats.qtypes, formats.lanes)", namespace)
    select = namespace["select"]
    overload(select, inline="always")(namespace["typing"])
    return select


def _branches(cases: dict, args: str, qtypes: tuple[int, ...], lanes: bool):
    """The body of `select` for one format set: one branch per format (exec: the branches are its code)."""
    if not qtypes:
        raise TypeError("a kernel call's format set needs at least one GGML type id")
    missing = [q for q in qtypes if q not in cases]
    if missing:
        raise TypeError(f"no kernel for GGML type ids {missing}")
    lines = [f"def select(formats, qtype, {args}):"]
    for q in qtypes[:-1]:
        lines += [f"    if qtype == {q}:", f"        return kernel_{q}({args})"]
    # the last without a test: a raise for other ids would keep a prange loop around `select` serial
    lines.append(f"    return kernel_{qtypes[-1]}({args})")
    kernels = {q: (cases[q].lanes if lanes else cases[q].plain) if isinstance(cases[q], ByLanes) else cases[q]
               for q in qtypes}
    namespace = {"__name__": __name__} | {f"kernel_{q}": kernels[q] for q in qtypes}
    exec("\n".join(lines), namespace)
    return namespace["select"]
