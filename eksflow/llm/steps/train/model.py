"""The model a worker trains: the base model loaded (in NF4 for QLoRA) and wrapped by peft with the adapter.

`train.lora.quantize=4bit` loads every linear layer of the base but the output head as bitsandbytes' NF4 (4-bit
NormalFloat, the QLoRA paper's data type) computing in the worker's precision, and prepares it as peft's
prepare_model_for_kbit_training does (base frozen, the rest fp32); the adapter trains in fp32 over it. bitsandbytes
0.50 runs it on CPU too (its libbitsandbytes_cpu), so QLoRA trains here as on GPUs. The adapter it writes is a plain
LoRA adapter of the unquantized base's shapes: serving loads it onto the base model as it loads any other.
"""

from __future__ import annotations

from typing import Any

from eksflow.llm.steps.train import TrainSettings


def peft_model(settings: TrainSettings, model_dir: str, device: Any, precision: str) -> Any:
    """The base model in `model_dir` with `settings.lora`'s adapter, on `device` when quantized (else on CPU).

    `precision` (bf16 or fp32) is the 4-bit layers' compute dtype; an unquantized base loads in fp32 and computes
    as the strategy casts it (autocast, FSDP's or ZeRO's mixed precision).
    """
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    checkpointing = {"use_reentrant": False}
    if settings.lora.quantize == "4bit":
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
        )
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir,
            dtype=torch.float32,
            attn_implementation="sdpa",
            quantization_config=quantization,
            device_map={"": device},  # bitsandbytes quantizes as it places the weights
        )
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=settings.gradient_checkpointing,
            gradient_checkpointing_kwargs=checkpointing,
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
            model.enable_input_require_grads()
    return get_peft_model(model, settings.lora.peft_config())


def parameter_count(model: Any) -> int:
    """The model's parameters, a 4-bit weight counted by its unquantized shape (bitsandbytes packs two a byte)."""
    total = 0
    for param in model.parameters():
        quant_state = getattr(param, "quant_state", None)
        total += quant_state.shape.numel() if quant_state is not None else param.numel()
    return total
