"""When the training loop commits a checkpoint and when it stops: one object the loop asks after every step.

A step ends in a commit when it is a multiple of `checkpoint_every`, the last step, a stop (SIGTERM or the
driver's stop file), the `checkpoint_every_minutes` timer, a new preemption notice, or a preemption's last chance.
A preempted node gives two notices, each a drain with a deadline: Karpenter's (its pod's preStop hook) and, a grace
later, its terminating signal's (`ray start` drains its node on SIGTERM, then kills it 30 s later). Each commits at
once and training goes on; then the last step boundary before the earliest deadline that leaves no time for
another step and its commit commits once more, so the node takes at most a step with it (Ray Train checkpoints on
its own schedule, not on a Spot deadline: ray #63968). Every rank agrees on the stop, timer and last-chance flags
and on the count of notices seen through one all-reduce each step (parallel.agree), so every rank takes part in the
same collectives (Update.full_state) at the same step; rank 0 alone writes, prunes and hands the commit to the
durable copy. `decide` is the pure decision.
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
    notice: bool  # a preemption notice not committed for yet: commit now, once, and keep training
    noticed: int  # the preemption notices committed for, this step's included (the next step's `noticed`)
    last_chance: bool = False  # a preempted node's deadline leaves no time for another step and its commit


def decide(
    done: int,
    max_steps: int,
    every: int,
    *,
    stop: bool,
    timed: bool,
    notices: int,
    noticed: int,
    last_chance: bool = False,
) -> Decision:
    """After `done` steps: commit when periodic, final, stopping, timed, noticed or at the last chance; stop: exit.

    `notices`: the preemption notices seen so far (the most any rank has seen); `noticed`: those committed for.
    """
    notice = notices > noticed
    commit = done % every == 0 or done == max_steps or stop or timed or notice or last_chance
    return Decision(commit=commit, stop=stop, notice=notice, noticed=max(notices, noticed), last_chance=last_chance)


def timer_due(minutes: float, since_commit_s: float) -> bool:
    """Whether the `checkpoint_every_minutes` timer has run out (0 minutes: off)."""
    return bool(minutes) and since_commit_s >= minutes * 60


def deadline_near(deadline_s: float, now_s: float, step_and_commit_s: float) -> bool:
    """Whether a preemption deadline (UNIX seconds; 0: none) leaves no time for another step and its commit."""
    return bool(deadline_s) and now_s + step_and_commit_s >= deadline_s


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
        preempted: Callable[[], tuple[int, float]],
        durable_uri: str = "",
        base_dir: str = "",
    ) -> None:
        self.root, self.settings, self.rank = root, settings, rank
        self.update, self.strategy = update, strategy
        self.stop_requested, self.stop_file, self.preempted = stop_requested, stop_file, preempted
        self.durable_uri = durable_uri
        self.base_dir = base_dir  # a full fine-tune's base model folder: its checkpoints get the base's tokenizer
        self.durable: checkpoints.DurableCopy | None = None
        self.noticed = 0  # the preemption notices seen (and committed for)
        self.last_chance_taken = False  # one commit at the last chance before a preemption deadline
        self.last_commit = time.monotonic()  # the timer starts with the loop
        self.step_started = self.last_commit  # when the step under way started (seconds, monotonic)
        self.commit_s = 0.0  # how long the last commit took

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
        step_s = time.monotonic() - self.step_started
        seen, deadline_s = self.preempted()
        stop, timed, notices, final = agree(
            self.stop_requested() or self.stop_file.exists(),
            timer_due(self.settings.checkpoint_every_minutes, time.monotonic() - self.last_commit),
            seen,
            not self.last_chance_taken and deadline_near(deadline_s, time.time(), step_s + self.commit_s),
        )
        decision = decide(
            done,
            self.settings.max_steps,
            self.settings.checkpoint_every,
            stop=bool(stop),
            timed=bool(timed),
            notices=int(notices),
            noticed=self.noticed,
            last_chance=bool(final),
        )
        self.noticed = decision.noticed
        self.last_chance_taken = self.last_chance_taken or decision.last_chance
        if decision.commit:
            self.commit(done, metrics)
        if decision.notice and self.rank == 0:
            print(
                f"rank 0: a node of this group is being preempted (notice {decision.noticed}); checkpoint step {done} "
                "committed",
                flush=True,
            )
        if decision.last_chance and self.rank == 0:
            print(f"rank 0: the preempted node's deadline is near; checkpoint step {done} committed", flush=True)
        if decision.stop:
            print(f"rank {self.rank}: stop requested; checkpoint step {done} committed, exiting", flush=True)
        self.step_started = time.monotonic()
        return decision.stop

    def commit(self, done: int, metrics: dict[str, float]) -> None:
        """Gather the full state (a collective: every rank), rank 0 commits, prunes and queues the durable copy."""
        started = time.monotonic()
        weights, optimizer_state = self.update.full_state()
        if self.rank == 0:
            save = partial(
                save_checkpoint,
                rank=self.rank,
                model=self.update.model,
                weights=weights,
                optimizer_state=optimizer_state,
                scheduler=self.update.scheduler,
                strategy=self.strategy,
                metrics={"step": done, **metrics},
                base_dir=self.base_dir,
            )
            committed = checkpoints.commit(self.root, done, save)
            checkpoints.prune(self.root, self.settings.keep_checkpoints)
            if self.durable:
                self.durable.submit(committed)
        self.last_commit = time.monotonic()
        self.commit_s = self.last_commit - started
