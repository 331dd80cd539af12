"""Kill, preempt and resume the real train step on the real SmolLM2 (docs/reliability.md CK1, CK5, CK6).

Each trainer is `python -m eksflow.llm.steps.train --launcher=local`: the same loop Ray Train runs in its workers, in
one process, so a kill costs ~5 s of model loading instead of Ray's ~20 s start-up and ~7 s shutdown; the last test
runs 2 Ray Train workers (FSDP over gloo) on the module's Ray cluster, with the session's tiny random Llama
(tests/e2e/conftest.py): what it checks is the strategies' exactness, which real weights only make slower. Tiny
settings: max_seq_len 64, micro-batch 2, a checkpoint every 2 steps.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train import EXIT_PREEMPTED
from eksflow.llm.steps.train.state import read_metrics

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 2
STEP_LINE = re.compile(r"\[train\] (\d+)/\d+ loss ([0-9.]+)")
RESUMED = re.compile(r"resumed from step-\d+ \(step (\d+)\)")
# Measured: a resumed run's per-step losses equal the uninterrupted run's exactly (max difference 0.0 on CPU with
# the same thread count, DDP or FSDP); the bound is the printing precision (6 decimals), nothing more.
LOSS_TOLERANCE = 1e-6

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": f"What is {i} plus {i}?", "completion": f"{i} plus {i} is {2 * i}."} for i in range(40)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


class Trainer:
    """One `eksflow.llm.steps.train` process; its merged output is read line by line into `lines`."""

    def __init__(
        self,
        dataset: Path,
        out: Path,
        max_steps: int,
        progress: Path,
        launcher: str = "local",
        workers: int = 1,
        base_model: str = "smollm2-135m-instruct",
        strategy: str = "auto",
        precision: str = "auto",
        checkpoint_every: int = INTERVAL,
        checkpoint_every_minutes: float = 0.0,
        keep_checkpoints: int = 3,
        log_every: int = 100,
    ) -> None:
        command = [
            sys.executable,
            "-u",
            "-m",
            "eksflow.llm.steps.train",
            f"--launcher={launcher}",
            f"--dataset-dir={dataset}",
            f"--base-model={base_model}",
            f"--output-dir={out}",
            f"--outputs-dir={out.parent / 'outputs'}",
            "--run-name=wf-test",
            f"--max-steps={max_steps}",
            "--max-seq-len=64",
            "--micro-batch-size=2",
            f"--checkpoint-every={checkpoint_every}",
            f"--checkpoint-every-minutes={checkpoint_every_minutes}",
            f"--keep-checkpoints={keep_checkpoints}",
            f"--log-every={log_every}",
            f"--num-workers={workers}",
            f"--cpus-per-worker={2 // workers}",
            f"--strategy={strategy}",
            f"--precision={precision}",
        ]
        env = {**os.environ, "ARGO_PROGRESS_FILE": str(progress)}
        self.progress = progress
        progress.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def done_steps(self) -> int:
        try:
            return int(self.progress.read_text().split("/")[0])
        except (OSError, ValueError):
            return -1

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out


def losses(output: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(output)}


def committed_losses(out: Path) -> dict[int, float]:
    """Each committed checkpoint's step loss (averaged over the workers; a run logging every step), by step: what
    2 Ray workers record of every step, since they print at most one step every 2 s."""
    return {c.step: read_metrics(c.path)["loss"] for c in checkpoints.committed(out / "checkpoints")}


def worst_difference(run: dict[int, float], reference: dict[int, float]) -> float:
    """Max |loss difference| over the steps both runs recorded."""
    common = sorted(set(run) & set(reference))
    assert common, f"no step recorded by both runs: {sorted(run)} vs {sorted(reference)}"
    return max(abs(run[s] - reference[s]) for s in common)


def resumed_step(output: str) -> int:
    match = RESUMED.search(output)
    return int(match.group(1)) if match else 0


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120, poll: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    raise AssertionError("trainer made no progress in time")


def test_sigkill_at_random_points_always_resumes_from_the_newest_complete_checkpoint(dataset, tmp_path):
    """CK1: 10 SIGKILLs, half during steps and half during checkpoint saves; then the run finishes."""
    rng = random.Random(1234)
    out, progress, max_steps = tmp_path / "out", tmp_path / "progress", 26
    root = out / "checkpoints"
    expected_start, kills, in_save = 0, 0, 0
    while kills < 10:
        trainer = Trainer(dataset, out, max_steps, progress)
        target = expected_start + rng.randint(1, 2)
        if kills % 2:  # during a save: the moment its temporary folder appears
            alive = wait_for(
                lambda t=trainer, n=target: t.done_steps() >= n and any(root.glob(".tmp-step-*")), trainer.proc
            )
        else:  # during a step: a random moment after step `target` was reported
            alive = wait_for(lambda t=trainer, n=target: t.done_steps() >= n, trainer.proc)
            time.sleep(rng.uniform(0.0, 1.0))
        reached = trainer.done_steps()
        trainer.proc.send_signal(signal.SIGKILL)
        code, output = trainer.finish()
        assert alive and code == -signal.SIGKILL, output[-2000:]
        assert resumed_step(output) == expected_start, output[-2000:]
        in_save += int(any(root.glob(".tmp-step-*")))
        kills += 1
        for folder in checkpoints.committed(root):
            checkpoints.verify(folder.path)  # a published folder is always complete: no partial checkpoint
        newest = checkpoints.latest(root)
        expected_start = newest.step if newest else 0
        assert reached - expected_start <= INTERVAL, f"lost {reached - expected_start} steps at kill {kills}"
    final = Trainer(dataset, out, max_steps, progress)
    code, output = final.finish()
    assert code == 0, output[-3000:]
    assert resumed_step(output) == expected_start
    assert checkpoints.latest(root).step == max_steps
    assert in_save >= 3, f"only {in_save} kills landed inside a save"


def test_sigterm_commits_a_checkpoint_and_the_retry_continues_exactly(dataset, tmp_path):
    """CK6: SIGTERM -> checkpoint committed, exit 143 (retried); CK5: the resumed losses match an uninterrupted run,
    even when the retry trains under FSDP (a 1-rank process group here) from the DDP run's checkpoint."""
    max_steps = 8
    # The reference commits by time only (every step takes longer than 0.6 ms), which checks that cadence too.
    # fp32 throughout: FSDP computes in fp32 on CPU, and the retry's losses are compared with DDP's
    reference = Trainer(
        dataset, tmp_path / "ref", max_steps, tmp_path / "p-ref", precision="fp32", checkpoint_every=1000,
        checkpoint_every_minutes=1e-5,
    )  # fmt: skip
    code, output = reference.finish()
    assert code == 0, output[-3000:]
    uninterrupted = losses(output)
    assert sorted(uninterrupted) == list(range(1, max_steps + 1))
    kept = sorted(p.name for p in (tmp_path / "ref" / "checkpoints").glob("step-*"))
    assert kept == [f"step-{s:08d}" for s in (6, 7, 8)]  # a commit after every step, the newest 3 kept

    out = tmp_path / "out"
    first = Trainer(dataset, out, max_steps, tmp_path / "p", precision="fp32")
    wait_for(lambda: first.done_steps() >= 3, first.proc)  # 3 is between checkpoints (every 2)
    first.proc.send_signal(signal.SIGTERM)
    code, output = first.finish()
    assert code == EXIT_PREEMPTED, output[-3000:]
    stopped = checkpoints.latest(out / "checkpoints").step
    assert stopped == max(losses(output)), "the checkpoint must hold the last finished step"

    retry = Trainer(dataset, out, max_steps, tmp_path / "p", strategy="fsdp", precision="fp32")
    code, output = retry.finish()
    assert code == 0, output[-3000:]
    assert resumed_step(output) == stopped
    assert "saved under ddp, training under fsdp" in output
    resumed = losses(output)
    assert sorted(resumed) == list(range(stopped + 1, max_steps + 1))
    worst = max(abs(resumed[s] - uninterrupted[s]) for s in resumed)
    print(f"resume determinism: max |loss difference| over steps {stopped + 1}-{max_steps} = {worst:.2e}")
    assert worst <= LOSS_TOLERANCE


