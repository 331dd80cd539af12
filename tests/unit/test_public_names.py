"""The flat public namespace: every name it lists loads, `When` among them (what `when=` takes)."""

from __future__ import annotations

import eksflow
from eksflow.conditions import Condition
from eksflow.refs import Ref


def test_every_public_name_loads():
    assert all(getattr(eksflow, name) is not None for name in eksflow.__all__)


def test_when_is_a_ref_or_a_condition():
    assert eksflow.When == Ref | Condition
