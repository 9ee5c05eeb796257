"""The JSON Lines guard (sessionstore/io/json_guard.py): the compiled kernel, its Python source
and the array form against a reference written here, line by line with a regular expression
for the escapes, over hard inputs (random JSON-ish bytes, escaped quotes and backslashes,
brackets inside strings, multi-byte UTF-8, CRLF, records over many lines, nesting at the limit
and one past it), every block size and every block boundary. The messages, lines included,
are the same whichever scan runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore.io import InputError, check_json_depth
from sessionstore.io.json_guard import (
    DEEP,
    OFFENCE,
    STRAY,
    guard_block,
    guard_kernel,
    new_state,
)
from sessionstore.jit import compiled

ROOT = Path(__file__).resolve().parents[2]

# a quote that an even run of backslashes (or none) comes right before
_TOGGLE = re.compile(rb'(?<!\\)(?:\\\\)*"')
_WORDS = {ord("n"): "a JSON null", ord("t"): "a JSON boolean", ord("f"): "a JSON boolean",
          ord('"'): "a JSON string", ord("["): "a JSON array",
          **{ord(c): "a JSON number" for c in "-0123456789"}}


def reference(data: bytes, limit: int) -> tuple[str, int, int] | None:
    """The first offence as (``deep`` or ``stray``, 1-based line, byte), or None. Lines are
    taken one at a time (a string never crosses a newline); the depth runs over the file."""
    depth = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        toggles = {m.end() - 1 for m in _TOGGLE.finditer(line)}
        inside = False
        for at, byte in enumerate(line):
            if at in toggles:
                inside = not inside
            if inside:  # the opening quote is inside its string, the closing one is not
                continue
            if byte in b"{[":
                if depth >= limit:
                    return "deep", number, byte
                if depth == 0 and byte == ord("["):
                    return "stray", number, byte
                depth += 1
            elif depth == 0 and byte not in b" \t\r":
                return "stray", number, byte
            elif byte in b"}]":
                depth -= 1
    return None


def expected_message(path: Path, data: bytes, limit: int) -> str | None:
    found = reference(data, limit)
    if found is None:
        return None
    kind, line, byte = found
    if kind == "deep":
        return (f"input {str(path)!r} line {line}: JSON nested deeper than {limit} levels; "
                f"refused before parsing")
    what = _WORDS.get(byte, f"a stray {chr(byte)!r}")
    return (f"input {str(path)!r} line {line}: {what}, not an object (JSON Lines holds one "
            f"object per record); refused before parsing")


def message(path: Path, limit: int, block_bytes: int, use_kernel: bool) -> str | None:
    try:
        check_json_depth(path, limit=limit, block_bytes=block_bytes, compiled=use_kernel)
    except InputError as exc:
        return str(exc)
    return None


# -- inputs -----------------------------------------------------------------------------------

_PIECES = [b"{", b"}", b"[", b"]", b'"', b"\\", b'\\"', b"\\\\", b"\n", b"\r\n", b" ", b"\t",
           b"\r", b":", b",", b"null", b"1", b"-2.5e3", b"true", b"false", b"x", b"\xc3\xa9",
           "€".encode(), "😀".encode(), b"\xff", b'"{[', b']}"', b'{"k":', b"}\n{", b'"\n',
           b"\\\n", b'"a\\\\"']
_SOUP = st.lists(st.sampled_from(_PIECES), max_size=30).map(b"".join)
_TEXT = st.text(alphabet=st.sampled_from(list('ab "\\{}[]\n\t\r/é€😀\x00')), max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12)
_STRAYS = [b"null", b"7", b'"s"', b"true", b"false", b"[1]", b"]", b"}", b"\\", b"x", b'"open']


@st.composite
def _records(draw: Any) -> bytes:
    """JSON Lines records, some over several lines or with CRLF ends, with now and then a value
    that is not an object between them, a record nested ``limit``-ish deep, or an object of
    random pieces (unclosed strings, stray escapes and brackets)."""
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        choice = draw(st.integers(0, 6))
        if choice == 0:
            parts.append(draw(st.sampled_from(_STRAYS)))
        elif choice == 1:
            depth = draw(st.integers(0, 9))
            opener = draw(st.sampled_from(["[", '{"a":', "[\n", '{\n"b" : ']))
            parts.append(('{"v":' + opener * depth + "1"
                          + ("]" if opener.startswith("[") else "}") * depth + "}").encode())
        elif choice == 2:
            parts.append(b"{" + draw(_SOUP))
        else:
            value = {"k": draw(_VALUES), draw(_TEXT): draw(_VALUES)}
            indent = draw(st.sampled_from([None, None, 0, 2]))
            parts.append(json.dumps(value, indent=indent,
                                    ensure_ascii=draw(st.booleans())).encode())
    ends = draw(st.sampled_from([b"\n", b"\r\n", b" \n\n"]))
    return ends.join(parts) + draw(st.sampled_from([b"", ends]))


_INPUTS = st.one_of(_records(), _SOUP, _SOUP.map(lambda soup: b"{" + soup),
                    st.binary(max_size=40))


def _kernels() -> list[tuple[str, Callable[..., int]]]:
    return [("compiled", compiled(guard_kernel)), ("python", guard_kernel),
            ("arrays", guard_block)]


def _scan_in_blocks(scan: Callable[..., int], data: bytes, cuts: list[int],
                    limit: int) -> tuple[int, int] | None:
    """Scan ``data`` cut at ``cuts`` with ``scan``: the offence's offset in the file and kind."""
    state = new_state()
    edges = [0, *cuts, len(data)]
    for start, stop in pairwise(edges):
        block = np.frombuffer(bytearray(data[start:stop]) + b"\0", dtype=np.uint8)
        at = scan(block, stop - start, state, limit)
        if at >= 0:
            assert 0 <= at < stop - start
            return start + at, int(state[OFFENCE])
    return None


