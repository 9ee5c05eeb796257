"""``benchmarks.spark_floors``: each floor query is the plan its name says, and the skeleton has
the shape of ``sessionize``'s streaming plan (so its time is a floor under ours)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks.spark_floors import FLOORS
from spark_adapter import sessionize
from tests.spark.streams import one_file_plan

ROWS = [("a", 0, 1), ("b", 3, 2), ("a", 8, 3), ("c", 30, 4), ("a", 31, 5)]


def _run(spark: Any, root: Path, build: Any, capsys: Any) -> tuple[list[str], int]:
    """The operators of the physical plan of ``build(stream)``'s micro-batch over one file of
    ROWS, and the rows it wrote."""
    plan, _, name = one_file_plan(spark, root, build, ROWS, capsys)
    return re.findall(r"(?m)^[ :|+-]*(\w+)", plan), spark.table(name).count()


def _shape(nodes: list[str]) -> tuple[int, int, int, int]:
    """(exchanges run, exchanges reused, Python round trips, stateful operators)."""
    return (nodes.count("Exchange"), nodes.count("ReusedExchange"), nodes.count("MapInArrow"),
            nodes.count("StreamingDeduplicateWithinWatermark"))


def test_each_floor_is_the_plan_it_names_and_emits_every_input_row(spark, tmp_path, capsys):
    """Kills a floor missing its shuffle, its Python round trip or its state store (its time
    would then be no floor), and a skeleton whose shape is not sessionize's."""
    shapes = {}
    for name, build in FLOORS.items():
        nodes, rows = _run(spark, tmp_path / name,
                           lambda s, build=build: build(s, "5 seconds"), capsys)
        shapes[name] = _shape(nodes)
        if name != "shuffle+state":  # the deduplication keeps one row per user
            assert rows == len(ROWS), name
    ours, _ = _run(spark, tmp_path / "ours", lambda s: sessionize(
        s, key="user", timestamp="ts", gap="10 seconds", aggregations={"n": "count"},
        watermark_delay="5 seconds", state_location=str(tmp_path / "state"),
        local_dir=str(tmp_path / "local")), capsys)
    assert shapes == {"source+sink": (0, 0, 0, 0), "shuffle": (1, 0, 0, 0),
                      "shuffle+python": (1, 0, 1, 0), "shuffle+state": (1, 0, 0, 1),
                      "skeleton": _shape(ours)}
    assert _shape(ours) == (1, 1, 1, 1)
