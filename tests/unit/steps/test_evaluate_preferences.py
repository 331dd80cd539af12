"""Evaluate with method=dpo: held-out preference pairs give preference_accuracy and reward_margin (base_ and _gain
forms), usable in thresholds; a rule on them is refused unless train's method is dpo; answers are scored against
`chosen`. The model is the tiny random Llama of test_evaluate_generate over the tests' word-level tokenizer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.gate import Threshold
from eksflow.llm.steps.common.preference import load_preferences
from eksflow.llm.steps.evaluate import Args, EvaluateSettings
from eksflow.llm.steps.evaluate.gate import combine, threshold_metric
from eksflow.llm.steps.evaluate.preference import answer_logps, preference_metrics
from eksflow.llm.steps.evaluate.step import run
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.data import MicroBatches, batch_indices
from eksflow.llm.steps.train.preference import PreferenceObjective
from tests.unit.steps.test_evaluate_generate import tiny_model  # noqa: F401 (a pytest fixture)

PAIRS = [
    {"prompt": f"what is {i} plus {i}", "chosen": f"the answer is {2 * i}", "rejected": f"{2 * i + 1}"}
    for i in range(4)
] + [
    {
        "prompt": [
            {"role": "user", "content": "what is 1 plus 1"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "what is 2 plus 2"},
        ],
        "chosen": [{"role": "assistant", "content": "the answer is 4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
]


def write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_preference_metrics_match_a_hand_computation():
    tuned = [(-1.0, -3.0), (-2.0, -1.0), (-4.0, -4.5)]  # (chosen, rejected) log-probs
    base = [(-1.5, -2.5), (-1.0, -1.5), (-4.0, -4.0)]
    tuned_metrics, base_metrics = preference_metrics(tuned, base, beta=0.5)
    # implicit reward margins beta * ((tc - bc) - (tx - bx)): 0.5 * (0.5 + 0.5), 0.5 * (-1.0 - 0.5), 0.5 * (0 + 0.5)
    assert tuned_metrics == {"preference_accuracy": pytest.approx(2 / 3), "reward_margin": pytest.approx(0.0 / 3)}
    # the base model's own ranking: chosen above rejected in pairs 0 and 1; margins 0.5 * (1.0, 0.5, 0.0)
    assert base_metrics == {"preference_accuracy": pytest.approx(2 / 3), "reward_margin": pytest.approx(0.25)}
    metrics = combine({"eval_loss": 1.0, **tuned_metrics}, {"eval_loss": 2.0, **base_metrics}, [])
    assert metrics["preference_accuracy_gain"] == 0.0 and metrics["reward_margin_gain"] == -0.25


def test_evaluate_scores_an_answer_as_training_scores_it(tmp_path, tiny_tokenizer, tiny_model):  # noqa: F811
    """answer_logps (evaluate) and the DPO objective's log-probabilities (train) agree pair by pair."""
    split = write(tmp_path / "eval.jsonl", PAIRS)
    pairs = load_preferences(split)
    scored = answer_logps(tiny_model, tiny_tokenizer, pairs, batch_size=2)
    settings = TrainSettings(method="dpo", micro_batch_size=len(PAIRS), max_seq_len=64)
    cache, _ = token_cache.ensure(split, tiny_tokenizer, tmp_path / "cache", preference=True)
    batch = MicroBatches(cache, settings, tiny_tokenizer.pad_token_id).get(0, 0, 0, 1, tiny_model.device)
    trained = PreferenceObjective(tiny_model, settings.dpo).logps(batch).tolist()
    order = batch_indices(0, 0, 0, settings, 1, len(PAIRS))
    for k, index in enumerate(order):
        assert scored[index] == pytest.approx((trained[k], trained[len(PAIRS) + k]), abs=1e-4)


def test_thresholds_may_name_preference_metrics_only_under_dpo():
    settings = EvaluateSettings(
        thresholds=(
            Threshold(metric="preference_accuracy_gain", value=0.1),
            Threshold(metric="base_reward_margin", value=-1.0),
        ),
        champion_metric="reward_margin",
    )
    assert threshold_metric("reward_margin_gain", settings.task_metrics) == "reward_margin_gain"
    settings.require_method("dpo")
    with pytest.raises(ValueError, match="preference_accuracy, reward_margin scores held-out preference pairs"):
        settings.require_method("sft")
    with pytest.raises(ValueError, match="preference_accuracy is from 0 to 1"):
        EvaluateSettings(thresholds=(Threshold(metric="preference_accuracy", value=1.5),))


def test_evaluate_with_method_dpo_gates_on_preference_metrics(tmp_path, tiny_tokenizer, tiny_model):  # noqa: F811
    import torch
    from peft import get_peft_model

    model_dir, adapter_dir = tmp_path / "model", tmp_path / "adapter"
    tiny_model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    torch.manual_seed(1)
    adapted = get_peft_model(tiny_model, TrainSettings().lora.peft_config())
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.2)
    adapted.save_pretrained(adapter_dir)
    adapted.unload()  # the module fixture's model, without the adapter layers
    write(tmp_path / "data" / "eval.jsonl", PAIRS)
    outputs = run(
        Args(
            dataset_dir=tmp_path / "data",
            adapter_dir=adapter_dir,
            base_model=str(model_dir),
            model_cache_dir=tmp_path / "cache",
            report_dir=tmp_path / "reports",
            champion_version="",
            method="dpo",
            dpo_beta=0.5,
            task_metrics=("exact_match",),
            thresholds=(Threshold(metric="preference_accuracy", op=">=", value=0.0),),
            champion_metric="exact_match",
            max_new_tokens=4,
        )
    )
    metrics = outputs.metrics
    for name in ("preference_accuracy", "reward_margin"):
        assert {name, f"base_{name}", f"{name}_gain"} <= set(metrics)
        assert math.isclose(metrics[f"{name}_gain"], metrics[name] - metrics[f"base_{name}"], abs_tol=1e-5)
    assert 0.0 <= metrics["preference_accuracy"] <= 1.0 and "exact_match" in metrics
    assert outputs.passed
    report = json.loads(Path(outputs.report).read_text())
    assert report["metrics"]["preference_accuracy"] == metrics["preference_accuracy"]
    # The rows the canary asks the served model: each pair's prompt (a conversation's history), scored against
    # `chosen`, up to the answer cap evaluate generated under.
    asked = [(row["prompt"], row.get("messages"), row["reference"]) for row in report["rows"]]
    assert asked == [(p["prompt"], None, p["chosen"]) for p in PAIRS[:4]] + [
        ("user: what is 1 plus 1\nassistant: 2\nuser: what is 2 plus 2", PAIRS[4]["prompt"], "the answer is 4")
    ]
    assert report["max_new_tokens"] == 4


def test_the_flagship_wires_the_method_and_refuses_a_preference_rule_under_sft():
    from eksflow.config import ConfigError
    from tests.flagship import config, rendered

    with pytest.raises(ConfigError, match="reward_margin scores held-out preference pairs"):
        config(["evaluate.champion_metric=reward_margin"])
    workflow = rendered(["train.method=dpo", "train.dpo.beta=0.25", "evaluate.champion_metric=reward_margin"])
    argv = {t["name"]: t["container"]["args"] for t in workflow["spec"]["templates"] if "container" in t}
    assert "--method=dpo" in argv["validate-data"] and "--dpo-beta=0.25" in argv["evaluate"]
