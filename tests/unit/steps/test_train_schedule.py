"""Pure parts of the train step: LR schedule and the resumable data order."""

import itertools

import pytest

from eksflow.llm.steps.train import TrainSettings
from eksflow.llm.steps.train.data import batch_indices
from eksflow.llm.steps.train.loop import lr_factor


def test_lr_warms_up_then_decays_to_the_floor():
    settings = TrainSettings(max_steps=20, warmup_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(s, settings) for s in range(21)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))
    assert factors[20] == pytest.approx(0.1)


def test_data_order_is_a_pure_function_of_seed_and_step():
    settings = TrainSettings(micro_batch_size=4, seed=7)
    first = [batch_indices(s, 0, r, settings, 2, 50) for s in range(30) for r in range(2)]
    again = [batch_indices(s, 0, r, settings, 2, 50) for s in range(30) for r in range(2)]
    assert first == again


def test_ranks_see_disjoint_examples_and_each_epoch_covers_the_data():
    settings = TrainSettings(micro_batch_size=5, seed=0)
    n, world = 20, 2  # 10 examples per step across ranks: 2 steps per epoch
    epoch = [i for step in range(2) for rank in range(world) for i in batch_indices(step, 0, rank, settings, world, n)]
    assert sorted(epoch) == list(range(n))
