"""Compiling the package's numba kernels on first use.

numba is imported here only when a kernel is first called, so that ``import sessionstore``
stays cheap for users who never run a batch. This module imports nothing of the package, so
every module with kernels (the planner's, the array utilities', the table's, the key
schema's) can use it without importing another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

_F = TypeVar("_F", bound=Callable[..., Any])

COMPILED: dict[str, Any] = {}
"""The compiled kernels by function name. Tests may put a plain-Python form here to run a
kernel's source under a caller that calls :func:`compiled`."""

HELPERS: dict[str, tuple[Callable[..., Any], ...]] = {}
"""The helpers each kernel calls, by the kernel's name (see :func:`register_helpers`)."""


def register_helpers(helpers: dict[str, tuple[Callable[..., Any], ...]]) -> None:
    """Declare, for kernels by name, the module functions they call: such a kernel is compiled
    against the helpers' compiled forms (a compiled kernel can only call compiled functions),
    while its Python source keeps calling the Python helpers."""
    HELPERS.update(helpers)


def compiled(function: _F) -> _F:
    """The numba-compiled form of ``function``, built on first use.

    ``cache=True`` keeps the machine code on disk beside the module, so only the first process
    on a machine pays for compiling. Set ``NUMBA_DISABLE_JIT=1`` to run the same code as plain
    Python (numba honours it). Helpers declared with :func:`register_helpers` are compiled
    first and bound in the kernel's globals.
    """
    kernel = COMPILED.get(function.__name__)
    if kernel is None:
        import types

        import numba

        helpers = HELPERS.get(function.__name__, ())
        if helpers:
            scope = dict(function.__globals__)
            for helper in helpers:
                scope[helper.__name__] = compiled(helper)
            function = cast(_F, types.FunctionType(
                function.__code__, scope, function.__name__, function.__defaults__,
                function.__closure__))
        kernel = numba.njit(cache=True, nogil=True)(function)
        COMPILED[function.__name__] = kernel
    return cast(_F, kernel)
