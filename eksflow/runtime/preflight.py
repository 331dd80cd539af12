"""What `plan` tells a step about where it will run, and what a step tells `plan` back.

A distributed step may define, in its contract module, `preflight(args: Mapping[str, object], layout: Layout) ->
Preflight`: given its arguments (settings and values as configured) and the layout the accelerator profile implies,
it returns plan rows (e.g. memory per worker) and problems (`field: what is wrong; fix: ...`). The same module is
what the step itself uses to decide at run time, so `plan` and the step agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Layout:
    """Where a distributed step runs: the profile of its nodes and how many workers it gets."""

    kind: Literal["cpu", "gpu", "trainium"]
    instance_type: str
    nodes: int
    workers: int  # all workers of the job
    memory_per_worker_gib: float  # device memory per worker (per GPU or Neuron core); on CPU its share of RAM
    spot: bool
    model_params_b: float  # the base model's size in billions as configured; 0: unknown


@dataclass(frozen=True)
class Preflight:
    """A step's answer: rows for the plan table and problems that stop the run (exit 2)."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
