"""train.finetune=full: its refusals, what the memory model and `plan` count for it, resume's check, evaluate's and
register's handling of a whole model's folder (kind `model`)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from eksflow import plan
from eksflow.config import load_config
from eksflow.errors import ConfigError
from eksflow.llm.steps import load_candidate, register
from eksflow.llm.steps.common import strategies, tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL
from eksflow.llm.steps.common.trained import model_digest, model_kind
from eksflow.llm.steps.evaluate import scoring
from eksflow.llm.steps.train import TrainSettings, sizing
from eksflow.llm.steps.train.state import read_trainer_state
from eksflow.runtime.args import StepInputError
from eksflow.runtime.preflight import Layout
from pipelines import lora_sweep
from pipelines.lora_sweep import LoraSweepConfig
from tests.flagship import config
from tests.unit.steps.test_load_candidate import load
from tests.unit.steps.test_train_lora_family import tiny_llama

GIB = 2**30
BILLION = 10**9
A_GPU = Layout("gpu", "g5.xlarge", nodes=1, workers=1, memory_per_worker_gib=24.0, spot=False, model_params_b=0)


def test_full_is_refused_with_a_4bit_base_where_the_config_loads():
    with pytest.raises(ValidationError, match=r"lora\.quantize=4bit with finetune=full: a 4-bit base is frozen"):
        TrainSettings.model_validate({"finetune": "full", "lora": {"quantize": "4bit"}})
    with pytest.raises(ConfigError) as raised:
        config(["train.finetune=full", "train.lora.quantize=4bit"])
    (line,) = str(raised.value).splitlines()
    assert "lora.quantize=4bit with finetune=full" in line and "set lora.quantize=none or finetune=lora" in line
    assert TrainSettings().finetune == "lora"
    assert TrainSettings.model_validate({"finetune": "full", "lora": {"use_dora": True}}).finetune == "full"


def memory(settings: dict, strategy: str, on_gpu: bool = False, world: int = 2, **extra) -> int:
    """Bytes per worker the one memory model gives a 1B model under `strategy`, less its activations."""
    resolved = TrainSettings.model_validate({"strategy": strategy, "micro_batch_size": 1, **settings, **extra})
    plan_ = resolved.resolve_strategy(
        num_params=BILLION, trainable_params=10**6, on_gpu=on_gpu, device_memory_bytes=0, world=world
    )
    activations = resolved.workload(BILLION, 0, 0).tokens * strategies.ACTIVATION_BYTES_PER_TOKEN_PER_B
    return round(plan_.memory_bytes - activations)


def test_the_memory_model_counts_16_bytes_a_parameter_sharded_as_each_strategy_shards():
    full = {"finetune": "full"}
    assert memory(full, "ddp") == 16 * BILLION  # fp32 weight, gradient, AdamW's two moments: a replica each
    assert memory(full, "fsdp") == 8 * BILLION  # all of it sharded over 2 workers
    assert memory(full, "deepspeed", zero_stage=1) == 12 * BILLION  # the moments sharded
    assert memory(full, "deepspeed", zero_stage=2) == 10 * BILLION  # + the gradients
    assert memory(full, "deepspeed", zero_stage=3) == 8 * BILLION  # + the weights
    assert memory(full, "ddp", on_gpu=True) == 16 * BILLION + round(2 * BILLION * strategies.WEIGHTS_OVERHEAD)
    # LoRA's frozen fp32 base and a small adapter: far less than the full fine-tune
    assert memory({}, "ddp") < 5 * BILLION


def test_dpo_with_full_adds_a_frozen_reference_copy_of_weights_on_every_worker():
    dpo = {"finetune": "full", "method": "dpo"}
    assert memory(dpo, "fsdp") == 8 * BILLION + 4 * BILLION  # the reference is not sharded: fp32 on CPU
    assert memory(dpo, "ddp", on_gpu=True) - memory({"finetune": "full"}, "ddp", on_gpu=True) == 2 * BILLION  # bf16
    assert memory({"method": "dpo"}, "ddp") == memory({}, "ddp")  # LoRA's reference is its base: no copy


def sweep(overrides: list[str]):
    """lora_sweep's pipeline: it trains and evaluates, rolling nothing out, so it takes a full fine-tune."""
    return lora_sweep.build(load_config(LoraSweepConfig, None, overrides))


def test_a_full_fine_tunes_lora_settings_are_not_checked_against_the_engine():
    """It trains no adapter: a LoRA rank above the engine's limit is refused with lora only."""
    assert config(["train.finetune=full", "train.lora.rank=64"]).train.registers == "model"
    with pytest.raises(ConfigError, match=r"train\.lora\.rank: rank 64 is above serving\.engine\.max_lora_rank"):
        config(["train.lora.rank=64"])


