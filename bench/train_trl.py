"""TRL's SFTTrainer (assistant-only loss) and DPOTrainer (peft) as `--extra` variants of bench/train_peers.py.

    .venv/bin/python bench/train_trl.py check          # TRL's template renders the same ids, masks the same turns
    .venv/bin/python bench/train_peers.py --rounds 3 --steps 3 --warmup 1 --variants '' \
        --extra eksflow_chat='BENCH_DATA=chat BENCH_PRECISION=fp32 .venv/bin/python bench/train.py' \
        --extra trl_sft='.venv/bin/python bench/train_trl.py sft' \
        --extra eksflow_dpo='BENCH_DATA=dpo BENCH_PRECISION=fp32 .venv/bin/python bench/train.py' \
        --extra trl_dpo='.venv/bin/python bench/train_trl.py dpo' \
        --extra eksflow_sft_pairs='BENCH_DATA=sft-pairs BENCH_PRECISION=fp32 .venv/bin/python bench/train.py'
    .venv/bin/python bench/train_trl.py report         # per-round ratios from /tmp/bench-train/results.json

The data is made here, deterministically (no hub): CONVERSATIONS multi-turn chats (a system turn and three
user/assistant exchanges) and PAIRS preference pairs in TRL's conversational form (`prompt` a user turn, `chosen` and
`rejected` one assistant turn each). eksflow's side (bench/train.py with BENCH_DATA) trains on the same records.
Every record fits the harness's sequence length, so neither side truncates.

TRL runs as its documentation has it, on the harness's model, LoRA shape (peft_config), micro-batch, sequence length,
threads, learning rate and AdamW, in fp32 and without gradient checkpointing (`bf16=False`,
`gradient_checkpointing=False`: TRL's configs default both to True; eksflow's step here runs neither):
- sft: SFTTrainer with `assistant_only_loss=True`. SmolLM2's chat template has no `{% generation %}` markers, which
  that option needs, so TRL gets TRAINING_TEMPLATE: the same template with the markers around each assistant turn's
  content, end-of-turn token and the newline after it (what eksflow learns); `check` proves that both render the
  same token ids and that TRL's assistant mask is eksflow's learned spans.
- dpo: DPOTrainer given the model and a peft_config, no ref_model: TRL then takes the reference log-probs from the
  same model with the adapter disabled, as eksflow does; `precompute_ref_log_probs=False` (the default, and what
  eksflow does: the reference forward runs in every step); sigmoid loss, beta 0.1; `disable_dropout=False`, so
  that LoRA dropout (0.05) runs on both sides.
tokens/s counts real tokens, as bench/train.py does: each step's attention mask summed (padding left out); for DPO
the chosen and the rejected sequence of each pair, prompt included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import round_ratios  # beside this file: a script's folder is on its path

CONVERSATIONS = 64
PAIRS = 64
SUBJECTS = ("a lighthouse", "the tides", "a compiler", "sourdough", "a glacier", "the violin", "a bridge", "tea")
# The peer harness's own word list (bench/train_peers.py, vendored as its authors wrote it, keeps it inside a
# function): the conversations read like the rows it makes.
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "at",
    "from",
    "this",
    "be",
    "are",
    "which",
    "or",
    "an",
    "has",
    "have",
    "not",
    "but",
    "they",
    "were",
    "its",
    "can",
    "all",
    "more",
    "about",
    "one",
    "also",
]
SYSTEM = "You are a concise assistant. Answer in plain sentences."

# SmolLM2's template (the demo model's chat_template.jinja) with TRL's {% generation %} markers around what eksflow
# learns of an assistant turn: its content, the end-of-turn token and the newline the template puts after it (all
# that follows the assistant header up to the next turn).
TRAINING_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _sentence(rnd: random.Random, low: int, high: int) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(low, high))).capitalize() + "."


def conversations(seed: int = 0) -> list[dict[str, Any]]:
    """CONVERSATIONS chats: a system turn, then three user questions each answered by the assistant."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(CONVERSATIONS):
        subject = rnd.choice(SUBJECTS)
        messages = [{"role": "system", "content": SYSTEM}]
        for question in (f"Tell me about {subject}.", "Why is that so?", "Sum it up in one line."):
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": _sentence(rnd, 18, 34)})
        rows.append({"messages": messages})
    return rows


