"""When the training loop commits a checkpoint and when it stops: one object the loop asks after every step.

A step ends in a commit when it is a multiple of `checkpoint_every`, the last step, a stop (SIGTERM or the
driver's stop file), the `checkpoint_every_minutes` timer, or the first preemption notice (a node is going: commit
at once and keep training). Every rank agrees on the stop, timer and notice flags through one all-reduce each step
(parallel.agree), so every rank takes part in the same collectives (Update.full_state) at the same step; rank 0
alone writes, prunes and hands the commit to the durable copy. `decide` is the pure decision.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType

from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.parallel import Update, agree
from eksflow.llm.steps.train.state import save_checkpoint


@dataclass(frozen=True)
class Decision:
    """What to do after one step, from the flags every rank agreed on."""

    commit: bool  # every rank takes part in Update.full_state; rank 0 writes
    stop: bool  # the run was asked to stop: commit, then exit
    notice: bool  # the first preemption notice: commit now, once, and keep training
    noticed: bool  # a preemption notice has been seen, this step or before (the next step's `noticed`)


def decide(
    done: int,
    max_steps: int,
    every: int,
    *,
    stop: bool,
    timed: bool,
    preempted: bool,
    noticed: bool,
) -> Decision:
    """After `done` steps: periodic (every `every`), final, stop, timed or first notice: commit; stop: also exit."""
    notice = preempted and not noticed
    commit = done % every == 0 or done == max_steps or stop or timed or notice
    return Decision(commit=commit, stop=stop, notice=notice, noticed=noticed or preempted)


def timer_due(minutes: float, since_commit_s: float) -> bool:
    """Whether the `checkpoint_every_minutes` timer has run out (0 minutes: off)."""
    return bool(minutes) and since_commit_s >= minutes * 60


class Commits:
    """The loop's checkpoint and stop policy: `after_step` once per step on every rank; `with` closes the copy.

    Rank 0 with a `durable_uri` uploads each commit in the background (checkpoints.DurableCopy); leaving the
    `with` block waits for the last upload and prints its errors as warnings.
    """

    def __init__(
        self,
        root: Path,
        settings: TrainSettings,
        rank: int,
        update: Update,
        strategy: str,
        *,
        stop_requested: Callable[[], bool],
        stop_file: Path,
        preempted: Callable[[], bool],
        durable_uri: str = "",
    ) -> None:
        self.root, self.settings, self.rank = root, settings, rank
        self.update, self.strategy = update, strategy
        self.stop_requested, self.stop_file, self.preempted = stop_requested, stop_file, preempted
        self.durable_uri = durable_uri
        self.durable: checkpoints.DurableCopy | None = None
        self.noticed = False  # a preemption notice was seen (and its checkpoint committed)
        self.last_commit = time.monotonic()  # the timer starts with the loop

    def __enter__(self) -> Commits:
        if self.rank == 0 and self.durable_uri:
            self.durable = checkpoints.DurableCopy(self.durable_uri)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.durable:
            for message in self.durable.close():
                print(f"warning: {message}", file=sys.stderr)

    def after_step(self, done: int, metrics: dict[str, float]) -> bool:
        """Agree with every rank, commit if due (`metrics`: the last logging window's), print; True: stop now.

        A collective: every rank calls it after every step.
        """
        stop, timed, preempted = agree(
            self.stop_requested() or self.stop_file.exists(),
            timer_due(self.settings.checkpoint_every_minutes, time.monotonic() - self.last_commit),
            self.preempted(),
        )
        decision = decide(
            done,
            self.settings.max_steps,
            self.settings.checkpoint_every,
            stop=stop,
            timed=timed,
            preempted=preempted,
            noticed=self.noticed,
        )
        self.noticed = decision.noticed
        if decision.commit:
            self.commit(done, metrics)
        if decision.notice and self.rank == 0:
            print(f"rank 0: a node of this group is being preempted; checkpoint step {done} committed", flush=True)
        if decision.stop:
            print(f"rank {self.rank}: stop requested; checkpoint step {done} committed, exiting", flush=True)
        return decision.stop

    def commit(self, done: int, metrics: dict[str, float]) -> None:
        """Gather the full state (a collective: every rank), rank 0 commits, prunes and queues the durable copy."""
        adapter, optimizer_state = self.update.full_state()
        if self.rank == 0:
            save = partial(
                save_checkpoint,
                rank=self.rank,
                model=self.update.model,
                adapter=adapter,
                optimizer_state=optimizer_state,
                scheduler=self.update.scheduler,
                strategy=self.strategy,
                metrics={"step": done, **metrics},
            )
            committed = checkpoints.commit(self.root, done, save)
            checkpoints.prune(self.root, self.settings.keep_checkpoints)
            if self.durable:
                self.durable.submit(committed)
        self.last_commit = time.monotonic()
