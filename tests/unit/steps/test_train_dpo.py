"""method=dpo: preference records tokenized and cached as two sequences, the losses, and the disabled-adapter reference.

The model is a 2-layer random Llama of width 32 over the tiny word-level tokenizer (tests/unit/steps/conftest.py): what
is checked is arithmetic and masking, which real weights only make slower.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.encoding import encode_batch
from eksflow.llm.steps.common.preference import load_preferences
from eksflow.llm.steps.train import DpoSettings, TrainSettings
from eksflow.llm.steps.train.data import MicroBatches
from eksflow.llm.steps.train.preference import (
    PreferenceObjective,
    learned_counts,
    preference_loss,
    sequence_logps,
)
from eksflow.runtime.args import StepInputError

PAIRS = [
    {"prompt": f"what is {i} plus {i}", "chosen": f"the answer is {2 * i}", "rejected": f"the answer is {2 * i + 1}"}
    for i in range(6)
]
HISTORY = [
    {"role": "user", "content": "what is 1 plus 1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "what is 2 plus 2"},
]
CONVERSATIONAL = {
    "prompt": HISTORY,
    "chosen": [{"role": "assistant", "content": "the answer is 4"}],
    "rejected": [{"role": "assistant", "content": "the answer is 5"}],
}


def write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_losses_match_a_hand_computation():
    # policy and reference log-probs of 2 pairs: chosen rows first, then rejected
    policy = torch.tensor([-1.0, -2.0, -3.0, -1.5])
    reference = torch.tensor([-1.5, -2.0, -2.5, -2.0])
    # margins: pair 0 (-1.0 + 1.5) - (-3.0 + 2.5) = 1.0; pair 1 (-2.0 + 2.0) - (-1.5 + 2.0) = -0.5
    sigmoid, stats = preference_loss(policy, reference, DpoSettings(beta=0.5))
    expected = (-math.log(1 / (1 + math.exp(-0.5))) - math.log(1 / (1 + math.exp(0.25)))) / 2
    assert float(sigmoid) == pytest.approx(expected, rel=1e-6)
    assert stats["rewards/chosen"] == pytest.approx((0.5 * 0.5 + 0.5 * 0.0) / 2)
    assert stats["rewards/rejected"] == pytest.approx((0.5 * -0.5 + 0.5 * 0.5) / 2)
    assert stats["rewards/margin"] == pytest.approx((0.5 * 1.0 + 0.5 * -0.5) / 2)
    assert stats["rewards/accuracy"] == 0.5
    ipo, _ = preference_loss(policy, reference, DpoSettings(beta=0.5, loss="ipo"))
    assert float(ipo) == pytest.approx(((1.0 - 1.0) ** 2 + (-0.5 - 1.0) ** 2) / 2)


def test_sequence_log_probs_sum_each_rows_learned_tokens():
    logits = torch.randn(5, 7)
    targets = torch.tensor([1, 2, 3, 4, 5])
    rows = torch.tensor([0, 0, 2, 2, 2])  # row 1 has no learned token (its answer cut off)
    picked = torch.log_softmax(logits, dim=-1)[torch.arange(5), targets]
    sums = sequence_logps(logits, targets, rows, 3)
    assert torch.allclose(sums, torch.stack([picked[:2].sum(), torch.tensor(0.0), picked[2:].sum()]))
    assert learned_counts(rows, 3).tolist() == [2, 1, 3]


def test_a_preference_split_caches_both_answers_and_learns_only_the_answer_turns(tmp_path, tiny_tokenizer):
    split = write(tmp_path / "train.jsonl", [PAIRS[0], CONVERSATIONAL])
    cache, built = token_cache.ensure(split, tiny_tokenizer, tmp_path / "cache", preference=True)
    assert built and cache.preference and cache.rows == 2 and cache.lines().tolist() == [1, 2]
    # a string pair is two prompt-completion examples: exactly SFT's ids and span for each answer
    (chosen, rejected), spans = encode_batch(
        tiny_tokenizer,
        [Example(PAIRS[0]["prompt"], PAIRS[0]["chosen"]), Example(PAIRS[0]["prompt"], PAIRS[0]["rejected"])],
    )
    assert cache.example(0)[0].tolist() == chosen and cache.example(0)[1] == spans[0]
    assert cache.rejected(0)[0].tolist() == rejected and cache.rejected(0)[1] == spans[1]
    # a conversational pair: the prompt's own assistant turn ("2") is context, only the answer is learned
    ids, learned = cache.example(1)
    assert len(learned) == 1
    start, end = learned[0]
    assert tiny_tokenizer.decode(ids[start:end].tolist()) == "the answer is 4"
    ids, learned = cache.rejected(1)
    assert tiny_tokenizer.decode(ids[learned[0][0] : learned[0][1]].tolist()) == "the answer is 5"
    assert cache.lengths().tolist() == [max(len(chosen), len(rejected)), len(cache.rejected(1)[0])]
    # the SFT cache of a pair file keeps its key: the preference key is another folder
    assert cache.folder.name != token_cache.cache_key(token_cache.sha256_file(split), "x")


def test_each_method_refuses_the_other_methods_records_naming_file_line_and_method(tmp_path, tiny_tokenizer):
    mixed = write(tmp_path / "train.jsonl", [PAIRS[0], {"prompt": "what is 1 plus 1", "completion": "2"}])
    with pytest.raises(StepInputError, match=r"^train.jsonl:2 is a prompt-completion record .*method=dpo"):
        token_cache.ensure(mixed, tiny_tokenizer, tmp_path / "cache", preference=True)
    preferences = write(tmp_path / "prefs" / "train.jsonl", PAIRS[:2])
    with pytest.raises(StepInputError, match=r"^train.jsonl:1 is a preference record .*supervised fine-tuning"):
        token_cache.ensure(preferences, tiny_tokenizer, tmp_path / "cache")
    with pytest.raises(StepInputError, match="holds no usable preference records"):
        load_preferences(write(tmp_path / "empty" / "eval.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "b"}]))


def test_dpo_refuses_packed_rows_in_one_line():
    with pytest.raises(ValueError, match="pack_sequences=true with method=dpo"):
        TrainSettings(method="dpo", pack_sequences=True)


@pytest.fixture(scope="module")
def tiny_lm(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tiny_tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


def test_the_reference_is_the_base_model_and_a_fresh_adapter_scores_log_2(tmp_path, tiny_tokenizer, tiny_lm):
    import copy

    from peft import get_peft_model

    settings = TrainSettings(method="dpo", micro_batch_size=4, max_seq_len=64)
    split = write(tmp_path / "train.jsonl", PAIRS)
    cache, _ = token_cache.ensure(split, tiny_tokenizer, tmp_path / "cache", preference=True)
    batch = MicroBatches(cache, settings, tiny_tokenizer.pad_token_id).get(0, 0, 0, 1, torch.device("cpu"))
    assert batch.inputs["input_ids"].shape[0] == 8  # 4 pairs: 4 chosen rows, then 4 rejected
    base = copy.deepcopy(tiny_lm)
    with torch.no_grad():
        base_logps = sequence_logps(base(**batch.inputs).logits, batch.targets, batch.target_rows, 8)
    model = get_peft_model(tiny_lm, settings.lora.peft_config())

    loss, stats = PreferenceObjective(model, settings.dpo)(batch)
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-6)  # step 0: the policy is the reference
    assert stats["rewards/margin"] == pytest.approx(0.0, abs=1e-6)

    with torch.no_grad():  # a trained adapter: the policy moves, the reference stays the base model
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    objective = PreferenceObjective(model, settings.dpo)
    assert torch.allclose(objective.reference_logps(batch), base_logps, atol=1e-5)
    assert not torch.allclose(objective.logps(batch), base_logps, atol=1e-3)
    loss, _ = objective(batch)
    assert abs(float(loss.detach()) - math.log(2)) > 1e-5  # the margin moved the loss off log 2
    loss.backward()  # the policy's gradient reaches the adapter: disable_adapter restored requires_grad
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
