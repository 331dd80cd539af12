"""Tokenization and generation shared by train and evaluate, so both see exactly the same prompt format."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100  # label value the loss skips: prompt tokens and padding


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with a pad token (the EOS token when the model has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prompt_text(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """The prompt wrapped in the model's chat template, ending where the assistant's answer starts."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return str(text)


def encode_example(
    tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str, max_len: int
) -> tuple[list[int], list[int]]:
    """Token ids and labels for one example; only the completion (and its EOS) is learned."""
    prompt_ids = tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = (prompt_ids + answer_ids)[:max_len]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_len]
    return ids, labels


def collate(batch: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch to its longest example; padding is masked out of attention and loss."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    pad = [width - len(ids) for ids, _ in batch]
    return {
        "input_ids": torch.tensor([ids + [pad_id] * n for (ids, _), n in zip(batch, pad, strict=True)]),
        "labels": torch.tensor([labels + [IGNORE_INDEX] * n for (_, labels), n in zip(batch, pad, strict=True)]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * n for (ids, _), n in zip(batch, pad, strict=True)]),
    }


def next_token_targets(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the loss looks, as a causal LM's `logits_to_keep`: (keep, targets) for a batch of `labels`.

    keep[b, t] is True where the token after position t, labels[b, t + 1], is learned (not IGNORE_INDEX); targets
    holds those labels in row-major order, the order of the logits that `logits_to_keep=keep` returns. Their mean
    cross-entropy is the loss transformers computes from `labels` (shifted the same way), while the projection onto
    the vocabulary, the largest matmul of a small model, runs at the learned positions only, not also at every
    prompt and padding position (most of them in short instruction data).
    """
    import torch

    following = labels[:, 1:]
    learned = following != IGNORE_INDEX
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = learned
    return keep, following[learned]


def generate(
    model: Any, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], *, batch_size: int, max_new_tokens: int
) -> tuple[list[str], int]:
    """Greedy answers for `prompts`, batched with left padding (deterministic for given weights).

    Returns the answers and how many of them reached `max_new_tokens` without their end-of-sequence token.
    """
    import torch

    tokenizer.padding_side = "left"
    answers: list[str] = []
    cut = 0
    for start in range(0, len(prompts), batch_size):
        texts = [prompt_text(tokenizer, p) for p in prompts[start : start + batch_size]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        width = batch["input_ids"].shape[1]
        for row in out:
            new = row[width:]
            ended = bool((new == tokenizer.eos_token_id).any()) or bool((new == tokenizer.pad_token_id).any())
            cut += int(len(new) >= max_new_tokens and not ended)
            answers.append(str(tokenizer.decode(new, skip_special_tokens=True)).strip())
    return answers, cut
