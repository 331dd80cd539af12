"""The LoRA family (train.lora.target_modules: all-linear, use_dora, quantize): settings, serving checks, tags, plan."""

import ast
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow import plan
from eksflow.config import load_config
from eksflow.llm import engines
from eksflow.llm.steps import register
from eksflow.llm.steps.common import tracking, vllm_lora
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.llm.steps.train import LoraSettings, TrainSettings, sizing
from eksflow.runtime.preflight import Layout
from pipelines import llama_lora, lora_sweep
from pipelines.lora_sweep import LoraSweepConfig
from tests.flagship import config, pipeline

LLAMA_LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256)  # fmt: skip
    return LlamaForCausalLM(shape)


def adapted_modules(model) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


def test_all_linear_adapts_attention_and_mlp_but_not_the_output_head():
    from peft import get_peft_model

    lora = LoraSettings(target_modules="all-linear")
    model = get_peft_model(tiny_llama(), lora.peft_config())
    assert adapted_modules(model) == LLAMA_LINEAR  # lm_head left out, as peft's all-linear does
    assert LoraSettings().target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert lora.modules_per_layer(7) == 7 and LoraSettings().modules_per_layer(7) == 4


def test_dora_adds_a_trained_magnitude_per_adapted_weight():
    from peft import get_peft_model

    model = get_peft_model(tiny_llama(), LoraSettings(use_dora=True, target_modules=("q_proj",)).peft_config())
    magnitudes = [n for n, p in model.named_parameters() if "lora_magnitude_vector" in n and p.requires_grad]
    assert len(magnitudes) == 2  # q_proj of each of the 2 layers


@pytest.mark.parametrize(
    ("lora", "field"),
    [({"target_modules": "attention"}, "target_modules"), ({"target_modules": []}, "target_modules"),
     ({"quantize": "8bit"}, "quantize")],
    ids=["unknown-shorthand", "no-module", "unknown-quantization"],
)  # fmt: skip
def test_bad_lora_settings_are_refused_at_their_field(lora, field):
    with pytest.raises(ValidationError) as raised:
        LoraSettings.model_validate(lora)
    assert all(error["loc"][0] == field for error in raised.value.errors())


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_a_4bit_base_trains_under_ddp_only(strategy):
    with pytest.raises(ValidationError, match=f"lora.quantize=4bit trains under DDP only .*strategy={strategy}"):
        TrainSettings.model_validate({"strategy": strategy, "lora": {"quantize": "4bit"}})
    settings = TrainSettings.model_validate({"strategy": "auto", "lora": {"quantize": "4bit"}})
    resolved = settings.resolve_strategy(
        num_params=8 * 10**9, trainable_params=10**7, on_gpu=True, device_memory_bytes=24 * 2**30, world=4
    )
    # 8B in bf16 (16 GB) is sharded over 4 GPUs of 24 GiB; in NF4 (~4.5 GB) each GPU holds a replica
    unquantized = TrainSettings().resolve_strategy(
        num_params=8 * 10**9, trainable_params=10**7, on_gpu=True, device_memory_bytes=24 * 2**30, world=4
    )
    assert (resolved.strategy, resolved.fits) == ("ddp", True) and "4-bit replica" in resolved.reason
    assert unquantized.strategy == "fsdp"  # where a bf16 replica does not fit


def engine_source(relative: str) -> str:
    site = engines.folder(engines.ENGINES["vllm"]) / "lib" / "python3.11" / "site-packages" / "vllm"
    if not (site / relative).is_file():
        pytest.skip(f"the pinned vLLM engine is not installed ({site}): `make setup` installs it")
    return (site / relative).read_text(encoding="utf-8")


