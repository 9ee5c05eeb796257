"""Input identity: what a resumed run must find again, so that it never resumes against changed
input."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from .readers import _BLOCK, InputSource


def file_identity(path: Path, fmt: str) -> dict[str, Any]:
    """Size, mtime and a content fingerprint of one input file.

    Parquet files are fingerprinted by their footer (row groups, column chunk offsets and sizes,
    statistics), which any rewrite changes; other formats by a BLAKE2b hash of every byte.
    """
    stat = path.stat()
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        if fmt == "parquet" and stat.st_size >= 12:
            handle.seek(stat.st_size - 8)
            tail = handle.read(8)
            footer = int.from_bytes(tail[:4], "little")
            handle.seek(max(stat.st_size - 8 - footer, 0))
            digest.update(b"parquet-footer:" + handle.read(footer + 8))
        else:
            while chunk := handle.read(_BLOCK):
                digest.update(chunk)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "fingerprint": digest.hexdigest()}


def input_identity(source: InputSource) -> dict[str, Any]:
    """What a resumed run must find again: the format and, for every file, its path (relative
    to the input's directory) and :func:`file_identity`."""
    def name(f: Path) -> str:
        return str(f.relative_to(source.root)) if source.root is not None else str(f.resolve())

    return {"format": source.format,
            "files": [{"path": name(f), **file_identity(f, source.format)} for f in source.files]}


def identity_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How ``current`` differs from ``recorded`` (None when it is the same input).

    The modification time alone does not count: a copy with the same bytes is the same input.
    """
    if recorded.get("format") != current.get("format"):
        return f"its format was {recorded.get('format')}, now {current.get('format')}"
    old = {f["path"]: f for f in recorded.get("files", [])}
    new = {f["path"]: f for f in current.get("files", [])}
    for path in sorted(old.keys() - new.keys()):
        return f"file {path!r} is gone"
    for path in sorted(new.keys() - old.keys()):
        return f"file {path!r} is new"
    for path in sorted(old):
        if old[path]["size"] != new[path]["size"]:
            return f"file {path!r} was {old[path]['size']} bytes, now {new[path]['size']}"
        if old[path]["fingerprint"] != new[path]["fingerprint"]:
            return f"file {path!r} has the same size but different content"
    return None
