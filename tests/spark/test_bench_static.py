"""``spark_bench``'s static figures: medians, spread, and ratios per round against native.

The runs are in the shape ``run_static`` returns, so these run without Spark.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.spark_bench import static_summary


def _run(seconds: float, load: float, jvm: float = 1.0, python: float = 0.0) -> dict[str, Any]:
    return {"rows_per_s": 1000 / seconds, "seconds": seconds, "jvm_cpu_s": jvm,
            "python_cpu_s": python, "cpu_s": jvm + python, "load_average": load}


def test_round_ratios_pair_the_runs_of_one_round() -> None:
    # a load that drifts: every engine is slower in later rounds, ours always 2x native
    native = [_run(1.0, 1.0), _run(2.0, 3.0), _run(4.0, 5.0)]
    ours = [_run(0.5, 1.5, 0.4, 0.1), _run(1.0, 3.5, 0.5, 0.2), _run(2.0, 5.5, 0.6, 0.3)]
    summary = static_summary({"native": native, "ours": ours}, base="native")
    figures = summary["ours"]
    # paired by round, the ratio is 2 in each
    assert figures["median_round_ratio"] == pytest.approx(2.0)
    assert figures["round_ratio_range"] == pytest.approx([2.0, 2.0])
    assert figures["ratio_of_medians"] == pytest.approx(2.0)
    assert figures["median_seconds"] == 1.0
    assert figures["seconds_range"] == [0.5, 2.0]
    assert figures["rows_per_s_range"] == pytest.approx([500.0, 2000.0])
    assert figures["median_jvm_cpu_s"] == 0.5
    assert figures["median_python_cpu_s"] == 0.2
    assert figures["median_cpu_s"] == pytest.approx(0.7)
    assert figures["cpu_ratio_of_medians"] == pytest.approx(1.0 / 0.7)  # native's 1.0 s
    assert figures["load_range"] == [1.5, 5.5]
    assert [r["seconds"] for r in figures["runs"]] == [0.5, 1.0, 2.0]  # in round order
    assert summary["native"]["median_round_ratio"] == pytest.approx(1.0)


def test_round_ratio_is_natives_wall_over_the_engines() -> None:
    native = [_run(1.0, 1.0), _run(1.2, 1.0), _run(0.9, 1.0)]
    ours = [_run(0.5, 1.0), _run(0.4, 1.0), _run(0.9, 1.0)]
    figures = static_summary({"native": native, "ours": ours}, base="native")["ours"]
    # rounds: 1.0/0.5 = 2, 1.2/0.4 = 3, 0.9/0.9 = 1 (each side sorted first would pair
    # 0.9/0.4, 1.0/0.5 and 1.2/0.9 instead: 1.33-2.25)
    assert figures["median_round_ratio"] == pytest.approx(2.0)
    assert figures["round_ratio_range"] == pytest.approx([1.0, 3.0])
    # medians: native 1.0 s, ours 0.5 s
    assert figures["ratio_of_medians"] == pytest.approx(2.0)


def test_runs_of_unequal_counts_are_refused() -> None:
    # a round without one engine's run has no ratio: refused, not paired with another round
    with pytest.raises(ValueError, match="shorter|longer"):
        static_summary({"native": [_run(1.0, 1.0), _run(2.0, 1.0)], "ours": [_run(0.5, 1.0)]},
                       base="native")
