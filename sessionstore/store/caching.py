"""A write-back cache in front of a session store (Kafka Streams' CachingSessionStore, KIP-63).

Writes stay in memory, one entry per session, until :meth:`flush` (or a commit, or eviction)
writes them to the wrapped store. Several updates of one session between flushes reach the store,
and the optional ``forward`` listener, once.

*What was forwarded is what the wrapped store holds.* On flush, a session's change is forwarded
with the value the wrapped store held before (Kafka's ``putAndMaybeForward``): a session that is
created and merged away between two flushes is neither written nor forwarded, while one that was
flushed before and is removed now is forwarded as a removal carrying its last flushed value. The
decision is never taken from the cache's own bookkeeping.

For every key it holds, the cache holds *all* of that key's sessions that end after a floor, so
the engine's merge queries for that key need no store read. It holds at most ``max_sessions``
sessions; when full it writes everything and starts over (0 writes through on every change).

With ``index_ends=True`` (the engine's emit-on-close event path) it also indexes its sessions by
end time and knows when it is *complete*: when every session of the wrapped store ending after
some time is in the cache (a fresh store, or once the close cursor has passed everything written
before an eviction, a bulk write or a reopen). Then :meth:`take_closed` hands the sessions that
close straight from memory, in store order, without writing them first and reading them back,
and a key seen for the first time needs no store read. Closed sessions stay dirty and reach the
wrapped store with the next flush (a commit, an eviction), in bulk.

Inside, a session is a plain ``(key, start, end)`` tuple, never a :class:`Session`: the garbage
collector stops tracking a plain tuple of scalars after its first pass, while a ``Session`` (a
tuple subclass) stays tracked for its whole life, and the cache holds up to ``max_sessions``
of them between flushes. ``Session`` objects are made only where they leave the cache (writes
to the wrapped store, ``forward``, read results).
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
from collections.abc import Callable, Iterator, Mapping, MutableSet, Sequence
from itertools import chain
from typing import Any, NamedTuple

from .. import keyschema
from ..gap_boundary import first_open_end
from ..timeutil import INT64_MAX, INT64_MIN
from ..types import Session

TOMBSTONE = object()
# The state of a session a view holds, the second item of its entry ``(value, state)``: NEW is
# a change the wrapped store has never held (written on flush, dropped if removed first),
# CHANGED a change of a session the store holds (written on flush, a removal on removal),
# CLEAN the session as the store holds it. A change stays in its view (not in ``_dirty``)
# until it is written, taken or forgotten: its key is in ``_dirty_keys``.
NEW = 0
CHANGED = 1
CLEAN = 2
_NO_CAP_CHANGE = object()
# Below this many changes a flush writes session by session: a bulk call's fixed cost (array
# building, sorting, a WriteBatch) outweighs the per-put overhead it saves on the small flushes
# the event path makes at each close.
_BULK_FLUSH_MIN = 256

_new_session = functools.partial(tuple.__new__, Session)  # Session(k, s, e), without a call

_KEY_BYTES_LIMIT = 1 << 16
# the longest end-index entry kept as a tuple (see CachingSessionStore._index)
_TUPLE_ENTRY = 32

_Pending = tuple[int, int, "tuple[Any, int, int] | None"]
# the entry of the pending heap that never falls due (its end is past every int64 end): the
# heap holds it while the cache tracks changes for ranged flushes, so that a non-empty heap
# says "tracking" to whoever holds the list (EventLayout.tracking)
_TRACKING: _Pending = (INT64_MAX + 1, 0, None)

ClosedRow = tuple[int, bytes, int, Any, Any, bool]
"""A session :meth:`CachingSessionStore.take_closed_rows` hands out: ``(end, key bytes, start,
key, value, changed)`` (no ``(key, start, end)`` tuple inside: one tracked allocation fewer per
closed session means fewer young collections)."""
_ROW = 6  # the items of a ClosedRow

Forward = Callable[[Session, Any, Any], None]
"""``forward(session, new_value_or_None, old_value_or_None)``, called for each flushed change."""

class View(dict[tuple[int, int], tuple[Any, int]]):
    """The sessions the cache holds of one key: ``{(start, end): (value, NEW | CHANGED |
    CLEAN)}``, every session of the key ending after :attr:`floor`.

    A dict subclass, so that the garbage collector never untracks it: the collector untracks
    an exact dict whose items hold nothing it tracks (a view's, after its tuples age) at each
    full collection; the next new ``(start, end)`` key tracks it again, as a young object, so
    every held key's view was promoted anew after each full collection and counted towards the
    next one (on the event path, 3-4 full collections per 400k events). A subclass stays
    tracked and old: only new views count.

    The view carries its key's floor and encoding, so that a step that found the view reads
    them without another lookup by key (in memory next to the view, where a dict of all keys
    is not)."""

    __slots__ = ("floor", "kb")

    def __init__(self, floor_ms: int, items: Any = ()) -> None:
        super().__init__(items)
        self.floor: int = floor_ms  # it holds every session of its key ending after this
        self.kb: bytes | None = None  # keyschema.encode_key of its key, once needed


class EventLayout(NamedTuple):
    """The live containers of a :class:`CachingSessionStore` that a one-event merge may change
    in place (the engine's fused event step, ``engine/fast_event.py``), so that its common step
    costs no call into the cache. Each stays the same object for the cache's life
    (:attr:`CachingSessionStore.event_layout`).

    A caller holding the view of ``key`` (``views[key]``, when its ``floor`` allows its close
    cursor, or from :meth:`~CachingSessionStore.cached_view`) may, as
    :meth:`~CachingSessionStore.put_merged` does:

    * replace the value of an entry: ``(value, NEW)`` if it was NEW, else ``(value, CHANGED)``;
    * delete an entry; one that was not NEW is then handed to
      :meth:`~CachingSessionStore.drop_stored` (the wrapped store may hold it);
    * add an entry ``(value, NEW)`` for bounds no entry and no pending removal has, then call
      :meth:`~CachingSessionStore.added` (after the two steps below), unless it replaces a
      deleted entry whose bounds it holds (then it counts as that one);
    * after any change of an entry: add ``key`` to ``changed_keys`` (unless the view held a
      NEW or CHANGED entry before: then the key is there, until a flush has made every entry of
      the view CLEAN), and while ``tracking`` is non-empty call
      :meth:`~CachingSessionStore.track_change` with the changed session, unless the entry was
      NEW or CHANGED before (it is tracked already).
    """

    views: Mapping[Any, View]
    """key -> its view; the view of ``key`` holds every session of the key ending after its
    :attr:`View.floor` (read only: views are opened and forgotten by the cache, which alone
    moves their floors)."""
    changed_keys: MutableSet[Any]
    """The keys whose views may hold NEW or CHANGED entries."""
    tracking: Sequence[Any]
    """Non-empty while ranged flushes track changes (read only)."""


class CachingSessionStore:
    """Write-back, de-duplicating cache over a session store. Same contract as the store.

    Args:
        wrapped: the store below (any :class:`~sessionstore.SessionStoreProtocol` with
            ``cap_expiry_time``).
        max_sessions: how many sessions to hold before writing everything (>= 0).
        forward: called for every change a flush writes, with the wrapped store's old value.
        index_ends: index the cached sessions by end time, for :meth:`take_closed`.
    """

    def __init__(self, wrapped: Any, max_sessions: int, forward: Forward | None = None,
                 *, index_ends: bool = False) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 0:
            raise ValueError(f"max_sessions must be an int >= 0, got {max_sessions!r}")
        self.wrapped = wrapped
        self.max_sessions = max_sessions
        self.forward = forward
        # key -> {(start, end): (value, NEW | CHANGED | CLEAN)}; complete for ends > its
        # floor. Entries are tuples, replaced on change: the collector stops tracking
        # them (lists, one per cached session, would stay tracked and make every collection
        # slower)
        self._views: dict[Any, View] = {}
        self._size = 0
        # the changes no view holds: (key, start, end) -> value (a change a view forgot, or
        # of a key without a view), or TOMBSTONE for a removal. Never a session a view holds,
        # except while a flush writes it (see _stage)
        self._dirty: dict[tuple[Any, int, int], Any] = {}
        # the keys whose views may hold a NEW or CHANGED entry (all of them do after a put;
        # a key stays until the next full flush)
        self._dirty_keys: set[Any] = set()
        # (end, seq, session) of the changed sessions, as a heap for flush(upto_end_ms); only
        # kept, with the _TRACKING entry, from the first such flush (built from the changes
        # then) until the next full flush: the event path's emit-on-close never asks for one
        # while the cache is complete
        self._pending: list[_Pending] = []
        self._seq = 0
        # a flush without a listener writes with one remove_many and one put_many when every
        # store below offers them (the listener needs each session's old value, one by one)
        self._bulk = forward is None and _has_bulk_writes(wrapped)
        # index_ends: end -> (key, start, key, start, ...) (flat, so that an entry allocates
        # nothing the collector tracks; see _index), a heap of those ends, and the time after
        # which every
        # session of the wrapped store is in the cache (INT64_MAX: not known). A session is
        # indexed when put or loaded, but not when it grows over the bounds of sessions it
        # replaces (the event path's common step: an end moves later): every session a view
        # holds that ends after the close cursor has an entry within its bounds. When
        # take_closed reaches an entry whose session is gone, the sessions now holding its
        # bounds close, or are indexed again at their own ends
        self._index_ends = index_ends and max_sessions > 0
        self._by_end: dict[int, tuple[Any, ...] | list[Any]] = {}
        self._end_heap: list[int] = []
        self._complete_above = INT64_MAX
        # the changed sessions take_closed handed out, with their values, in store order: no
        # longer dirty or in a view (still counted in the size), written first by the next
        # flush, or before any read that could miss them (see _write_closed). Their rows lie
        # flat, _ROW items each: a list of scalars makes no object per row for the collector
        # to count and visit (at about one closed session per 2.5 events on the event path,
        # a tuple each was a third of the young collections), and its columns are slices
        self._closed_rows: list[Any] = []
        # key -> its encoding (a pure function of the key), for take_closed's store order;
        # keyed as the views are, bounded by _KEY_BYTES_LIMIT
        self._key_bytes: dict[Any, bytes] = {}
        # a cap_expiry_time() call held back until the changes cached before it are written
        self._deferred_cap: Any = _NO_CAP_CHANGE
        self._reset_completeness()

    # -- the end index (index_ends) ---------------------------------------------------------

    def _reset_completeness(self, exact: bool = False) -> None:
        """After a reset, an eviction or a bulk write: the cache is complete above the largest
        session end the wrapped store has seen (everything it holds ends at or before that).
        It only moves up, unless ``exact`` (an abort, which forgets everything)."""
        if not self._index_ends:
            return
        try:
            stream_time = self.wrapped.observed_stream_time
        except AttributeError:  # a store that does not say: never complete
            self._complete_above = INT64_MAX
            return
        floor = INT64_MIN if stream_time is None else stream_time
        if exact or self._complete_above == INT64_MAX or floor > self._complete_above:
            self._complete_above = floor

    def _index(self, key: Any, start: int, end: int) -> None:
        """Add ``(key, start)`` to the end index at ``end``.

        An entry is a tuple while it is short: the collector stops tracking a tuple of scalars
        at its first pass, while a list, which lives until its end closes, would be promoted to
        the oldest generation and count towards its next full collection. A long one (many
        sessions ending together, as after an eviction) becomes a list, so that growing it
        stays linear."""
        by_end = self._by_end
        bucket = by_end.get(end)
        if bucket is None:
            by_end[end] = (key, start)
            heapq.heappush(self._end_heap, end)
        elif type(bucket) is tuple and len(bucket) < _TUPLE_ENTRY:
            by_end[end] = bucket + (key, start)
        elif type(bucket) is list:
            bucket.append(key)
            bucket.append(start)
        else:
            by_end[end] = [*bucket, key, start]

    def has_ends_upto(self, upto_ms: int) -> bool:
        """Whether some session put or loaded since the last :meth:`take_closed` may end at or
        before ``upto_ms`` (False without ``index_ends``)."""
        heap = self._end_heap
        return bool(heap) and heap[0] <= upto_ms

    def take_closed(self, low_ms: int, upto_ms: int) -> list[tuple[Session, Any]] | None:
        """The sessions with ``low_ms <= end <= upto_ms``, as ``find_sessions`` would return them
        (ordered by end, key bytes, start), taken from memory; or None when the cache may not
        hold all of them (the caller asks :meth:`find_sessions`).

        Either way the end index forgets everything up to ``upto_ms``: the caller promises never
        to ask about those ends again (its close cursor moves to ``upto_ms``). The sessions
        returned leave the cache's views; their changes stay dirty until the next flush.
        """
        rows = self.take_closed_rows(low_ms, upto_ms)
        if rows is None:
            return None
        new_session = _new_session
        return [(new_session((row[3], row[2], row[0])), row[4]) for row in rows]

    def take_closed_rows(self, low_ms: int, upto_ms: int) -> list[ClosedRow] | None:
        """:meth:`take_closed` as the cache's own rows, ``(end, key bytes, start, key, value,
        changed)``, in the same order (the engine's emit-on-close reads them
        without a :class:`Session` per row). The cache keeps its own copy of the changed ones,
        flat, for the next flush."""
        heap = self._end_heap
        if not heap or heap[0] > upto_ms:
            return [] if self._complete_above < low_ms else None
        by_end = self._by_end
        complete = self._complete_above < low_ms
        views = self._views
        heappop = heapq.heappop
        # sorted once into store order below; (end, key bytes, start) is unique per session,
        # so the tuples compare on those three only
        found: list[ClosedRow] = []
        append = found.append
        left = 0  # clean sessions that leave the views
        while heap and heap[0] <= upto_ms:
            end = heappop(heap)
            pairs = iter(by_end.pop(end))
            exact = complete and end >= low_ms
            for key, start in zip(pairs, pairs, strict=True):
                view = views.get(key)
                if not view:
                    continue
                if exact:
                    cached = view.pop((start, end), None)
                    if cached is not None:  # the session indexed here: it closes
                        if view.floor < upto_ms:
                            view.floor = upto_ms
                        kb = view.kb
                        if kb is None:
                            kb = view.kb = self.key_bytes(key)
                        if cached[1] == CLEAN:
                            left += 1  # already in the wrapped store: it just leaves the view
                            append((end, kb, start, key, cached[0], False))
                        else:
                            append((end, kb, start, key, cached[0], True))
                        continue
                # that session grew (its end moved later, or it merged into another), or
                # closed: the sessions that hold its bounds now close, or are indexed again at
                # their own ends (commonly one, ending after upto_ms)
                due = None
                for bounds in view:
                    if bounds[0] <= start and bounds[1] >= end:
                        if bounds[1] > upto_ms:
                            self._index(key, bounds[0], bounds[1])
                        elif complete and bounds[1] >= low_ms:
                            due = [bounds] if due is None else [*due, bounds]
                if due is not None:
                    left += self._take(key, view, due, upto_ms, append)
        self._size -= left
        if not complete:
            return None
        if len(found) > 1:
            found.sort()
        if left == 0:
            self._closed_rows.extend(chain.from_iterable(found))
        elif left < len(found):
            self._closed_rows.extend(chain.from_iterable([row for row in found if row[5]]))
        return found

    def _take(self, key: Any, view: View, due: list[tuple[int, int]], upto_ms: int,
              append: Callable[[ClosedRow], None]) -> int:
        """:meth:`take_closed_rows` for sessions ``due`` of ``key`` found through an entry of
        the end index that is not their own: append their rows, taking them from ``view``.
        Returns how many of them were clean (already in the wrapped store)."""
        if view.floor < upto_ms:
            view.floor = upto_ms
        kb = view.kb
        if kb is None:
            kb = view.kb = self.key_bytes(key)
        clean = 0
        for start, end in due:
            value, state = view.pop((start, end))
            if state == CLEAN:
                clean += 1  # already in the wrapped store: it just leaves the view
            append((end, kb, start, key, value, state != CLEAN))
        return clean

    def key_bytes(self, key: Any) -> bytes:
        """``keyschema.encode_key(key)``, remembered for the keys the cache holds.

        Raises:
            TypeError / ValueError: as ``keyschema.encode_key`` (a key no store can hold).
        """
        known = self._key_bytes.get(key)
        return self._encode_key(key) if known is None else known

    def _encode_key(self, key: Any) -> bytes:
        """``keyschema.encode_key``, remembered for the keys the cache holds."""
        encoded = keyschema.encode_key(key)
        key_bytes = self._key_bytes
        if len(key_bytes) >= _KEY_BYTES_LIMIT:
            key_bytes.clear()
        key_bytes[key] = encoded
        return encoded

    # -- the engine's view ------------------------------------------------------------------

    @property
    def event_layout(self) -> EventLayout:
        """The containers a one-event merge may change in place, and how (:class:`EventLayout`)."""
        return EventLayout(self._views, self._dirty_keys, self._pending)

    def sessions_of(self, key: Any, floor_ms: int) -> Mapping[tuple[int, int], tuple[Any, int]]:
        """Every session of ``key`` ending after ``floor_ms``, as ``{(start, end): (value, _)}``.

        Loads the key on first use. The mapping may hold sessions ending at or before the floor
        too; callers filter. Read only (see :class:`EventLayout` for the one exception).
        """
        view = self.cached_view(key, floor_ms)
        if view is not None:
            return view
        if key in self._views:  # older sessions wanted than held: reload from the store
            self._flush_key(key)
            self._size -= len(self._views.pop(key))
        low = first_open_end(floor_ms)
        view = View(floor_ms, {(s.start, s.end): (value, CLEAN) for s, value
                               in self.wrapped.find_sessions_to_merge(key, low, INT64_MAX)})
        if self.max_sessions == 0:
            return view  # not kept: writes of this key go straight through
        if self._size + len(view) > self.max_sessions:
            self.evict()
        if self._index_ends:
            for start, end in view:
                self._index(key, start, end)
        self._views[key] = view
        self._size += len(view)
        return view

    def cached_view(self, key: Any, floor_ms: int) -> View | None:
        """:meth:`sessions_of` when the cache answers it without reading the wrapped store (the
        view it holds, or a new empty one when the store holds nothing of the key above the
        floor); None when only a read can (the caller asks :meth:`sessions_of`)."""
        view = self._views.get(key)
        if view is not None:
            held_floor = view.floor
            if floor_ms < held_floor:
                return None  # older sessions wanted than held
            if floor_ms > held_floor and len(view) > 2:
                self._forget_before(key, view, floor_ms)
            return view
        if floor_ms < self._complete_above:
            return None
        # complete: the wrapped store holds nothing of this key above the floor
        view = View(floor_ms)
        self._views[key] = view
        return view

    def _forget_before(self, key: Any, view: View, floor_ms: int) -> None:
        """Drop a key's sessions ending at or before the floor from its view.

        A change among them stays dirty (and counted in the size) until the next flush writes
        it with all the others, in (end, key, start) order: writing it now would forward it
        ahead of changes of other keys that end earlier, an order no flush produces.
        """
        dirty = self._dirty
        for bounds in [b for b in view if b[1] <= floor_ms]:
            value, state = view.pop(bounds)
            if state == CLEAN:
                self._size -= 1
            else:
                dirty[(key, bounds[0], bounds[1])] = value
            if self._index_ends:  # the view forgets it: index it at its own end
                self._index(key, bounds[0], bounds[1])
        view.floor = floor_ms
        if floor_ms > self._complete_above:
            self._complete_above = floor_ms  # the cache no longer holds what it forgot

    @property
    def dirty_count(self) -> int:
        """Changes not yet written to the wrapped store."""
        return len(self._dirty) + len(self._closed_rows) // _ROW + len(self._held_changes())

    def _held_changes(self, key: Any = None) -> list[tuple[Any, int, int]]:
        """The changes the views hold (NEW or CHANGED entries), as ``(key, start, end)``; only
        ``key``'s when given."""
        views = self._views
        keys = self._dirty_keys if key is None else (key,) if key in self._dirty_keys else ()
        return [(k, b[0], b[1]) for k in keys if k in views
                for b, cached in views[k].items() if cached[1] != CLEAN]

    def _has_changes(self) -> bool:
        """Whether a change other than the closed rows :meth:`take_closed` handed out is not
        yet written to the wrapped store."""
        return bool(self._dirty) or bool(self._held_changes())

    # -- writes -----------------------------------------------------------------------------

    def put(self, session: Session, value: Any) -> bool:
        """Cache ``value`` for ``session`` (written on flush). Always True: an expired put is
        dropped and counted by the wrapped store when it is written. A ``None`` value removes
        the session, as the stores below do."""
        if value is None:
            self.remove(session)
            return True
        key, start, end = sid = _plain(session)
        view = self._views.get(key)
        if view is None:
            self._dirty[sid] = value
            self._flush_one(sid)
            if self._index_ends:  # the store holds a session no view does
                self._index(key, start, end)
                self._reset_completeness()
            return True
        bounds = (start, end)
        cached = view.get(bounds)
        if cached is None:
            # a removal still pending means the wrapped store holds the session (a re-cut can
            # put back the bounds of a session it removed); the view holds the change now
            view[bounds] = (value, CHANGED if self._dirty.pop(sid, None) is TOMBSTONE else NEW)
        else:
            view[bounds] = (value, NEW if cached[1] == NEW else CHANGED)
        self._dirty_keys.add(key)
        if self._pending and (cached is None or cached[1] == CLEAN):
            self._track(sid)
        if cached is None:
            self.added(key, start, end)
        elif self._size > self.max_sessions:
            self._overflow()
        return True

    @property
    def held_keys(self) -> Mapping[Any, Any]:
        """The keys whose sessions the cache holds (read only; a live view that stays the same
        object for the cache's life)."""
        return self._views

    def put_merged(self, key: Any, view: Mapping[tuple[int, int], tuple[Any, int]],
                   joined: Sequence[tuple[int, int]], session: tuple[Any, int, int],
                   value: Any) -> None:
        """:meth:`remove` each of ``joined`` (bounds of ``key``'s sessions, from ``view``, the
        mapping :meth:`sessions_of` returned) other than the bounds of ``session``, then
        :meth:`put` ``session``: one event's merge, in one call. ``session`` is a plain
        ``(key, start, end)`` tuple (see the module docstring), or a :class:`Session`.

        The sessions of ``joined`` end after the close cursor (the ``upto_ms`` of the last
        :meth:`take_closed`), as every session an event joins does: then a ``session`` that
        holds the bounds of one of them needs no entry of its own in the end index (that
        one's entry lies within its bounds)."""
        if type(session) is not tuple:
            session = _plain(session)
        held = self._views.get(key)
        if held is None or held is not view:  # not kept (max_sessions=0) or since evicted
            for b in joined:
                if b != (session[1], session[2]):
                    self.remove(_new_session((key, b[0], b[1])))
            self.put(_new_session(session), value)
            return
        bounds = (session[1], session[2])
        covered = False  # by the end-index entry of a joined session it holds
        for b in joined:
            if b != bounds:
                gone = held.pop(b)
                self._size -= 1
                if bounds[0] <= b[0] and b[1] <= bounds[1]:
                    covered = True
                if gone[1] != NEW:  # NEW: never written, nothing to undo downstream
                    self.drop_stored(key, b[0], b[1])
        cached = held.get(bounds)
        if cached is None:
            pending_removal = self._dirty.pop(session, None) is TOMBSTONE
            held[bounds] = (value, CHANGED if pending_removal else NEW)  # as put() does
        else:
            held[bounds] = (value, NEW if cached[1] == NEW else CHANGED)
        self._dirty_keys.add(key)
        if self._pending and (cached is None or cached[1] == CLEAN):
            self._track(session)
        if cached is None and not covered:
            self.added(key, bounds[0], bounds[1])
            return
        if cached is None:
            self._size += 1  # indexed by the end-index entry of a joined session it holds
        if self._size > self.max_sessions:
            self._overflow()

    def added(self, key: Any, start_ms: int, end_ms: int) -> None:
        """Count the session ``(key, start_ms, end_ms)`` a caller added to the view of ``key``
        (see :class:`EventLayout`): index its end, and write everything when the cache now
        holds more than ``max_sessions``."""
        self._size += 1
        if self._index_ends:
            self._index(key, start_ms, end_ms)
        if self._size > self.max_sessions:
            self._overflow()

    def drop_stored(self, key: Any, start_ms: int, end_ms: int) -> None:
        """The session ``(key, start_ms, end_ms)``, no longer in the view of ``key``, was not
        NEW: the wrapped store may hold it, so a flush removes it there (a NEW one was never
        written and needs nothing). Every removal from a view calls this."""
        sid = (key, start_ms, end_ms)
        if self._pending:
            self._track(sid)
        self._dirty[sid] = TOMBSTONE

    def track_change(self, key: Any, start_ms: int, end_ms: int) -> None:
        """While ranged flushes track changes (``event_layout.tracking`` is non-empty): track
        the session ``(key, start_ms, end_ms)`` a caller changed in a view (see
        :class:`EventLayout`)."""
        self._track((key, start_ms, end_ms))

    def _overflow(self) -> None:
        """Make room when a put took the cache past ``max_sessions``."""
        if self._closed_rows:  # first write what closed; it leaves the cache then
            self._write_closed(None)
        if self._size > self.max_sessions:
            self.evict()

    def remove(self, session: Session) -> None:
        """Remove ``session``; the removal reaches the wrapped store (and ``forward``) on flush,
        and only if the wrapped store holds the session."""
        key, start, end = sid = _plain(session)
        view = self._views.get(key)
        if view is None:
            self._dirty[sid] = TOMBSTONE
            self._flush_one(sid)
            return
        cached = view.pop((start, end), None)
        if cached is None:
            return
        self._size -= 1
        if cached[1] != NEW:  # NEW: never written, nothing to undo downstream
            self.drop_stored(key, start, end)

    def put_many(self, keys: Any, starts_ms: Any, ends_ms: Any, values: Any, *,
                 key_index: Any = None) -> Any:
        """Bulk write straight to the wrapped store (its ``put_many``), after writing and
        forgetting everything cached, so that no cached view goes stale."""
        self.evict()
        try:
            return self.wrapped.put_many(keys, starts_ms, ends_ms, values, key_index=key_index)
        finally:
            self._reset_completeness()  # the store now holds sessions the cache does not

    def remove_many(self, keys: Any, starts_ms: Any, ends_ms: Any, *,
                    key_index: Any = None) -> None:
        """Bulk remove from the wrapped store, after writing and forgetting the cache."""
        self.evict()
        self.wrapped.remove_many(keys, starts_ms, ends_ms, key_index=key_index)

    @property
    def holds_nothing(self) -> bool:
        """True when nothing is cached: the wrapped store alone answers every query."""
        return not self._views and not self._dirty and not self._closed_rows

    def _track(self, sid: tuple[Any, int, int]) -> None:
        """Add a newly dirty session to the pending heap (only called while it is kept)."""
        assert self._pending
        self._seq += 1
        heapq.heappush(self._pending, (sid[2], self._seq, sid))

    def flush(self, upto_end_ms: int | None = None) -> None:
        """Write (and forward) the changes of sessions ending at or before ``upto_end_ms``
        (all, by default), in (end, key bytes, start) order."""
        dirty = self._dirty
        if upto_end_ms is None:
            if self._bulk and self._flush_all_bulk():
                return
            held = self._stage_held()
            self._pending.clear()
        else:
            pending = self._pending
            if not pending:  # the first ranged flush since a full one: index the changes
                changes = [*dirty, *self._held_changes()]
                pending.extend((sid[2], seq, sid)
                               for seq, sid in enumerate(changes, self._seq + 1))
                self._seq += len(changes)
                pending.append(_TRACKING)  # never due: the heap stays non-empty
                heapq.heapify(pending)
            due: list[tuple[Any, int, int]] = []
            while pending[0][0] <= upto_end_ms:  # the _TRACKING entry is never due
                sid = heapq.heappop(pending)[2]
                assert sid is not None
                due.append(sid)
            # a session put, removed before it was written, and put again is tracked twice
            due = list(dict.fromkeys(due))
            held = [s for s in due if s not in dirty and self._holds_change(s)]
            self._stage(held)
        batch = list(dirty) if upto_end_ms is None else [s for s in due if s in dirty]
        # A large flush builds a few short-lived lists of tuples per session and makes no
        # reference cycles; the collector would walk them several times over (about a fifth
        # of a commit's CPU time), so it is paused for the flush and resumed after it, also
        # on failure. Cyclic garbage of other threads waits until then.
        pause = (len(batch) + len(self._closed_rows) // _ROW >= _BULK_FLUSH_MIN
                 and gc.isenabled())
        if pause:
            gc.disable()
        try:
            if self._closed_rows:
                self._write_closed(max((s[2] for s in batch if dirty[s] is not TOMBSTONE),
                                       default=None))
            self._write_batch(batch)
        except BaseException:
            self._unstage(held)
            raise
        finally:
            if pause:
                gc.enable()
        if upto_end_ms is None:
            self._dirty_keys.clear()  # every view entry is CLEAN now
        if self._deferred_cap is not _NO_CAP_CHANGE and not self._has_changes():
            self._apply_deferred_cap()

    def _flush_all_bulk(self) -> bool:
        """:meth:`flush` of every change with the wrapped store's bulk calls (no listener),
        written straight from the views: the outcome of staging them into ``_dirty`` and
        writing the batch (:meth:`_flush_bulk`), without a staged copy, a ``(key, start, end)``
        tuple or a lookup by session per change. False, having changed nothing, when there
        are too few changes for the bulk calls (the caller writes them one by one).

        The views hold no session ``_dirty`` holds (see ``_dirty``), so the rows are distinct
        and their order is (end, key bytes, start). Removals go first; on failure every change
        not written stays where it was, for a retry."""
        views = self._views
        dirty = self._dirty
        key_bytes = self.key_bytes
        rows: list[tuple[int, bytes, int, Any, Any]] = []
        append = rows.append
        changed_views = []
        for key in self._dirty_keys:
            view = views.get(key)
            if not view:
                continue
            kb = None
            for bounds, entry in view.items():
                if entry[1] != CLEAN:
                    if kb is None:
                        kb = view.kb
                        if kb is None:
                            kb = view.kb = key_bytes(key)
                        changed_views.append(view)
                    append((bounds[1], kb, bounds[0], key, entry[0]))
        removes = []
        for sid, value in dirty.items():
            row = (sid[2], key_bytes(sid[0]), sid[1], sid[0], value)
            if value is TOMBSTONE:
                removes.append(row)
            else:
                append(row)
        if len(rows) + len(removes) < _BULK_FLUSH_MIN:
            return False
        rows.sort()
        self._pending.clear()
        pause = gc.isenabled()  # as in flush: short-lived tuples, no cycles
        if pause:
            gc.disable()
        try:
            if self._closed_rows:
                self._write_closed(rows[-1][0] if rows else None)
            if removes:
                removes.sort()
                self.wrapped.remove_many([r[3] for r in removes], [r[2] for r in removes],
                                         [r[0] for r in removes])
                for r in removes:
                    del dirty[(r[3], r[2], r[0])]
            if rows:
                ends, _, starts, keys, values = zip(*rows, strict=True)
                self.wrapped.put_many(list(keys), list(starts), list(ends), list(values))
        finally:
            if pause:
                gc.enable()
        dirty.clear()  # what is left was written by put_many
        for view in changed_views:
            for bounds, entry in view.items():
                if entry[1] != CLEAN:
                    view[bounds] = (entry[0], CLEAN)
        self._dirty_keys.clear()
        if self._deferred_cap is not _NO_CAP_CHANGE:
            self._apply_deferred_cap()
        return True

    def _holds_change(self, sid: tuple[Any, int, int]) -> bool:
        """Whether a view holds ``sid`` as a NEW or CHANGED entry."""
        view = self._views.get(sid[0])
        cached = None if view is None else view.get((sid[1], sid[2]))
        return cached is not None and cached[1] != CLEAN

    def _stage(self, held: list[tuple[Any, int, int]]) -> None:
        """Copy the changes ``held`` (NEW or CHANGED view entries) into ``_dirty``, for a flush
        to write: a write marks the entry CLEAN and drops the copy, :meth:`_unstage` drops the
        copies a failed flush left."""
        views = self._views
        stage = self._stage_entry
        for sid in held:
            view = views[sid[0]]
            bounds = (sid[1], sid[2])
            stage(view, bounds, sid, *view[bounds])

    def _stage_entry(self, view: View, bounds: tuple[int, int],
                     sid: tuple[Any, int, int], value: Any, state: int) -> None:
        """:meth:`_stage` one change, ``view[bounds] == (value, state)``."""
        if state == NEW and self._dirty.get(sid) is TOMBSTONE:
            view[bounds] = (value, CHANGED)  # a removal pending: the store holds it
        self._dirty[sid] = value

    def _stage_held(self, key: Any = None) -> list[tuple[Any, int, int]]:
        """:meth:`_stage` every change the views hold (only ``key``'s when given), in one pass;
        returns them."""
        views = self._views
        stage = self._stage_entry
        keys = self._dirty_keys if key is None else (key,) if key in self._dirty_keys else ()
        held = []
        for k in keys:
            view = views.get(k)
            if not view:
                continue
            for bounds, (value, state) in view.items():
                if state != CLEAN:
                    sid = (k, bounds[0], bounds[1])
                    stage(view, bounds, sid, value, state)
                    held.append(sid)
        return held

    def _unstage(self, held: list[tuple[Any, int, int]]) -> None:
        """After a failed flush: drop the copies of :meth:`_stage` not written (the views still
        hold those changes)."""
        dirty = self._dirty
        for sid in held:
            if sid in dirty and self._holds_change(sid):
                del dirty[sid]

    def _write_batch(self, batch: list[tuple[Any, int, int]]) -> None:
        """Write dirty sessions, in (end, key bytes, start) order."""
        if len(batch) > 1:
            # keyschema.store_order, written out (a call per session costs more than the
            # sort); encodings are never empty (length-prefixed); (end, key bytes, start) is
            # unique per session, so the rows compare on those three only
            known = self._key_bytes.get
            encode = self._encode_key
            order = [(s[2], known(s[0]) or encode(s[0]), s[1], s) for s in batch]
            order.sort()
            batch[:] = [row[3] for row in order]
        if self._bulk and len(batch) >= _BULK_FLUSH_MIN and self.forward is None:
            self._flush_bulk(batch)
            return
        for index, session in enumerate(batch):
            try:
                self._flush_one(session)
            except BaseException:
                if self._pending:  # keep every unwritten change for a retry
                    for rest in batch[index:]:
                        if rest in self._dirty:
                            self._track(rest)
                raise

    def _write_closed(self, next_end_ms: int | None) -> None:
        """Write the sessions :meth:`take_closed` handed out (already in store order), ahead of
        a flush whose largest written end is ``next_end_ms`` (None: nothing else).

        They were emitted, so those ending below the expiry boundary this flush reaches are
        left out: written earlier, expiry would have dropped them by now, and a put would only
        be refused and counted as a dropped write (as the batch path does with the sessions
        that open and close inside one batch). A failure keeps them all for a retry.
        """
        rows = self._closed_rows
        if not rows:
            return
        ends = rows[0::_ROW]
        top = ends[-1]
        boundary = self.wrapped.expiry_boundary_ms(
            top if next_end_ms is None or next_end_ms < top else next_end_ms)
        first = 0
        if boundary is not None and ends[0] < boundary:
            first = bisect.bisect_left(ends, boundary)
        n = len(ends)
        if first < n:
            at = first * _ROW
            if self._bulk and n - first >= _BULK_FLUSH_MIN:
                # the columns of a row (end, key bytes, start, key, value, changed)
                self.wrapped.put_many(rows[at + 3::_ROW], rows[at + 2::_ROW], ends[first:],
                                      rows[at + 4::_ROW])
            else:
                put = self.wrapped.put
                for index in range(first, n):
                    at = index * _ROW
                    try:
                        put(_new_session((rows[at + 3], rows[at + 2], rows[at])), rows[at + 4])
                    except BaseException:
                        self._size -= index
                        del rows[:at]
                        raise
        self._size -= n
        rows.clear()

    def _flush_bulk(self, batch: list[tuple[Any, int, int]]) -> None:
        """Write ``batch`` (dirty sessions in flush order) with the wrapped store's bulk calls:
        the outcome of flushing them one by one. Removals go first: a removal and a put never
        name the same session, and a removal in a segment that a put expires finds nothing
        either way. ``put_many`` validates everything before it writes, so on failure every
        put stays dirty (and tracked) for a retry; the removals done stay done."""
        dirty = self._dirty
        removes = [s for s in batch if dirty[s] is TOMBSTONE]
        puts = [s for s in batch if dirty[s] is not TOMBSTONE] if removes else batch
        try:
            if removes:
                self.wrapped.remove_many([s[0] for s in removes], [s[1] for s in removes],
                                         [s[2] for s in removes])
                for session in removes:
                    del dirty[session]
            if puts:
                self.wrapped.put_many([s[0] for s in puts], [s[1] for s in puts],
                                      [s[2] for s in puts], [dirty[s] for s in puts])
        except BaseException:
            if self._pending:  # keep every unwritten change for a retry
                for rest in batch:
                    if rest in dirty:
                        self._track(rest)
            raise
        views = self._views
        for sid in puts:
            del dirty[sid]
            view = views.get(sid[0])
            if view is not None:
                bounds = (sid[1], sid[2])
                cached = view.get(bounds)
                if cached is not None:
                    view[bounds] = (cached[0], CLEAN)

    def _flush_one(self, sid: tuple[Any, int, int]) -> None:
        if sid not in self._dirty:
            return  # written already
        value = self._dirty[sid]
        wrapped = self.wrapped
        forward = self.forward
        session = _new_session(sid)
        old = wrapped.fetch_session(*session) if forward is not None else None
        if value is TOMBSTONE:
            wrapped.remove(session)
            del self._dirty[sid]
            if forward is not None and old is not None:
                forward(session, None, old)
            return
        wrapped.put(session, value)  # raises before changing anything: the change stays dirty
        del self._dirty[sid]
        view = self._views.get(sid[0])
        if view is not None:
            bounds = (sid[1], sid[2])
            cached = view.get(bounds)
            if cached is not None:
                view[bounds] = (cached[0], CLEAN)
        if forward is not None:
            forward(session, value, old)

    def _flush_key(self, key: Any) -> None:
        if self._closed_rows:
            self._write_closed(None)
        held = self._stage_held(key)
        try:
            for sid in [s for s in self._dirty if s[0] == key]:
                self._flush_one(sid)
        except BaseException:
            self._unstage(held)
            raise

    def evict(self) -> None:
        """Write every change and forget every cached session."""
        self.flush()
        if self._index_ends:  # the store holds them now: index each at its own end
            index = self._index
            for key, view in self._views.items():
                for start, end in view:
                    index(key, start, end)
        self._views.clear()
        self._size = 0
        self._reset_completeness()

    # -- reads ------------------------------------------------------------------------------

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        if self._closed_rows:
            self._write_closed(None)
        sid = (key, start_ms, end_ms)
        if sid in self._dirty:
            value = self._dirty[sid]
            return None if value is TOMBSTONE else value
        view = self._views.get(key)
        if view is not None and end_ms > view.floor:
            cached = view.get((start_ms, end_ms))
            return None if cached is None else cached[0]
        return self.wrapped.fetch_session(key, start_ms, end_ms)

    def find_sessions_to_merge(self, key: Any, earliest_end_ms: int,
                               latest_start_ms: int) -> Iterator[tuple[Session, Any]]:
        view = self._views.get(key)
        if view is not None and earliest_end_ms > view.floor:
            rows = sorted(
                (Session(key, s, e), cached[0]) for (s, e), cached in view.items()
                if e >= earliest_end_ms and s <= latest_start_ms
            )
            rows.sort(key=lambda row: (row[0].end, row[0].start))
            return iter(rows)
        self._flush_key(key)
        return iter(self.wrapped.find_sessions_to_merge(key, earliest_end_ms, latest_start_ms))

    def fetch(self, key: Any) -> Iterator[tuple[Session, Any]]:
        self._flush_key(key)
        return iter(self.wrapped.fetch(key))

    def find_sessions(self, earliest_end_ms: int,
                      latest_end_ms: int) -> Iterator[tuple[Session, Any]]:
        """Writes the changes in the range first, then asks the wrapped store."""
        self.flush(latest_end_ms)
        return iter(self.wrapped.find_sessions(earliest_end_ms, latest_end_ms))

    def find_sessions_columns(self, earliest_end_ms: int) -> Any:
        """Writes every change first, then reads the wrapped store's
        ``find_sessions_columns`` (None when it has none: the caller uses
        :meth:`find_sessions`)."""
        read = getattr(self.wrapped, "find_sessions_columns", None)
        if read is None:
            return None
        self.flush()
        return read(earliest_end_ms)

    # -- versions and pass-through ----------------------------------------------------------

    def commit(self, metadata: Any = None) -> int:
        """Write every change, then commit the wrapped store. A failure keeps what is unwritten
        in the cache and what is written in the store, so a retry commits all of it."""
        self.flush()
        self._apply_deferred_cap()
        return self.wrapped.commit(metadata)  # type: ignore[no-any-return]

    def abort(self) -> None:
        """Forget every cached change and abort the wrapped store."""
        self._views.clear()
        self._dirty.clear()
        self._dirty_keys.clear()
        self._pending.clear()
        self._size = 0
        self._closed_rows.clear()
        self._by_end.clear()
        self._end_heap.clear()
        self._deferred_cap = _NO_CAP_CHANGE  # the wrapped store restores its committed cap
        self.wrapped.abort()
        self._reset_completeness(exact=True)

    def close(self) -> None:
        self.wrapped.close()

    def cap_expiry_time(self, cap_ms: int | None) -> None:
        """Cap the wrapped store's expiry time (see the store's ``cap_expiry_time``).

        With a ``forward`` listener, a new cap waits until the changes cached so far are
        written: each forwarded change carries the old value the wrapped store held when the
        change was made, and a raised cap would hide a delivered session that has since been
        merged away, so its retraction would be lost. Waiting expires less, never more."""
        if self.forward is not None and self._has_changes():
            self._deferred_cap = cap_ms
            return
        self._deferred_cap = _NO_CAP_CHANGE
        self.wrapped.cap_expiry_time(cap_ms)

    def _apply_deferred_cap(self) -> None:
        cap = self._deferred_cap
        if cap is not _NO_CAP_CHANGE:
            self._deferred_cap = _NO_CAP_CHANGE
            self.wrapped.cap_expiry_time(cap)

    @property
    def retention_ms(self) -> int:
        return self.wrapped.retention_ms  # type: ignore[no-any-return]

    @property
    def segment_interval_ms(self) -> int:
        return self.wrapped.segment_interval_ms  # type: ignore[no-any-return]

    @property
    def observed_stream_time(self) -> int | None:
        return self.wrapped.observed_stream_time  # type: ignore[no-any-return]

    @property
    def committed_version(self) -> int:
        return self.wrapped.committed_version  # type: ignore[no-any-return]

    @property
    def committed_metadata(self) -> Any:
        return self.wrapped.committed_metadata

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.wrapped.metrics  # type: ignore[no-any-return]

    def segment_id(self, timestamp_ms: int) -> int:
        return self.wrapped.segment_id(timestamp_ms)  # type: ignore[no-any-return]

    def is_expired(self, end_ms: int) -> bool:
        return self.wrapped.is_expired(end_ms)  # type: ignore[no-any-return]

    def expiry_boundary_ms(self, stream_time_ms: int) -> int | None:
        return self.wrapped.expiry_boundary_ms(stream_time_ms)  # type: ignore[no-any-return]


def _plain(session: Any) -> tuple[Any, int, int]:
    """A session as the plain ``(key, start, end)`` tuple the cache keeps (see the module
    docstring); equal to, and hashing as, the :class:`Session` it came from."""
    return session if type(session) is tuple else (session[0], session[1], session[2])


def _has_bulk_writes(store: Any) -> bool:
    """True when ``store`` and every layer it wraps offer ``put_many`` and ``remove_many``."""
    while store is not None:
        if not (callable(getattr(store, "put_many", None))
                and callable(getattr(store, "remove_many", None))):
            return False
        store = getattr(store, "wrapped", None)
    return True