def _reference_offset(data: bytes, limit: int) -> tuple[int, int] | None:
    """The reference's offence as an offset in ``data`` and a kind code."""
    found = reference(data, limit)
    if found is None:
        return None
    kind, line, _ = found
    first = 0
    for _ in range(line - 1):
        first = data.index(b"\n", first) + 1
    line_bytes = data[first:].split(b"\n", 1)[0]
    # the offence is the first byte of its line at which the line's prefix offends
    for at in range(1, len(line_bytes) + 1):
        if reference(data[:first] + line_bytes[:at], limit) == found:
            return first + at - 1, DEEP if kind == "deep" else STRAY
    raise AssertionError("the reference's offence is not on its line")


# -- the properties ---------------------------------------------------------------------------


@settings(max_examples=300)
@given(data=_INPUTS, limit=st.integers(0, 12), block=st.integers(1, 48), big=st.booleans())
@example(data=b'{"a": "x\n}\nnull', limit=5, block=1, big=True)  # a newline ends a string
@example(data=b'{"a": "x\\\n}\r\n[', limit=5, block=3, big=False)
@example(data=b'{"a": "\\\\"}\n{"b": "\\\\\\"}"}\n\\', limit=5, block=2, big=False)
@example(data=b'{"a": {\n"b": [1, "]}"]}\r\n}\r\n\r\n"bare"\n', limit=5, block=1, big=False)
@example(data=b'{"\xc3\xa9": "\xe2\x82\xac"}\n\xe2\x82\xac', limit=5, block=1, big=False)
@example(data=b'{"v": [[[1]]]}\n{"w": [[[[1]]]]}', limit=4, block=5, big=False)
def test_every_scan_names_the_references_line_at_any_block_size(tmp_path_factory: Any,
                                                                 data: bytes, limit: int,
                                                                 block: int, big: bool) -> None:
    path = tmp_path_factory.mktemp("guard") / "in.jsonl"
    path.write_bytes(data)
    expected = expected_message(path, data, limit)
    block_bytes = 1 << 20 if big else block
    for use_kernel in (True, False):
        assert message(path, limit, block_bytes, use_kernel) == expected, use_kernel


