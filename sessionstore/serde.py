"""Value serialisation. msgpack by default; never pickle.

A serde is any object with ``dumps(obj) -> bytes`` and ``loads(bytes) -> obj``. Opening a store or
reading a value must not be able to run code, so the default refuses every type msgpack does not
know instead of falling back to pickle.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .types import ValueSerde

__all__ = ["MsgpackSerde", "ValueSerde", "DEFAULT_SERDE"]


class MsgpackSerde:
    """msgpack values: None, bool, int, float, str, bytes, lists/tuples and dicts of them.

    Tuples come back as lists, as in JSON. Maps may have non-string keys.
    """

    __slots__ = ("_pack",)

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``.

        Raises:
            TypeError: ``value`` (or something inside it) is not msgpack-serialisable; the
                message names the type.
            ValueError: ``value`` is nested too deeply or holds an int outside 64 bits.
        """
        try:
            data: bytes = self._pack(value)
        except TypeError as exc:
            raise TypeError(f"value is not msgpack-serialisable: {exc}") from None
        except (OverflowError, ValueError) as exc:
            raise ValueError(f"value cannot be encoded: {exc}") from None
        return data

    def loads(self, data: bytes) -> Any:
        """Decode what :meth:`dumps` wrote. Never runs code."""
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


DEFAULT_SERDE = MsgpackSerde()
