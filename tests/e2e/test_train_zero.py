"""DeepSpeed ZeRO trains like DDP, checkpoints in the one format, and runs as an MPIJob and under Ray Train (CPU).

Every run is the real train step on 2 CPU workers (gloo) with the session's tiny random Llama (tests/e2e/conftest.py:
the demo model's tokenizer, 2 layers of width 64; real weights add nothing here), gradient accumulation 2, a
checkpoint after every step whose metrics.json holds that step's loss averaged over the workers. The reference runs
go through the local executor's MPIJob handler: the MPIJob that `cluster.launcher: mpijob` renders
(eksflow/launchers/mpijob.py), its launcher's `mpirun -np 2` run here with a local hostfile; the SIGTERM run goes
through Ray Train, the default launcher.
"""

import io
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from eksflow.launchers import mpijob
from eksflow.llm.steps.common import checkpoints
from eksflow.llm.steps.train import EXIT_PREEMPTED
from eksflow.llm.steps.train.state import read_metrics
from eksflow.local import run_workflow
from eksflow.local.mpijob import mpirun
from tests.e2e.conftest import training_folder
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 8
RUN_NAME = "zero-test"
# Measured on 2 CPU workers (fp32, gloo, gradient accumulation 2): ZeRO-1, ZeRO-2 (with and without optimizer
# offload) and ZeRO-3 per-step losses differ from DDP's by at most 4.8e-7 over 8 steps (the order in which
# gradients are summed); resumes across DDP and ZeRO by at most 2.4e-7. The bound is 20x that, far below a real
# fault: a wrong AdamW step count on resume moved the next step's loss by 1.5e-2.
ZERO_TOLERANCE = 1e-5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(mpirun() is None, reason="no mpirun: `make setup` installs Open MPI's wheel"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_llama):
    """The session's tiny random Llama (tests/e2e/conftest.py) and a dataset of 40 examples."""
    return training_folder(tmp_path_factory.mktemp("zero"), tiny_llama)


def train_args(workdir: Path, out: Path, strategy: str, zero_stage: int = 2, **extra: object) -> list[str]:
    settings = {
        "dataset-dir": workdir / "data",
        "base-model": workdir / "model",
        "output-dir": out,
        "outputs-dir": out / "outputs",
        "run-name": RUN_NAME,
        "max-steps": MAX_STEPS,
        "max-seq-len": 64,
        "micro-batch-size": 2,
        "grad-accum-steps": 2,
        "checkpoint-every": 1,
        "keep-checkpoints": 100,
        "log-every": 1,
        "num-workers": 2,
        "cpus-per-worker": 1,
        "strategy": strategy,
        "zero-stage": zero_stage,
        "precision": "fp32",  # what ZeRO computes in on CPU: DDP's losses are compared with it step for step
        **extra,
    }
    return [f"--{name}={value}" for name, value in settings.items()]


def run_as_mpijob(state: Path, argv: list[str]):
    """The MPIJob `cluster.launcher: mpijob` renders on the CPU profile, run by the local executor."""
    cfg = config(["cluster.launcher=mpijob"])
    argv = ["--launcher=mpi", *argv]
    manifest = mpijob.manifest(cfg, "train", "eksflow.llm.steps.train", 2, argv, ("final_loss",))
    template = {
        "name": "train",
        "resource": {
            "action": "create",
            "setOwnerReference": True,
            "successCondition": mpijob.SUCCESS,
            "failureCondition": mpijob.failure(cfg),
            "manifest": yaml.safe_dump(manifest, sort_keys=False),
        },
    }
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "zero-"},
        "spec": {
            "entrypoint": "main",
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}],
            "templates": [template, {"name": "main", "dag": {"tasks": [{"name": "train", "template": "train"}]}}],
        },
    }
    result = run_workflow(workflow, state, cwd=ROOT, console=Console(file=io.StringIO()))
    node = result.nodes["train"]
    log = (result.run_dir / "logs" / "train.log").read_text(errors="replace")
    return node, log


def losses(out: Path) -> dict[int, float]:
    """Each step's loss (mean over the workers) from its checkpoint's metrics."""
    return {c.step: read_metrics(c.path)["loss"] for c in checkpoints.committed(out / "checkpoints")}


def worst(run: dict[int, float], reference: dict[int, float]) -> float:
    common = sorted(set(run) & set(reference))
    assert common, f"no common steps: {sorted(run)} vs {sorted(reference)}"
    return max(abs(run[s] - reference[s]) for s in common)


