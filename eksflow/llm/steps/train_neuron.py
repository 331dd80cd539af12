"""Fine-tune a LoRA adapter on AWS Trainium with optimum-neuron's NeuronTrainer (one process per NeuronCore).

    torchrun --nproc_per_node=32 -m eksflow.llm.steps.train_neuron --dataset-dir=/fsx/run/data \
        --base-model=/fsx/models/llama \
        --output-dir=/fsx/run/train            # the same arguments as eksflow.llm.steps.train

Runs in the train-neuron image (the `neuron` extra: optimum-neuron pins its own transformers), launched by the
Volcano Job that eksflow/launchers/volcano.py renders for trn1 instance types. The eksflow -> NeuronTrainingArguments
mapping (tensor parallelism, bf16, ZeRO-1, checkpoint cadence) is eksflow.llm.steps.common.neuron.training_arguments,
unit tested without the Neuron SDK; this module itself needs Trainium and has not run on this project's CPU machines.

Outputs: the same files as eksflow.llm.steps.train (adapter_dir, checkpoint_dir, final_loss, tokens_per_s,
mlflow_run_id).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.base_model import resolve_model
from eksflow.llm.steps.common.data import TRAIN_FILE, load_examples
from eksflow.llm.steps.common.encoding import BATCH, encode_batch
from eksflow.llm.steps.common.modeling import truncated
from eksflow.llm.steps.common.neuron import training_arguments
from eksflow.llm.steps.train import Args, Outputs, TrainSettings
from eksflow.runtime.args import StepInputError, run_step


def run(args: Args) -> Outputs:
    """Train with NeuronTrainer; the Trainer's own checkpoints (save_steps, save_total_limit) give resume."""
    if args.lora.quantize != "none":
        raise StepInputError(f"lora.quantize={args.lora.quantize}: bitsandbytes has no Trainium path; use none here")
    if args.method != "sft":
        raise StepInputError(
            f"train.method={args.method}: the Trainium step trains with NeuronTrainer, supervised only; train "
            "preference tuning on CPU or GPU nodes (eksflow.llm.steps.train)"
        )
    if args.finetune != "lora":
        raise StepInputError(
            f"train.finetune={args.finetune}: the Trainium step trains a LoRA adapter with NeuronTrainer; train a "
            "full fine-tune on CPU or GPU nodes (eksflow.llm.steps.train)"
        )
    try:
        from optimum.neuron import NeuronTrainer, NeuronTrainingArguments
    except ImportError as err:
        raise StepInputError(
            "eksflow.llm.steps.train_neuron needs optimum-neuron on a Trainium instance (the train-neuron image, "
            f"`pip install eksflow[neuron]`); for CPUs and GPUs use eksflow.llm.steps.train ({err})"
        ) from err
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq
    from transformers.trainer_utils import get_last_checkpoint

    from eksflow.llm.steps.common.modeling import load_tokenizer

    model_dir = args.templated(resolve_model(args.base_model, args.model_cache_dir), args.model_cache_dir)
    tokenizer = load_tokenizer(model_dir)
    examples = load_examples(args.dataset_dir / TRAIN_FILE)
    dataset = []
    for start in range(0, len(examples), BATCH):
        ids, spans = encode_batch(tokenizer, examples[start : start + BATCH])
        for row, learned in zip(ids, spans, strict=True):
            dataset.append(dict(zip(("input_ids", "labels"), truncated(row, learned, args.max_seq_len), strict=True)))
    settings = args.model_dump(include=set(TrainSettings.model_fields))
    trainer_args = NeuronTrainingArguments(**training_arguments(settings, str(args.output_dir / "checkpoints")))
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    model = get_peft_model(model, args.lora.peft_config())
    trainer = NeuronTrainer(
        model=model,
        args=trainer_args,
        train_dataset=dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100),
    )
    resume = get_last_checkpoint(trainer_args.output_dir) if Path(trainer_args.output_dir).is_dir() else None
    result = trainer.train(resume_from_checkpoint=resume)
    adapter_dir = args.output_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    mean_tokens = sum(len(row["input_ids"]) for row in dataset) / len(dataset)
    metrics = {
        "loss": float(result.training_loss),
        "tokens_per_s": float(result.metrics.get("train_samples_per_second", 0.0)) * mean_tokens,
    }
    run_id = ""
    if args.tracking_uri and int(os.environ.get("RANK", "0")) == 0:
        run_id = tracking.start_run(
            args.tracking_uri,
            args.experiment,
            args.run_name,
            {"eksflow.step": "train", tracking.WORKFLOW_TAG: args.run_name},
        )
        tracking.log_metrics(args.tracking_uri, run_id, metrics, step=args.max_steps)
    return Outputs(
        adapter_dir=str(adapter_dir),
        checkpoint_dir=str(resume or trainer_args.output_dir),
        final_loss=metrics["loss"],
        tokens_per_s=metrics["tokens_per_s"],
        mlflow_run_id=run_id,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: `torchrun ... -m eksflow.llm.steps.train_neuron --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