def test_the_pinned_vllm_serves_a_lora_on_every_module_all_linear_adapts_on_llama():
    """vLLM 0.32 puts a LoRA layer on every LinearBase of the model (vllm/lora/utils.py, get_supported_lora_modules)
    and unpacks the fused ones by packed_modules_mapping: read from its Llama's source, what vllm_lora accepts."""
    source = engine_source("model_executor/models/llama.py")
    linears = set(re.findall(r"self\.(\w+) = \w*(?:Parallel|Replicated)Linear\(", source))
    (mapping,) = re.findall(r"packed_modules_mapping = (\{.*?\})", source, re.DOTALL)
    packed = ast.literal_eval(mapping)
    served = set().union(*(packed.get(name, [name]) for name in linears))
    assert served == LLAMA_LINEAR == vllm_lora.LORA_MODULES


def test_the_pinned_vllm_refuses_dora_adapters():
    """Where vLLM 0.32 says so: PEFTHelper._validate_features, called by validate_legal on every adapter it loads."""
    assert 'error_msg.append("vLLM does not yet support DoRA.")' in engine_source("lora/peft_helper.py")


@pytest.mark.parametrize("overrides", [["train.lora.use_dora=true"], ['train.lora.target_modules=["c_attn"]']],
                         ids=["dora", "module-without-a-vllm-layer"])  # fmt: skip
def test_an_adapter_vllm_cannot_serve_as_a_lora_rolls_out_merged_as_a_model_of_its_own(overrides):
    """It registers merged into its base (kind model), so the rollout serves it as a full fine-tune's: no base model
    fleet, each version on a fleet of its own."""
    cfg = config(overrides)
    assert cfg.train.registers == "model" and config([]).train.registers == "adapter"
    tasks = set(llama_lora.build(cfg).templates)
    assert {"publish-champion", "candidate-vllm", "retire-deployment"} <= tasks and "prepare-fleet" not in tasks


def test_plan_lists_the_adapter_and_passes_qlora_on_all_linear():
    rows = dict(plan.check(pipeline(["train.lora.target_modules=all-linear", "train.lora.quantize=4bit"])).rows)
    assert rows["train: adapter"] == (
        "LoRA rank 16 on all-linear (attention and MLP); base in 4-bit NF4 (QLoRA), served unquantized"
    )
    assert dict(plan.check(pipeline([])).rows)["train: adapter"] == "LoRA rank 16 on q_proj, k_proj, v_proj, o_proj"
    sweep = lora_sweep.build(load_config(LoraSweepConfig, None, ["train.lora.use_dora=true"]))  # it rolls nothing out
    assert dict(plan.check(sweep).rows)["train: adapter"] == (
        "DoRA rank 16 on q_proj, k_proj, v_proj, o_proj; vLLM cannot serve it as a LoRA: merged into its base at "
        "register time and rolled out as a model of its own"
    )
    # a renderer takes it as a step argument (the train step's Args parse the same JSON)
    assert (
        llama_lora.LlamaLoraConfig.model_validate({"train": {"lora": {"quantize": "4bit"}}}).train.lora.quantize
        == "4bit"
    )


def test_all_linear_counts_every_linear_layer_in_the_memory_model():
    layout = Layout("gpu", "p4d.24xlarge", nodes=1, workers=1, memory_per_worker_gib=80.0, spot=False, model_params_b=0)
    few = sizing.memory_plan(TrainSettings(), layout, 8.0)[1]
    every = sizing.memory_plan(TrainSettings.model_validate({"lora": {"target_modules": "all-linear"}}), layout, 8.0)[1]
    assert every.memory_bytes > few.memory_bytes


def test_trainium_refuses_a_quantized_base():
    settings = {"lora": {"quantize": "4bit"}, "base_model": "llama-3-8b"}
    layout = Layout(
        "trainium", "trn1.32xlarge", nodes=1, workers=1, memory_per_worker_gib=32.0, spot=False, model_params_b=0
    )
    problems = sizing.preflight(settings, layout).problems
    assert any(
        p.startswith("train.lora.quantize: 4bit needs bitsandbytes, which has no Trainium path") for p in problems
    )


