r"""Fine-tune a LoRA adapter (or every weight) on the staged dataset with Ray Train or mpirun (DDP, FSDP or ZeRO).

    python -m eksflow.llm.steps.train --dataset-dir=/fsx/run/data --base-model=smollm2-135m-instruct \
        --output-dir=/fsx/run/train

Locally Ray starts in-process (`ray.init(address="local")`, never a `ray start` cluster it happens to find); inside
a KubeRay RayJob the same entrypoint joins the cluster through RAY_ADDRESS. Every `checkpoint_every` steps rank 0
commits a checkpoint under <output_dir>/checkpoints (adapter, optimizer, scheduler, RNG, step; see
eksflow.llm.steps.common.checkpoints); a rerun with the same output dir resumes from the newest verified checkpoint, and
the data order is a pure function of (seed, step), so it continues exactly.
Checkpoints hold full (unsharded) state keyed by parameter name, whatever the strategy (`strategy`: DDP replicas,
FSDP2 shards per decoder layer, or ZeRO partitions, gathered; see eksflow.llm.steps.common.strategies and
eksflow.llm.steps.train.zero), so a run may resume under another strategy.

Data: the driver tokenizes train.jsonl once, before any worker starts, into a memory-mapped Arrow cache keyed by
the data and the tokenizer (eksflow.llm.steps.common.token_cache, under --token-cache-dir): workers, retries and later
runs on the same data map it instead of tokenizing (validate_data, counting tokens with the same tokenizer, usually
built it already), and a micro-batch costs O(micro_batch_size) at any dataset size (eksflow.llm.steps.train.data).

`--launcher=local` runs the same training loop in this process (world size 1, no Ray; FSDP and ZeRO get a 1-rank
process group): tests and benchmarks use it to skip Ray's start-up and shutdown (~25 s on 2 CPU cores).
`--launcher=mpi` is one rank of `mpirun -np N` (an MPIJob's launcher): rank 0 drives, every rank trains
(eksflow.llm.steps.train.mpi); `--launcher=torchrun` is one worker of torchrun (a Kubeflow TrainJob's pods), the
same way (eksflow.llm.steps.train.torchrun). A lease
(eksflow.llm.steps.common.lease) keeps a second trainer off the same checkpoints, and the checkpoint root records the
run_name: a retry resumes, another run is refused. With `--checkpoint-uri=s3://...` each committed checkpoint also gets
a durable copy in the background (marker last), restored when the local root is empty.

Spot: SIGTERM asks every worker to stop after the current step; rank 0 commits a checkpoint and the step exits
with EXIT_PREEMPTED (143, what a SIGTERM-killed process reports), which the workflow's retry expression retries
(it retries everything but 2, bad input); the retry resumes from that checkpoint. One optimizer step plus a LoRA
commit takes seconds, well inside the 2-minute Spot notice and the default 30 s grace period on CPU demo sizes.

Outputs (one file each under --outputs-dir):
    adapter_dir     what trained, inside the last checkpoint: the LoRA adapter (peft format), or with
                    train.finetune=full the whole model's folder (safetensors, config.json, tokenizer), which
                    `from_pretrained` and vLLM load as a model
    checkpoint_dir  the last committed checkpoint
    final_loss      mean training loss over the last logging window
    tokens_per_s    training throughput: non-padding tokens per second, all workers
    mlflow_run_id   the MLflow run with params and metrics ("" when MLflow was unreachable)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from eksflow.llm.steps.common import strategies, vllm_lora
from eksflow.llm.steps.common.base_model import default_cache_dir
from eksflow.llm.steps.common.chat_template import TemplateSettings
from eksflow.llm.steps.common.data import Method
from eksflow.llm.steps.common.trained import ModelKind
from eksflow.runtime.args import Location, Settings, StepArgs
from eksflow.runtime.preflight import Layout, Preflight

# Ray Train restarts a failed worker group this many times within one attempt, from the last committed checkpoint:
# a worker's node lost without notice costs the steps since it, not a new job. `plan` counts these restarts in the
# one retry budget (Argo x RayJob x Ray Train); a preempted node's restarts Ray counts apart (max_preemption_failures).
MAX_FAILURES = 1
EXIT_PREEMPTED = 143  # 128 + SIGTERM: retried by the workflow's retry expression (only 2 is not)
# How `--launcher` runs the training loop, by name; the driver has one launch function each (step.py LAUNCHES).
Launcher = Literal["ray", "local", "mpi", "torchrun"]
LAUNCHERS: dict[Launcher, str] = {
    "ray": "Ray Train workers",
    "local": "this process",
    "mpi": "one rank of `mpirun` (eksflow.llm.steps.train.mpi)",
    "torchrun": "one worker of `torchrun`, a TrainJob's (eksflow.llm.steps.train.torchrun)",
}
Precision = Literal["auto", "bf16", "fp32"]  # resolved per worker: eksflow.llm.steps.train.parallel.resolve_precision
# peft's name for every linear layer of the model but its output head: on a Llama-style model the attention's q, k, v,
# o and the MLP's gate, up, down projections (peft writes the names it found into adapter_config.json).
ALL_LINEAR = "all-linear"
# How the frozen base is held while the adapter trains: as loaded (fp32, bf16 under autocast), or 4bit: QLoRA, NF4
# weights through bitsandbytes (eksflow.llm.steps.train.model).
Quantize = Literal["none", "4bit"]
# Bytes per base parameter in NF4: 4 bits, plus an fp32 absmax per 64-weight block (bitsandbytes' default blocksize)
NF4_WEIGHT_BYTES = 0.5 + 4 / 64
# What trains: an adapter over the frozen base (lora), or every weight of the model (full; train/model.py)
Finetune = Literal["lora", "full"]


class LoraSettings(Settings):
    """Low-rank adapter shape (peft LoraConfig), DoRA, and the base model's quantization (QLoRA)."""

    rank: int = Field(16, ge=1, le=256, description="adapter rank r")
    alpha: int = Field(32, ge=1, description="scaling numerator; usually 2 x rank")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: Annotated[tuple[str, ...], Field(min_length=1)] | Literal["all-linear"] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj"),
        description="module names, or all-linear: every linear layer but the output head (attention and MLP)",
    )
    use_dora: bool = Field(
        False,
        description="DoRA: the adapter also learns each weight's magnitude; vLLM serves no DoRA adapter, so "
        "register merges it into its base and the rollout serves it as a model of its own",
    )
    quantize: Quantize = Field(
        "none", description="4bit: QLoRA, the frozen base in NF4 (bitsandbytes) under DDP; the adapter stays fp32"
    )

    def modules_per_layer(self, linear_layers: int) -> int:
        """Adapted matrices per decoder layer, where a layer has `linear_layers` linear layers (all-linear's)."""
        return linear_layers if self.target_modules == ALL_LINEAR else len(self.target_modules)

    def peft_config(self) -> Any:
        """The peft LoraConfig for a causal LM (peft imported here: the pipeline imports this module)."""
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets if isinstance(targets, str) else list(targets),
            use_dora=self.use_dora,
            task_type="CAUSAL_LM",
        )