def test_plan_says_what_full_costs_and_refuses_a_model_it_does_not_fit():
    rows = dict(plan.check(sweep(["train.finetune=full"])).rows)
    assert rows["train: fine-tune"].startswith("full: every weight of ~0.14B trains; fp32 weights, gradients and")
    assert "train: adapter" not in rows
    dpo = sizing.preflight({"finetune": "full", "method": "dpo", "base_model": DEMO_MODEL}, A_GPU)
    assert dict(dpo.rows)["DPO reference"] == "a frozen copy of the base on every worker, ~0.3 GiB of it"
    assert dpo.problems == []
    # 8B parameters at 16 bytes each on one 24 GiB GPU: even auto's last row, ZeRO-3 with AdamW on the host, needs
    # 8 bytes a parameter (fp32 weight and gradient) and a bf16 copy on the device
    big = sizing.preflight({"finetune": "full", "base_model": "llama-3-8b"}, A_GPU)
    (problem,) = big.problems
    assert problem.startswith("train.finetune: full needs about 85.5 GiB per worker (deepspeed ZeRO-3 with CPU offload")
    assert "24 GiB available on g5.xlarge; fix: --set train.finetune=lora" in problem
    with pytest.raises(ConfigError, match=r"train\.finetune: full needs about"):
        plan.check(sweep(["train.finetune=full", "cluster.model_params_b=70"]))


def test_trainium_refuses_a_full_fine_tune():
    trainium = Layout("trainium", "trn1.32xlarge", nodes=1, workers=1, memory_per_worker_gib=32.0, spot=False,
                      model_params_b=0)  # fmt: skip
    problems = sizing.preflight({"finetune": "full", "base_model": "llama-3-8b"}, trainium).problems
    assert any(p.startswith("train.finetune: the Trainium step trains a LoRA adapter") for p in problems)


def test_a_checkpoint_of_the_other_finetune_is_refused_on_resume(tmp_path):
    import torch

    (tmp_path / "step-00000002" / "adapter").mkdir(parents=True)
    torch.save({"step": 2, "strategy": "ddp"}, tmp_path / "step-00000002" / "trainer_state.pt")
    with pytest.raises(StepInputError, match=r"holds no model folder: it was written with another train\.finetune"):
        read_trainer_state(tmp_path / "step-00000002", "full")


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "model"
    tiny_llama().save_pretrained(folder)
    return folder


def test_evaluate_scores_a_model_folder_as_it_is(model_folder, tmp_path):
    import torch

    assert model_kind(model_folder, "--adapter-dir") == "model"
    with pytest.raises(StepInputError, match="neither a LoRA adapter"):
        model_kind(tmp_path, "--adapter-dir")
    tuned = scoring._tuned_model(None, SimpleNamespace(adapter_dir=model_folder), "cpu")
    saved = tiny_llama().state_dict()
    assert not tuned.training and all(torch.equal(saved[k], v) for k, v in tuned.state_dict().items())


def register_args(model_folder: Path, tmp_path: Path) -> tuple[str, register.Args]:
    """The registry's URI under `tmp_path`, and register's arguments for the model folder the train step wrote."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = register.Args.model_validate(
        {
            "adapter_dir": model_folder,
            "base_model": DEMO_MODEL,
            "metrics": {"exact_match": 0.9},
            "dataset_digest": "sha256:" + "d" * 64,
            "workflow_name": "wf",
            "tracking_uri": uri,
            "outputs_dir": tmp_path / "out",
        }
    )
    return uri, args


def test_register_logs_a_model_folder_as_a_version_of_kind_model(model_folder, tmp_path):
    uri, args = register_args(model_folder, tmp_path)
    first, again = register.run(args), register.run(args)
    assert (first.model_kind, first.model_version, again.model_version) == ("model", "1", "1")  # idempotent
    client = tracking.client(uri)
    version = client.get_model_version("llama-lora", "1")
    assert version.tags["kind"] == "model" and version.tags["checkpoint_digest"] == model_digest(model_folder)
    assert not any(tag.startswith("lora.") for tag in version.tags)  # no adapter to describe
    assert version.source.endswith(f"/{tracking.MODEL_ARTIFACT}")
    logged = {a.path for a in client.list_artifacts(first.mlflow_run_id, tracking.MODEL_ARTIFACT)}
    assert {f"{tracking.MODEL_ARTIFACT}/config.json", f"{tracking.MODEL_ARTIFACT}/model.safetensors"} <= logged


def test_a_version_of_kind_model_is_refused_by_load_candidate_in_one_line(model_folder, tmp_path, capsys):
    """A whole model registered elsewhere (rollout_pipeline takes any version) is not fetched as an adapter."""
    uri, args = register_args(model_folder, tmp_path)
    version = register.run(args).model_version
    capsys.readouterr()
    assert load_candidate.main(load(tmp_path, uri, version)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--model-version={version}: llama-lora version {version} is a whole model (tag kind=model" in line
    assert not any((tmp_path / "adapters").rglob("*.safetensors"))  # nothing published for the fleet
