"""Durations and log tails, shown one way by the local executor and the steps' reports."""

from __future__ import annotations

from eksflow.runtime.readable import format_duration, log_tail


def test_a_duration_is_short_enough_for_a_table_column():
    assert [format_duration(s) for s in (None, 0, 45.9, 192, 3720)] == ["", "0s", "45s", "3m12s", "1h02m"]


def test_a_log_tail_is_its_last_lines_decoded_leniently_and_read_from_its_end_only(tmp_path):
    log = tmp_path / "task.log"
    log.write_bytes(b"x" * 200_000 + b"\n" + b"\n".join(f"line {i}".encode() for i in range(30)) + b"\n\xff end\n")
    assert log_tail(log, 3) == ["line 28", "line 29", "\ufffd end"]
    assert len(log_tail(log)) == 20
    assert log_tail(tmp_path / "missing.log") == [] and log_tail(None) == []
