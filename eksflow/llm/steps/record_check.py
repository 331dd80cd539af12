r"""Record a re-evaluation of a registered version on the version itself, and say whether it regressed.

    python -m eksflow.llm.steps.record_check --model-name=llama-lora --version=3 --passed=false \
        --reason="exact_match = 0.41 fails exact_match >= 0.6" --metrics='{"exact_match": 0.41}' \
        --dataset-digest=sha256:... --workflow-name=champion-check-x7k2p

Tags on the version (each run overwrites the last check's): check.passed, check.reason, check.at (UTC),
check.workflow, check.dataset_digest, check.eval_set_digest and check.metric.<name>. The MLflow UI shows them on
the version's page; a regressed champion is not demoted here (that is a rollout decision), but the workflow fails
loudly after this step (see pipelines/champion_check.py) with `summary` as its message.

Outputs (one file each under --outputs-dir):
    regressed  "true" when the version no longer meets the thresholds
    summary    one line a notification can carry: model, version, data, verdict and the failing rules
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import Location, StepArgs, run_step
from eksflow.runtime.outputs import output_text


class Args(StepArgs):
    """The check's outcome (evaluate's outputs) and the version it was about."""

    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    version: str = Field(pattern=r"^[1-9][0-9]*$", description="the version that was re-evaluated")
    tracking_uri: Location = Field(description="MLflow tracking and registry URI")
    passed: bool = Field(description="evaluate's gate decision on the fresh data")
    reason: str = Field(description="evaluate's one-line reason")
    metrics: dict[str, float] = Field(description="evaluate's metrics")
    dataset_digest: str = Field("", description="digest of the data it was checked on")
    eval_set_digest: str = Field("", description="digest of the eval split it was scored on")
    workflow_name: str = Field("", description="the checking workflow, for the record")


class Outputs(BaseModel):
    """Argo output parameters."""

    regressed: bool
    summary: str


def summary(args: Args) -> str:
    """The one line a notification carries. Pure."""
    verdict = "still meets its thresholds" if args.passed else "REGRESSED"
    data = f" on {args.dataset_digest[:19]}" if args.dataset_digest else ""
    return f"{args.model_name} version {args.version} {verdict}{data}: {args.reason}"


def run(args: Args) -> Outputs:
    """Tag the version with this check; report whether it regressed."""
    tags = {
        "check.passed": str(args.passed).lower(),
        "check.reason": args.reason[:4000],
        "check.at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "check.workflow": args.workflow_name,
        "check.dataset_digest": args.dataset_digest,
        "check.eval_set_digest": args.eval_set_digest,
        **{f"check.metric.{name}": output_text(value) for name, value in args.metrics.items()},
    }
    with tracking.errors(args.tracking_uri, f"recording the check on version {args.version}"):
        mlflow_client = tracking.client(args.tracking_uri)
        for tag, value in tags.items():
            mlflow_client.set_model_version_tag(args.model_name, args.version, tag, value)
    line = summary(args)
    print(line, file=sys.stderr)
    return Outputs(regressed=not args.passed, summary=line)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.record_check --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
