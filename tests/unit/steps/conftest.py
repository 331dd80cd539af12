"""Fixtures for the step tests: a tiny real tokenizer (a `tokenizers` word-level model) with a chat template."""

from __future__ import annotations

from typing import Any

import pytest

WORDS = ["<pad>", "<eos>", "<unk>", "user", "assistant", ":"]
WORDS += [str(i) for i in range(1000)] + ["what", "is", "plus", "the", "answer", "question", "q", "a", "long", "story"]
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def make_tokenizer(template: str = TEMPLATE) -> Any:
    """A fast tokenizer over WORDS (unknown words: <unk>), EOS and pad tokens, and `template` as chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return make_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_factory() -> Any:
    """make_tokenizer, for tests that need a tokenizer with another chat template."""
    return make_tokenizer
