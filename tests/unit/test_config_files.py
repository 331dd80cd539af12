"""A --config file is bounded: its size, its aliases once expanded, and each key given once (YAML keeps the last)."""

import os
from pathlib import Path

import pytest

from eksflow.config import load_config
from eksflow.config_file import MAX_CONFIG_BYTES
from eksflow.errors import ConfigError
from pipelines.llama_lora import LlamaLoraConfig
from tests.commands import python

# 9 levels of 9 aliases: 700 bytes that expand to 9^9 values (the "billion laughs" of YAML).
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def refused(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        load_config(LlamaLoraConfig, path)
    message = str(err.value)
    assert message.startswith(f"--config {path}: ") and "\n" not in message
    return message


def test_an_endless_device_is_refused_without_reading_it():
    with pytest.raises(ConfigError, match=r"^--config /dev/zero: is a character device; give a YAML file$"):
        load_config(LlamaLoraConfig, Path("/dev/zero"))


def test_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    # In a process of its own (python() bounds it): opening a FIFO to read waits for a writer, which never comes.
    refused = python("pipelines/llama_lora.py", "render", "--config", str(fifo))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [f"config error: --config {fifo}: is a named pipe (FIFO); give a YAML file"]


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    assert "more than 1024 KiB" in refused(tmp_path, "# " + "x" * MAX_CONFIG_BYTES + "\n")


def test_an_alias_bomb_is_refused_before_validation(tmp_path):
    assert len(ALIAS_BOMB) < 800
    assert "once its aliases (*name) are expanded" in refused(tmp_path, ALIAS_BOMB)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("train:\n  max_steps: 10\ntrain:\n  learning_rate: 0.1\n", "'train' is given twice (lines 1 and 3)"),
        ("train:\n  max_steps: 10\n  max_steps: 20\n", "'max_steps' is given twice (lines 2 and 3)"),
    ],
    ids=["section", "field"],
)
def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path, text, key):
    assert key in refused(tmp_path, text)


def test_merge_keys_and_aliases_within_bounds_still_load(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("train:\n  <<: &defaults {max_steps: 7, learning_rate: 0.002}\n  max_steps: 9\n")
    cfg = load_config(LlamaLoraConfig, path)
    assert (cfg.train.max_steps, cfg.train.learning_rate) == (9, 0.002)  # a key over a merged one is no duplicate


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("serving.proxy_image=docker.litellm.ai/berriai/litellm-database:1.110.2\nx", "is not an image reference"),
        ("image=ghcr.io/x/y:1\n  hostPID: true", "is not an image reference"),
        ("canary.weights=[10.0000001, 10.0000002, 100]", "would name the same canary step"),
        ("evaluate.champion_margin=.inf", "finite number"),
    ],
    ids=["proxy-image-newline", "image-newline", "weights-one-task-name", "infinite-margin"],
)
def test_settings_that_would_break_a_manifest_or_a_task_name_are_refused(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_config(LlamaLoraConfig, None, [setting])


def test_a_number_field_given_an_expression_says_it_takes_a_number():
    with pytest.raises(
        ConfigError, match=r"^--set train.max_steps: takes a whole number, got '\{\{workflow.name\}\}'$"
    ):
        load_config(LlamaLoraConfig, None, ["train.max_steps={{workflow.name}}"])
