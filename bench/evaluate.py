"""Time evaluate's scoring of the demo's held-out rows: the previous path against eksflow.llm.steps.evaluate.scoring.

    .venv/bin/python bench/evaluate.py --adapter-dir=/tmp/run/train/checkpoints/step-00000024/adapter --rounds 2

Each round scores base and tuned (completion loss and greedy answers, model and adapter load included) with both
paths, alternating which goes first, in one process; prints each time, the medians, their ratio, and how many
answers differ between the paths. The previous path is copied here as it was: torch threads = os.cpu_count()
(--previous-threads=1 leaves only the other changes),
unmerged PEFT model, prompts in file order with no shared-prefix cache.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.base_model import DEMO_MODEL
from eksflow.llm.steps.common.data import EVAL_FILE, Example, load_examples
from eksflow.llm.steps.evaluate import Args
from eksflow.llm.steps.evaluate.scoring import score_models

REPO = Path(__file__).resolve().parent.parent


def previous_generate(model: Any, tokenizer: Any, prompts: Sequence[str], batch_size: int, limit: int) -> list[str]:
    """Greedy answers as modeling.generate made them before: left-padded batches in file order, no prefix cache."""
    import torch

    from eksflow.llm.steps.common.modeling import prompt_text

    tokenizer.padding_side = "left"
    answers = []
    for start in range(0, len(prompts), batch_size):
        texts = [prompt_text(tokenizer, p) for p in prompts[start : start + batch_size]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=limit, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        width = batch["input_ids"].shape[1]
        answers += [str(tokenizer.decode(row[width:], skip_special_tokens=True)).strip() for row in out]
    return answers


def previous_scores(args: Args, examples: Sequence[Example], threads: int) -> dict[str, list[str]]:
    """The answers of the previous score_models (its loss pass included, as it ran)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from eksflow.llm.steps.common.base_model import resolve_model
    from eksflow.llm.steps.common.modeling import load_tokenizer
    from eksflow.llm.steps.evaluate.scoring import _completion_loss, answer_budget
    from eksflow.runtime.outputs import Progress

    torch.set_num_threads(threads)
    model_dir = resolve_model(args.base_model, args.model_cache_dir)
    tokenizer = load_tokenizer(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    limit = args.max_new_tokens or answer_budget(tokenizer, [e.completion for e in examples])
    prompts = [e.prompt for e in examples]
    answers = {}
    with Progress(4 * len(examples), "previous") as progress:
        for name in ("base", "tuned"):
            if name == "tuned":
                model = PeftModel.from_pretrained(model, args.adapter_dir).eval()
            _completion_loss(model, tokenizer, examples, args, progress)
            answers[name] = previous_generate(model, tokenizer, prompts, args.batch_size, limit)
    return answers


def main() -> None:
    """Interleave the two paths for --rounds rounds; print times, medians, ratio and differing answers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter-dir", type=Path, required=True, help="a LoRA adapter trained on the demo data")
    parser.add_argument("--dataset-dir", type=Path, default=REPO / "data" / "demo")
    parser.add_argument("--model-cache-dir", type=Path, default=Path("/tmp/evalspeed-models"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--previous-threads", type=int, default=os.cpu_count() or 1, help="torch threads of the previous path"
    )
    opts = parser.parse_args()
    args = Args(
        dataset_dir=opts.dataset_dir,
        adapter_dir=opts.adapter_dir,
        base_model=DEMO_MODEL,
        model_cache_dir=opts.model_cache_dir,
        report_dir=Path("/tmp/bench-evaluate"),
        batch_size=opts.batch_size,
    )
    examples = load_examples(opts.dataset_dir / EVAL_FILE)
    times: dict[str, list[float]] = {"previous": [], "current": []}
    answers: dict[str, dict[str, list[str]]] = {}
    for round_ in range(opts.rounds):
        order = ["previous", "current"] if round_ % 2 == 0 else ["current", "previous"]
        for path in order:
            start = time.perf_counter()
            if path == "previous":
                answers[path] = previous_scores(args, examples, opts.previous_threads)
            else:
                answers[path] = {name: s.answers for name, s in score_models(args, examples).items()}
            times[path].append(time.perf_counter() - start)
            print(f"round {round_ + 1} {path}: {times[path][-1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    old, new = (statistics.median(times[p]) for p in ("previous", "current"))
    print(f"{len(examples)} rows, base and tuned: previous {old:.1f} s, current {new:.1f} s, {old / new:.2f}x")
    for name in ("base", "tuned"):
        pairs = zip(answers["previous"][name], answers["current"][name], strict=True)
        differ = [(a, b) for a, b in pairs if a != b]
        print(f"{name}: {len(differ)} of {len(examples)} answers differ {differ[:4]}")


if __name__ == "__main__":
    main()