def test_two_ray_workers_fsdp_learns_stops_on_sigterm_and_resumes_exactly(
    dataset, tmp_path, ray_cluster, monkeypatch, tiny_llama
):
    """Ray Train, 2 workers over gloo. The reference run starts a Ray of its own beside the module's cluster (a
    `ray start` on the machine, which a bare ray.init would join); the others join that cluster through RAY_ADDRESS,
    as the step joins a KubeRay cluster. FSDP: the loss falls; SIGTERM to the driver (a Spot notice) reaches both
    workers through STOP_FILE, they agree on the stopping step, rank 0 commits the gathered full state and the step
    exits 143; the retry continues exactly, and stops on a second SIGTERM as the first run did. (Sharded checkpoints
    resumed under another strategy: the local SIGTERM test above, DDP to FSDP, and tests/e2e/test_train_zero.py,
    ZeRO-3 to DDP on 2 ranks: a checkpoint holds full state whatever the strategy.)"""
    # Room for a SIGTERM seen several steps late (7 under the full suite's load) in both interrupted runs
    max_steps = 24
    out = tmp_path / "out"

    def trainer(folder: Path, checkpoint_every: int = INTERVAL) -> Trainer:
        progress = tmp_path / f"progress-{folder.name}"
        return Trainer(
            dataset, folder, max_steps, progress, launcher="ray", workers=2, strategy="fsdp", precision="fp32",
            base_model=str(tiny_llama), checkpoint_every=checkpoint_every, keep_checkpoints=100, log_every=1,
        )  # fmt: skip

    def interrupt(run: Trainer, after: int) -> tuple[int, str]:
        """SIGTERM once a checkpoint of step `after` or later is committed (the progress file, written every 2 s
        by Ray workers, can be several steps behind)."""
        root = out / "checkpoints"
        wait_for(lambda: (c := checkpoints.latest(root)) is not None and c.step >= after, run.proc, 300, poll=0.05)
        run.proc.send_signal(signal.SIGTERM)
        return run.finish()

    code, output = trainer(tmp_path / "ref", checkpoint_every=1).finish()  # every step's loss, to compare with
    assert code == 0, output[-3000:]
    assert "strategy: fsdp" in output
    assert "Reporting training result" not in output  # a ray.train.report held each commit up to 2 s (train_loop)
    reference = committed_losses(tmp_path / "ref")
    assert sorted(reference) == list(range(1, max_steps + 1))
    assert reference[max_steps] < reference[min(reference)], f"FSDP loss did not decrease: {reference}"
    ray_cluster.join(monkeypatch)

    code, output = interrupt(trainer(out), after=2)
    assert code == EXIT_PREEMPTED, output[-3000:]
    stopped = checkpoints.latest(out / "checkpoints").step
    assert 2 <= stopped < max_steps - 2
    assert not (out / "checkpoints" / "LEASE").exists()  # released on the way out: the retry need not wait

    code, output = interrupt(trainer(out), after=stopped + 1)
    assert code == EXIT_PREEMPTED, output[-3000:]
    assert resumed_step(output) == stopped
    first_stop, stopped = stopped, checkpoints.latest(out / "checkpoints").step
    assert first_stop < stopped < max_steps
    resumed = worst_difference({s: v for s, v in committed_losses(out).items() if s > first_stop}, reference)
    print(
        f"2 workers, FSDP: stopped at steps {first_stop} and {stopped} of {max_steps} (SIGTERMs after steps 2 and "
        f"{first_stop + 1}); resumed: max |loss difference| from the uninterrupted run {resumed:.2e}"
    )
    assert resumed <= LOSS_TOLERANCE
