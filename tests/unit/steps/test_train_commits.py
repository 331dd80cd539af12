"""The train loop's checkpoint and stop policy: when a step commits or stops, and what every rank does then.

No torch: `agree` (an all-reduce across ranks) and `save_checkpoint` (torch.save) are replaced by fakes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train import TrainSettings, commits
from eksflow.llm.steps.train.commits import Commits, Decision, decide, timer_due

QUIET = {"stop": False, "timed": False, "preempted": False, "noticed": False}


def at(done: int, max_steps: int = 10, every: int = 4, **flags: bool) -> Decision:
    return decide(done, max_steps, every, **{**QUIET, **flags})


@pytest.mark.parametrize(
    ("done", "flags", "expected"),
    [
        (1, {}, Decision(commit=False, stop=False, notice=False, noticed=False)),
        (4, {}, Decision(commit=True, stop=False, notice=False, noticed=False)),  # periodic
        (8, {}, Decision(commit=True, stop=False, notice=False, noticed=False)),
        (10, {}, Decision(commit=True, stop=False, notice=False, noticed=False)),  # final
        (3, {"stop": True}, Decision(commit=True, stop=True, notice=False, noticed=False)),
        (3, {"timed": True}, Decision(commit=True, stop=False, notice=False, noticed=False)),
        (3, {"preempted": True}, Decision(commit=True, stop=False, notice=True, noticed=True)),  # first notice
        # a notice already seen: no more commits for it, and it stays seen
        (3, {"preempted": True, "noticed": True}, Decision(commit=False, stop=False, notice=False, noticed=True)),
        (5, {"noticed": True}, Decision(commit=False, stop=False, notice=False, noticed=True)),
        (4, {"preempted": True, "noticed": True}, Decision(commit=True, stop=False, notice=False, noticed=True)),
        (3, {"stop": True, "preempted": True}, Decision(commit=True, stop=True, notice=True, noticed=True)),
    ],
)
def test_which_steps_commit_and_which_stop(done: int, flags: dict[str, bool], expected: Decision) -> None:
    assert at(done, **flags) == expected


def test_the_timer_is_off_at_zero_minutes_and_due_once_they_have_passed() -> None:
    assert not timer_due(0.0, 1e9)
    assert not timer_due(1.0, 59.9)
    assert timer_due(1.0, 60.0)
    assert timer_due(0.5, 31.0)


class FakeUpdate:
    """Counts full_state calls: the collective every rank must make at each commit."""

    model = "model"
    scheduler = "scheduler"

    def __init__(self) -> None:
        self.gathered = 0

    def full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.gathered += 1
        return {"adapter": self.gathered}, {"optimizer": self.gathered}


class Rank:
    """One rank's Commits over fakes: agree returns this rank's flags (or `others` OR-ed in) and records each call."""

    def __init__(
        self, root: Path, monkeypatch: pytest.MonkeyPatch, rank: int = 0, durable_uri: str = "", **settings: Any
    ) -> None:
        self.update = FakeUpdate()
        self.agreed: list[tuple[bool, ...]] = []
        self.others = (False, False, False)  # what the other ranks contribute to the all-reduce
        self.sigterm = False
        self.preempted = False
        self.saved: list[dict[str, Any]] = []
        monkeypatch.setattr(commits, "agree", self._agree)
        monkeypatch.setattr(commits, "save_checkpoint", self._save)
        self.settings = TrainSettings(**{"max_steps": 10, "checkpoint_every": 4, "keep_checkpoints": 2, **settings})
        self.commits = Commits(
            root,
            self.settings,
            rank,
            self.update,  # type: ignore[arg-type]
            "ddp",
            stop_requested=lambda: self.sigterm,
            stop_file=root / "STOP",
            preempted=lambda: self.preempted,
            durable_uri=durable_uri,
        )

    def _agree(self, *flags: bool) -> tuple[bool, ...]:
        self.agreed.append(flags)
        return tuple(a or b for a, b in zip(flags, self.others, strict=True))

    def _save(self, folder: Path, **kw: Any) -> None:
        assert kw["rank"] == 0 and kw["model"] == "model" and kw["scheduler"] == "scheduler"
        assert kw["strategy"] == "ddp" and kw["adapter"] == {"adapter": self.update.gathered}
        self.saved.append(kw["metrics"])
        (folder / "metrics.json").write_text(json.dumps(kw["metrics"]), encoding="utf-8")

    def run(self, steps: range) -> int | None:
        """The loop's calls: after_step after every step; the step it stopped at, or None."""
        with self.commits:
            for done in steps:
                if self.commits.after_step(done, {"loss": float(done)}):
                    return done
        return None


