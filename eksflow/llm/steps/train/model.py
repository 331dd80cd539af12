"""The model a worker trains: the base model wrapped by peft with the adapter (lora), or the whole model (full).

`train.finetune=full` loads the model in fp32 with every parameter trainable and no peft wrapping; a resumed run
loads it from its checkpoint's model folder instead of the base. DPO's reference for it is a second, frozen copy of
the base (`reference_model`), built once per attempt: LoRA's reference, the adapter disabled, has no counterpart
when every weight moves.

`train.lora.quantize=4bit` loads every linear layer of the base but the output head as bitsandbytes' NF4 (4-bit
NormalFloat, the QLoRA paper's data type) computing in the worker's precision, and prepares it as peft's
prepare_model_for_kbit_training does (base frozen, the rest fp32); the adapter trains in fp32 over it. bitsandbytes
0.50 runs it on CPU too (its libbitsandbytes_cpu), so QLoRA trains here as on GPUs. The adapter it writes is a plain
LoRA adapter of the unquantized base's shapes: serving loads it onto the base model as it loads any other.
"""

from __future__ import annotations

from typing import Any

from eksflow.llm.steps.train import TrainSettings


def trained_model(settings: TrainSettings, model_dir: str, device: Any, precision: str) -> Any:
    """What `settings.finetune` trains: the whole model in `model_dir` (full) or the base with its adapter (lora)."""
    return (
        full_model(settings, model_dir)
        if settings.finetune == "full"
        else peft_model(settings, model_dir, device, precision)
    )


def full_model(settings: TrainSettings, model_dir: str) -> Any:
    """The model in `model_dir` in fp32 on CPU, every parameter trainable (the strategy places and casts it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.requires_grad_(True)
    return model


def reference_model(model_dir: str, device: Any, bf16: bool) -> Any:
    """DPO's reference for a full fine-tune: the base in `model_dir`, frozen (eval mode, no gradients) on `device`.

    It computes in the worker's precision (bf16 or fp32) as loaded: its forward runs outside the strategy's wrapper
    and its casts.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    model.requires_grad_(False)
    return model.to(device).eval()


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
