"""Tokenization and generation shared by train and evaluate, so both see exactly the same prompt format."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
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
    """The prompt wrapped in the model's chat template as one user turn, ending where the assistant's answer starts.

    `encoding.prompt_texts` gives the same text for the history [{"role": "user", "content": prompt}].
    """
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return str(text)


def encode_example(
    tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str, max_len: int
) -> tuple[list[int], list[int]]:
    """Token ids and labels for one prompt-completion pair; only the completion (and its EOS) is learned.

    The definition of a pair's tokens: `encoding.encode_batch` (what training and evaluate use, batched, and for
    conversations too) must give these ids, and learn these labels, for every pair.
    """
    prompt_ids = tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = (prompt_ids + answer_ids)[:max_len]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_len]
    return ids, labels


def truncated(
    ids: np.ndarray | Sequence[int], spans: Sequence[tuple[int, int]], max_len: int
) -> tuple[list[int], list[int]]:
    """(input ids, labels) cut to `max_len`: labels are the ids inside the learned spans, IGNORE_INDEX elsewhere.

    For a pair (one span from the prompt's end to the last id) this is exactly what `encode_example` makes. Training
    learns every span of a row; evaluate scores the spans of the answer it judges.
    """
    kept = [int(t) for t in ids[:max_len]] if isinstance(ids, Sequence) else ids[:max_len].tolist()
    labels = [IGNORE_INDEX] * len(kept)
    for start, end in spans:
        labels[start:end] = kept[start:end]
    return kept, labels


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


def shared_prefix(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least its last token of its own.

    The chat template's system turn and an instruction common to the eval set are the same tokens in every
    prompt: they are run through the model once and their keys and values reused by every row. Every row keeps
    one token so that each row has a forward of its own, whose logits give its first answer token.
    """
    if not rows:
        return 0
    first, limit = rows[0], min(len(r) for r in rows) - 1
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def prefix_cache(model: Any, ids: Sequence[int]) -> Any:
    """The key/value cache of `ids` (one row), to be copied for each batch that starts with them."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if ids:
        with torch.inference_mode():
            model(input_ids=torch.tensor([list(ids)], device=model.device), cache=cache, use_cache=True)
    return cache


def batch_cache(cache: Any, rows: int) -> Any:
    """A copy of a one-row `prefix_cache` for `rows` rows (the model appends to the cache it is given)."""
    import copy

    batch = copy.deepcopy(cache)
    batch.batch_repeat_interleave(rows)
    return batch


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
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    histories: Sequence[list[dict[str, Any]]],
    *,
    batch_size: int,
    max_new_tokens: int,
) -> tuple[list[str], int]:
    """Greedy answers to `histories` (each the chat messages asked: `Example.history()`), batched.

    Deterministic for given weights. Each history is asked as the chat template renders it up to where the answer
    starts (`encoding.prompt_texts`): the text training learned the answer after. The prompts' shared leading tokens
    (`shared_prefix`) are computed once; each row's own tokens follow them, left-padded to the batch's longest, and
    the padding is masked out (the positions count real tokens only, so a row's answer is the one it would get
    alone, up to float rounding). Prompts are batched by length, so that a batch pads little.

    Returns the answers, in the order of `histories`, and how many of them reached `max_new_tokens` without their
    end-of-sequence token.
    """
    import torch

    from eksflow.llm.steps.common.encoding import prompt_texts

    rows: list[list[int]] = tokenizer(prompt_texts(tokenizer, histories), add_special_tokens=False)["input_ids"]
    shared = shared_prefix(rows)
    prefix = rows[0][:shared] if rows else []
    cache = prefix_cache(model, prefix)
    pad = tokenizer.pad_token_id
    answers: dict[int, str] = {}
    cut = 0
    order = by_length(rows)
    for start in range(0, len(order), batch_size):
        part = order[start : start + batch_size]
        own = [rows[i][shared:] for i in part]
        width = max(len(r) for r in own)
        input_ids = torch.tensor([prefix + [pad] * (width - len(r)) + r for r in own], device=model.device)
        mask = torch.tensor([[1] * shared + [0] * (width - len(r)) + [1] * len(r) for r in own], device=model.device)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            cache=batch_cache(cache, len(part)),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for i, row in zip(part, out, strict=True):
            new = row[input_ids.shape[1] :]
            ended = bool((new == tokenizer.eos_token_id).any()) or bool((new == pad).any())
            cut += int(len(new) >= max_new_tokens and not ended)
            answers[i] = str(tokenizer.decode(new, skip_special_tokens=True)).strip()
    return [answers[i] for i in range(len(histories))], cut


def by_length(rows: Sequence[Sequence[int]]) -> list[int]:
    """Indices of `rows` from the shortest to the longest (ties in their order): batches of similar lengths."""
    return sorted(range(len(rows)), key=lambda i: len(rows[i]))
