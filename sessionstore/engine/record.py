"""The stored value of one session: a typed record and its msgpack wire form.

On disk a record is the msgpack list ``[acc, n_new, pane_index, phase, pt_target_ms]`` (the
layout of store format 1, kept so that existing stores reopen); with ``max_duration_ms`` the
list has two more items, the session's events and their largest window end
(:mod:`sessionstore.engine.max_duration`). In memory it is a
:class:`SessionRecord`; the hot paths that keep the wire form use this module's accessors
(:func:`plain_record`, :func:`acc_of`, :func:`record_with_events`, :func:`events_of`), so no
code outside this module indexes the positional list (``tests/engine/test_rules.py`` pins
them to :class:`SessionRecord`).
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
            if not isinstance(raw, list | tuple) or len(raw) != _WITH_EVENTS:
                raise ValueError(f"not a session record: {raw!r:.80}")
            raw = raw[:5]
        acc, n_new, index, phase, target = raw
        # a dict lookup: calling the enum costs more than the rest of the decode (and EARLY
        # is 0, so no `or`)
        known = _PHASES.get(phase)
        return cls(acc, n_new, index, Phase(phase) if known is None else known, target)

    def copy(self) -> SessionRecord:
        return SessionRecord(self.acc, self.n_new, self.pane_index, self.phase, self.pt_target_ms)


def plain_record(acc: Any) -> tuple[Any, ...]:
    """The wire form of a record with no trigger state (``SessionRecord(acc).to_wire()``), as
    a tuple: it packs as the same msgpack array and costs less to build."""
    return (acc, 0, 0, 0, None)


def acc_of(raw: Any) -> Any:
    """The accumulator of a stored record (``SessionRecord.from_wire(raw).acc``, without
    decoding the rest).

    Raises:
        ValueError: ``raw`` is not a record of this layout.
    """
    kind = type(raw)
    if (kind is tuple or kind is list) and (len(raw) == 5 or len(raw) == _WITH_EVENTS):
        return raw[0]
    return SessionRecord.from_wire(raw).acc


_WITH_EVENTS = 7


def record_with_events(acc: Any, events: list[Any], max_end_ms: int) -> list[Any]:
    """The wire form of a record with ``max_duration_ms``: :func:`plain_record`'s items, then
    the session's events and their largest own window end."""
    return [acc, 0, 0, 0, None, events, max_end_ms]


def events_of(raw: Any) -> tuple[Any, int] | None:
    """``(events, max_end_ms)`` of a record written by :func:`record_with_events`, or None
    for a record without them."""
    if not isinstance(raw, list | tuple) or len(raw) != _WITH_EVENTS:
        return None
    return raw[5], raw[6]


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
