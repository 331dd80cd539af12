"""How the train loop computes: the precision each setting resolves to, the CPU LoRA dropout (nn.Dropout's
distribution, scale and gradient), the frozen projections through oneDNN (linear's value and input gradient), and the
loss (cross_entropy's value and gradient)."""

import math

import pytest
import torch
from pydantic import ValidationError

from eksflow.llm.steps.train import TrainSettings, linear
from eksflow.llm.steps.train.dropout import MaskDropout, use_mask_dropout
from eksflow.llm.steps.train.linear import FrozenLinear, use_onednn_linears
from eksflow.llm.steps.train.loss import learned_token_loss
from eksflow.llm.steps.train.parallel import resolve_precision
from eksflow.runtime.args import StepInputError

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("amx", [True, False])
def test_auto_is_bf16_on_gpu_and_on_an_amx_cpu_under_ddp_only(monkeypatch, amx):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    auto = TrainSettings()
    assert resolve_precision(auto, CPU, "ddp") == ("bf16" if amx else "fp32")
    assert resolve_precision(auto, CPU, "fsdp") == "fp32"  # gloo FSDP and ZeRO on CPU stay fp32
    assert resolve_precision(auto, CPU, "deepspeed") == "fp32"
    for strategy in ("ddp", "fsdp", "deepspeed"):
        assert resolve_precision(auto, GPU, strategy) == "bf16"
        assert resolve_precision(TrainSettings(precision="fp32"), GPU, strategy) == "fp32"
    assert resolve_precision(TrainSettings(precision="bf16"), CPU, "ddp") == "bf16"  # emulated without AMX: slow


def test_bf16_with_fsdp_or_zero_on_cpu_is_refused_in_one_line():
    with pytest.raises(ValidationError, match="precision=bf16 on CPU trains under DDP only; strategy=fsdp"):
        TrainSettings(precision="bf16", strategy="fsdp")
    assert TrainSettings(precision="bf16", strategy="fsdp", use_gpu=True).precision == "bf16"
    # strategy=auto resolves in the worker, with the model's size: the refusal comes from there
    with pytest.raises(StepInputError, match="strategy auto chose deepspeed: set strategy=ddp or precision=auto"):
        resolve_precision(TrainSettings(precision="bf16"), CPU, "deepspeed")


def test_mask_dropout_keeps_one_minus_p_scaled_and_passes_the_gradient_through_the_mask():
    p, n = 0.05, 1_000_000
    torch.manual_seed(0)
    x = torch.ones(n, requires_grad=True)
    y = MaskDropout(p)(x)
    kept = y != 0
    # 1 - p within 5 standard deviations of a binomial count
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert torch.allclose(y[kept], torch.full((int(kept.sum()),), 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x * mask * scale)/dx = mask * scale


@pytest.mark.parametrize("shape", [(4, 8, 16), (3, 5, 7)])  # two draws an integer: an odd count leaves one unused
def test_mask_dropout_follows_the_seed_and_is_the_identity_when_off(shape):
    x = torch.randn(*shape)
    dropout = MaskDropout(0.3)
    torch.manual_seed(7)
    first = dropout(x)
    torch.manual_seed(7)
    assert torch.equal(dropout(x), first)
    assert not torch.equal(dropout(x), first)  # the stream moves on
    assert dropout.eval()(x) is x
    assert MaskDropout(0.0).train()(x) is x
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        MaskDropout(1.0)


def _tiny_peft_model(dropout: float = 0.1):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    lora = LoraConfig(r=2, lora_dropout=dropout, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return get_peft_model(LlamaForCausalLM(config), lora)


def test_every_lora_dropout_of_a_peft_model_is_replaced_with_its_p():
    model = _tiny_peft_model()
    assert use_mask_dropout(model) == 4  # q and v of 2 layers
    dropouts = [m for m in model.modules() if isinstance(m, (MaskDropout, torch.nn.Dropout))]
    assert dropouts and all(type(m) is MaskDropout and m.p == 0.1 for m in dropouts)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    assert use_mask_dropout(_tiny_peft_model(dropout=0.0)) == 0  # dropout 0: peft's Identity stays


@pytest.mark.parametrize("bias", [False, True])
def test_a_frozen_linear_is_torchs_linear_and_passes_only_the_inputs_gradient(bias):
    torch.manual_seed(0)
    reference = torch.nn.Linear(96, 40, bias=bias).requires_grad_(False)
    ours = torch.nn.Linear(96, 40, bias=bias).requires_grad_(False)
    ours.load_state_dict(reference.state_dict())
    assert use_onednn_linears(ours) == 1 and type(ours) is FrozenLinear
    x = torch.randn(3, 7, 96)  # a batch of sequences: the product runs over the last dimension
    ours_x, reference_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, expected = ours(ours_x), reference(reference_x)
    grad = torch.randn_like(expected)
    y.backward(grad)
    expected.backward(grad)
    assert y.shape == expected.shape and torch.allclose(y, expected, rtol=0, atol=1e-5)  # summed in another order
    assert torch.allclose(ours_x.grad, reference_x.grad, rtol=0, atol=1e-5)
    assert all(p.grad is None for p in ours.parameters())
    assert ours.state_dict().keys() == reference.state_dict().keys()
    with torch.no_grad():
        assert torch.allclose(ours(x.mT.contiguous().mT), expected, atol=1e-5)  # a strided input
        assert torch.equal(ours.double()(x.double()), reference.double()(x.double()))  # not fp32: torch's own


def test_only_frozen_plain_linears_go_through_onednn_and_training_still_moves_the_adapter():
    torch.manual_seed(0)
    model = _tiny_peft_model(dropout=0.0)
    frozen = [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad]
    # every projection of 2 layers (q, k, v, o, gate, up, down) and the vocabulary head; not the LoRA A and B
    assert use_onednn_linears(model) == len(frozen) == 15
    adapters = [m for name, m in model.named_modules() if name.endswith((".lora_A.default", ".lora_B.default"))]
    assert len(adapters) == 8 and all(type(m) is torch.nn.Linear for m in adapters)
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    model.train()
    loss = model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0).step()
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, adapter[n])]
    assert moved and all(".lora_A." in n or ".lora_B." in n for n in moved)


def test_no_linear_changes_where_onednn_is_not_available(monkeypatch):
    monkeypatch.setattr(linear.platform, "machine", lambda: "aarch64")  # Graviton: its BLAS is not measured
    model = _tiny_peft_model()
    assert not linear.onednn_available() and use_onednn_linears(model) == 0
    assert not any(type(m) is FrozenLinear for m in model.modules())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_and_its_gradient_are_cross_entropys_in_fp32(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(37, 1000) * 4).to(dtype)
    targets = torch.randint(0, 1000, (37,))
    ours, reference = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss = learned_token_loss(ours, targets)
    expected = torch.nn.functional.cross_entropy(reference.float(), targets)
    (3.0 * loss).backward()
    (3.0 * expected).backward()
    assert loss.dtype == torch.float32 and ours.grad.dtype == dtype
    assert torch.allclose(loss, expected, rtol=1e-6, atol=0)
    tolerance = 1e-7 if dtype == torch.float32 else 1e-3  # bf16: the gradient is rounded to bf16 either way
    assert torch.allclose(ours.grad.float(), reference.grad.float(), rtol=0, atol=tolerance)


def test_a_micro_batch_with_no_learned_token_adds_nothing_instead_of_nan():
    weight = torch.randn(4, 8, requires_grad=True)
    logits = torch.zeros(0, 4) @ weight  # every completion cut off by max_seq_len: no row
    loss = learned_token_loss(logits, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(weight.grad, torch.zeros(4, 8))
