"""CRC-32C with the SSE 4.2 ``crc32`` instruction, for the block trailers of :mod:`.sstfile`.

Imported only on a host whose CPU has the instruction (:func:`.sstfile.block_sealer` checks),
and only once a file is written: it imports numba at once, and LLVM cannot build the
instruction for another CPU. The table-driven ``sstfile.crc32c_kernel`` computes the same
checksum everywhere else; ``tests/store/test_rocks_sst_file.py`` pins the two together.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir  # type: ignore[import-untyped]
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["seal_blocks_sse42_kernel"]


def _instruction(name: str, width: int, operand: int) -> Any:
    """A numba intrinsic calling LLVM's ``llvm.x86.sse42.crc32.<width>.<operand>``."""

    def typer(typingctx: Any, crc: Any, data: Any) -> Any:
        signature = getattr(types, f"uint{width}")(getattr(types, f"uint{width}"),
                                                   getattr(types, f"uint{operand}"))

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            function_type = ir.FunctionType(ir.IntType(width),
                                            [ir.IntType(width), ir.IntType(operand)])
            function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
                builder.module, function_type, name)
            return builder.call(function, args)

        return signature, codegen

    typer.__name__ = name.replace(".", "_")
    return intrinsic(typer)


_crc_word = _instruction("llvm.x86.sse42.crc32.64.64", 64, 64)
_crc_byte = _instruction("llvm.x86.sse42.crc32.32.8", 32, 8)


# The instruction takes 3 cycles and can start one a cycle: one chain of it runs at a third
# of its speed. So the checksum runs three chains at once over three runs of _RUN bytes, the
# second and third started from 0, and joins them: the CRC (without its inversions) is linear,
# so the state after a || b is the state after a carried over len(b) zero bytes, xor the state
# of b from 0. Carrying a state over n zero bytes is a fixed linear map: 4 tables of 256.
_RUN = 256
_POLY = 0x82F63B78  # CRC-32C, reflected


def _zeros_tables(n_bytes: int) -> npt.NDArray[np.uint32]:
    """The tables of the map that carries a CRC-32C state over ``n_bytes`` zero bytes: the
    image of ``x`` is ``t[0][x & 0xFF] ^ t[1][x >> 8 & 0xFF] ^ t[2][x >> 16 & 0xFF] ^
    t[3][x >> 24]``."""
    def apply(images: list[int], state: int) -> int:  # the linear map of the bits' images
        out = 0
        for bit in range(32):
            if state >> bit & 1:
                out ^= images[bit]
        return out

    # one zero bit moves each bit down one place (bit 0 out, the polynomial in); the map for
    # 8 * n_bytes bits by squaring
    power = [1 << bit for bit in range(32)]
    base = [_POLY] + [1 << (bit - 1) for bit in range(1, 32)]
    exponent = 8 * n_bytes
    while exponent:
        if exponent & 1:
            power = [apply(base, image) for image in power]
        base = [apply(base, image) for image in base]
        exponent >>= 1
    byte = np.arange(256, dtype=np.uint32)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for part in range(4):
        for bit in range(8):
            tables[part] ^= np.where((byte >> np.uint32(bit)) & np.uint32(1),
                                     np.uint32(power[8 * part + bit]), np.uint32(0))
    return tables


_OVER_RUN = _zeros_tables(_RUN)
_OVER_TWO_RUNS = _zeros_tables(2 * _RUN)


@numba.njit(cache=True, nogil=True)
def _carried(tables: npt.NDArray[np.uint32], state: np.uint64) -> np.uint64:
    """``state`` carried over the zero bytes ``tables`` stand for (:func:`_zeros_tables`)."""
    x = np.uint32(state)
    low = np.uint32(0xFF)
    return np.uint64(tables[0, x & low] ^ tables[1, (x >> np.uint32(8)) & low]
                     ^ tables[2, (x >> np.uint32(16)) & low] ^ tables[3, x >> np.uint32(24)])


@numba.njit(cache=True, nogil=True)
def _crc32c(data: npt.NDArray[np.uint8], words: npt.NDArray[np.uint64], first: int,
            stop: int) -> int:
    """CRC-32C of ``data[first:stop]``; ``words`` is ``data`` seen as u64 (8-byte aligned):
    the bytes before the first whole word and after the last go one at a time, the words
    three runs at a time while three runs are left."""
    crc32 = np.uint32(0xFFFFFFFF)
    at = first
    while at < stop and at % 8:
        crc32 = _crc_byte(crc32, data[at])
        at += 1
    crc = np.uint64(crc32)
    while at + 3 * _RUN <= stop:
        second = np.uint64(0)
        third = np.uint64(0)
        word = at >> 3
        for i in range(_RUN // 8):
            crc = _crc_word(crc, words[word + i])
            second = _crc_word(second, words[word + _RUN // 8 + i])
            third = _crc_word(third, words[word + _RUN // 4 + i])
        crc = _carried(_OVER_TWO_RUNS, crc) ^ _carried(_OVER_RUN, second) ^ third
        at += 3 * _RUN
    while at + 8 <= stop:
        crc = _crc_word(crc, words[at >> 3])
        at += 8
    crc32 = np.uint32(crc)
    while at < stop:
        crc32 = _crc_byte(crc32, data[at])
        at += 1
    return int(crc32 ^ np.uint32(0xFFFFFFFF))


@numba.njit(cache=True, nogil=True)
def seal_blocks_sse42_kernel(out: npt.NDArray[np.uint8], words: npt.NDArray[np.uint64],
                             block_first: npt.NDArray[np.int64],
                             block_length: npt.NDArray[np.int64], blocks: int) -> None:
    """Write the checksum of each block's trailer (see ``sstfile.seal_blocks_kernel``)."""
    for b in range(blocks):
        first = block_first[b]
        at = first + block_length[b]
        crc = _crc32c(out, words, first, at + 1)
        masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
        for i in range(4):
            out[at + 1 + i] = (masked >> (8 * i)) & 0xFF


def crc32c_sse42(data: bytes, offset: int = 0) -> int:
    """CRC-32C of ``data`` placed ``offset`` bytes into an 8-byte aligned buffer (for tests:
    the instruction's result on any bytes at any alignment)."""
    buffer = np.zeros(offset + len(data) + 8, dtype=np.uint8)  # numpy aligns it to 16 at least
    buffer[offset:offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
    words = buffer[:len(buffer) // 8 * 8].view(np.uint64)
    return int(_crc32c(buffer, words, offset, offset + len(data)))
