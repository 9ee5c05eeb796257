"""The pass that guards pyarrow's JSON reader: where a JSON Lines file first nests deeper than a
limit, or first holds a value outside every object.

The rule, byte by byte over the whole file (records may span lines and the blocks the file is
read in):

- a quote toggles "inside a string" unless an odd run of backslashes comes right before it;
  a newline ends any string (a JSON string holds no raw newline: this keeps an unclosed quote
  from hiding the rest of the file);
- outside strings, ``{`` and ``[`` open a level, ``}`` and ``]`` close one. The depth is the
  file's, not the line's: an object written over many lines is as deep as its nesting, and the
  parser recurses as deep (a value 20,000 deep crashes it, written on one line or many). A byte
  that takes the depth over the limit is an offence;
- outside every object (depth 0, not inside a string) only whitespace and the ``{`` that opens
  the next record may stand: any other byte (a ``[``, a closing bracket, a number, ``null``,
  ``true``, ``false``, a backslash, or the quote that ends a bare string) is an offence.
  Where both could be said of one byte, the depth comes first.

:func:`guard_kernel` is the rule, a sequential pass that numba compiles on first use
(:func:`sessionstore.jit.compiled`; ``NUMBA_DISABLE_JIT=1`` runs it as written).
:func:`guard_block` answers the same with array operations, without numba, which costs more
to import than small files take to scan (see :data:`COMPILED_FROM_BYTES`); a property test
pins the two to each other and to an independent reference at every block size.

Both scan one block of bytes from a state carried over from the previous block, an int64
array of :data:`STATE_SIZE`: :data:`IN_STRING`, :data:`ESCAPING` (the run of backslashes
before the block's first byte is odd), :data:`DEPTH`; and after an offence, :data:`OFFENCE`
(:data:`DEEP` or :data:`STRAY`). The state is updated in place; both return the offending
byte's position in the block, or -1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

ByteArray = npt.NDArray[np.uint8]
Int64Array = npt.NDArray[np.int64]

IN_STRING, ESCAPING, DEPTH, OFFENCE = 0, 1, 2, 3
STATE_SIZE = 4
#: The kinds of offence, in ``state[OFFENCE]``.
DEEP, STRAY = 1, 2
#: From this many bytes of JSON Lines input on, :func:`guard_kernel` scans them: below it, the
#: array form scans them in less time than importing numba takes (about 0.6 s), when numba is
#: not imported yet.
COMPILED_FROM_BYTES = 16 << 20


def new_state() -> Int64Array:
    """The state before a file's first byte."""
    return np.zeros(STATE_SIZE, dtype=np.int64)


def guard_kernel(data: ByteArray, stop: int, state: Int64Array, limit: int) -> int:
    """Scan ``data[:stop]`` from ``state`` (see the module's docstring); the first offence's
    position, or -1."""
    in_string = state[IN_STRING] != 0
    escaping = state[ESCAPING] != 0
    depth = state[DEPTH]
    found = -1
    kind = 0
    for i in range(stop):
        byte = data[i]
        if byte == 0x5C:  # backslash
            escaping = not escaping
            if not in_string and depth <= 0:
                found, kind = i, STRAY
                break
            continue
        escaped = escaping
        escaping = False
        if byte == 0x22:  # quote
            if not escaped:
                in_string = not in_string
            if not in_string and depth <= 0:
                found, kind = i, STRAY
                break
        elif byte == 0x0A:
            in_string = False
        elif in_string:
            continue
        elif byte == 0x7B or byte == 0x5B:  # { [
            if depth >= limit:
                found, kind = i, DEEP
                break
            if byte == 0x5B and depth <= 0:
                found, kind = i, STRAY
                break
            depth += 1
        elif byte == 0x7D or byte == 0x5D:  # } ]
            if depth <= 0:
                found, kind = i, STRAY
                break
            depth -= 1
        elif depth <= 0 and byte != 0x20 and byte != 0x09 and byte != 0x0D:
            found, kind = i, STRAY
            break
    state[IN_STRING] = in_string
    state[ESCAPING] = escaping
    state[DEPTH] = depth
    state[OFFENCE] = kind
    return found


def guard_block(data: ByteArray, stop: int, state: Int64Array, limit: int) -> int:
    """:func:`guard_kernel`'s answer with array operations (same arguments and result)."""
    # a quote and a backslash restate the string and escape state carried in; neither offends
    # (the quote opens a string, and a backslash outside one is carried only inside an object)
    carried = (b'"' if state[IN_STRING] else b"") + (b"\\" if state[ESCAPING] else b"")
    a = np.concatenate((np.frombuffer(carried, dtype=np.uint8), data[:stop]))
    n = len(a)
    start = len(carried)
    if n == start:
        return -1
    index = np.arange(n, dtype=np.int64)
    last_plain = np.maximum.accumulate(np.where(a == 0x5C, -1, index))
    quotes = np.flatnonzero(a == 0x22)
    before = quotes - 1
    run = np.where(before >= 0, before - last_plain[np.maximum(before, 0)], 0)
    toggles = np.zeros(n, dtype=np.int64)
    toggles[quotes[run % 2 == 0]] = 1
    newline = a == 0x0A
    line_of = np.cumsum(newline)
    breaks = np.flatnonzero(newline)  # a line's toggles count from the newline before it
    flips = np.cumsum(toggles)
    flips -= np.concatenate(([0], flips[breaks]))[line_of]
    in_string = (flips & 1).astype(bool)
    opens = (a == 0x5B) | (a == 0x7B)
    step = opens.astype(np.int64) - ((a == 0x5D) | (a == 0x7D))
    step[in_string] = 0
    after = int(state[DEPTH]) + np.cumsum(step)
    outside = after - step <= 0
    blank = (a == 0x20) | (a == 0x09) | (a == 0x0A) | (a == 0x0D)
    stray = outside & ~in_string & ~blank & (a != 0x7B)
    deep = after > limit
    offences = np.flatnonzero(stray | deep)
    if len(offences):
        at = int(offences[0])
        state[OFFENCE] = DEEP if deep[at] else STRAY
        return at - start
    state[IN_STRING] = in_string[-1]
    state[ESCAPING] = (n - 1 - last_plain[-1]) % 2
    state[DEPTH] = after[-1]
    return -1
