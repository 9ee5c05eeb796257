"""Helpers shared by the benchmark scripts: timing, peak memory and result files."""

from __future__ import annotations

import json
import platform
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "bench"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once; return (seconds, result)."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write one benchmark's results as JSON under docs/bench/."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path
