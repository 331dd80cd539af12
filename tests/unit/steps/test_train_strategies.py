"""Strategy choice (decision matrix), DeepSpeed configs, and the Trainium argument mapping: pure functions."""

import pytest

from eksflow.llm.steps.common import neuron, strategies
from eksflow.runtime.args import StepInputError

GIB = 1024**3
TOKENS = 8 * 256  # micro_batch_size x max_seq_len


def work(num_params=8_000_000_000, trainable_params=20_000_000, checkpointing=True, weight_bytes=2):
    return strategies.Workload(num_params, trainable_params, TOKENS, checkpointing, weight_bytes)


def plan(requested="auto", **kw):
    args = {"use_gpu": True, "work": work(), "device_memory_bytes": 80 * GIB, "world": 8}
    return strategies.choose(requested, **{**args, **kw})


def test_auto_follows_the_memory_decision_matrix():
    assert plan().strategy == "ddp"  # 8B in bf16 = 18 GiB with context, fits an 80 GiB GPU
    assert plan(work=work(70_000_000_000)).strategy == "fsdp"  # 157 GiB: fits only sharded over 8
    offload = plan(work=work(70_000_000_000, 6_000_000_000), device_memory_bytes=40 * GIB)
    assert (offload.strategy, offload.zero_stage, offload.cpu_offload, offload.fits) == ("deepspeed", 3, True, True)
    refused = plan(work=work(400_000_000_000), device_memory_bytes=24 * GIB, world=2)
    assert not refused.fits and "does not fit" in refused.reason
    assert plan(use_gpu=False, work=work(70_000_000_000)).strategy == "ddp"  # CPU: always DDP over gloo


def test_explicit_strategy_wins_and_says_whether_it_fits():
    assert plan("fsdp").strategy == "fsdp"
    on_cpu = plan("deepspeed", use_gpu=False, zero_stage=3, cpu_offload=True)
    assert (on_cpu.strategy, on_cpu.zero_stage, on_cpu.cpu_offload) == ("deepspeed", 3, True)
    assert not plan("ddp", work=work(70_000_000_000)).fits
    assert plan("ddp", device_memory_bytes=0).fits  # no known budget: nothing is refused
    with pytest.raises(StepInputError, match="zero_stage=4 is not a ZeRO stage"):
        plan("deepspeed", zero_stage=4)


def test_each_zero_stage_shards_more_and_offload_moves_the_moments_to_the_host():
    big_adapter = work(8_000_000_000, 2_000_000_000)

    def need(layout, stage=0, offload=False):
        return strategies.memory_bytes(big_adapter, layout, 8, stage, offload)

    assert need("ddp") > need("deepspeed", 1) > need("deepspeed", 2) > need("deepspeed", 3)
    assert need("deepspeed", 3) == need("fsdp")  # both shard weights, gradients and moments
    assert need("deepspeed", 2) - need("deepspeed", 2, offload=True) == 2_000_000_000 * 8 // 8  # moments / world
    without = strategies.memory_bytes(work(checkpointing=False), "ddp", 1)
    assert without > strategies.memory_bytes(work(checkpointing=True), "ddp", 1)


@pytest.mark.parametrize(
    ("layers", "hidden", "kv", "num_params"),
    [(30, 576, 192, 134_515_008), (32, 4096, 1024, 8_030_261_248), (80, 8192, 1024, 70_553_706_496)],
    ids=["smollm2-135m", "llama-3-8b", "llama-3-70b"],
)
def test_the_adapter_estimate_of_plan_is_near_the_real_lora_size(layers, hidden, kv, num_params):
    rank = 16
    real = layers * rank * ((hidden + hidden) * 2 + (hidden + kv) * 2)  # q, o: hidden -> hidden; k, v: -> kv
    estimate = strategies.estimate_lora_params(num_params, rank, 4)
    assert 0.6 <= estimate / real <= 1.5


