r"""Look up the current champion: the version this run's candidate is judged against, and what it was trained on.

    python -m eksflow.llm.steps.champion --retrain=if-data-changed --model-name=llama-lora \
        --tracking-uri=sqlite:////fsx/mlflow/mlflow.db

The step reads the version holding alias `champion`, once, at the start of the run: `evaluate` compares the
candidate with that version (its `champion_version`, also part of evaluate's memo key, so an evaluation reused from
an earlier run was judged against this run's champion), and the rollout refuses to go ahead if `champion` has moved
since. With `--retrain=if-data-changed` it also reads the champion's `dataset_digest` lineage tag (written by
eksflow.llm.steps.register): stage_data compares it with the digest of the data it stages and writes `changed`; the
train task runs only when `changed` is true. With `--retrain=always` (the default for manual runs) `dataset_digest`
is empty, so `changed` is always true.

A registry that cannot answer fails the step (exit 1, retried): guessing "no champion" would judge the candidate
against nothing, guessing "changed" would spend GPUs, guessing "unchanged" would silently skip a needed retrain.

Outputs (one file each under --outputs-dir):
    version         the champion's version, empty when there is none
    dataset_digest  the champion's training data digest; empty when unknown, or with retrain=always
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, Field

from eksflow.llm.steps.common import tracking
from eksflow.runtime.args import Location, StepArgs, run_step

Retrain = Literal["always", "if-data-changed"]


class Args(StepArgs):
    """Which registered model's champion to read, and whether to compare the data it was trained on."""

    retrain: Retrain = Field(
        "always", description="always: train every run; if-data-changed: skip when the champion's data is the same"
    )
    model_name: str = Field(pattern=tracking.MODEL_NAME_PATTERN, description="registered model name")
    tracking_uri: Location = Field(description="MLflow tracking and registry URI; empty: no registry, so no champion")


class Outputs(BaseModel):
    """Argo output parameters."""

    version: str
    dataset_digest: str


def run(args: Args) -> Outputs:
    """The champion's version, and (retrain=if-data-changed) the digest of the data it was trained on."""
    if not args.tracking_uri:
        print("no tracking URI: no registry, so no champion to judge against", file=sys.stderr)
        return Outputs(version="", dataset_digest="")
    db = tracking.sqlite_path(args.tracking_uri)
    unmade = db is not None and not db.exists()  # nothing registered yet; opening it would make (migrate) it, ~3 s
    champion = None if unmade else tracking.alias_version(args.tracking_uri, args.model_name, tracking.CHAMPION)
    if champion is None:
        why = f" (no registry at {db} yet)" if unmade else ""
        print(f"{args.model_name} has no champion yet{why}: training runs, judged by the thresholds alone",
              file=sys.stderr)  # fmt: skip
        return Outputs(version="", dataset_digest="")
    version = str(champion.version)
    if args.retrain == "always":
        print(
            f"champion {args.model_name} version {version}; retrain=always: its data is not compared", file=sys.stderr
        )
        return Outputs(version=version, dataset_digest="")
    digest = str((champion.tags or {}).get(tracking.DATASET_DIGEST_TAG, ""))
    known = f"was trained on {digest}" if digest else f"has no {tracking.DATASET_DIGEST_TAG} tag: training runs"
    print(f"champion {args.model_name} version {version} {known}", file=sys.stderr)
    return Outputs(version=version, dataset_digest=digest)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.champion --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
