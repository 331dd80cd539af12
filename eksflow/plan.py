"""`plan`: the preflight checks and estimates printed before anything is submitted.

Each rule returns the problems it finds as `field: what is wrong; fix: ...` lines; `check` raises ConfigError with all
of them at once (exit 2), otherwise returns the rows of the plan table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from eksflow.config import ConfigError, PipelineConfig
from eksflow.launchers import retry_attempts, train_layout
from eksflow.profiles import Profile, profile_for
from steps.common import strategies

PRICES = Path(__file__).with_name("prices.yaml")
GIB = 1024**3
MODEL_SIZE = re.compile(r"(\d+(?:\.\d+)?)([mb])\b", re.IGNORECASE)


@dataclass(frozen=True)
class Plan:
    """The preflight table: (what, value) rows."""

    rows: list[tuple[str, str]]


def model_params_b(cfg: PipelineConfig) -> float | None:
    """Base model size in billions: configured, or read from a name such as `smollm2-135m` or `llama-3-8b`."""
    if cfg.cluster.model_params_b:
        return cfg.cluster.model_params_b
    found = MODEL_SIZE.search(cfg.base_model.rsplit("/", 1)[-1])
    if found is None:
        return None
    size = float(found.group(1))
    return size / 1000 if found.group(2).lower() == "m" else size


def available_gib(cfg: PipelineConfig, profile: Profile) -> float:
    """Memory one training process may use: its device's (per Neuron core), or its share of the node's RAM on CPU."""
    if profile.kind == "cpu":
        return profile.memory_gib / max(train_layout(cfg, profile).num_workers, 1)
    return profile.device_memory_gib / profile.cores_per_device


def memory_plan(cfg: PipelineConfig, profile: Profile, params_b: float) -> tuple[str, strategies.Plan]:
    """How the train step will hold the model and the memory per worker that takes, as (label, strategy plan).

    The step's own resolution (TrainSettings.resolve_strategy, the one memory model in steps.common.strategies),
    fed with estimates: parameters from the model's name, the adapter's size from its shape. Trainium splits the
    weights by tensor parallelism, which the same memory model prices.
    """
    settings = train_layout(cfg, profile)
    num_params = int(params_b * 1e9)
    trainable = strategies.estimate_lora_params(num_params, settings.lora.rank, len(settings.lora.target_modules))
    budget = int(available_gib(cfg, profile) * GIB)
    if profile.kind == "trainium":
        work = settings.workload(num_params, trainable, weight_bytes=2)
        need = strategies.memory_bytes(work, "tensor_parallel", settings.tensor_parallel_size)
        fits = need <= budget * strategies.HEADROOM
        return "NeuronTrainer, tensor parallel", strategies.Plan("ddp", 0, False, "Trainium", need, fits)
    plan = settings.resolve_strategy(
        num_params=num_params,
        trainable_params=trainable,
        on_gpu=profile.kind == "gpu",
        device_memory_bytes=budget,
        world=settings.num_workers,
    )
    label: str = plan.strategy
    if plan.strategy == "deepspeed":
        label = f"deepspeed ZeRO-{plan.zero_stage}" + (" with CPU offload" if plan.cpu_offload else "")
    if cfg.train.strategy == "auto" and plan.strategy != "ddp":
        label += " (auto: a replica does not fit one device)"
    return label, plan


def rule_memory(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Estimated memory per worker, with the weights as the strategy holds them, must fit the device (or RAM)."""
    params_b = model_params_b(cfg)
    if params_b is None:
        return [
            f"cluster.model_params_b: cannot tell the size of {cfg.base_model!r} from its name; "
            "fix: --set cluster.model_params_b=<billions>"
        ]
    label, plan = memory_plan(cfg, profile, params_b)
    if not plan.fits:
        return [
            f"train.micro_batch_size: about {plan.memory_bytes / GIB:.1f} GiB per worker needed ({label}), "
            f"{available_gib(cfg, profile):.0f} GiB available on {profile.instance_type}; fix: lower "
            "train.micro_batch_size or train.max_seq_len, set train.gradient_checkpointing=true, add cluster.nodes, "
            "or pick a larger cluster.instance_type"
        ]
    return []


