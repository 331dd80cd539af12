"""Training input: the per-epoch sampler, micro-batches from the token cache, and sequence packing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eksflow.llm.steps.common.modeling import collate, encode_example, next_token_targets
from eksflow.llm.steps.common.token_cache import ensure
from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.data import MicroBatches, batch_indices, epoch_order, first_position, pack


def epoch_of(settings: TrainSettings, world: int, n: int, epoch: int) -> list[int]:
    """Every index the ranks draw during epoch `epoch` (whole steps only: n is a multiple of the global batch)."""
    per_step = settings.micro_batch_size * world * settings.grad_accum_steps
    steps = range(epoch * n // per_step, (epoch + 1) * n // per_step)
    return [
        i
        for step in steps
        for micro in range(settings.grad_accum_steps)
        for rank in range(world)
        for i in batch_indices(step, micro, rank, settings, world, n)
    ]


@pytest.mark.parametrize(("world", "accum"), [(1, 1), (2, 1), (2, 3), (4, 2)])
def test_each_epoch_is_a_permutation_and_epochs_differ(world, accum):
    settings = TrainSettings(micro_batch_size=3, grad_accum_steps=accum, seed=5)
    n = 3 * world * accum * 7
    first, second = epoch_of(settings, world, n, 0), epoch_of(settings, world, n, 1)
    assert sorted(first) == sorted(second) == list(range(n))
    assert first != second


def test_ranks_draw_disjoint_slices_of_the_global_batch():
    settings = TrainSettings(micro_batch_size=4, grad_accum_steps=2, seed=1)
    for step in range(5):
        drawn = [tuple(batch_indices(step, m, r, settings, 3, 1000)) for m in range(2) for r in range(3)]
        flat = [i for batch in drawn for i in batch]
        assert len(set(flat)) == len(flat) == 4 * 2 * 3
        starts = sorted(first_position(step, m, r, settings, 3) for m in range(2) for r in range(3))
        assert starts == list(range(step * 24, step * 24 + 24, 4))  # the global batch, cut into rank slices


def test_the_order_is_a_pure_function_of_seed_and_step():
    settings = TrainSettings(micro_batch_size=8, seed=3)
    before = [batch_indices(s, 0, 0, settings, 1, 77) for s in range(40)]
    epoch_order.cache_clear()  # a resumed process starts with nothing computed
    after = [batch_indices(s, 0, 0, settings, 1, 77) for s in reversed(range(40))][::-1]
    assert before == after
    assert before != [batch_indices(s, 0, 0, TrainSettings(micro_batch_size=8, seed=4), 1, 77) for s in range(40)]


def test_a_micro_batch_costs_o_batch_one_permutation_per_epoch():
    """By construction: 2,000 micro-batches over a 4,000-row set (4 epochs) compute 4 permutations, no more."""
    settings = TrainSettings(micro_batch_size=8, seed=0)
    epoch_order.cache_clear()
    for step in range(2000):
        batch_indices(step, 0, 0, settings, 1, 4000)
    info = epoch_order.cache_info()
    assert info.misses == 4
    assert info.hits == 2000 * 8 - 4


def write_split(path: Path, n: int) -> Path:
    rows = [{"prompt": f"what is {i} plus {i} " + "long " * (i % 9), "completion": str(2 * i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_padded_micro_batches_equal_the_per_example_encoding(tmp_path, tiny_tokenizer):
    """What the loop trained on before the cache: collate(encode_example(...)) of the sampled examples."""
    import torch

    split = write_split(tmp_path / "train.jsonl", 50)
    cache, _ = ensure(split, tiny_tokenizer, tmp_path / "cache")
    settings = TrainSettings(micro_batch_size=4, max_seq_len=16, seed=2)  # 16 cuts the longer examples
    batches = MicroBatches(cache, settings, tiny_tokenizer.pad_token_id)
    for step in range(20):
        batch = batches.get(step, 0, 1, 2, torch.device("cpu"))
        picked = batch_indices(step, 0, 1, settings, 2, 50)
        expected = collate(
            [
                encode_example(tiny_tokenizer, f"what is {i} plus {i} " + "long " * (i % 9), str(2 * i), 16)
                for i in picked
            ],
            tiny_tokenizer.pad_token_id,
        )
        assert batch.inputs["use_cache"] is False
        keep, targets = next_token_targets(expected.pop("labels"))
        assert torch.equal(batch.inputs["logits_to_keep"], keep) and torch.equal(batch.targets, targets)
        for name, tensor in expected.items():
            assert torch.equal(batch.inputs[name], tensor), name
        assert batch.tokens == int(expected["attention_mask"].sum())


def test_next_token_targets_shift_the_labels():
    import torch

    labels = torch.tensor([[-100, -100, 5, 6, -100], [-100, 7, 8, 9, 10]])  # a padded row, then a full one
    keep, targets = next_token_targets(labels)
    assert keep.tolist() == [[False, True, True, False, False], [True, True, True, True, False]]
    assert targets.tolist() == [5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("packed", [False, True])
def test_logits_at_the_learned_positions_give_the_loss_of_labels(packed):
    """cross_entropy(logits_to_keep=keep) is the loss transformers computes from the labels, gradients alike."""
    import torch

    generator = torch.Generator().manual_seed(3)
    examples = []
    for length, prompt in [(9, 4), (5, 2), (12, 6), (3, 1)]:
        ids = torch.randint(2, 64, (length,), generator=generator).tolist()
        examples.append((ids, [-100] * prompt + ids[prompt:]))
    batch = pack(examples, capacity=16, pad_id=0) if packed else collate(examples, 0)
    model = tiny_llama()
    reference = model(**batch, use_cache=False).loss
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    keep, targets = next_token_targets(batch["labels"])
    logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    assert logits.shape[0] == len(targets) < batch["input_ids"].numel()
    loss = torch.nn.functional.cross_entropy(logits, targets)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    for p, grad in zip(model.parameters(), expected, strict=True):
        assert torch.allclose(p.grad, grad, atol=1e-6)


def test_pack_layout():
    examples = [([1, 2, 3], [-100, 2, 3]), ([4, 5], [-100, 5]), ([6, 7, 8, 9], [-100, -100, 8, 9]), ([10], [10])]
    batch = pack(examples, capacity=6, pad_id=0)
    # longest first, first fit: [ex2 (4), ex1 (2)], [ex0 (3), ex3 (1)]; rows padded to 6
    assert batch["input_ids"].tolist() == [[6, 7, 8, 9, 4, 5], [1, 2, 3, 10, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 1]]
    # each example's first label is ignored: no example learns to predict the next one's first token
    assert batch["labels"].tolist() == [[-100, -100, 8, 9, -100, 5], [-100, 2, 3, -100, -100, -100]]
    assert "attention_mask" not in batch


def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def test_packed_rows_give_the_loss_of_padded_rows():
    """Attention stays inside each example and positions restart: the same examples, the same loss. With one
    continuous position range (no boundaries) the loss differs, so the equality is the boundaries' doing."""
    import torch

    generator = torch.Generator().manual_seed(1)
    examples = []
    for length, prompt in [(9, 4), (5, 2), (12, 6), (3, 1), (7, 3)]:
        ids = torch.randint(2, 64, (length,), generator=generator).tolist()
        examples.append((ids, [-100] * prompt + ids[prompt:]))
    model = tiny_llama()
    with torch.no_grad():
        padded = model(**collate(examples, 0), use_cache=False).loss
        packed_batch = pack(examples, capacity=20, pad_id=0)
        assert packed_batch["input_ids"].shape[0] < len(examples)  # really packed
        packed = model(**packed_batch, use_cache=False).loss
        continuous = {
            **packed_batch,
            "position_ids": torch.arange(packed_batch["input_ids"].shape[1]).expand_as(packed_batch["input_ids"]),
        }
        leaking = model(**continuous, use_cache=False).loss
    assert float(packed) == pytest.approx(float(padded), abs=1e-5)
    assert abs(float(leaking) - float(padded)) > 1e-3


