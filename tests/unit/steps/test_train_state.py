"""The CUDA random state a checkpoint keeps: its training device's, resumable where fewer GPUs are visible."""

from __future__ import annotations

import torch

from eksflow.llm.steps.train.state import device_rng


def test_a_checkpoints_one_cuda_state_is_restored_on_whichever_gpu_resumes_it():
    state = torch.arange(8, dtype=torch.uint8)
    assert device_rng(state, 0) is state
    assert device_rng(state, 3) is state  # another index on the resuming node: the same stream carries on
    assert device_rng(None, 0) is None  # written without a GPU


def test_an_older_checkpoints_list_of_every_gpus_state_gives_the_resuming_gpus_entry_or_none():
    """Found on an H200: a checkpoint of an MPI rank that saw two GPUs failed to resume on one (IndexError)."""
    states = [torch.zeros(4, dtype=torch.uint8), torch.ones(4, dtype=torch.uint8)]
    assert device_rng(states, 1) is states[1]
    assert device_rng(states, 2) is None
    assert device_rng([], 0) is None
