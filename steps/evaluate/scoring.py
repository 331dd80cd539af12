"""Scoring a model on the held-out examples: completion loss and batched greedy answers (CPU or the first GPU)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from eksflow.runtime.outputs import Progress
from steps.common.base_model import resolve_model
from steps.common.data import Example
from steps.evaluate import Args
from steps.evaluate.gate import task_score


class Scores(BaseModel):
    """Metrics of one model on the held-out split, and its answers."""

    metrics: dict[str, float]
    answers: list[str]


def score_models(args: Args, examples: Sequence[Example]) -> dict[str, Scores]:
    """Scores of the base model and of base + adapter on `examples` (CPU or the first GPU)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from steps.common.modeling import load_tokenizer

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model_dir = resolve_model(args.base_model, args.model_cache_dir)
    tokenizer = load_tokenizer(model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(device).eval()
    # examples scored: loss and answers, base and tuned; a line every 2 s (the Argo UI and the executor table)
    with Progress(4 * len(examples), "evaluate") as progress:
        base = _score(model, tokenizer, examples, args, progress)
        tuned_model = PeftModel.from_pretrained(model, args.adapter_dir).eval()
        return {"base": base, "tuned": _score(tuned_model, tokenizer, examples, args, progress)}


def _score(model: Any, tokenizer: Any, examples: Sequence[Example], args: Args, progress: Progress) -> Scores:
    from steps.common.modeling import generate

    loss = _completion_loss(model, tokenizer, examples, args, progress)
    answers: list[str] = []
    prompts = [e.prompt for e in examples]
    for start in range(0, len(prompts), args.batch_size):
        part = prompts[start : start + args.batch_size]
        answers += generate(model, tokenizer, part, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
        progress.advance(len(part))
    metrics = {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    for metric in args.task_metrics:
        scores = [task_score(metric, a, e.completion) for a, e in zip(answers, examples, strict=True)]
        metrics[metric] = sum(scores) / len(scores)
    return Scores(metrics=metrics, answers=answers)


def _completion_loss(model: Any, tokenizer: Any, examples: Sequence[Example], args: Args, progress: Progress) -> float:
    """Mean cross-entropy per completion token (prompt tokens are not scored)."""
    import torch

    from steps.common.encoding import encode_batch
    from steps.common.modeling import IGNORE_INDEX, collate

    total, count = 0.0, 0
    for start in range(0, len(examples), args.batch_size):
        part = examples[start : start + args.batch_size]
        ids, prompt_lens = encode_batch(tokenizer, [e.prompt for e in part], [e.completion for e in part])
        # as encode_example(..., 4096) makes them: cut to 4096 tokens, prompt tokens not scored
        encoded = [(row[:4096], ([IGNORE_INDEX] * n + row[n:])[:4096]) for row, n in zip(ids, prompt_lens, strict=True)]
        batch = {k: v.to(model.device) for k, v in collate(encoded, 0).items()}
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        total += float(losses)
        count += int((labels != IGNORE_INDEX).sum())
        progress.advance(len(part))
    return total / max(count, 1)
