"""The exceptions the package raises on purpose, in one place.

Every failure caused by bad state on disk is a :class:`StoreCorruptedError`: a ``ValueError``, so
code written against the documented ``ValueError`` keeps working, and specific enough that a
caller can tell damaged state from a bad argument.
"""

from __future__ import annotations

import os

from .locking import LockHeldError

#: Why a float key is refused, and what to use instead: the engine's key check
#: (:mod:`sessionstore.keyschema`) and the bounded path's (:func:`sessionstore.bounded.order.check_key_type`)
#: both say this (docs/semantics.md, "Keys are ...").
FLOAT_KEY_HINT = "floats are not accepted as keys: cast the column to a string or a scaled int"


class StoreCorruptedError(ValueError):
    """Stored state (a store directory, a checkpoint, a snapshot) is damaged or inconsistent.

    Raised instead of returning less data. Nothing is changed on disk when it is raised.

    Attributes:
        path: the file or directory found damaged.
        detail: what was wrong with it.
    """

    def __init__(self, path: str | os.PathLike[str], detail: str) -> None:
        self.path = os.fspath(path)
        self.detail = detail
        super().__init__(f"corrupted state in {self.path}: {detail}")


class StoreLockedError(LockHeldError, ValueError):
    """A session store directory is already open, in this process or another: its lock file is
    held. A ``ValueError`` (as documented for ``SessionStore``) and a
    :class:`~sessionstore.locking.LockHeldError` (``path`` is the lock file, ``holder_pid`` the
    holder's recorded process id or None)."""