@settings(max_examples=150)
@given(data=_INPUTS, limit=st.integers(0, 12))
def test_every_scan_finds_the_references_byte_with_a_block_boundary_at_every_position(
        data: bytes, limit: int) -> None:
    expected = _reference_offset(data, limit)
    for name, scan in _kernels():
        assert _scan_in_blocks(scan, data, [], limit) == expected, name
        for cut in range(1, len(data)):
            assert _scan_in_blocks(scan, data, [cut], limit) == expected, (name, cut)
        # and an empty block between two
        cut = len(data) // 2
        assert _scan_in_blocks(scan, data, [cut, cut], limit) == expected, name
        assert _scan_in_blocks(scan, data, list(range(1, len(data))), limit) == expected, name


@pytest.mark.parametrize("use_kernel", [True, False])
def test_nesting_at_the_limit_passes_and_one_past_it_is_refused_on_one_line_or_many(
        tmp_path: Path, use_kernel: bool) -> None:
    """The depth is the file's: a record written over many lines is as deep as its nesting
    (the JSON parser recurses as deep and crashes the process at 20,000 levels)."""
    path = tmp_path / "in.jsonl"
    head = b'{"user": "a", "ts": 1}\r\n'
    for sep in (b"", b"\n", b"\r\n  "):
        for inner in (999, 1000):  # the record's own object is one level more
            body = b'{"v":' + (b"[" + sep) * inner + b"1" + (sep + b"]") * inner + b"}\n"
            path.write_bytes(head + body)
            if inner == 999:
                check_json_depth(path, compiled=use_kernel)
                continue
            line = 2 + (999 if sep else 0)
            with pytest.raises(InputError, match=f"line {line}: JSON nested deeper than 1000 "):
                check_json_depth(path, compiled=use_kernel)


def test_a_record_nested_deep_over_many_lines_is_refused_before_the_parser_can_crash(
        tmp_path: Path) -> None:
    """A record 20,000 levels deep written one bracket a line crashed the JSON reader
    (SIGSEGV): the guard measured each line's depth, 1 here."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "a", "ts": 1}\n{"user": "a", "ts": 2, "v":\n'
                      + "[\n" * 20_000 + "]\n" * 20_000 + "}\n")
    child = subprocess.run([sys.executable, "-m", "sessionstore.cli", "sessionize", str(source),
                            "--key", "user", "--time", "ts", "--gap", "1m", "--out",
                            str(tmp_path / "o.jsonl"), "--no-progress"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert child.returncode == 2, child.stderr
    assert "line 1002: JSON nested deeper than 1000 levels" in child.stderr


def test_the_first_offence_is_named_not_the_deepest_one(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": [[[1]]]}\n{"b": [[[[[[1]]]]]]}\nnull\n')
    for use_kernel in (True, False):
        with pytest.raises(InputError, match="line 1: JSON nested deeper than 3 levels"):
            check_json_depth(path, limit=3, compiled=use_kernel)
        with pytest.raises(InputError, match="line 3: a JSON null"):
            check_json_depth(path, limit=7, compiled=use_kernel)


def test_small_inputs_leave_numba_unloaded_and_large_ones_are_compiled(tmp_path: Path) -> None:
    """Importing numba costs about 0.6 s, more than the array form takes on small files."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"a": 1}\n' * 1000)
    code = f"""
import sys
from pathlib import Path
from sessionstore.io import open_input, readers
open_input({str(path)!r}, key_columns=["a"])
assert "numba" not in sys.modules
readers.COMPILED_FROM_BYTES = {path.stat().st_size}
readers.check_json_depth(Path({str(path)!r}))
assert "numba" in sys.modules
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_negative_limit_or_an_empty_block_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ValueError, match="limit must be >= 0, got -1"):
        check_json_depth(path, limit=-1)
    with pytest.raises(ValueError, match="block_bytes must be >= 1, got 0"):
        check_json_depth(path, block_bytes=0)
