"""Scoring a model on the held-out examples: completion loss and batched greedy answers (CPU or the first GPU)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from eksflow.llm.steps.common.base_model import resolve_model
from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.preference import Preference
from eksflow.llm.steps.common.trained import model_kind
from eksflow.llm.steps.evaluate import Args, base_scores
from eksflow.llm.steps.evaluate import metrics as task_metrics
from eksflow.runtime.args import StepInputError
from eksflow.runtime.metrics import Metric
from eksflow.runtime.outputs import Progress


class Scores(BaseModel):
    """Metrics of one model on the held-out split, and its answers."""

    metrics: dict[str, float]
    answers: list[str]
    cut: int = 0  # answers that hit the new-token cap before their end
    max_new_tokens: int = 0  # that cap: the canary asks the served model up to it too


def score_models(args: Args, examples: Sequence[Example], preferences: Sequence[Preference] = ()) -> dict[str, Scores]:
    """Scores of the base model and of the tuned one (base + adapter, or a full fine-tune's model) on `examples`.

    They run on CPU or the first GPU.
    The base model's answers come from the model cache when an earlier evaluation decoded them (base_scores). With
    `preferences` (method dpo; `examples` their chosen answers) both get preference_accuracy and reward_margin from
    each model's log-probabilities of the chosen and rejected answers (eksflow.llm.steps.evaluate.preference).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from eksflow.llm.steps.common import encoding, modeling
    from eksflow.llm.steps.evaluate.preference import answer_logps, preference_metrics

    metric_functions(args)  # a metric that cannot be imported fails now, before minutes of scoring
    torch.manual_seed(0)
    torch.set_num_threads(compute_threads())
    model_dir = args.templated(resolve_model(args.base_model, args.model_cache_dir), args.model_cache_dir)
    tokenizer = modeling.load_tokenizer(model_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = model.to(device).eval()
    limit = args.max_new_tokens or answer_budget(tokenizer, [e.completion for e in examples])
    print(f"answers are generated up to {limit} new tokens", file=sys.stderr)
    decoding = {
        "batch_size": args.batch_size,
        "max_new_tokens": limit,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    code = (sys.modules[__name__], modeling, encoding)  # what decodes and scores: part of the kept answers' key
    kept = base_scores.cache_file(args.model_cache_dir, model_dir, examples, decoding, code)
    # examples scored: loss and answers, base and tuned; a line every 2 s (the Argo UI and the executor table)
    with Progress(4 * len(examples), "evaluate") as progress, torch.inference_mode():
        base = base_scores.read(kept)
        if base is None:
            base = _decode(model, tokenizer, examples, args, limit, progress)
            base_scores.write(kept, base)
        else:
            print(f"base model: answers and loss of an earlier evaluation ({kept})", file=sys.stderr)
            progress.advance(2 * len(examples))
        base_logps = answer_logps(model, tokenizer, preferences, args.batch_size)
        tuned_model = _tuned_model(model, args, device)
        tuned = _decode(tuned_model, tokenizer, examples, args, limit, progress)
        tuned_logps = answer_logps(tuned_model, tokenizer, preferences, args.batch_size)
    scores = {"base": _scores(base, examples, args, limit), "tuned": _scores(tuned, examples, args, limit)}
    if preferences:
        ranked = preference_metrics(tuned_logps, base_logps, args.dpo_beta)
        for name, found in zip(("tuned", "base"), ranked, strict=True):
            scores[name].metrics.update(found)
    return scores


def _tuned_model(base: Any, args: Args, device: str) -> Any:
    """The tuned model of --adapter-dir: a full fine-tune's model as saved, or the adapter merged into `base`.

    Merged into the base weights (in place: the base model is scored already): unmerged, every adapted projection
    costs two more matmuls per token, which on CPU is most of a decode step's time. A full fine-tune's preference
    metrics still take `base`'s log-probabilities as the reference, computed before.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if model_kind(args.adapter_dir, "--adapter-dir") == "model":
        tuned: Any = AutoModelForCausalLM.from_pretrained(args.adapter_dir, dtype=torch.float32)
        return tuned.to(device).eval()
    return PeftModel.from_pretrained(base, args.adapter_dir).merge_and_unload()


def compute_threads() -> int:
    """Torch's intra-op threads: OMP_NUM_THREADS when set, else one.

    Decoding runs hundreds of small matmuls per token, each ending in a barrier of all threads. On the demo's two
    cores, shared with other processes, two threads made a 16-row decode matmul 15x slower than one
    (the barrier waits for a descheduled thread) and a whole evaluate 4-8x slower (bench/README.md); one thread
    never waits. `os.cpu_count()` is also the node's count in a container, not the pod's CPU limit.
    """
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP allows a list: "4,2"
    return max(1, int(first)) if first.isdigit() else 1


def metric_functions(args: Args) -> dict[str, Metric]:
    """The configured task metrics as functions; a name that is no built-in or declared metric is bad input (exit 2)."""
    try:
        return {name: task_metrics.resolve(name) for name in args.task_metrics}
    except ValueError as err:
        raise StepInputError(f"evaluate.task_metrics: {err}") from err


def answer_budget(tokenizer: Any, references: Sequence[str]) -> int:
    """New tokens to generate: the longest reference (with its EOS) plus a quarter, at least 8 more.

    Enough for every reference answer, so a correct model is never cut off; bounded, so a model that rambles
    costs little.
    """
    longest = max(len(tokenizer(r + tokenizer.eos_token, add_special_tokens=False)["input_ids"]) for r in references)
    return longest + max(8, longest // 4)


def _decode(
    model: Any, tokenizer: Any, examples: Sequence[Example], args: Args, limit: int, progress: Progress
) -> base_scores.Decoded:
    from eksflow.llm.steps.common.modeling import generate

    loss = _completion_loss(model, tokenizer, examples, args, progress)
    answers: list[str] = []
    cut = 0
    histories = [e.history() for e in examples]  # a conversation is asked with every turn before its answer
    for start in range(0, len(histories), args.batch_size):
        part = histories[start : start + args.batch_size]
        part_answers, part_cut = generate(model, tokenizer, part, batch_size=args.batch_size, max_new_tokens=limit)
        answers += part_answers
        cut += part_cut
        progress.advance(len(part))
    return base_scores.Decoded(eval_loss=loss, answers=answers, cut=cut)


def _scores(decoded: base_scores.Decoded, examples: Sequence[Example], args: Args, limit: int) -> Scores:
    if decoded.cut:
        print(
            f"warning: {decoded.cut} of {len(decoded.answers)} answers reached the {limit}-token cap before ending; "
            "raise evaluate.max_new_tokens (0 sizes it from the references) if they were cut short",
            file=sys.stderr,
        )
    loss = decoded.eval_loss
    metrics = {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
    references = [e.completion for e in examples]
    for name, metric in metric_functions(args).items():
        metrics[name] = task_metrics.score(metric, decoded.answers, references)
    return Scores(metrics=metrics, answers=decoded.answers, cut=decoded.cut, max_new_tokens=limit)


def _completion_loss(model: Any, tokenizer: Any, examples: Sequence[Example], args: Args, progress: Progress) -> float:
    """Mean cross-entropy per token of each example's answer; no other token is scored.

    The answer is the example's last learned span: a pair's completion, a conversation's last assistant turn (the
    reference its generated answer is scored against).
    """
    import torch

    from eksflow.llm.steps.common.encoding import encode_batch
    from eksflow.llm.steps.common.modeling import IGNORE_INDEX, collate

    total, count = 0.0, 0
    for start in range(0, len(examples), args.batch_size):
        part = examples[start : start + args.batch_size]
        ids, spans = encode_batch(tokenizer, part)
        encoded = [answer_labels(row, learned[-1], 4096) for row, learned in zip(ids, spans, strict=True)]
        batch = {k: v.to(model.device) for k, v in collate(encoded, 0).items()}
        with torch.inference_mode():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        total += float(losses)
        count += int((labels != IGNORE_INDEX).sum())
        progress.advance(len(part))
    return total / max(count, 1)


def answer_labels(ids: Sequence[int], answer: tuple[int, int], max_len: int) -> tuple[list[int], list[int]]:
    """`ids` cut to `max_len` and their labels: the answer's tokens [start, end), IGNORE_INDEX everywhere else.

    For a pair (answer = (prompt_len, len(ids))) this is `modeling.encode_example(..., max_len)`.
    """
    from eksflow.llm.steps.common.modeling import truncated

    return truncated(ids, [answer], max_len)
