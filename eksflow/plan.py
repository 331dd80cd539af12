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

PRICES = Path(__file__).with_name("prices.yaml")
GIB = 1024**3
# Rough LoRA memory model (DDP: every worker holds the whole base model; FSDP: 1/world of it): weights x 1.2 for
# the CUDA/Neuron context, adapter optimizer state and buffers, plus activations of about 0.5 MiB per token per
# billion parameters (bf16, ~34 x hidden x layers bytes per token), an eighth of that with gradient checkpointing.
OVERHEAD = 1.2
ACTIVATION_BYTES_PER_TOKEN_PER_B = 0.5 * 1024**2
HEADROOM = 0.9  # refuse plans that need more than 90% of device memory: fragmentation and NCCL buffers need the rest
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


def memory_per_worker_gib(cfg: PipelineConfig, profile: Profile, params_b: float, shards: int = 1) -> float:
    """Estimated memory one training process needs on its device (or in RAM on CPU), weights split `shards` ways."""
    bytes_per_param = 4 if profile.kind == "cpu" else 2  # fp32 on CPU, bf16 on GPU and Trainium
    weights = params_b * 1e9 * bytes_per_param * OVERHEAD / shards
    tokens = cfg.train.micro_batch_size * cfg.train.max_seq_len
    activations = tokens * params_b * ACTIVATION_BYTES_PER_TOKEN_PER_B
    if cfg.train.gradient_checkpointing:
        activations /= 8
    return (weights + activations) / GIB


def available_gib(cfg: PipelineConfig, profile: Profile) -> float:
    """Memory one training process may use: its device's (per Neuron core), or its share of the node's RAM on CPU."""
    if profile.kind == "cpu":
        return profile.memory_gib / max(train_layout(cfg, profile).num_workers, 1)
    return profile.device_memory_gib / profile.cores_per_device


def sharding(cfg: PipelineConfig, profile: Profile, params_b: float) -> tuple[str, int]:
    """How the train step will hold the weights, and over how many workers they are split.

    Mirrors steps.common.strategies: `auto` shards (FSDP) only on GPUs and only when a replica does not fit one
    device; Trainium splits them by tensor parallelism.
    """
    if profile.kind == "trainium":
        return "NeuronTrainer, tensor parallel", cfg.train.tensor_parallel_size
    world = train_layout(cfg, profile).num_workers
    if cfg.train.strategy == "fsdp":
        return "fsdp", world
    replica_fits = memory_per_worker_gib(cfg, profile, params_b) <= available_gib(cfg, profile) * HEADROOM
    if cfg.train.strategy == "auto" and profile.kind == "gpu" and world > 1 and not replica_fits:
        return "fsdp (auto: a replica does not fit one device)", world
    return "ddp", 1


def rule_memory(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Estimated memory per worker, with the weights as the strategy holds them, must fit the device (or RAM)."""
    params_b = model_params_b(cfg)
    if params_b is None:
        return [
            f"cluster.model_params_b: cannot tell the size of {cfg.base_model!r} from its name; "
            "fix: --set cluster.model_params_b=<billions>"
        ]
    strategy, shards = sharding(cfg, profile, params_b)
    need = memory_per_worker_gib(cfg, profile, params_b, shards)
    available = available_gib(cfg, profile)
    if need > available * HEADROOM:
        return [
            f"train.micro_batch_size: about {need:.1f} GiB per worker needed ({strategy}), {available:.0f} GiB "
            f"available on {profile.instance_type}; fix: lower train.micro_batch_size or train.max_seq_len, set "
            "train.gradient_checkpointing=true, add cluster.nodes, or pick a larger cluster.instance_type"
        ]
    return []


def rule_strategy(cfg: PipelineConfig, profile: Profile) -> list[str]:
    """Only strategies the training loop runs: DeepSpeed is planned by `auto` in the step but refused there."""
    if cfg.train.strategy == "deepspeed":
        return [
            "train.strategy: deepspeed is not run by the training loop (only its config is built and validated); "
            "fix: --set train.strategy=fsdp (parameters sharded over the workers) or auto"
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


RULES = (rule_memory, rule_strategy, rule_world_size, rule_efa_single_az, rule_spot_checkpoints, rule_retry_budget)


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
    table = prices()
    usd: dict[str, float] = table["usd_per_hour"]  # type: ignore[assignment]
    hourly = usd[profile.instance_type] * nodes
    params_b = model_params_b(cfg) or 0.0
    strategy, shards = sharding(cfg, profile, params_b)
    need = memory_per_worker_gib(cfg, profile, params_b, shards)
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
