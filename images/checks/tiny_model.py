"""Write a tiny Llama (2 layers, width 64) with the demo model's tokenizer, and a LoRA adapter on it.

    python /checks/tiny_model.py <tokenizer folder> <out folder>     # -> <out>/model, <out>/adapter

Runs inside the steps image (its own torch, transformers and peft), so that `make check-images` can run the
evaluate step for real in seconds: real weights would only add time. The adapter is trained by no one: its
LoRA B matrices start at zero, so it answers as the base does. The e2e tests' `tiny_llama` is the same model.
"""

import sys
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.modeling import load_tokenizer


def write_model(tokenizer_folder: Path, out: Path) -> Any:
    """Write to `out` a random Llama of 2 layers, width 64, with the tokenizer of `tokenizer_folder`; the model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_folder)
    torch.manual_seed(0)
    shape = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(shape)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model


def main(tokenizer_folder: Path, out: Path) -> None:
    """Write <out>/model and <out>/adapter (LoRA on q and v)."""
    from peft import LoraConfig, get_peft_model

    model = write_model(tokenizer_folder, out / "model")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(str(out / "adapter"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
