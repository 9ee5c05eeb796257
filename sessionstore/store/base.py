"""What every session store shares: argument checks, segment arithmetic, stream time and expiry.

Backends implement a handful of byte-level hooks; the contract (DESIGN.md section 3) lives here
once, so the RocksDB store and the in-memory model cannot drift apart.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import msgpack
import numpy as np
import numpy.typing as npt

from .. import keyschema
from ..arrays import int64_column, last_of_each
from ..errors import StoreCorruptedError
from ..packing import PackedValues
from ..serde import DEFAULT_SERDE, MsgpackSerde
from ..timeutil import INT64_MAX, INT64_MIN, check_int64
from ..types import Session, ValueSerde
from .keycodec import EncodedKeys, KeyEncodings, encode_key_column, encode_key_rows

log = logging.getLogger(__name__)
_StoreT = TypeVar("_StoreT", bound="SegmentedSessionStore")
_Reader = Generator[tuple[Session, Any], None, None]  # what reads return, closed by close()

# what MsgpackSerde.dumps packs with (autoreset: an error leaves it empty for the next value)
_PACK = msgpack.Packer(use_bin_type=True).pack

MIN_SEGMENT_INTERVAL_MS = 60_000
# 2: the manifest carries its own SHA-256 and what the version must contain (checkpoint.py).
# 3: large bulk writes index a segment's sessions with index blocks instead of time-first
#    records (keyschema.py); a format-2 reader would not see those sessions in find_sessions, so
#    it must refuse the store. Format 2 stores are read as they are (they hold no blocks).
STORE_FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (2, 3)


def default_segment_interval_ms(retention_ms: int) -> int:
    """Kafka's current default: half the retention, and at least one minute."""
    return max(retention_ms // 2, MIN_SEGMENT_INTERVAL_MS)


class CommittedState:
    """What one commit records besides the sessions themselves."""

    __slots__ = ("version", "metadata", "stream_time_ms", "expired_below", "segment_interval_ms",
                 "expiry_cap_ms", "retention_ms")

    def __init__(
        self,
        version: int = 0,
        metadata: Any = None,
        stream_time_ms: int | None = None,
        expired_below: int | None = None,
        segment_interval_ms: int | None = None,
        expiry_cap_ms: int | None = None,
        retention_ms: int | None = None,
    ) -> None:
        self.version = version
        self.metadata = metadata
        self.stream_time_ms = stream_time_ms
        self.expired_below = expired_below
        self.segment_interval_ms = segment_interval_ms
        # what reads filter expired sessions by (see SegmentedSessionStore.read_floor_ms);
        # None in manifests written before they were recorded
        self.expiry_cap_ms = expiry_cap_ms
        self.retention_ms = retention_ms

    def to_manifest(self, segment_interval_ms: int) -> dict[str, Any]:
        return {
            "format": STORE_FORMAT_VERSION,
            "version": self.version,
            "metadata": self.metadata,
            "stream_time_ms": self.stream_time_ms,
            "expired_below": self.expired_below,
            "segment_interval_ms": segment_interval_ms,
            "expiry_cap_ms": self.expiry_cap_ms,
            "retention_ms": self.retention_ms,
        }

    @classmethod
    def from_manifest(cls, manifest: Any, source: str) -> CommittedState:
        """Validate a decoded manifest.

        Raises:
            StoreCorruptedError: a field is missing or invalid (naming ``source``).
            ValueError: the manifest is of another format version.
        """
        if not isinstance(manifest, dict):
            raise StoreCorruptedError(source, "corrupted store manifest: not a map")
        fmt = manifest.get("format")
        if fmt not in READABLE_FORMAT_VERSIONS:
            readable = " and ".join(map(str, READABLE_FORMAT_VERSIONS))
            raise ValueError(
                f"store manifest {source} has format version {fmt!r}; this sessionstore reads "
                f"formats {readable} (was it written by a newer release?)"
            )
        try:
            version = check_int64(manifest["version"], "version")
            stream_time = manifest["stream_time_ms"]
            expired_below = manifest["expired_below"]
            if stream_time is not None:
                check_int64(stream_time, "stream_time_ms")
            if expired_below is not None:
                check_int64(expired_below, "expired_below")
            interval = check_int64(manifest["segment_interval_ms"], "segment_interval_ms")
            if interval <= 0:
                raise ValueError(f"segment_interval_ms must be > 0, got {interval}")
            cap = manifest.get("expiry_cap_ms")  # optional: absent before read filtering
            if cap is not None:
                check_int64(cap, "expiry_cap_ms")
            retention = manifest.get("retention_ms")
            if retention is not None and check_int64(retention, "retention_ms") < 0:
                raise ValueError(f"retention_ms must be >= 0, got {retention}")
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptedError(source, f"corrupted store manifest: {exc}") from None
        return cls(version, manifest.get("metadata"), stream_time, expired_below, interval,
                   cap, retention)


def check_session(session: Any) -> tuple[bytes, int, int]:
    """Validate a session argument; return ``(encoded_key, start_ms, end_ms)``."""
    if not isinstance(session, tuple) or len(session) != 3:
        raise TypeError(f"session must be a Session(key, start, end), got {session!r:.80}")
    key, start, end = session
    if type(start) is not int or not INT64_MIN <= start <= INT64_MAX:
        start = check_int64(start, "session.start")
    if type(end) is not int or not INT64_MIN <= end <= INT64_MAX:
        end = check_int64(end, "session.end")
    if start > end:
        raise ValueError(f"session.start must be <= session.end, got start={start} end={end}")
    return keyschema.encode_key(key), start, end


class BulkSessions(NamedTuple):
    """Validated sessions of a bulk write or remove, each session once.

    Session ``i`` is ``(encoded_keys[key_index[i]], starts_ms[i], ends_ms[i])``; ``key_rank``
    gives each entry of ``encoded_keys`` a rank, equal for equal encodings: in byte order (see
    :func:`keyschema.key_order`) unless the backend's ``_key_ranks`` says otherwise (the
    in-memory store, which has no on-disk order). ``values`` holds the serialised values, and is
    empty for a remove.
    """

    encoded_keys: Sequence[bytes]
    key_rank: npt.NDArray[np.int64]
    key_index: npt.NDArray[np.int64]
    starts_ms: npt.NDArray[np.int64]
    ends_ms: npt.NDArray[np.int64]
    values: Sequence[bytes]


class StoredSessions(NamedTuple):
    """Sessions read in bulk (:meth:`SegmentedSessionStore.find_sessions_columns`), in no
    particular order, each once.

    Session ``i`` is ``(key, starts_ms[i], ends_ms[i])``, where ``key``'s encoding
    (:func:`keyschema.encode_key`) is ``key_bytes[key_first[i]:key_stop[i]]`` and its stored
    value, serialised by the store's serde, is ``value_bytes[value_first[i]:value_stop[i]]``.
    ``msgpack_values``: that serde is :class:`~sessionstore.serde.MsgpackSerde`.
    """

    key_bytes: npt.NDArray[np.uint8]
    key_first: npt.NDArray[np.int64]
    key_stop: npt.NDArray[np.int64]
    starts_ms: npt.NDArray[np.int64]
    ends_ms: npt.NDArray[np.int64]
    value_bytes: npt.NDArray[np.uint8]
    value_first: npt.NDArray[np.int64]
    value_stop: npt.NDArray[np.int64]
    msgpack_values: bool

    def __len__(self) -> int:
        return len(self.starts_ms)


def byte_rows(pieces: list[bytes]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``pieces`` joined into one buffer, and the ``len(pieces) + 1`` offsets of the pieces."""
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)),
              out=offsets[1:])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8), offsets


def check_sessions_many(
    keys: Sequence[Any] | KeyEncodings, starts_ms: Any, ends_ms: Any, key_index: Any = None, *,
    cut: bool = True,
) -> tuple[Sequence[bytes], npt.NDArray[np.int64], npt.NDArray[np.int64],
           npt.NDArray[np.int64], keyschema.KeyMatrix | None]:
    """Validate the sessions of a bulk operation; return ``(encoded_keys, index, starts, ends,
    matrix)``, where ``matrix`` is the encoded keys' :class:`~sessionstore.keyschema.KeyMatrix`
    when the encoder built it on the way (None otherwise). The encodings are a list of bytes,
    or, when not ``cut``, may be :class:`~.keycodec.EncodedKeys` (see
    :func:`~.keycodec.encode_key_rows`).

    ``keys`` may be :class:`~.keycodec.KeyEncodings` (encoded already): only the rows that
    some session refers to are then taken, none encoded again.

    Raises:
        TypeError / ValueError: naming the argument and the row.
    """
    if isinstance(keys, KeyEncodings):
        return _check_encoded_many(keys, starts_ms, ends_ms, key_index, cut)
    encode = encode_key_column if cut else encode_key_rows
    if key_index is None:
        # vectorised for int and str columns; names a bad row
        encoded, matrix = encode(keys)
        index = np.arange(len(encoded), dtype=np.int64)
    else:
        n_keys = len(keys)
        # Only the keys that some session refers to are encoded (and checked): the columnar
        # callers pass a batch's whole key list, of which the sessions at hand may use a part.
        index, present, used = _referenced_keys(key_index, n_keys)
        if len(used) * 10 < n_keys * 9:
            picked = used.tolist()
            encoded, matrix = encode([keys[row] for row in picked], picked)
            index = (np.cumsum(present) - 1)[index]
        else:
            encoded, matrix = encode(keys)
    starts, ends = _check_bounds(starts_ms, ends_ms, len(index))
    return encoded, index, starts, ends, matrix


def _referenced_keys(key_index: Any, n_keys: int
                     ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_],
                                npt.NDArray[np.int64]]:
    """``key_index`` checked, whether each of the ``n_keys`` keys is referred to, and those
    that are (ascending).

    Raises:
        TypeError / ValueError: a key index that is not int64 or not in ``[0, n_keys)``,
            naming the row.
    """
    index = int64_column("key_index", key_index)
    if len(index) and (index.min() < 0 or index.max() >= n_keys):
        row = int(np.argmax((index < 0) | (index >= n_keys)))
        raise ValueError(f"key_index[{row}] = {index[row]} is not in [0, {n_keys})")
    present = np.zeros(n_keys, dtype=np.bool_)
    present[index] = True
    return index, present, np.flatnonzero(present)


def _check_bounds(starts_ms: Any, ends_ms: Any, n: int
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    starts = int64_column("starts_ms", starts_ms, n)
    ends = int64_column("ends_ms", ends_ms, n)
    bad = starts > ends
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"starts_ms[{row}] must be <= ends_ms[{row}], got start={starts[row]} end={ends[row]}"
        )
    return starts, ends


def _check_encoded_many(
    keys: KeyEncodings, starts_ms: Any, ends_ms: Any, key_index: Any, cut: bool,
) -> tuple[Sequence[bytes], npt.NDArray[np.int64], npt.NDArray[np.int64],
           npt.NDArray[np.int64], keyschema.KeyMatrix | None]:
    """:func:`check_sessions_many` for keys encoded already: the rows some session refers to
    (all without ``key_index``), renumbered in their order."""
    n_keys = len(keys)
    if key_index is None:
        used = index = np.arange(n_keys, dtype=np.int64)
    else:
        index, present, used = _referenced_keys(key_index, n_keys)
        if len(used) < n_keys:  # else every key is referred to: renumbering changes nothing
            index = (np.cumsum(present) - 1)[index]
    matrix = keys.take(used)
    encoded: Sequence[bytes] = (keys.cut(used) if cut
                                else EncodedKeys(matrix, keys.identities(used)))
    starts, ends = _check_bounds(starts_ms, ends_ms, len(index))
    return encoded, index, starts, ends, matrix


def min_live_segment(reference_ms: int, retention_ms: int, interval_ms: int) -> int:
    """The retention rule: the oldest segment that expiry keeps when its reference time (the
    stream time, capped by the expiry cap) is ``reference_ms``, Kafka's
    ``segmentId(observedStreamTime - retentionPeriod)``. Floored at INT64_MIN, which lies below
    every segment there can be and compares the same way."""
    return max((reference_ms - retention_ms) // interval_ms, INT64_MIN)


def read_floor(reference_ms: int, retention_ms: int) -> int:
    """The retention rule for reads: the smallest session end a read returns at expiry
    reference time ``reference_ms``, Kafka's ``observedStreamTime - retentionPeriod + 1``. It
    may lie outside int64 (beyond the maximum, nothing is returned)."""
    return reference_ms - retention_ms + 1


def _floor_segments(times_ms: npt.NDArray[np.int64], minus_ms: int,
                    interval_ms: int) -> npt.NDArray[np.int64]:
    """:func:`min_live_segment` of each of ``times_ms``, without int64 overflow (Python ints
    for the few times within ``minus_ms`` of the int64 minimum)."""
    safe = times_ms >= INT64_MIN + minus_ms
    result = np.empty(len(times_ms), dtype=np.int64)
    result[safe] = (times_ms[safe] - minus_ms) // interval_ms
    for row in np.flatnonzero(~safe).tolist():
        result[row] = min_live_segment(int(times_ms[row]), minus_ms, interval_ms)
    return result


class SegmentedSessionStore(ABC):
    """Base of the KIP-94 segmented session store. See :class:`~sessionstore.SessionStore`."""

    #: Whether the backend's bulk writes keep keys and values as byte rows (see
    #: :class:`~sessionstore.arrays.ByteRows`): the bulk calls then hand it encodings and packed
    #: values that are not cut into bytes objects (:class:`~.keycodec.EncodedKeys`,
    #: :class:`~sessionstore.packing.PackedValues`); otherwise lists of bytes.
    _KEEPS_BYTE_ROWS = False
    #: Whether bulk writes may hand the backend :class:`~sessionstore.packing.PackedValues`
    #: (read as byte rows) while its keys come as lists of bytes.
    _TAKES_PACKED_VALUES = False

    def __init__(
        self,
        *,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        value_serde: ValueSerde | None = None,
    ) -> None:
        retention_ms = check_int64(retention_ms, "retention_ms")
        if retention_ms < 0:
            raise ValueError(f"retention_ms must be >= 0, got {retention_ms}")
        if segment_interval_ms is None:
            segment_interval_ms = default_segment_interval_ms(retention_ms)
        segment_interval_ms = check_int64(segment_interval_ms, "segment_interval_ms")
        if segment_interval_ms <= 0:
            raise ValueError(f"segment_interval_ms must be > 0, got {segment_interval_ms}")
        if value_serde is None:
            value_serde = DEFAULT_SERDE
        elif not (callable(getattr(value_serde, "dumps", None))
                  and callable(getattr(value_serde, "loads", None))):
            raise TypeError(
                f"value_serde must have dumps() and loads(), got {type(value_serde).__name__}"
            )
        self._retention_ms = retention_ms
        self._interval = segment_interval_ms
        self._serde = value_serde
        self._committed = CommittedState()
        self._stream_time: int | None = None
        self._expiry_cap: int | None = None
        self._expired_below: int | None = None
        self._metrics: dict[str, float] = {
            "dropped-records": 0,
            "expired-segments": 0,
            "commits": 0,
        }
        self._closed = False
        # the iterators reads returned that may still be running (closed by close and abort)
        self._open_iterators: weakref.WeakSet[_Reader] = weakref.WeakSet()

    # -- properties -------------------------------------------------------------------------

    @property
    def retention_ms(self) -> int:
        return self._retention_ms

    @property
    def segment_interval_ms(self) -> int:
        return self._interval

    @property
    def value_serde(self) -> Any:
        """The serde the values are stored with (the default msgpack one unless given)."""
        return self._serde

    @property
    def observed_stream_time(self) -> int | None:
        """The largest session end seen by ``put`` (None before the first put)."""
        return self._stream_time

    @property
    def committed_version(self) -> int:
        """The version of the last commit; 0 for a store that was never committed."""
        return self._committed.version

    @property
    def committed_metadata(self) -> Any:
        """The metadata passed to the last ``commit`` (None at version 0)."""
        return self._committed.metadata

    @property
    def metrics(self) -> Mapping[str, float]:
        """Counters: ``dropped-records``, ``expired-segments``, ``put-records``, ..."""
        return dict(self._metrics)

    # -- segment arithmetic -----------------------------------------------------------------

    def segment_id(self, timestamp_ms: int) -> int:
        """The segment that holds sessions ending at ``timestamp_ms``: ``floor(t / interval)``."""
        return check_int64(timestamp_ms, "timestamp_ms") // self._interval

    def cap_expiry_time(self, cap_ms: int | None) -> None:
        """Let expiry run on ``min(observed stream time, cap_ms)`` instead of stream time alone.

        KIP-94 expires by stream time, the largest session end. An owner whose notion of time
        lags the data (an engine driven by an external watermark) caps it, so that no segment
        expires while it may still hold sessions the owner has not finished with. None removes
        the cap. Reads skip expired sessions by the same capped time (:attr:`read_floor_ms`).
        A commit records the cap; reopening and ``abort()`` restore it.
        """
        self._expiry_cap = None if cap_ms is None else check_int64(cap_ms, "cap_ms")

    def _expiry_time(self, stream_time_ms: int | None) -> int | None:
        cap = self._expiry_cap
        if stream_time_ms is None or cap is None:
            return stream_time_ms
        return min(stream_time_ms, cap)

    def _min_live_segment(self, stream_time_ms: int | None) -> int | None:
        reference = self._expiry_time(stream_time_ms)
        if reference is None:
            return None
        return min_live_segment(reference, self._retention_ms, self._interval)

    def expiry_boundary_ms(self, stream_time_ms: int) -> int | None:
        """The smallest session end that stays live if stream time reached ``stream_time_ms``.

        Sessions ending before it would be expired. The engine uses this to emit closed sessions
        before a ``put`` lets their segment go.
        """
        current = self._stream_time
        target = stream_time_ms if current is None else max(current, stream_time_ms)
        segment = self._min_live_segment(target)
        return None if segment is None else segment * self._interval

    def is_expired(self, end_ms: int) -> bool:
        """True when a session ending at ``end_ms`` lies in a segment that expiry removed."""
        segment = self._min_live_segment(self._stream_time)
        return segment is not None and end_ms // self._interval < segment

    # -- writes -----------------------------------------------------------------------------

    def put(self, session: Session, value: Any) -> bool:
        """Store ``value`` for ``session``, replacing any previous value. A ``None`` value
        deletes the session instead, as a null aggregate does in Kafka's session stores.

        Advances the observed stream time to ``session.end`` and expires every segment older
        than ``segment_id(stream_time - retention_ms)``, whole (a ``None`` value too).

        Returns:
            False when the session's segment had already expired: the put is dropped and
            counted in ``metrics["dropped-records"]``. True otherwise.

        Raises:
            TypeError / ValueError: a malformed session or key, or a value the serde refuses.
        """
        if self._closed:
            self._check_open()
        encoded, start, end = check_session(session)
        data = self._serde.dumps(value)
        stream_time = self._stream_time
        if stream_time is None or end > stream_time:
            self._stream_time = stream_time = end
        interval = self._interval
        cap = self._expiry_cap
        reference = stream_time if cap is None or cap > stream_time else cap
        min_live = min_live_segment(reference, self._retention_ms, interval)
        if end // interval < min_live:
            self._metrics["dropped-records"] += 1
            return False
        if value is None:
            self._delete(encoded, end, start)
        else:
            self._write(encoded, end, start, data)
        if self._expired_below is None or min_live > self._expired_below:
            dropped = self._drop_segments_below(min_live)
            self._metrics["expired-segments"] += dropped
            self._expired_below = min_live
        return True

    def remove(self, session: Session) -> None:
        """Delete ``session`` if present."""
        self._check_open()
        encoded, start, end = check_session(session)
        self._delete(encoded, end, start)

    def put_many(
        self,
        keys: Sequence[Any] | KeyEncodings,
        starts_ms: Any,
        ends_ms: Any,
        values: Sequence[Any],
        *,
        key_index: Any = None,
    ) -> npt.NDArray[np.bool_]:
        """Store many sessions at once; the same outcome as calling :meth:`put` on each in turn.

        Stream time advances session by session as it would with ``put``, so a session whose
        segment an earlier session of the same call has expired is dropped and counted in
        ``metrics["dropped-records"]``; segments are expired whole. When one session appears
        twice, the later value wins; a ``None`` value deletes the session, as with :meth:`put`.
        Everything is validated and every value serialised before anything changes, so a bad
        call raises and leaves the store as it was.

        Args:
            keys: the record keys, one per session, or each distinct key once with ``key_index``
            (keys that no session refers to are ignored, unchecked); or their encodings
            (:class:`~.keycodec.KeyEncodings`).
            starts_ms, ends_ms: int64 per session, ``start <= end``.
            values: one per session.
            key_index: optional int per session, indexing ``keys``.

        Returns:
            bool per session: False where ``put`` would have returned False (dropped).

        Raises:
            TypeError / ValueError: a bad key, time or value, naming the argument and the row.
        """
        self._check_open()
        encoded, index, starts, ends, matrix = check_sessions_many(
            keys, starts_ms, ends_ms, key_index, cut=not self._KEEPS_BYTE_ROWS)
        n = len(index)
        if len(values) != n:
            raise ValueError(f"values has {len(values)} rows, there are {n} sessions")
        data = self._dumps_all(values)
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        running = np.maximum.accumulate(ends)
        if self._stream_time is not None:
            np.maximum(running, self._stream_time, out=running)
        self._stream_time = int(running[-1])
        cap = self._expiry_cap
        reference = running if cap is None else np.minimum(running, cap, out=running)
        interval = self._interval
        if reference[0] >= INT64_MIN + self._retention_ms:  # (nondecreasing: every row is)
            min_live = reference - self._retention_ms
            min_live //= interval  # _floor_segments without its int64 minimum's rows
        else:
            min_live = _floor_segments(reference, self._retention_ms, interval)
        written = ends // interval >= min_live
        kept = int(np.count_nonzero(written))
        self._metrics["dropped-records"] += n - kept
        if kept == 0:
            return written
        # the last accepted row's segment floor; the rows themselves only when some are not
        accepted = None if kept == n else np.flatnonzero(written)
        final_min_live = int(min_live[-1 if accepted is None else accepted[-1]])
        if type(values) is not PackedValues and (
                values.count(None) if isinstance(values, list)
                else any(v is None for v in values)):
            # None values are deletes (Kafka's null aggregate): taken in call order, row by
            # row, so that every segment a loop of put() would create is created
            for row in (range(n) if accepted is None else accepted.tolist()):
                encoded_key, end, start = encoded[index[row]], int(ends[row]), int(starts[row])
                if values[row] is None:
                    self._delete(encoded_key, end, start)
                else:
                    self._write(encoded_key, end, start, data[row])
            self._expire_after_bulk(final_min_live)
            return written
        # Keep only the last write of a session that appears twice, as consecutive puts
        # would, in the backend's write order (_last_writes: on-disk order by default, as
        # RocksDB inserts sorted keys several times faster).
        key_rank = self._key_ranks(encoded, matrix)
        rows: npt.NDArray[np.int64] | None
        if accepted is None:  # none dropped (the usual case): every row is accepted
            rows = self._last_writes(key_rank[index], ends, starts)
        else:
            last = self._last_writes(key_rank[index[accepted]], ends[accepted],
                                     starts[accepted])
            rows = accepted if last is None else accepted[last]
        picked: Sequence[bytes]
        # every row, in order (the usual case): the columns go on as they are, not gathered
        every = rows is None or (len(rows) == n and bool((rows == np.arange(n)).all()))
        if every:
            picked = data
        elif type(data) is PackedValues:
            assert rows is not None
            picked = data.take(rows)
        else:  # an object array gathers about twice as fast as a list comprehension
            boxed = np.empty(n, dtype=object)
            boxed[:] = data
            picked = boxed[rows].tolist()
        if type(picked) is PackedValues and not (self._KEEPS_BYTE_ROWS
                                                 or self._TAKES_PACKED_VALUES):
            picked = picked.as_list()
        if not every:
            assert rows is not None
            index, starts, ends = index[rows], starts[rows], ends[rows]
        self._write_many(BulkSessions(encoded, key_rank, index, starts, ends, picked))
        self._expire_after_bulk(final_min_live)
        return written

    def _expire_after_bulk(self, final_min_live: int) -> None:
        if self._expired_below is None or final_min_live > self._expired_below:
            self._metrics["expired-segments"] += self._drop_segments_below(final_min_live)
            self._expired_below = final_min_live

    def _dumps_all(self, values: Sequence[Any]) -> Sequence[bytes]:
        """Serialise every value, or raise naming the first row that cannot be. Values the
        caller packed already (:class:`~sessionstore.packing.PackedValues`) are taken as they
        are by a store whose serde is msgpack's, and refused by any other."""
        if type(values) is PackedValues:
            if type(self._serde) is not MsgpackSerde:
                raise TypeError(f"values were packed with msgpack, but this store's serde is "
                                f"{type(self._serde).__name__}")
            return values
        dumps = self._serde.dumps
        try:
            if type(self._serde) is MsgpackSerde:
                # the packer itself, mapped in C: the serde's method only wraps its errors,
                # and on an error the loop below calls it to report them
                return list(map(_PACK, values))
            return list(map(dumps, values))
        except Exception:  # find the row, then report it with the serde's own error type
            for row, value in enumerate(values):
                try:
                    dumps(value)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"values[{row}] cannot be serialised: {exc}") from None
                except Exception as exc:  # a custom serde may raise anything
                    raise TypeError(f"values[{row}] cannot be serialised: {exc}") from None
            raise

    def remove_many(
        self, keys: Sequence[Any] | KeyEncodings, starts_ms: Any, ends_ms: Any, *,
        key_index: Any = None,
    ) -> None:
        """Delete many sessions, those present; the same outcome as :meth:`remove` on each.

        Arguments are those of :meth:`put_many`, without values. Everything is validated before
        anything is deleted.
        """
        self._check_open()
        encoded, index, starts, ends, matrix = check_sessions_many(
            keys, starts_ms, ends_ms, key_index, cut=not self._KEEPS_BYTE_ROWS)
        if len(index):
            self._delete_many(
                BulkSessions(encoded, self._key_ranks(encoded, matrix), index, starts, ends, [])
            )

    # -- reads ------------------------------------------------------------------------------
    #
    # Every read skips expired sessions as Kafka (>= 3.x) does: a session ending before
    # ``read_floor_ms`` (expiry time - retention + 1) is not returned, also when its segment is
    # still held. The expiry time is the one segment expiry runs on (stream time, capped by
    # ``cap_expiry_time``), so reads never hide a session the owner has not finished with.
    # Iterators stay open until exhausted; ``close()`` and ``abort()`` close them (they then
    # yield nothing more, as Kafka's iterators of a closed store).

    @property
    def read_floor_ms(self) -> int | None:
        """The smallest session end that reads return: ``expiry time - retention_ms + 1``,
        where the expiry time is the observed stream time capped by :meth:`cap_expiry_time`
        (Kafka's ``observedStreamTime - retentionPeriod + 1``). None before the first put.
        It may lie outside int64 (beyond the maximum: nothing is returned)."""
        reference = self._expiry_time(self._stream_time)
        return None if reference is None else read_floor(reference, self._retention_ms)

    def _floor(self, earliest_end: int) -> int:
        floor = self.read_floor_ms
        return earliest_end if floor is None or floor <= earliest_end else floor

    def _track(self, iterator: _Reader) -> _Reader:
        self._open_iterators.add(iterator)
        return iterator

    def _close_iterators(self) -> None:
        """Close every iterator still open: it yields nothing more, and holds no database."""
        for iterator in list(self._open_iterators):
            # ValueError: running in another thread right now; it ends with the database
            with contextlib.suppress(ValueError):
                iterator.close()
        self._open_iterators.clear()

    def fetch(self, key: Any, *, backward: bool = False) -> Iterator[tuple[Session, Any]]:
        """All live sessions of ``key``, ordered by end, then start (both descending when
        ``backward``, Kafka's ``backwardFetch``)."""
        return self.find_sessions_to_merge(key, INT64_MIN, INT64_MAX, backward=backward)

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        """The value of the session ``(key, start_ms, end_ms)``, or None if there is none or it
        ended before :attr:`read_floor_ms` (expired)."""
        self._check_open()
        encoded, start, end = check_session((key, start_ms, end_ms))
        floor = self.read_floor_ms
        if floor is not None and end < floor:
            return None
        data = self._get(encoded, end, start)
        return None if data is None else self._serde.loads(data)

    def find_sessions_to_merge(
        self, key: Any, earliest_end_ms: int, latest_start_ms: int, *, backward: bool = False
    ) -> Iterator[tuple[Session, Any]]:
        """Live sessions of ``key`` with ``end >= earliest_end_ms and start <= latest_start_ms``.

        Both bounds are inclusive; results are ordered by end, then start (both descending when
        ``backward``, Kafka's ``backwardFindSessions``). Sessions ending before
        :attr:`read_floor_ms` are expired and skipped. The iterator reads the store as it goes;
        :meth:`close` and :meth:`abort` end it.
        """
        self._check_open()
        encoded = keyschema.encode_key(key)
        earliest = self._floor(check_int64(earliest_end_ms, "earliest_end_ms"))
        latest = check_int64(latest_start_ms, "latest_start_ms")
        return self._track(self._iter_key(key, encoded, earliest, latest, backward))

    def _iter_key(
        self, key: Any, encoded: bytes, earliest: int, latest: int, backward: bool
    ) -> _Reader:
        if earliest > INT64_MAX:
            return
        loads = self._serde.loads
        for end, start, data in self._scan_key(encoded, earliest, latest, backward):
            yield Session(key, start, end), loads(data)

    def find_sessions(
        self, earliest_end_ms: int, latest_end_ms: int, *, backward: bool = False
    ) -> Iterator[tuple[Session, Any]]:
        """Live sessions of every key with ``earliest_end_ms <= end <= latest_end_ms`` (KIP-825).

        Ordered by end, then by the key's encoded bytes, then start (all three descending when
        ``backward``). Sessions ending before :attr:`read_floor_ms` are expired and skipped.
        """
        self._check_open()
        earliest = self._floor(check_int64(earliest_end_ms, "earliest_end_ms"))
        latest = check_int64(latest_end_ms, "latest_end_ms")
        return self._track(self._iter_time(earliest, latest, backward))

    def _iter_time(
        self, earliest: int, latest: int, backward: bool
    ) -> _Reader:
        if earliest > latest:
            return
        loads = self._serde.loads
        decode = keyschema.decode_key
        for end, encoded, start, data in self._scan_time(earliest, latest, backward):
            yield Session(decode(encoded), start, end), loads(data)

    def find_sessions_columns(self, earliest_end_ms: int) -> StoredSessions | None:
        """``find_sessions(earliest_end_ms, INT64_MAX)`` as columns: every live session ending
        at or after ``earliest_end_ms`` (and :attr:`read_floor_ms`), read at once, in no
        particular order, the values still serialised (a cold start reading every open session
        back: no Python object per session on a backend that can avoid it).

        Returns:
            The sessions, or None when the backend cannot read its records in bulk (a damaged
            record: the caller reads them with :meth:`find_sessions`, which names the damage).

        Raises:
            StoreCorruptedError: as :meth:`find_sessions`.
        """
        self._check_open()
        earliest = self._floor(check_int64(earliest_end_ms, "earliest_end_ms"))
        if earliest > INT64_MAX:
            return self._stored_from_rows([])
        return self._read_columns(earliest)

    def _stored_from_rows(self, rows: list[tuple[int, bytes, int, bytes]]) -> StoredSessions:
        """:class:`StoredSessions` of ``(end, encoded_key, start, data)`` rows."""
        keys, key_offsets = byte_rows([row[1] for row in rows])
        values, value_offsets = byte_rows([row[3] for row in rows])
        return StoredSessions(
            keys, key_offsets[:-1], key_offsets[1:],
            np.fromiter((row[2] for row in rows), dtype=np.int64, count=len(rows)),
            np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows)),
            values, value_offsets[:-1], value_offsets[1:], type(self._serde) is MsgpackSerde)

    def _read_columns(self, earliest: int) -> StoredSessions | None:
        """:meth:`find_sessions_columns` from ``earliest`` (the floor applied); here from the
        time-first scan, row by row: backends override it to read in bulk."""
        return self._stored_from_rows(list(self._scan_time(earliest, INT64_MAX)))

    # -- versions ---------------------------------------------------------------------------

    def commit(self, metadata: Any = None) -> int:
        """Make every write since the last commit durable as the next version, atomically.

        ``metadata`` (any msgpack value: input offsets, the last emitted close time, ...) is
        stored in the same atomic step and returned by ``committed_metadata``.

        Returns:
            The new version number.
        """
        self._check_open()
        DEFAULT_SERDE.dumps(metadata)  # refuse unserialisable metadata before touching disk
        state = CommittedState(
            self._committed.version + 1, metadata, self._stream_time, self._expired_below,
            expiry_cap_ms=self._expiry_cap, retention_ms=self._retention_ms,
        )
        self._commit_state(state)
        self._committed = state
        self._metrics["commits"] += 1
        return state.version

    def abort(self) -> None:
        """Discard every write since the last commit. Open iterators are closed first."""
        self._check_open()
        self._close_iterators()
        self._restore_committed()
        self._stream_time = self._committed.stream_time_ms
        self._expired_below = self._committed.expired_below
        self._expiry_cap = self._committed.expiry_cap_ms

    def close(self) -> None:
        """Release the store. Writes not committed are discarded; open iterators are closed
        (they yield nothing more)."""
        if not self._closed:
            self._closed = True
            self._close_iterators()
            self._release()

    def __enter__(self: _StoreT) -> _StoreT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the session store is closed")

    def _apply_committed(self, state: CommittedState) -> None:
        self._committed = state
        self._stream_time = state.stream_time_ms
        self._expired_below = state.expired_below
        self._expiry_cap = state.expiry_cap_ms

    # -- backend hooks ----------------------------------------------------------------------

    def _key_ranks(self, encoded: Sequence[bytes], matrix: keyschema.KeyMatrix | None = None
                   ) -> npt.NDArray[np.int64]:
        """Ranks of the encoded keys for :class:`BulkSessions`: equal encodings get equal
        ranks. In byte order (:func:`keyschema.key_order`) here, for backends that write in
        on-disk order; a backend that needs identity only may override this. ``matrix``: the
        keys' :class:`~sessionstore.keyschema.KeyMatrix`, when the caller has it."""
        return keyschema.key_order(encoded, matrix)

    def _last_writes(self, key_ranks: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                     starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
        """The row of each session's last write among rows ``(key_ranks, ends, starts)`` (a
        session written twice in one call keeps its later value), in the order
        :meth:`_write_many` takes them: here by key rank, end, start (on-disk order); a backend
        with no on-disk order may override this to keep the call's order, and return None
        for every row in the call's order."""
        return last_of_each([key_ranks, ends, starts])

    @abstractmethod
    def _write(self, encoded_key: bytes, end: int, start: int, data: bytes) -> None: ...

    @abstractmethod
    def _delete(self, encoded_key: bytes, end: int, start: int) -> None: ...

    def _write_many(self, sessions: BulkSessions) -> None:
        """Write validated, accepted sessions (expiry runs after); backends override to batch."""
        keys = sessions.encoded_keys
        for k, start, end, data in zip(sessions.key_index.tolist(), sessions.starts_ms.tolist(),
                                       sessions.ends_ms.tolist(), sessions.values, strict=True):
            self._write(keys[k], end, start, data)

    def _delete_many(self, sessions: BulkSessions) -> None:
        """Delete validated sessions; backends override to batch."""
        keys = sessions.encoded_keys
        for k, start, end in zip(sessions.key_index.tolist(), sessions.starts_ms.tolist(),
                                 sessions.ends_ms.tolist(), strict=True):
            self._delete(keys[k], end, start)

    @abstractmethod
    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None: ...

    @abstractmethod
    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[int, int, bytes]]:
        """Yield ``(end, start, data)`` ordered by end then start (reversed when ``backward``)."""

    @abstractmethod
    def _scan_time(
        self, earliest_end: int, latest_end: int, backward: bool = False
    ) -> Iterator[tuple[int, bytes, int, bytes]]:
        """Yield ``(end, encoded_key, start, data)`` ordered by end, key bytes, start (reversed
        when ``backward``)."""

    @abstractmethod
    def _drop_segments_below(self, segment: int) -> int:
        """Remove every segment with a smaller id, whole; return how many were removed."""

    @abstractmethod
    def _commit_state(self, state: CommittedState) -> None: ...

    @abstractmethod
    def _restore_committed(self) -> None: ...

    @abstractmethod
    def _release(self) -> None: ...
