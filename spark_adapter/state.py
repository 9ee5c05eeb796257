"""Reading a sessionize state location from the driver: per-partition figures."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.fs as pafs

from .provider import open_filesystem


def read_state_metrics(state_location: str) -> dict[str, int]:
    """Sum the running totals (records in, late records dropped) over every partition's newest
    snapshot under ``state_location``.

    The totals are committed with each partition's state, so they count each record once even
    across task retries and query restarts.
    """
    fs, base = open_filesystem(state_location)
    counters = ("records_in", "dropped_records", "null_times_dropped", "null_keys_dropped")
    totals = dict.fromkeys(counters, 0) | {"partitions": 0}
    for operator in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if operator.type != pafs.FileType.Directory:
            continue
        for partition in fs.get_file_info(pafs.FileSelector(operator.path)):
            manifests = [
                info for info in fs.get_file_info(
                    pafs.FileSelector(f"{partition.path}/manifests", allow_not_found=True))
                if info.base_name.endswith(".json") and info.base_name[:-5].isdigit()
            ]
            if not manifests:
                continue
            newest = max(manifests, key=lambda info: int(info.base_name[:-5]))
            with fs.open_input_file(newest.path) as handle:
                manifest: dict[str, Any] = json.loads(handle.read())
            spark = _spark_metadata(manifest)
            totals["partitions"] += 1
            for name in counters:
                totals[name] += int(spark.get(name, 0))
    return totals


def _spark_metadata(manifest: dict[str, Any]) -> dict[str, Any]:
    spark = manifest.get("spark")
    return spark if isinstance(spark, dict) else {}