def test_register_merges_a_dora_adapter_into_its_base_as_a_model_and_keeps_its_tags(tmp_path):
    """vLLM cannot serve DoRA as a LoRA: the version is the adapter merged into its base (artifact model, kind model),
    the adapter logged beside it, its lora.* tags kept; the merged weights are peft's merge of it."""
    import torch
    from peft import PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    base, folder = tmp_path / "base", tmp_path / "dora"
    tiny_llama().save_pretrained(base)
    AutoTokenizer.from_pretrained(resolve_model(DEMO_MODEL, default_cache_dir())).save_pretrained(base)
    lora = LoraSettings(target_modules="all-linear", use_dora=True, rank=4)
    dora = get_peft_model(tiny_llama(), lora.peft_config())
    torch.manual_seed(1)
    for name, weight in dora.named_parameters():  # trained: DoRA's update is zero as peft initializes it
        if "lora_B" in name:
            weight.data.normal_(std=0.1)
    dora.save_pretrained(folder)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = register.Args.model_validate(
        {
            "adapter_dir": folder,
            "base_model": str(base),
            "metrics": {"exact_match": 0.9},
            "dataset_digest": "sha256:" + "d" * 64,
            "workflow_name": "wf",
            "tracking_uri": uri,
            "lora_quantize": "4bit",
            "outputs_dir": tmp_path / "out",
        }
    )
    registered = register.run(args)
    assert registered.model_kind == "model" and register.run(args).model_version == registered.model_version
    client = tracking.client(uri)
    version = client.get_model_version("llama-lora", registered.model_version)
    assert version.tags["kind"] == "model" and version.source.endswith(f"/{tracking.MODEL_ARTIFACT}")
    assert {k: v for k, v in version.tags.items() if k.startswith("lora.")} == {
        "lora.rank": "4",
        "lora.target_modules": ",".join(sorted(LLAMA_LINEAR)),  # peft's full paths, read as module names
        "lora.use_dora": "true",
        "lora.quantize": "4bit",
    }
    logged = {a.path for a in client.list_artifacts(registered.mlflow_run_id)}
    assert {tracking.ADAPTER_ARTIFACT, tracking.MODEL_ARTIFACT} <= logged
    merged_file = Path(client.download_artifacts(registered.mlflow_run_id, tracking.MODEL_ARTIFACT, str(tmp_path)))
    merged = load_file(merged_file / "model.safetensors")
    expected = PeftModel.from_pretrained(tiny_llama(), folder).merge_and_unload().state_dict()
    assert all(torch.allclose(merged[k], v, atol=1e-6) for k, v in expected.items() if k in merged)
    assert not list(folder.parent.glob(".merged.*"))  # the merge's scratch folder went with it


def test_the_train_step_carries_the_lora_family_in_its_argv():
    from eksflow.llm.steps.train import Args

    argv_lora = json.dumps({"target_modules": "all-linear", "use_dora": True, "quantize": "4bit"})
    args = Args.from_argv(["--dataset-dir=/d", "--base-model=m", "--output-dir=/o", f"--lora={argv_lora}"])
    assert (args.lora.target_modules, args.lora.use_dora, args.lora.quantize) == ("all-linear", True, "4bit")
    assert Path(args.output_dir) == Path("/o")


@pytest.mark.parametrize("header", [b"\xff" * 8, (2**62).to_bytes(8, "little"), (1024).to_bytes(8, "little")])
def test_a_weight_file_whose_header_names_a_length_beyond_it_is_one_line(tmp_path, header):
    """Random bytes as adapter_model.safetensors made the shape reader allocate what its first 8 bytes named
    (MemoryError, OverflowError); register's tags read the config alone, so such a folder registers."""
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    (tmp_path / "adapter_model.safetensors").write_bytes(header + b"{}")
    with pytest.raises(vllm_lora.StepInputError, match=r"is not a readable safetensors file \(its header length"):
        vllm_lora.read_adapter(tmp_path, "--adapter-dir")
    assert vllm_lora.read_adapter(tmp_path, "--adapter-dir", weights=False).rank == 4
