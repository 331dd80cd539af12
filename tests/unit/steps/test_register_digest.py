"""Identical weights get one digest (hence one model version), whatever order PEFT wrote target_modules in."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from eksflow.llm.steps import register
from eksflow.runtime.args import StepInputError

WEIGHTS = b"\x00safetensors bytes\x01" * 64


def adapter(folder, weights=WEIGHTS, **config):
    folder.mkdir()
    base = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "k_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **config}, indent=2))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_set_valued_lists_in_any_order_give_one_digest(tmp_path):
    first = adapter(tmp_path / "a", target_modules=["q_proj", "v_proj", "k_proj"], modules_to_save=["lm_head", "x"])
    second = adapter(tmp_path / "b", target_modules=["k_proj", "q_proj", "v_proj"], modules_to_save=["x", "lm_head"])
    assert (first / "adapter_config.json").read_bytes() != (second / "adapter_config.json").read_bytes()
    assert register.checkpoint_digest(first) == register.checkpoint_digest(second)


def test_key_order_and_whitespace_do_not_matter(tmp_path):
    first = adapter(tmp_path / "a")
    second = adapter(tmp_path / "b")
    config = json.loads((second / "adapter_config.json").read_text())
    (second / "adapter_config.json").write_text(json.dumps(dict(reversed(list(config.items())))))
    assert register.checkpoint_digest(first) == register.checkpoint_digest(second)


@pytest.mark.parametrize(
    "change",
    [
        {"weights": WEIGHTS[:-1] + b"\x02"},
        {"target_modules": ["q_proj", "v_proj"]},
        {"r": 16},
        {"layers_to_transform": [1, 0]},  # a list whose order is not a set's: kept as written
    ],
    ids=["weights", "modules", "rank", "ordered-list"],
)
def test_a_real_difference_gives_another_digest(tmp_path, change):
    baseline = adapter(tmp_path / "a", layers_to_transform=[0, 1])
    changed = adapter(tmp_path / "b", **{"layers_to_transform": [0, 1], **change})
    assert register.checkpoint_digest(baseline) != register.checkpoint_digest(changed)


def test_a_config_that_is_not_json_is_bad_input(tmp_path):
    folder = adapter(tmp_path / "a")
    (folder / "adapter_config.json").write_bytes(b"{\xff")
    with pytest.raises(StepInputError, match=r"adapter_config\.json is not JSON"):
        register.checkpoint_digest(folder)


SAVE_ADAPTER = textwrap.dedent(
    """
    import sys, torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    get_peft_model(model, LoraConfig(r=4, target_modules=modules)).save_pretrained(sys.argv[1])
    """
)


@pytest.mark.slow
def test_peft_saves_under_two_hash_seeds_give_one_digest(tmp_path):
    """The reproduction: the same adapter saved by two processes whose string hashes differ."""
    folders = []
    for seed in ("1", "2"):
        folder = tmp_path / f"seed-{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, "-c", SAVE_ADAPTER, str(folder)], check=True, env=env, timeout=300)
        folders.append(folder)
    configs = [json.loads((f / "adapter_config.json").read_text()) for f in folders]
    assert configs[0]["target_modules"] != configs[1]["target_modules"]  # PEFT wrote the set in two orders
    weights = [(f / "adapter_model.safetensors").read_bytes() for f in folders]
    assert weights[0] == weights[1]
    assert register.checkpoint_digest(folders[0]) == register.checkpoint_digest(folders[1])
