"""Batched tokenization: prompt/completion pairs to token ids exactly as `modeling.encode_example` makes them.

One call tokenizes a few thousand examples through the fast (Rust) tokenizer's batch API instead of two calls per
example: the per-call Python overhead, not the tokenizing, is what made one-at-a-time encoding slow. Ids are kept
untruncated (a consumer cuts them to its max_seq_len), so one tokenized copy serves every sequence length.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump when encode_batch changes what it returns: it is part of every tokenized cache's key.
ENCODING_VERSION = 1
# Examples per tokenizer call: large enough that Python's per-call overhead vanishes (measured flat from ~512 up
# on SmolLM2's tokenizer), small enough that a batch's Python lists stay a few MB.
BATCH = 2048


def prompt_texts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[str]:
    """Each prompt wrapped in the chat template up to where the answer starts (`modeling.prompt_text`, batched)."""
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    return [str(t) for t in texts]


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], completions: Sequence[str]
) -> tuple[list[list[int]], list[int]]:
    """Token ids (prompt then completion and EOS, untruncated) and the prompt's token count of each pair.

    Equal to `modeling.encode_example(tokenizer, p, c, max_len)` once cut to max_len: ids[:max_len], and labels
    IGNORE_INDEX for the first prompt_len ids.
    """
    if not prompts:
        return [], []
    prompt_ids = tokenizer(prompt_texts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token or ""
    answer_ids = tokenizer([c + eos for c in completions], add_special_tokens=False)["input_ids"]
    ids = [p + a for p, a in zip(prompt_ids, answer_ids, strict=True)]
    return ids, [len(p) for p in prompt_ids]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of what decides `encode_batch`'s output: vocabulary and rules, chat template, EOS, and a probe.

    The probe (one example encoded) catches what the serialized tokenizer does not show, such as a template
    that adds a system turn.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    probe = encode_batch(tokenizer, ["What is 2 + 2?"], ["4"])
    parts = [
        str(ENCODING_VERSION),
        type(tokenizer).__name__,
        rules,
        str(getattr(tokenizer, "chat_template", "") or ""),
        str(tokenizer.eos_token),
        json.dumps(probe),
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()
