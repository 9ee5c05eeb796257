"""Reading events from files and writing sessions to files, for the CLI and the main job.

One concern per module:

- :mod:`.readers`: input formats, resolving and opening an input, streaming its record batches,
  the JSON depth check;
- :mod:`.identity`: the input's identity, which a resumed run must find again;
- :mod:`.columns`: time, gap, key and value columns as the engine reads them;
- :mod:`.writers`: :class:`SessionWriter`, the resumable output, and
  :class:`ReplacedOutput`, the output of a run without state.

The names below are re-exported so that ``from sessionstore.io import X`` keeps working.
"""

from __future__ import annotations

from .columns import (
    TIME_UNITS,
    EngineBatch,
    TimeColumn,
    check_gap_column,
    engine_batch,
    engine_columns,
    gap_column_ms,
    time_column_ms,
)
from .identity import file_identity, identity_difference, input_identity
from .readers import (
    FORMATS,
    KEY_TYPES,
    MAX_JSON_DEPTH,
    TSV_SUFFIXES,
    InputError,
    InputSource,
    check_json_depth,
    csv_delimiter,
    file_format,
    first_line,
    iter_batches,
    open_input,
    resolve_files,
)
from .writers import ReplacedOutput, SessionWriter, check_output_place

__all__ = [
    "FORMATS",
    "KEY_TYPES",
    "MAX_JSON_DEPTH",
    "TIME_UNITS",
    "TSV_SUFFIXES",
    "EngineBatch",
    "InputError",
    "InputSource",
    "ReplacedOutput",
    "SessionWriter",
    "TimeColumn",
    "check_gap_column",
    "check_json_depth",
    "check_output_place",
    "csv_delimiter",
    "engine_batch",
    "engine_columns",
    "file_format",
    "file_identity",
    "first_line",
    "gap_column_ms",
    "identity_difference",
    "input_identity",
    "iter_batches",
    "open_input",
    "resolve_files",
    "time_column_ms",
]
