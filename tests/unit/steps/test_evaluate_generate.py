"""Batched greedy answers (eksflow.llm.steps.common.modeling.generate): a shared-prefix cache and length-sorted batches
give each prompt the answer it gets alone, in the order of the prompts."""

from __future__ import annotations

import pytest

from eksflow.llm.steps.common.modeling import by_length, generate, prompt_text, shared_prefix
from eksflow.llm.steps.evaluate.scoring import compute_threads

PROMPTS = [
    "what is 3 plus 4",
    "q 7",
    "what is the answer to the long question 12 plus 9 plus 30",
    "what is 3 plus 5",
    "a",
]


def test_the_shared_prefix_leaves_every_row_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter row keeps its last token
    assert shared_prefix([[1, 2, 3]]) == 2
    assert shared_prefix([[5, 2], [6, 2]]) == 0
    assert shared_prefix([]) == 0


def test_by_length_orders_shortest_first_and_keeps_ties_in_order():
    rows = [[1, 2, 3], [1], [4, 5], [6], [7, 8, 9]]
    assert by_length(rows) == [1, 3, 2, 0, 4]


def test_one_compute_thread_unless_omp_num_threads_says(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert compute_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert compute_threads() == 3


@pytest.fixture(scope="module")
def tiny_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.unit.steps.conftest import WORDS

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(WORDS), pad_token_id=0, eos_token_id=1)  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_batched_answers_equal_each_prompt_alone_in_prompt_order(tiny_model, tiny_tokenizer, batch_size):
    import torch

    alone = []
    for prompt in PROMPTS:  # no padding, no cache given: plain HF greedy decoding of one prompt
        ids = tiny_tokenizer(prompt_text(tiny_tokenizer, prompt), return_tensors="pt", add_special_tokens=False)
        out = tiny_model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        alone.append(tiny_tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip())

    with torch.inference_mode():
        histories = [[{"role": "user", "content": p}] for p in PROMPTS]  # a pair's: its prompt as one user turn
        answers, cut = generate(tiny_model, tiny_tokenizer, histories, batch_size=batch_size, max_new_tokens=6)

    assert answers == alone
    assert len(set(alone)) > 1  # the prompts get different answers, so an order mix-up would show
    assert 0 <= cut <= len(PROMPTS)
