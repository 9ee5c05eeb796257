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


@numba.njit(cache=True, nogil=True)
def _crc32c(data: npt.NDArray[np.uint8], words: npt.NDArray[np.uint64], first: int,
            stop: int) -> int:
    """CRC-32C of ``data[first:stop]``; ``words`` is ``data`` seen as u64 (8-byte aligned):
    the bytes before the first whole word and after the last go one at a time."""
    crc32 = np.uint32(0xFFFFFFFF)
    at = first
    while at < stop and at % 8:
        crc32 = _crc_byte(crc32, data[at])
        at += 1
    crc = np.uint64(crc32)
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
