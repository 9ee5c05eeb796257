"""Input identity covers the data (issue 25 item 2): a rewritten input is never resumed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import main


def write_parquet(path: Path, users: list[str], times: list[int]) -> Path:
    # uncompressed and plain-encoded, so that a rewrite keeps the size to the byte
    pq.write_table(pa.table({"user": users, "ts": pa.array(times, pa.int64())}), path,
                   compression="none", use_dictionary=False)
    return path


def test_a_rewritten_parquet_file_of_the_same_size_and_statistics_is_refused(tmp_path, capsys):
    users = ["u1", "u2", "u3", "u4"]
    times = [0, 1_000, 2_000, 90_000_000]
    source = write_parquet(tmp_path / "events.parquet", users, times)
    out, state = tmp_path / "sessions.jsonl", tmp_path / "state"
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
"--out", str(out), "--state", str(state), "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    before_meta = pq.read_metadata(source)
    size = source.stat().st_size
    # swap two keys and nudge a time inside the range: same size, same min/max per column
    write_parquet(source, ["u2", "u1", "u3", "u4"], [0, 1_000, 2_001, 90_000_000])
    assert source.stat().st_size == size
    after_meta = pq.read_metadata(source)
    for column in range(after_meta.num_columns):
        old = before_meta.row_group(0).column(column).statistics
        new = after_meta.row_group(0).column(column).statistics
        assert (old.min, old.max) == (new.min, new.max)
    out_before = out.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "belongs to another input" in err and "events.parquet" in err, err
    assert "different content" in err, err
    assert out.read_bytes() == out_before


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_an_unchanged_input_resumes_in_every_format(tmp_path, capsys, suffix):
    table = pa.table({"user": ["a", "b", "a"], "ts": pa.array([0, 5, 10], pa.int64())})
    source = tmp_path / f"events{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, source)
    elif suffix == ".csv":
        source.write_text("user,ts\na,0\nb,5\na,10\n")
    else:
        source.write_text('{"user":"a","ts":0}\n{"user":"b","ts":5}\n{"user":"a","ts":10}\n')
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
"--out", str(tmp_path / "o.jsonl"), "--state",
            str(tmp_path / "state"), "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    source.touch()  # a new mtime alone is the same input
    assert main(argv) == 0


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_state_recorded_before_content_fingerprints_is_judged_by_its_own_rule(tmp_path,
                                                                               suffix):
    # docs/quickstart.md: a state whose Parquet files were fingerprinted by their footer only
    # is refused with a message that says so; text files were always hashed whole, so such a
    # state resumes when the bytes are the same (records without "fingerprint_of")
    from sessionstore.io import identity_difference, input_identity, open_input

    source = tmp_path / f"events{suffix}"
    if suffix == ".parquet":
        write_parquet(source, ["u1", "u2"], [0, 1_000])
    else:
        source.write_text('{"user":"u1","ts":0}\n{"user":"u2","ts":1000}\n')
    current = input_identity(open_input(str(source), key_columns=["user"]))
    legacy = {"format": current["format"],
              "files": [{k: v for k, v in f.items() if k != "fingerprint_of"}
                        for f in current["files"]]}
    change = identity_difference(legacy, current)
    if suffix == ".parquet":
        assert change is not None and "Parquet footer only" in change, change
    else:
        assert change is None
    assert identity_difference(current, current) is None