def steps_on_disk(root: Path) -> list[int]:
    return [c.step for c in checkpoints.committed(root)]


def test_rank_0_commits_periodically_and_at_the_end_prunes_and_saves_the_windows_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = Rank(tmp_path, monkeypatch)
    assert rank.run(range(1, 11)) is None
    assert len(rank.agreed) == 10  # the all-reduce, every step
    assert rank.update.gathered == 3  # steps 4, 8, 10
    assert [m["step"] for m in rank.saved] == [4, 8, 10]
    assert rank.saved[-1] == {"step": 10, "loss": 10.0}
    assert steps_on_disk(tmp_path) == [8, 10]  # keep_checkpoints=2
    for checkpoint in checkpoints.committed(tmp_path):
        checkpoints.verify(checkpoint.path)


def test_another_rank_gathers_at_the_same_steps_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = Rank(tmp_path, monkeypatch, rank=1)
    assert rank.run(range(1, 11)) is None
    assert len(rank.agreed) == 10
    assert rank.update.gathered == 3
    assert rank.saved == [] and steps_on_disk(tmp_path) == []


def test_a_stop_on_any_rank_commits_and_stops_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rank = Rank(tmp_path, monkeypatch, rank=1)
    rank.others = (True, False, False)  # rank 0 got SIGTERM
    assert rank.run(range(1, 11)) == 1
    assert rank.update.gathered == 1
    assert "rank 1: stop requested; checkpoint step 1 committed, exiting" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["sigterm", "stop file"])
def test_sigterm_or_the_drivers_stop_file_stops_after_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    rank = Rank(tmp_path, monkeypatch)
    with rank.commits:
        assert not rank.commits.after_step(1, {})
        if how == "sigterm":
            rank.sigterm = True
        else:
            (tmp_path / "STOP").write_text("1", encoding="utf-8")
        assert rank.commits.after_step(2, {"loss": 0.5})
    assert rank.agreed == [(False, False, False), (True, False, False)]
    assert rank.saved == [{"step": 2, "loss": 0.5}]
    assert steps_on_disk(tmp_path) == [2]
    assert "rank 0: stop requested; checkpoint step 2 committed, exiting" in capsys.readouterr().out


def test_a_preemption_notice_commits_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rank = Rank(tmp_path, monkeypatch)
    with rank.commits:
        assert not rank.commits.after_step(1, {})
        rank.preempted = True
        for done in range(2, 10):
            assert not rank.commits.after_step(done, {})
    assert [m["step"] for m in rank.saved] == [2, 4, 8]
    out = capsys.readouterr().out
    assert out.count("being preempted") == 1
    assert "rank 0: a node of this group is being preempted; checkpoint step 2 committed" in out


def test_the_timer_commits_and_restarts_at_each_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rank = Rank(tmp_path, monkeypatch, checkpoint_every=100, max_steps=100, checkpoint_every_minutes=1.0)
    with rank.commits:
        assert not rank.commits.after_step(1, {})
        rank.commits.last_commit = time.monotonic() - 61
        assert not rank.commits.after_step(2, {})
        assert not rank.commits.after_step(3, {})  # the commit at step 2 restarted the timer
    assert rank.agreed == [(False, False, False), (False, True, False), (False, False, False)]
    assert [m["step"] for m in rank.saved] == [2]


def test_leaving_prints_the_durable_copys_errors_as_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted: list[int] = []

    class FakeCopy:
        def __init__(self, uri: str) -> None:
            assert uri == "s3://bucket/run"

        def submit(self, checkpoint: checkpoints.Checkpoint) -> None:
            submitted.append(checkpoint.step)

        def close(self) -> list[str]:
            return ["durable copy of step-00000004 failed: no bucket"]

    monkeypatch.setattr(checkpoints, "DurableCopy", FakeCopy)
    rank = Rank(tmp_path, monkeypatch, durable_uri="s3://bucket/run")
    with pytest.raises(RuntimeError, match="boom"), rank.commits:
        rank.commits.after_step(4, {})
        raise RuntimeError("boom")
    assert submitted == [4]
    assert "warning: durable copy of step-00000004 failed: no bucket" in capsys.readouterr().err
