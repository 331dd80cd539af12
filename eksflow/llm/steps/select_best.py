r"""Pick the best of several evaluated candidates (a sweep's fan-out), among those that passed the gate.

    python -m eksflow.llm.steps.select_best --names='["r8-lr1e-3","r16-lr1e-3"]' --passed='[true,false]' \
        --metrics='[{"exact_match":0.8},{"exact_match":0.9}]' --adapter-dirs='["/fsx/a","/fsx/b"]' \
        --mlflow-run-ids='["1","2"]' --reports='["/fsx/r1","/fsx/r2"]' --metric=exact_match

The lists are a fan-out's collected outputs, in item order (Argo aggregates them so). The best candidate has the
highest `metric` (the lowest for eval_loss and perplexity) among those whose gate passed; ties go to the earlier
item. With none passing, `found` is false and the reason lists each candidate's score: the pipeline registers
nothing.

Outputs (one file each under --outputs-dir):
    found          "true" when a candidate passed the gate
    name           the chosen candidate's name ("" when none)
    adapter_dir    its adapter, for registration
    mlflow_run_id  its training run
    report         its evaluation report
    metrics        its metrics (JSON)
    reason         one line: which candidate won and by how much, or why none did
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from eksflow.runtime.args import StepArgs, StepInputError, run_step

LOWER_IS_BETTER = ("eval_loss", "perplexity")


class Args(StepArgs):
    """The candidates' collected outputs and the metric that ranks them."""

    names: list[str] = Field(min_length=1, description="candidate names, in item order")
    passed: list[bool] = Field(description="each candidate's gate decision (evaluate's `passed`)")
    metrics: list[dict[str, float]] = Field(description="each candidate's metrics (evaluate's `metrics`)")
    adapter_dirs: list[str] = Field(description="each candidate's adapter (train's `adapter_dir`)")
    mlflow_run_ids: list[str] = Field(description="each candidate's training run")
    reports: list[str] = Field(description="each candidate's evaluation report")
    metric: str = Field("exact_match", min_length=1, description="ranks the candidates that passed")

    @field_validator("passed", "metrics", mode="before")
    @classmethod
    def _decoded(cls, values: object) -> object:
        """Collected outputs may arrive as JSON text per item (`"true"`, `"{...}"`): decode those."""
        if isinstance(values, list):
            return [json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v for v in values]
        return values

    @model_validator(mode="after")
    def _same_length(self) -> Args:
        lists: dict[str, list[Any]] = {
            "passed": self.passed,
            "metrics": self.metrics,
            "adapter_dirs": self.adapter_dirs,
            "mlflow_run_ids": self.mlflow_run_ids,
            "reports": self.reports,
        }
        for name, values in lists.items():
            if len(values) != len(self.names):
                raise ValueError(f"{name} has {len(values)} entries for {len(self.names)} candidates")
        return self


class Outputs(BaseModel):
    """Argo output parameters."""

    found: bool
    name: str
    adapter_dir: str
    mlflow_run_id: str
    report: str
    metrics: dict[str, float]
    reason: str


def best(names: list[str], passed: list[bool], metrics: list[dict[str, float]], metric: str) -> int | None:
    """Index of the best candidate that passed, or None. Pure."""
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    ranked = [
        (sign * scores[metric], -i)
        for i, (ok, scores) in enumerate(zip(passed, metrics, strict=True))
        if ok and not math.isnan(scores.get(metric, math.nan))
    ]
    return -max(ranked)[1] if ranked else None


def run(args: Args) -> Outputs:
    """Choose, and say why."""
    if any(args.metric not in scores for scores in args.metrics):
        raise StepInputError(
            f"--metric={args.metric!r} is not among every candidate's metrics; use one evaluate reports"
        )
    scores = ", ".join(
        f"{n} {s[args.metric]:.4f}{'' if ok else ' (gate failed)'}"
        for n, ok, s in zip(args.names, args.passed, args.metrics, strict=True)
    )
    index = best(args.names, args.passed, args.metrics, args.metric)
    if index is None:
        reason = f"no candidate passed the gate: {scores}"
        print(reason, file=sys.stderr)
        return Outputs(found=False, name="", adapter_dir="", mlflow_run_id="", report="", metrics={}, reason=reason)
    reason = f"{args.names[index]} is best by {args.metric}: {scores}"
    print(reason, file=sys.stderr)
    return Outputs(
        found=True,
        name=args.names[index],
        adapter_dir=args.adapter_dirs[index],
        mlflow_run_id=args.mlflow_run_ids[index],
        report=args.reports[index],
        metrics=args.metrics[index],
        reason=reason,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.select_best --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
