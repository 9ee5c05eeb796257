"""The stored value of one session: a typed record and its msgpack wire form.

On disk a record is the msgpack list ``[acc, n_new, pane_index, phase, pt_target_ms]`` (the
layout of store format 1, kept so that existing stores reopen); with ``max_duration_ms`` the
list has two more items, the session's events and their largest window end
(:mod:`sessionstore.engine.max_duration`). In memory it is a
:class:`SessionRecord`, so no code indexes a positional list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgpack

_PACK = msgpack.Packer(use_bin_type=True).pack


class Phase(enum.IntEnum):
    """Where a window is in its trigger life: before its ON_TIME pane, or after it."""

    EARLY = 0
    LATE = 1


@dataclass(slots=True)
class SessionRecord:
    """The state of one session.

    Attributes:
        acc: the aggregation's accumulator (since the last firing, with DISCARDING triggers).
        n_new: elements since the last firing (AfterCount, and "fire only if something new").
        pane_index: the index the next pane of this window gets.
        phase: EARLY before the ON_TIME pane, LATE after it.
        pt_target_ms: the processing-time target of an AfterProcessingTime trigger, or None.
    """

    acc: Any
    n_new: int = 0
    pane_index: int = 0
    phase: Phase = Phase.EARLY
    pt_target_ms: int | None = None

    def to_wire(self) -> list[Any]:
        """The msgpack-ready list stored for this record."""
        return [self.acc, self.n_new, self.pane_index, int(self.phase), self.pt_target_ms]

    @classmethod
    def from_wire(cls, raw: Any) -> SessionRecord:
        """Decode a stored record.

        Raises:
            ValueError: ``raw`` is not a record of this layout (a foreign or damaged store).
        """
        if not isinstance(raw, list | tuple) or len(raw) != 5:
            # with max_duration_ms two more items follow (engine/max_duration.py)
            if not isinstance(raw, list | tuple) or len(raw) != 7:
                raise ValueError(f"not a session record: {raw!r:.80}")
            raw = raw[:5]
        acc, n_new, index, phase, target = raw
        # a dict lookup: calling the enum costs more than the rest of the decode (and EARLY
        # is 0, so no `or`)
        known = _PHASES.get(phase)
        return cls(acc, n_new, index, Phase(phase) if known is None else known, target)

    def copy(self) -> SessionRecord:
        return SessionRecord(self.acc, self.n_new, self.pane_index, self.phase, self.pt_target_ms)


_PHASES = {int(phase): phase for phase in Phase}
_PLAIN = frozenset((int, float, str, bytes, bool, type(None)))


def as_stored(acc: Any) -> Any:
    """``acc`` as a read from a store with the default msgpack serde returns it: scalars as
    they are, anything else packed and unpacked (tuples become lists, and the result shares
    nothing with ``acc``). For values emitted from memory that the old path read back."""
    if type(acc) in _PLAIN:
        return acc
    return msgpack.unpackb(_PACK(acc), raw=False, strict_map_key=False)


def check_encodable(value: Any, what: str) -> None:
    """Refuse, before any state changes, a value msgpack cannot store.

    Args:
        value: the value or accumulator.
        what: how to name it in the error, e.g. ``"values[3]"``.

    Raises:
        TypeError: naming ``what`` and the offending type (sets, Decimals, dates, objects, ints
            beyond 64 bits, ...).
    """
    try:
        _PACK(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"{what} cannot be stored (msgpack: {exc}); use None, bool, int, float, str, "
            f"bytes, lists and dicts"
        ) from None


def first_unencodable(values: list[Any], what: str) -> None:
    """:func:`check_encodable` over a column, naming the first bad row; one C call when fine."""
    try:
        _PACK(values)
        return
    except (TypeError, ValueError, OverflowError):
        pass
    for row, value in enumerate(values):
        check_encodable(value, f"{what}[{row}]")
