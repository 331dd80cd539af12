"""Evaluating from a checkpoint: the manifest is verified first, degraded weights never pass, and the metrics
of one checkpoint are reproducible (docs/reliability.md EV1, EV2)."""

import json
from pathlib import Path

import pytest

from eksflow.llm.steps import evaluate
from eksflow.llm.steps.common import checkpoints, tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.llm.steps.evaluate import step as evaluate_step
from eksflow.runtime.args import StepInputError

DEMO_DATA = Path(__file__).resolve().parents[3] / "data" / "demo"


def fake_adapter(folder: Path) -> None:
    adapter = folder / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4)


def eval_args(tmp_path: Path, adapter_dir: Path, **extra) -> evaluate.Args:
    values = {
        "dataset_dir": DEMO_DATA,
        "adapter_dir": adapter_dir,
        "base_model": DEMO_MODEL,
        "model_cache_dir": default_cache_dir(),
        "report_dir": tmp_path / "reports",
        "outputs_dir": tmp_path / "outputs",
        "champion_version": "",
        **extra,
    }
    return evaluate.Args.model_validate(values)


def test_a_flipped_byte_in_the_checkpoint_is_refused_before_scoring(tmp_path, monkeypatch):
    checkpoint = checkpoints.commit(tmp_path / "checkpoints", 40, fake_adapter)
    weights = checkpoint.path / "adapter" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0x01
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(evaluate_step, "score_models", lambda *_: pytest.fail("a corrupt checkpoint was scored"))

    with pytest.raises(StepInputError, match=r"checkpoint failed verification: .*adapter_model\.safetensors"):
        evaluate_step.run(eval_args(tmp_path, checkpoint.path / "adapter"))


def test_a_step_folder_without_manifest_is_refused(tmp_path, monkeypatch):
    checkpoint = checkpoints.commit(tmp_path / "checkpoints", 40, fake_adapter)
    (checkpoint.path / checkpoints.MANIFEST).unlink()  # the save did not finish
    monkeypatch.setattr(evaluate_step, "score_models", lambda *_: pytest.fail("an unfinished checkpoint was scored"))

    with pytest.raises(StepInputError, match=r"has no manifest\.json"):
        evaluate_step.run(eval_args(tmp_path, checkpoint.path / "adapter"))


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    return resolve_model(DEMO_MODEL, default_cache_dir())


@pytest.fixture(scope="session")
def random_checkpoint(base_model_dir, tmp_path_factory) -> Path:
    """A committed checkpoint whose LoRA weights are random (not the zero-delta init): a degraded model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    root = tmp_path_factory.mktemp("random") / "checkpoints"
    checkpoint = checkpoints.commit(root, 1, lambda folder: peft_model.save_pretrained(folder / "adapter"))
    return checkpoint.path / "adapter"


@pytest.mark.slow
def test_random_adapter_never_passes_and_scores_are_reproducible(tmp_path, random_checkpoint):
    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    run_id = tracking.start_run(uri, "eksflow", "train", {})
    settings = {"max_examples": 4, "batch_size": 4, "max_new_tokens": 8, "tracking_uri": uri, "mlflow_run_id": run_id}

    first = evaluate_step.run(eval_args(tmp_path / "a", random_checkpoint, **settings))
    second = evaluate_step.run(eval_args(tmp_path / "b", random_checkpoint, **settings))

    assert not first.passed
    assert "exact_match" in first.reason
    # EV2: the same checkpoint, seed and examples give the same metrics. Tolerance 0 after the 6-digit rounding
    # of `combine`: greedy decoding on CPU in float32 is deterministic for a fixed thread count.
    assert second.metrics == first.metrics
    assert first.eval_set_digest.endswith("@first-4")
    assert first.champion_version == ""  # no champion registered yet

    report = json.loads(Path(first.report).read_text())
    assert report["passed"] is False
    assert report["eval_set_digest"] == first.eval_set_digest
    assert report["champion"]["reason"] == "no champion yet: thresholds only"
    assert [t["metric"] for t in report["thresholds"]] == ["exact_match", "exact_match_gain"]

    client = tracking.client(uri)
    run = client.get_run(run_id)
    assert run.data.tags["gate.decision"] == "failed"
    assert run.data.tags["eval_set_digest"] == first.eval_set_digest
    assert json.loads(run.data.tags["gate.thresholds"]) == ["exact_match >= 0.6", "exact_match_gain >= 0.2"]
    assert run.data.metrics["gate_passed"] == 0.0
    assert run.data.metrics["exact_match"] == first.metrics["exact_match"]
    assert {a.path for a in client.list_artifacts(run_id, "eval")} == {"eval/eval_report.json", "eval/eval_report.md"}