class DpoSettings(Settings):
    """Direct preference optimization (config section `train.dpo`; read only with `method: dpo`)."""

    beta: float = Field(
        0.1, gt=0.0, le=100.0, description="how far the policy may move from the reference: the implicit reward's scale"
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="sigmoid: DPO's -log sigmoid(beta x margin) on summed log-probs; ipo: (margin - 1/(2 beta))^2 "
        "on length-normalized log-probs (TRL's loss_type names)",
    )


class TrainSettings(TemplateSettings):
    """Training hyper-parameters and layout (config section `train`); the chat template from TemplateSettings."""

    max_steps: int = Field(24, ge=1, description="optimizer steps")
    micro_batch_size: int = Field(8, ge=1, description="examples per worker per forward pass")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches per optimizer step")
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0, description="peak learning rate")
    warmup_steps: int = Field(3, ge=0, description="linear warm-up steps before the cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="final LR as a fraction of the peak")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay on the LoRA weights")
    max_grad_norm: float = Field(1.0, gt=0.0, description="clip the gradient norm to this before each step")
    max_seq_len: int = Field(256, ge=16, description="tokens per example; longer examples are truncated")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory")
    pack_sequences: bool = Field(
        False,
        description="put each micro-batch's examples end to end in rows of max_seq_len tokens (no padding; "
        "attention and positions kept per example): faster when example lengths vary",
    )
    lora: LoraSettings = Field(LoraSettings(), description="LoRA rank, alpha, dropout and target modules")
    method: Method = Field(
        "sft",
        description="sft: supervised on prompt-completion or conversational records; dpo: preference tuning on "
        "prompt/chosen/rejected records, the reference being the base model (the adapter disabled)",
    )
    dpo: DpoSettings = Field(DpoSettings(), description="DPO's beta and loss (method: dpo)")
    finetune: Finetune = Field(
        "lora",
        description="lora: an adapter over the frozen base (train.lora); full: every weight trains (fp32 weights, "
        "gradients and AdamW's two moments, 16 bytes a parameter, sharded by fsdp or deepspeed; with method dpo "
        "plus a frozen copy of the base as the reference) and the output is a whole model; train.lora's settings "
        "are unused with full",
    )
    # Measured on 2 cores: 2 DDP workers x 1 thread run at 0.96-0.975x a bare loop, 1 worker x 2 threads at 0.81x.
    num_workers: int = Field(2, ge=1, description="Ray Train workers (one per GPU on GPU nodes)")
    cpus_per_worker: int = Field(1, ge=1, description="CPU threads per worker")
    use_gpu: bool = Field(False, description="one GPU per worker, NCCL")
    precision: Precision = Field(
        "auto",
        description="compute dtype of the frozen model: auto is bf16 on GPU, and on a CPU with AMX (Xeon Sapphire "
        "Rapids or later: EC2 m7i, c7i, r7i) under DDP, fp32 otherwise; the LoRA weights and AdamW stay fp32",
    )
    strategy: strategies.Strategy = Field(
        "auto", description="auto (by memory, see eksflow.llm.steps.common.strategies), ddp, fsdp or deepspeed (ZeRO)"
    )
    zero_stage: int = Field(
        2, ge=1, le=3, description="DeepSpeed ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters sharded"
    )
    cpu_offload: bool = Field(False, description="DeepSpeed: keep optimizer state (and ZeRO-3 params) on CPU")
    tensor_parallel_size: int = Field(1, ge=1, description="Trainium only (eksflow.llm.steps.common.neuron)")
    checkpoint_every: int = Field(8, ge=1, description="commit a checkpoint every N optimizer steps")
    checkpoint_every_minutes: float = Field(0.0, ge=0.0, description="also commit after this many minutes; 0: off")
    keep_checkpoints: int = Field(3, ge=1, description="keep the newest K committed checkpoints")
    log_every: int = Field(5, ge=1, description="steps between loss/LR/throughput logs")
    seed: int = Field(0, description="seed of the LoRA init, data order and dropout")

    @model_validator(mode="after")
    def _bf16_on_cpu_is_ddp(self) -> TrainSettings:
        if self.precision == "bf16" and not self.use_gpu and self.strategy in ("fsdp", "deepspeed"):
            raise ValueError(
                f"precision=bf16 on CPU trains under DDP only; strategy={self.strategy} trains in fp32 there "
                "(precision=auto or fp32)"
            )
        return self

    @model_validator(mode="after")
    def _dpo_rows_unpacked(self) -> TrainSettings:
        if self.method == "dpo" and self.pack_sequences:
            raise ValueError(
                "pack_sequences=true with method=dpo: DPO sums each answer's log-probabilities over a row of its "
                "own (chosen and rejected side by side), so its rows are padded, not packed; set pack_sequences=false"
            )
        return self

    @model_validator(mode="after")
    def _quantized_base_under_ddp(self) -> TrainSettings:
        if self.lora.quantize == "4bit" and self.strategy in ("fsdp", "deepspeed"):
            raise ValueError(
                f"lora.quantize=4bit trains under DDP only (each worker holds the whole 4-bit base, a quarter of a "
                f"bf16 replica); strategy={self.strategy} would shard and cast its packed weights: set strategy=ddp "
                "or auto"
            )
        return self

    @model_validator(mode="after")
    def _full_fine_tune_unquantized(self) -> TrainSettings:
        if self.finetune == "full" and self.lora.quantize == "4bit":
            raise ValueError(
                "lora.quantize=4bit with finetune=full: a 4-bit base is frozen (QLoRA trains an adapter over it), "
                "a full fine-tune trains every weight in fp32; set lora.quantize=none or finetune=lora"
            )
        return self

    def workload(
        self, num_params: int, trainable_params: int, weight_bytes: float, reference_bytes: float = 0.0
    ) -> strategies.Workload:
        """The memory model's inputs: the model's size and what these settings put through it per micro-batch."""
        return strategies.Workload(
            num_params=num_params,
            trainable_params=trainable_params,
            # a DPO micro-batch of n pairs is 2n rows (chosen, rejected); the reference forward keeps no activations
            tokens=self.micro_batch_size * self.max_seq_len * (2 if self.method == "dpo" else 1),
            gradient_checkpointing=self.gradient_checkpointing,
            weight_bytes=weight_bytes,
            reference_bytes=reference_bytes,
        )

    @property
    def registers(self) -> ModelKind:
        """What register makes of what this trains, so how it is served: a whole model, or an adapter on its base.

        An adapter the pinned vLLM cannot serve as a LoRA (DoRA, a module with no vLLM LoRA layer) is merged into
        its base when it registers, and served as a model of its own like a full fine-tune.
        """
        if self.finetune == "full" or vllm_lora.unservable_setting(self.lora.use_dora, self.lora.target_modules):
            return "model"
        return "adapter"

    def reference_bytes(self, num_params: int, on_gpu: bool) -> float:
        """Bytes of DPO's frozen reference with finetune=full; 0 otherwise (LoRA's reference is its own base).

        A copy of the base's weights on every worker: bf16 on GPU, fp32 on CPU; no gradients or optimizer state.
        """
        if self.finetune != "full" or self.method != "dpo":
            return 0.0
        return float(num_params * (2 if on_gpu else 4))

    def resolve_strategy(
        self, *, num_params: int, trainable_params: int, on_gpu: bool, device_memory_bytes: int, world: int
    ) -> strategies.Plan:
        """The strategy and memory per worker for a model of this size: the one memory model (common/strategies.py).

        The train step calls it with the loaded model's counted parameters, `plan` with its estimates, so both
        resolve `auto` alike and report the same memory.
        """
        if self.lora.quantize == "4bit":  # a 4-bit replica per worker (_quantized_base_under_ddp)
            work = self.workload(num_params, trainable_params, weight_bytes=NF4_WEIGHT_BYTES)
            plan = strategies.choose(
                "ddp", use_gpu=on_gpu, work=work, device_memory_bytes=device_memory_bytes, world=world
            )
            return dataclasses.replace(plan, reason="lora.quantize=4bit: a 4-bit replica per worker, DDP")
        if self.finetune == "full":
            # Every parameter trains (16 bytes each, trainable); on GPU a bf16 copy of the weights computes besides
            # the fp32 ones, on CPU the fp32 weights compute themselves.
            work = self.workload(
                num_params,
                num_params,
                weight_bytes=2 if on_gpu else 0,
                reference_bytes=self.reference_bytes(num_params, on_gpu),
            )
        else:
            work = self.workload(num_params, trainable_params, weight_bytes=2 if on_gpu else 4)  # bf16 GPU, fp32 CPU
        return strategies.choose(
            self.strategy,
            use_gpu=on_gpu,
            work=work,
            device_memory_bytes=device_memory_bytes,
            world=world,
            zero_stage=self.zero_stage,
            cpu_offload=self.cpu_offload,
        )


