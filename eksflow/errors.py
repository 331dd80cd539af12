"""The root of eksflow's exceptions and its exit codes.

Every error eksflow raises on purpose is an EksflowError: a pipeline file's command line catches the root once and
prints it as one line, `<label>: <message>`, then exits with the error's exit code. Steps end with the same codes.
"""

from __future__ import annotations

EXIT_FAILED = 1  # could not finish (a server down, a smoke test failed): the workflow may retry it
EXIT_BAD_INPUT = 2  # bad input or config: never retried (the workflow's retry expression skips it)


class EksflowError(Exception):
    """An error eksflow raises on purpose; its message names what was wrong and the fix."""

    label = "error"  # how the command line introduces the message
    exit_code = EXIT_BAD_INPUT


class PipelineError(EksflowError):
    """A pipeline that cannot be built; the message names the task and field, and the fix."""

    label = "pipeline error"
    exit_code = EXIT_BAD_INPUT


class NotFoundError(EksflowError):
    """What a command names (a run, a task of a run) does not exist; the message lists what does."""

    label = "not found"
    exit_code = EXIT_BAD_INPUT


class ConfigError(EksflowError):
    """Config that cannot run; each line names the field and the fix."""

    label = "config error"
    exit_code = EXIT_BAD_INPUT