def pairs(seed: int = 1) -> list[dict[str, Any]]:
    """PAIRS preference pairs in TRL's conversational form: a user turn, a chosen and a rejected assistant turn."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(PAIRS):
        prompt = f"Explain {rnd.choice(SUBJECTS)} to a child in a few sentences."
        rows.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": _sentence(rnd, 40, 70)}],
                "rejected": [{"role": "assistant", "content": _sentence(rnd, 40, 70)}],
            }
        )
    return rows


class _Clock:
    """Step ends (TrainerCallback's on_train_begin and on_step_end) and each step's real tokens."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.tokens: list[int] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback

        marks = self.marks

        class StepEnds(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                marks.append(time.perf_counter())

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                marks.append(time.perf_counter())

        return StepEnds()


def _counting(trainer_class: Any, clock: _Clock) -> Any:
    """`trainer_class` recording each training step's real tokens (its batch's attention mask summed)."""

    class Counting(trainer_class):  # type: ignore[misc, valid-type]
        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            mask = inputs.get("attention_mask")
            clock.tokens.append(int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel()))
            return super().training_step(model, inputs, *args, **kwargs)

    return Counting


def run_trl(kind: str) -> dict[str, Any]:
    """Train BENCH_WARMUP + BENCH_STEPS steps with TRL's SFTTrainer (kind sft) or DPOTrainer (dpo)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    model_dir = os.environ.get("BENCH_MODEL_DIR") or _demo_model()
    seq, mb = int(os.environ.get("BENCH_SEQ", "256")), int(os.environ.get("BENCH_MB", "4"))
    steps, warmup = int(os.environ.get("BENCH_STEPS", "3")), int(os.environ.get("BENCH_WARMUP", "1"))
    threads = int(os.environ.get("BENCH_THREADS", str(os.cpu_count() or 1)))
    lora = json.loads(os.environ.get("BENCH_LORA", "{}")) or {
        "r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    torch.set_num_threads(threads)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.use_cache = False
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        common = {
            "output_dir": tmp,
            "per_device_train_batch_size": mb,
            "max_steps": warmup + steps,
            "learning_rate": 2e-4,
            "weight_decay": 0.0,
            "optim": "adamw_torch",
            "lr_scheduler_type": "constant",
            "warmup_steps": 0,
            "logging_strategy": "no",
            "save_strategy": "no",
            "eval_strategy": "no",
            "report_to": [],
            "use_cpu": True,
            "bf16": False,
            "gradient_checkpointing": False,  # TRL's configs default to True; eksflow's train step to False
            "dataloader_num_workers": 0,
            "seed": 0,
            "disable_tqdm": True,
            "max_length": seq,
        }
        peft_config = LoraConfig(task_type="CAUSAL_LM", bias="none", **lora)
        if kind == "sft":
            tokenizer.chat_template = TRAINING_TEMPLATE
            trainer = _counting(SFTTrainer, clock)(
                model=model,
                args=SFTConfig(**common, assistant_only_loss=True, packing=False),
                train_dataset=Dataset.from_list(conversations()),
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[clock.callback()],
            )
        else:
            trainer = _counting(DPOTrainer, clock)(
                model=model,
                args=DPOConfig(
                    **common, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=False, disable_dropout=False
                ),
                train_dataset=Dataset.from_list(pairs()),
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[clock.callback()],
            )
        ready = time.perf_counter() - started
        trainer.train()
    intervals = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    timed = intervals[warmup:]
    return {
        "tokens_per_s": statistics.median(n / s for n, s in zip(clock.tokens[warmup:], timed, strict=True)),
        "real_tokens_per_step": clock.tokens[warmup:],
        "intervals": timed,
        "warmup_intervals": intervals[:warmup],
        "startup_s": ready,
        "threads": threads,
        "precision": "fp32",
    }


def check() -> int:
    """Exit 0 when TRL's template and the model's render the same ids and TRL masks eksflow's learned spans.

    Every conversation is rendered by both templates and by eksflow's encode_batch; every record must also fit the
    harness's sequence length (256).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from eksflow.llm.steps.common.data import Example
    from eksflow.llm.steps.common.encoding import encode_batch
    from eksflow.llm.steps.common.modeling import load_tokenizer

    tokenizer = load_tokenizer(Path(os.environ.get("BENCH_MODEL_DIR") or _demo_model()))
    chats = conversations()
    examples = [Example("", "", tuple(chat["messages"])) for chat in chats]
    ids, spans = encode_batch(tokenizer, examples)
    own = tokenizer.chat_template
    for chat, row_ids, row_spans in zip(chats, ids, spans, strict=True):
        tokenizer.chat_template = own
        plain = tokenizer.apply_chat_template(chat["messages"], tokenize=True, return_dict=True)["input_ids"]
        tokenizer.chat_template = TRAINING_TEMPLATE
        marked = tokenizer.apply_chat_template(
            chat["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        mask = marked["assistant_masks"]
        learned = [int(any(a <= i < b for a, b in row_spans)) for i in range(len(row_ids))]
        if not (list(plain) == list(marked["input_ids"]) == list(row_ids)) or list(mask) != learned:
            print(f"MISMATCH: {chat['messages'][1]['content']!r}", file=sys.stderr)
            return 1
    tokenizer.chat_template = own
    longest_pair = max(
        len(tokenizer.apply_chat_template(pair["prompt"] + pair[side], tokenize=True, return_dict=True)["input_ids"])
        for pair in pairs()
        for side in ("chosen", "rejected")
    )
    lengths = [len(row) for row in ids]
    print(
        f"ok: {len(chats)} conversations render the same ids under both templates ({min(lengths)}-{max(lengths)} "
        f"tokens, {sum(sum(b - a for a, b in s) for s in spans)} learned of {sum(lengths)}); TRL's assistant mask "
        f"is eksflow's learned spans; the longest preference sequence is {longest_pair} tokens"
    )
    return 0 if max(lengths) <= 256 and longest_pair <= 256 else 1


TRL_RATIOS = {  # name: (numerator variant, denominator variant, result key), each a ratio per round
    "chat SFT eksflow/TRL tokens/s": ("eksflow_chat", "trl_sft", "tokens_per_s"),
    "DPO eksflow/TRL tokens/s": ("eksflow_dpo", "trl_dpo", "tokens_per_s"),
    "peak RSS eksflow DPO/SFT": ("eksflow_dpo", "eksflow_sft_pairs", "tree_peak_rss_mb"),
    "peak RSS TRL DPO/eksflow DPO": ("trl_dpo", "eksflow_dpo", "tree_peak_rss_mb"),
}


def _demo_model() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from eksflow.llm.steps.common.base_model import resolve_model

    return str(resolve_model("smollm2-135m-instruct"))


def main() -> int:
    """Run TRL's `sft` or `dpo` with the harness's BENCH_* settings (printing its RESULT line), `check` or `report`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("sft", "dpo", "check", "report"))
    parser.add_argument("--results", default="/tmp/bench-train/results.json", help="report: the harness's JSON")
    what = parser.parse_args().what
    if what == "check":
        return check()
    if what == "report":
        return round_ratios.report(parser.parse_args().results, TRL_RATIOS)
    print("RESULT " + json.dumps(run_trl(what)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