class Args(TrainSettings, StepArgs):
    """Train step arguments."""

    dataset_dir: Path = Field(description="staged dataset folder holding train.jsonl")
    base_model: Location = Field(
        description="demo name, model folder, or s3:// prefix (eksflow.llm.steps.common.base_model)"
    )
    model_cache_dir: Path = Field(default_factory=default_cache_dir, description="cache for resolved base models")
    token_cache_dir: Path | None = Field(
        None, description="tokenized copies of train.jsonl, shared by runs; default <model_cache_dir>/tokenized"
    )
    output_dir: Path = Field(description="run folder on shared storage; checkpoints live under it")
    run_name: str = Field("local", description="the workflow name: a retry resumes, a new run starts fresh")
    checkpoint_uri: Location = Field("", description="s3:// prefix for a durable copy of every checkpoint; '' for none")
    launcher: Launcher = Field("ray", description="; ".join(f"{name}: {how}" for name, how in LAUNCHERS.items()))
    tracking_uri: Location = Field("", description="MLflow tracking URI for params and losses; empty: no tracking")
    experiment: str = Field("eksflow", description="MLflow experiment of the training run")


class Outputs(BaseModel):
    """Train step outputs."""

    adapter_dir: str
    checkpoint_dir: str
    final_loss: float
    tokens_per_s: float
    mlflow_run_id: str


# Prometheus gauges the controller emits from these outputs (eksflow_<task>_<output>, labelled by pipeline).
GAUGES = {"final_loss": "mean loss of the last logging window", "tokens_per_s": "throughput, all workers"}


def preflight(args: Mapping[str, object], layout: Layout) -> Preflight:
    """`plan`'s checks of a training job (memory per worker, strategy, Spot checkpoints): train/sizing.py."""
    from eksflow.llm.steps.train import sizing

    return sizing.preflight(args, layout)