@pytest.fixture(scope="module")
def references(workdir, tmp_path_factory):
    """Uninterrupted runs, each an MPIJob on the local executor: DDP, ZeRO-2 with optimizer offload, ZeRO-3."""
    runs = {}
    for name, strategy, stage, offload in (
        ("ddp", "ddp", 2, False),
        ("zero2-offload", "deepspeed", 2, True),
        ("zero3", "deepspeed", 3, False),
    ):
        out = tmp_path_factory.mktemp(name)
        node, log = run_as_mpijob(
            out / "state", train_args(workdir, out / "train", strategy, stage, cpu_offload=offload)
        )
        assert node.phase == "Succeeded", f"{name}: {node.message}\n{log[-3000:]}"
        runs[name] = out / "train"
    return runs


def test_zero2_and_zero3_match_ddp_step_for_step(references):
    ddp = losses(references["ddp"])
    assert sorted(ddp) == list(range(1, MAX_STEPS + 1))
    assert ddp[MAX_STEPS] < ddp[1], f"DDP's loss did not fall: {ddp}"
    for name in ("zero2-offload", "zero3"):
        zero = losses(references[name])
        assert sorted(zero) == sorted(ddp)
        difference = worst(zero, ddp)
        print(f"{name} vs DDP, 2 CPU workers, steps 1-{MAX_STEPS}: max |loss difference| = {difference:.1e}")
        assert difference <= ZERO_TOLERANCE


def test_a_zero_checkpoint_is_the_one_format(references):
    import torch
    from safetensors.torch import load_file

    ddp, zero = (checkpoints.latest(references[n] / "checkpoints") for n in ("ddp", "zero3"))
    checkpoints.verify(zero.path)  # manifest and commit marker, as every strategy writes them
    ddp_adapter = load_file(ddp.path / "adapter" / "adapter_model.safetensors")
    zero_adapter = load_file(zero.path / "adapter" / "adapter_model.safetensors")
    assert sorted(zero_adapter) == sorted(ddp_adapter)  # PEFT names, whole tensors (not ZeRO-3 partitions)
    assert all(zero_adapter[k].shape == ddp_adapter[k].shape for k in ddp_adapter)
    state = torch.load(zero.path / "trainer_state.pt", weights_only=False)
    assert state["strategy"] == "deepspeed" and state["step"] == MAX_STEPS
    moments = state["optimizer"]["state"]
    assert sorted(moments) == sorted(
        torch.load(ddp.path / "trainer_state.pt", weights_only=False)["optimizer"]["state"]
    )
    assert {float(m["step"]) for m in moments.values()} == {float(MAX_STEPS)}


def resume_from(reference: Path, step: int, out: Path) -> None:
    """A run folder holding `reference`'s checkpoints up to `step`: a retry of that run after step `step`."""
    shutil.copytree(reference / "checkpoints", out / "checkpoints")
    for newer in checkpoints.committed(out / "checkpoints"):
        if newer.step > step:
            shutil.rmtree(newer.path)


@pytest.mark.parametrize(
    ("saved", "resumed", "stage"), [("zero3", "ddp", 2), ("ddp", "deepspeed", 2)], ids=["zero3-to-ddp", "ddp-to-zero2"]
)
def test_resume_across_strategies_is_exact(references, workdir, tmp_path, saved, resumed, stage):
    resume_from(references[saved], 3, tmp_path / "train")
    node, log = run_as_mpijob(tmp_path / "state", train_args(workdir, tmp_path / "train", resumed, stage))
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    assert "resumed from step-00000003 (step 3)" in log
    continued = {s: v for s, v in losses(tmp_path / "train").items() if s > 3}
    assert sorted(continued) == list(range(4, MAX_STEPS + 1))
    difference = worst(continued, losses(references[saved]))
    print(f"{saved} checkpoint resumed under {resumed}: max |loss difference| steps 4-{MAX_STEPS} = {difference:.1e}")
    assert difference <= ZERO_TOLERANCE