def test_deepspeed_config_shape():
    config = strategies.deepspeed_config(
        plan("deepspeed", zero_stage=3, cpu_offload=True),
        micro_batch_size=4,
        grad_accum_steps=2,
        max_grad_norm=1.0,
        bf16=True,
    )
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu"
    assert "train_batch_size" not in config  # DeepSpeed derives it from micro x accum x world
    assert "optimizer" not in config and config["zero_force_ds_cpu_optimizer"] is False  # the loop's own AdamW
    stage2 = strategies.deepspeed_config(
        plan("deepspeed", zero_stage=2, cpu_offload=True),
        micro_batch_size=4,
        grad_accum_steps=1,
        max_grad_norm=1.0,
        bf16=True,
    )
    assert "offload_param" not in stage2["zero_optimization"]  # parameter offload exists only in ZeRO-3


@pytest.mark.parametrize("bf16", [False, True], ids=["cpu-fp32", "gpu-bf16"])
@pytest.mark.parametrize(("stage", "offload"), [(1, False), (2, False), (2, True), (3, False), (3, True)])
def test_deepspeed_accepts_every_config_the_step_builds(stage, offload, bf16):
    config = strategies.deepspeed_config(
        plan("deepspeed", zero_stage=stage, cpu_offload=offload),
        micro_batch_size=4,
        grad_accum_steps=2,
        max_grad_norm=1.0,
        bf16=bf16,
    )
    strategies.validate_deepspeed_config(config)


def test_trainium_mapping_from_a_plain_dict():
    train = {
        "max_steps": 100,
        "micro_batch_size": 2,
        "grad_accum_steps": 4,
        "learning_rate": 2e-4,
        "warmup_steps": 10,
        "min_lr_ratio": 0.05,
        "gradient_checkpointing": True,
        "checkpoint_every": 20,
        "keep_checkpoints": 4,
        "tensor_parallel_size": 8,
    }
    args = neuron.training_arguments(train, "/fsx/run/train")
    assert args["tensor_parallel_size"] == 8
    assert args["zero_1"] is True  # 32 cores / tp 8 = 4 data-parallel ranks
    assert args["bf16"] is True
    assert args["gradient_checkpointing"] is True
    assert (args["save_steps"], args["save_total_limit"], args["save_strategy"]) == (20, 4, "steps")
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (2, 4)
    assert args["lr_scheduler_kwargs"] == {"min_lr_rate": 0.05}
    assert neuron.training_arguments({"tensor_parallel_size": 32}, "/o")["zero_1"] is False


def test_trainium_mapping_refuses_what_neuron_cannot_do():
    with pytest.raises(StepInputError, match="tensor_parallel_size=3"):
        neuron.training_arguments({"tensor_parallel_size": 3}, "/o")
    with pytest.raises(StepInputError, match="no Trainium equivalent"):
        neuron.training_arguments({"strategy": "deepspeed"}, "/o")


def test_neuron_module_does_not_import_optimum():
    import sys

    assert "optimum.neuron" not in sys.modules


def test_train_loop_plans_every_strategy_on_cpu():
    import torch

    from eksflow.llm.steps.train import TrainSettings
    from eksflow.llm.steps.train.parallel import plan_strategy

    cpu = torch.device("cpu")
    assert plan_strategy(TrainSettings(), cpu, 2, 135_000_000, 1_800_000).strategy == "ddp"  # auto on CPU
    assert plan_strategy(TrainSettings(strategy="fsdp"), cpu, 2, 135_000_000, 1_800_000).strategy == "fsdp"
    zero = plan_strategy(TrainSettings(strategy="deepspeed", zero_stage=1), cpu, 2, 135_000_000, 1_800_000)
    assert (zero.strategy, zero.zero_stage) == ("deepspeed", 1)


def tiny_llama_with_lora():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    return get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def test_fsdp_units_are_the_decoder_layers_found_through_the_peft_wrapper():
    import torch

    model = tiny_llama_with_lora()
    units = strategies.fsdp_units(model)
    assert units == list(model.base_model.model.model.layers)
    assert strategies.fsdp_units(model.get_base_model()) == units
    with pytest.raises(StepInputError, match=r"Sequential names no decoder layer class.*use strategy=ddp"):
        strategies.fsdp_units(torch.nn.Sequential(torch.nn.Linear(2, 2)))
