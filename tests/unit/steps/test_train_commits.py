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
from eksflow.llm.steps.train.commits import Commits, Decision, deadline_near, decide, timer_due

QUIET: dict[str, Any] = {"stop": False, "timed": False, "notices": 0, "noticed": 0}


def at(done: int, max_steps: int = 10, every: int = 4, **flags: Any) -> Decision:
    return decide(done, max_steps, every, **{**QUIET, **flags})


@pytest.mark.parametrize(
    ("done", "flags", "expected"),
    [
        (1, {}, Decision(commit=False, stop=False, notice=False, noticed=0)),
        (4, {}, Decision(commit=True, stop=False, notice=False, noticed=0)),  # periodic
        (8, {}, Decision(commit=True, stop=False, notice=False, noticed=0)),
        (10, {}, Decision(commit=True, stop=False, notice=False, noticed=0)),  # final
        (3, {"stop": True}, Decision(commit=True, stop=True, notice=False, noticed=0)),
        (3, {"timed": True}, Decision(commit=True, stop=False, notice=False, noticed=0)),
        (3, {"notices": 1}, Decision(commit=True, stop=False, notice=True, noticed=1)),  # the Spot notice
        # a notice already committed for: no more commits for it, and it stays counted
        (3, {"notices": 1, "noticed": 1}, Decision(commit=False, stop=False, notice=False, noticed=1)),
        (5, {"noticed": 1}, Decision(commit=False, stop=False, notice=False, noticed=1)),
        (4, {"notices": 1, "noticed": 1}, Decision(commit=True, stop=False, notice=False, noticed=1)),
        # the node's terminating signal, a grace after its notice: a second notice commits again
        (5, {"notices": 2, "noticed": 1}, Decision(commit=True, stop=False, notice=True, noticed=2)),
        (3, {"stop": True, "notices": 1}, Decision(commit=True, stop=True, notice=True, noticed=1)),
    ],
)
def test_which_steps_commit_and_which_stop(done: int, flags: dict[str, Any], expected: Decision) -> None:
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
        self.agreed: list[tuple[float, ...]] = []
        # what the other ranks contribute to the all-reduce: stop, timer, notices seen, last chance
        self.others = (0.0, 0.0, 0.0, 0.0)
        self.sigterm = False
        self.notices = 0  # the preemption notices this rank has seen
        self.deadline_s = 0.0  # their earliest deadline (UNIX seconds; 0: none)
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
            preempted=lambda: (self.notices, self.deadline_s),
            durable_uri=durable_uri,
        )

    def _agree(self, *values: float) -> tuple[float, ...]:
        self.agreed.append(tuple(float(v) for v in values))
        return tuple(max(float(a), b) for a, b in zip(values, self.others, strict=True))

    def _save(self, folder: Path, **kw: Any) -> None:
        assert kw["rank"] == 0 and kw["model"] == "model" and kw["scheduler"] == "scheduler"
        assert kw["strategy"] == "ddp" and kw["weights"] == {"adapter": self.update.gathered}
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
    rank.others = (1.0, 0.0, 0.0, 0.0)  # rank 0 got SIGTERM
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
    assert rank.agreed == [(0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)]
    assert rank.saved == [{"step": 2, "loss": 0.5}]
    assert steps_on_disk(tmp_path) == [2]
    assert "rank 0: stop requested; checkpoint step 2 committed, exiting" in capsys.readouterr().out


def test_each_preemption_notice_commits_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Spot notice commits at once; the node's terminating signal, Ray's second drain of it a grace later,
    commits again, so the node takes at most the step under way with it instead of every step since the notice."""
    rank = Rank(tmp_path, monkeypatch, max_steps=20, checkpoint_every=100)
    with rank.commits:
        assert not rank.commits.after_step(1, {})
        rank.notices, rank.deadline_s = 1, time.time() + 90  # the preStop hook drained the node
        for done in range(2, 7):
            assert not rank.commits.after_step(done, {})
        rank.notices, rank.deadline_s = 2, time.time() + 30  # SIGTERM: `ray start` drained it again
        for done in range(7, 10):
            assert not rank.commits.after_step(done, {})
    assert [m["step"] for m in rank.saved] == [2, 7]
    out = capsys.readouterr().out
    assert out.count("being preempted") == 2
    assert "rank 0: a node of this group is being preempted (notice 2); checkpoint step 7 committed" in out


def test_a_notice_another_rank_saw_first_commits_every_rank_at_the_same_step_and_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = Rank(tmp_path, monkeypatch, rank=1, max_steps=20, checkpoint_every=100)
    with rank.commits:
        rank.others = (0.0, 0.0, 1.0, 0.0)  # rank 0 saw the notice a step before this rank
        assert not rank.commits.after_step(1, {})
        rank.notices = 1
        assert not rank.commits.after_step(2, {})
    assert rank.update.gathered == 1  # one commit, at the step the first rank saw it


def test_the_last_step_boundary_before_a_preemption_deadline_commits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray start` kills the node's processes 30 s after its SIGTERM: the boundary that leaves no time for another
    step and its commit commits, so the node takes at most the step under way with it."""
    rank = Rank(tmp_path, monkeypatch, max_steps=20, checkpoint_every=100)
    with rank.commits:
        rank.notices, rank.deadline_s = 1, time.time() + 3600
        assert not rank.commits.after_step(1, {})  # the notice's own commit
        assert not rank.commits.after_step(2, {})
        rank.deadline_s = time.time() + 0.001  # the deadline, closer than a step and a commit
        for done in range(3, 6):
            assert not rank.commits.after_step(done, {})
    assert [m["step"] for m in rank.saved] == [1, 3]
    assert "rank 0: the preempted node's deadline is near; checkpoint step 3 committed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("deadline_s", "now_s", "step_and_commit_s", "near"),
    [(0.0, 100.0, 5.0, False), (110.0, 100.0, 5.0, False), (110.0, 105.0, 5.0, True), (110.0, 120.0, 0.0, True)],
)
def test_a_deadline_is_near_when_another_step_and_commit_would_not_end_before_it(
    deadline_s: float, now_s: float, step_and_commit_s: float, near: bool
) -> None:
    assert deadline_near(deadline_s, now_s, step_and_commit_s) is near


def test_the_timer_commits_and_restarts_at_each_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rank = Rank(tmp_path, monkeypatch, checkpoint_every=100, max_steps=100, checkpoint_every_minutes=1.0)
    with rank.commits:
        assert not rank.commits.after_step(1, {})
        rank.commits.last_commit = time.monotonic() - 61
        assert not rank.commits.after_step(2, {})
        assert not rank.commits.after_step(3, {})  # the commit at step 2 restarted the timer
    assert rank.agreed == [(0.0, 0.0, 0.0, 0.0), (0.0, 1.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0)]
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