def sigterm_after_first_commit(command: list[str], out: Path) -> tuple[int, str]:
    """Run `command` training into `out`, SIGTERM it once its first checkpoint is committed: (exit code, output)."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and checkpoints.latest(out / "checkpoints") is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=600)
    return proc.returncode, output


def test_sigterm_under_zero3_with_ray_train_commits_exits_143_and_resumes_exactly(
    references, workdir, tmp_path, joined_ray
):
    """Ray Train (2 workers on the module's Ray cluster, DeepSpeed adopting Ray's gloo group): SIGTERM to the
    driver, a Spot notice, reaches the workers; they agree on a step, rank 0 commits the gathered ZeRO-3 state, the
    step exits 143; the retry (here as an MPIJob) continues with the uninterrupted run's losses."""
    out = tmp_path / "train"
    command = [sys.executable, "-u", "-m", "eksflow.llm.steps.train", "--launcher=ray"]
    command += train_args(workdir, out, "deepspeed", 3)
    # The first commit, not the progress file, which Ray workers write every 2 s. Ray's driver handles a signal
    # within a second, in which the workers trained up to 4 more steps: the stop lands well before step 8.
    returncode, output = sigterm_after_first_commit(command, out)
    assert returncode == EXIT_PREEMPTED, output[-3000:]
    assert "strategy: deepspeed" in output
    stopped = checkpoints.latest(out / "checkpoints").step
    assert 1 <= stopped < MAX_STEPS, output[-3000:]
    reference = losses(references["zero3"])
    before = worst(losses(out), reference)

    node, log = run_as_mpijob(tmp_path / "state", train_args(workdir, out, "deepspeed", 3))
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    assert f"resumed from step-{stopped:08d} (step {stopped})" in log
    after = worst({s: v for s, v in losses(out).items() if s > stopped}, reference)
    print(f"ZeRO-3, Ray Train: steps 1-{stopped} {before:.1e}; SIGTERM; resumed {stopped + 1}-{MAX_STEPS} {after:.1e}")
    assert before <= ZERO_TOLERANCE and after <= ZERO_TOLERANCE


def test_zero2_under_torchrun_commits_on_sigterm_and_resumes_matching_ddp(references, workdir, tmp_path):
    """`torchrun --nproc-per-node 2`, as a TrainJob's pod runs the step (--launcher=torchrun, the workers meeting in
    the agent's store): a SIGTERM to torchrun reaches both workers, which agree on a step and commit it before the
    agent's 30 s shutdown timeout; the agent exits 1 (its SignalException; retried as 143 would be); the retry
    resumes and every step's loss matches DDP's under mpirun."""
    out = tmp_path / "train"
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--nproc-per-node", "2"]
    command = [*torchrun, "-m", "eksflow.llm.steps.train", "--launcher=torchrun"]
    command += train_args(workdir, out, "deepspeed", 2)
    returncode, output = sigterm_after_first_commit(command, out)
    assert returncode == 1 and "preempted: SIGTERM: stopped after step" in output, output[-3000:]
    assert "rank 1/2: host" in output  # torchrun's second worker trained
    stopped = checkpoints.latest(out / "checkpoints").step
    assert 1 <= stopped < MAX_STEPS, output[-3000:]

    retry = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert retry.returncode == 0, retry.stdout[-3000:] + retry.stderr[-3000:]
    assert f"resumed from step-{stopped:08d} (step {stopped})" in retry.stdout + retry.stderr
    difference = worst(losses(out), losses(references["ddp"]))
    print(
        f"ZeRO-2 under torchrun, SIGTERM after step {stopped}, resumed: max |loss difference| vs DDP {difference:.1e}"
    )
    assert sorted(losses(out)) == list(range(1, MAX_STEPS + 1)) and difference <= ZERO_TOLERANCE


