"""Numba typed lists built by cached kernels.

`numba.typed.List(items)` called from Python compiles the list's helpers (make, append) for the item type
in every process, uncached: about a second per item type, paid before a model's first token even when
every kernel comes from the cache. Built here, the same lists come from kernels that are cached.
"""

from numba import njit
from numba.typed import List

from kernels.common.quant_blocks import KERNEL


@njit(**KERNEL)
def _list_of(first):
    items = List()
    items.append(first)
    return items


@njit(**KERNEL)
def _append(items, item):
    items.append(item)


def typed_list(items):
    """A numba.typed.List of `items` (at least one, all of one Numba type)."""
    items = iter(items)
    out = _list_of(next(items))
    for item in items:
        _append(out, item)
    return out