def rule_world_size(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Workers must match the nodes' devices (GPU, Neuron) or fit the node's vCPUs (CPU)."""
    problems = []
    if profile.kind == "cpu":
        threads = cfg.train.num_workers * cfg.train.cpus_per_worker
        if threads > profile.vcpus:
            problems.append(
                f"train.num_workers: {cfg.train.num_workers} workers x {cfg.train.cpus_per_worker} CPUs exceed the "
                f"{profile.vcpus} vCPUs of {profile.instance_type}; fix: lower train.num_workers or "
                "train.cpus_per_worker"
            )
        if cfg.cluster.nodes > 1:
            problems.append("cluster.nodes: CPU training runs in one pod; fix: --set cluster.nodes=1")
        return problems
    world = cfg.cluster.nodes * profile.workers
    if "num_workers" in cfg.train.model_fields_set and cfg.train.num_workers != world:
        problems.append(
            f"train.num_workers: {cfg.train.num_workers} does not match {cfg.cluster.nodes} node(s) x "
            f"{profile.workers} devices of {profile.instance_type} = {world}; fix: --set train.num_workers={world} "
            "or leave it unset (the profile sets it)"
        )
    if "use_gpu" in cfg.train.model_fields_set and cfg.train.use_gpu != (profile.kind == "gpu"):
        problems.append(
            f"train.use_gpu: {cfg.train.use_gpu} on {profile.kind} nodes; fix: leave it unset (the profile sets it)"
        )
    return problems


def rule_efa_single_az(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Multi-node EFA training needs one availability zone."""
    if profile.efa and cfg.cluster.nodes > 1 and not cfg.cluster.zone:
        return [
            f"cluster.zone: {cfg.cluster.nodes} {profile.instance_type} nodes talk over EFA, which does not cross "
            "availability zones; fix: --set cluster.zone=<az>, e.g. us-west-2a"
        ]
    return []


def rule_spot_checkpoints(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Spot training must checkpoint before its last step, or a reclaim loses everything."""
    if cfg.cluster.spot and cfg.train.checkpoint_every >= cfg.train.max_steps:
        return [
            f"train.checkpoint_every: Spot nodes can be reclaimed, but no checkpoint is written before step "
            f"{cfg.train.max_steps}; fix: --set train.checkpoint_every=<fewer steps> or cluster.spot=false"
        ]
    return []


def rule_retry_budget(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Argo x RayJob x Ray Train attempts must stay within cluster.retry_budget."""
    attempts = retry_attempts(cfg)
    if attempts > cfg.cluster.retry_budget:
        return [
            f"cluster.retry_budget: Argo x RayJob x Ray Train allow {attempts} training attempts, more than the "
            f"budget of {cfg.cluster.retry_budget}; fix: lower cluster.rayjob_backoff_limit or raise "
            "cluster.retry_budget"
        ]
    return []


def rule_launcher(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """An MPIJob launches GPU and CPU training; Trainium always runs torchrun in a Volcano Job."""
    if cfg.cluster.launcher == "mpijob" and profile.kind == "trainium":
        return [
            "cluster.launcher: mpijob runs on GPU or CPU nodes; Trainium trains with torchrun in a Volcano Job; "
            "fix: --set cluster.launcher=rayjob"
        ]
    return []


RULES = (rule_memory, rule_launcher, rule_world_size, rule_efa_single_az, rule_spot_checkpoints, rule_retry_budget)


def prices() -> dict[str, object]:
    """The dated on-demand price table (prices.yaml)."""
    loaded: dict[str, object] = yaml.safe_load(PRICES.read_text(encoding="utf-8"))
    return loaded


def check(cfg: PipelineConfig) -> Plan:
    """Run every rule; raise ConfigError listing all problems, or return the plan's rows."""
    profile = profile_for(cfg.cluster.instance_type)
    problems = [line for rule in RULES for line in rule(cfg, profile)]
    if problems:
        raise ConfigError("\n".join(problems))
    layout = train_layout(cfg, profile)
    nodes = cfg.cluster.nodes
    pods = {"cpu": "1 train pod", "gpu": f"1 Ray head + {nodes} worker(s)", "trainium": f"{nodes} torchrun pod(s)"}
    if cfg.cluster.launcher == "mpijob":
        from eksflow import mpijob

        pods["cpu"] = pods["gpu"] = mpijob.describe(cfg)
    table = prices()
    usd: dict[str, float] = table["usd_per_hour"]  # type: ignore[assignment]
    hourly = usd[profile.instance_type] * nodes
    strategy, memory = memory_plan(cfg, profile, model_params_b(cfg) or 0.0)
    need = memory.memory_bytes / GIB
    rows = [
        (
            "instance",
            f"{profile.instance_type} x {nodes} ({profile.kind}, {'Spot' if cfg.cluster.spot else 'on-demand'})",
        ),
        ("pods", pods[profile.kind]),
        ("devices", f"{profile.devices * nodes} ({profile.devices} per node), {profile.efa} EFA per node"),
        ("world size", f"{layout.num_workers} workers"),
        ("strategy", strategy),
        ("memory per worker", f"~{need:.1f} GiB of {available_gib(cfg, profile):.0f} GiB"),
        ("gang admission", f"{cfg.cluster.scheduler} queue {cfg.cluster.queue}"),
        ("training attempts", f"{retry_attempts(cfg)} at most (budget {cfg.cluster.retry_budget})"),
        ("cost per hour", f"${hourly:,.2f} (on-demand, {table['region']}, prices as of {table['as_of']})"),
        ("cost per run", f"${hourly * cfg.cluster.expected_hours:,.2f} for {cfg.cluster.expected_hours:g} h"),
    ]
    return Plan(rows)


def print_plan(plan: Plan, console: Console) -> None:
    """Print the plan as a two-column table."""
    table = Table(title="plan", show_header=False)
    for name, value in plan.rows:
        table.add_row(name, value)
    console.print(table)
