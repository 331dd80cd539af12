r"""Fail the workflow loudly with a message: the last task of a check whose outcome needs a human.

    python -m eksflow.llm.steps.alert \
        --message="llama-lora version 3 REGRESSED on sha256:...: exact_match = 0.41 fails ..."

Exits 1 with the message as its one error line, which the Argo UI shows on the node and in the workflow's
failures (what an exit-handler notification reads). A pipeline gives this task no retries: there is nothing a
second attempt could change.

Outputs: none.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from eksflow.runtime.args import StepArgs, StepFailedError, run_step
from eksflow.runtime.shown import printable


class Args(StepArgs):
    """What to say."""

    message: str = Field(min_length=1, description="the one line the failure carries")


class Outputs(BaseModel):
    """No outputs: the step always fails."""


def run(args: Args) -> Outputs:
    """Fail with the message, as one line: a line break in it would print a second, forged `error:` line."""
    raise StepFailedError(printable(args.message))


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.alert --message=...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