def test_dpo_under_ddp_learns_its_preferences_and_resumes_exactly_under_zero3(workdir, tmp_path):
    """method=dpo, 2 workers of an MPIJob (`mpirun -np 2`, run by the local executor): the reference is the model with
    its adapter disabled, so step 1 (a fresh adapter) scores log 2 with zero rewards; training on 8 pairs (each step's
    global batch) ranks most chosen answers above their rejected ones; a retry of the run after step 2 under ZeRO-3
    with torchrun (the reference forward gathering partitioned weights) continues with the uninterrupted run's losses
    and rewards."""
    import json
    import math

    prefs = tmp_path / "prefs"
    prefs.mkdir()
    rows = [
        {
            "prompt": f"What is {i} plus {i}?",
            "chosen": f"{i} plus {i} is {2 * i}.",
            "rejected": f"{i} plus {i} is {2 * i + 1}.",
        }
        for i in range(8)
    ]
    (prefs / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--nproc-per-node", "2"]

    def argv(out: Path, strategy: str, stage: int) -> list[str]:
        dpo = {"dataset-dir": prefs, "max-steps": 4, "method": "dpo", "learning-rate": 0.01}
        return train_args(workdir, out, strategy, stage, **dpo)

    def train(out: Path, strategy: str, stage: int) -> None:
        command = [*torchrun, "-m", "eksflow.llm.steps.train", "--launcher=torchrun", *argv(out, strategy, stage)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def metrics(out: Path) -> dict[int, dict[str, float]]:
        return {c.step: read_metrics(c.path) for c in checkpoints.committed(out / "checkpoints")}

    reference = tmp_path / "ddp"
    node, log = run_as_mpijob(tmp_path / "state", argv(reference, "ddp", 2))
    assert node.phase == "Succeeded", f"{node.message}\n{log[-3000:]}"
    run = metrics(reference)
    assert sorted(run) == [1, 2, 3, 4]
    assert run[1]["loss"] == pytest.approx(math.log(2), abs=1e-6) and run[1]["rewards/accuracy"] == 0.0
    assert run[4]["rewards/accuracy"] > 0.5 and run[4]["rewards/margin"] > 0.0 and run[4]["loss"] < math.log(2)

    resume_from(reference, 2, tmp_path / "zero3")
    train(tmp_path / "zero3", "deepspeed", 3)
    resumed = metrics(tmp_path / "zero3")
    for step in (3, 4):
        for name in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy"):
            assert resumed[step][name] == pytest.approx(run[step][name], abs=ZERO_TOLERANCE), (step, name)


ALL_LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.parametrize(
    ("launcher", "strategy", "lora"),
    [
        ("torchrun", "deepspeed", {"target_modules": "all-linear", "use_dora": True}),
        ("local", "ddp", {"target_modules": "all-linear", "quantize": "4bit"}),
    ],
    ids=["dora-all-linear-zero3-torchrun", "qlora-all-linear-local"],
)
def test_the_lora_family_trains_on_cpu(workdir, tmp_path, launcher, strategy, lora):
    """DoRA on every linear layer under ZeRO-3 across 2 torchrun workers (the strategy that partitions the base
    weights DoRA's magnitude reads); QLoRA (an NF4 base through bitsandbytes' CPU path) in one process. Each writes
    an adapter on the 7 linear layers of a Llama layer, and its loss falls."""
    import json

    out = tmp_path / "train"
    if launcher == "torchrun":
        command = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--nproc-per-node", "2"]
    else:
        command = [sys.executable]
    command += ["-m", "eksflow.llm.steps.train", f"--launcher={launcher}", f"--lora={json.dumps(lora)}"]
    command += train_args(workdir, out, strategy, 3, learning_rate=0.01)
    if launcher == "local":
        command.append("--num-workers=1")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = losses(out)
    assert sorted(run) == list(range(1, MAX_STEPS + 1)) and run[MAX_STEPS] < run[1], run
    config = json.loads((checkpoints.latest(out / "checkpoints").path / "adapter" / "adapter_config.json").read_text())
    assert {name.rsplit(".", 1)[-1] for name in config["target_modules"]} == ALL_LINEAR
    assert config["use_dora"] is bool(lora.get("use_dora"))
    if lora.get("quantize") == "4bit":
        assert "strategy: ddp (lora.quantize=4bit: a 4-bit replica per worker, DDP)" in done.stdout + done.stderr


def test_a_full_fine_tune_trains_every_weight_resumes_exactly_under_zero3_and_fsdp_and_loads_as_a_model(
    workdir, tmp_path
):
    """train.finetune=full, 2 torchrun workers: DDP trains every weight of the model (no adapter) with a checkpoint a
    step, each holding the whole model; retries of the run after step 2 under ZeRO-3 (each rank holding a partition
    of the weights) and FSDP (a shard) continue with the uninterrupted run's losses; the final folder loads with
    `from_pretrained` as a model whose every weight moved from the base's."""
    import torch
    from transformers import AutoModelForCausalLM

    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--nproc-per-node", "2"]

    def train(out: Path, strategy: str) -> None:
        argv = train_args(workdir, out, strategy, 3, **{"max-steps": 4, "finetune": "full", "learning-rate": 0.001})
        command = [*torchrun, "-m", "eksflow.llm.steps.train", "--launcher=torchrun", *argv]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    reference = tmp_path / "ddp"
    train(reference, "ddp")
    run = losses(reference)
    assert sorted(run) == [1, 2, 3, 4] and run[4] < run[1], run
    final = checkpoints.latest(reference / "checkpoints").path
    assert not (final / "adapter").exists()
    assert (reference / "outputs" / "adapter_dir").read_text() == str(final / "model")
    for strategy in ("deepspeed", "fsdp"):
        resume_from(reference, 2, tmp_path / strategy)
        train(tmp_path / strategy, strategy)
        continued = {s: v for s, v in losses(tmp_path / strategy).items() if s > 2}
        difference = worst(continued, run)
        print(
            f"full fine-tune, DDP checkpoint resumed under {strategy}: max |loss difference| steps 3-4 {difference:.1e}"
        )
        assert sorted(continued) == [3, 4] and difference <= ZERO_TOLERANCE

    tuned = AutoModelForCausalLM.from_pretrained(final / "model").state_dict()
    base = AutoModelForCausalLM.from_pretrained(workdir / "model").state_dict()
    assert sorted(tuned) == sorted(base)
    assert all(not torch.equal(tuned[name], base[name]) for name in base), "a weight did not train"