def test_packed_micro_batches_hold_the_same_examples(tmp_path, tiny_tokenizer):
    import torch

    split = write_split(tmp_path / "train.jsonl", 50)
    cache, _ = ensure(split, tiny_tokenizer, tmp_path / "cache")
    padded = MicroBatches(cache, TrainSettings(micro_batch_size=6, max_seq_len=40), tiny_tokenizer.pad_token_id)
    packed = MicroBatches(
        cache, TrainSettings(micro_batch_size=6, max_seq_len=40, pack_sequences=True), tiny_tokenizer.pad_token_id
    )
    cpu = torch.device("cpu")
    for step in range(10):
        a, b = padded.get(step, 0, 0, 1, cpu), packed.get(step, 0, 0, 1, cpu)
        a_ids, b_ids = a.inputs["input_ids"], b.inputs["input_ids"]
        assert a.tokens == b.tokens == int(a.inputs["attention_mask"].sum())
        assert b_ids.shape[0] < a_ids.shape[0] and b_ids.shape[1] <= 40
        real_ids = a_ids[a.inputs["attention_mask"] == 1]
        assert sorted(b_ids[b_ids != 0].tolist()) == sorted(real_ids.tolist())
        assert sorted(b.targets.tolist()) == sorted(a.targets.tolist())  # the same tokens learned
