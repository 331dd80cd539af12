"""Workflow parameters: one set of rules for a value, whichever way it enters a run.

    Pipeline(cfg, title=..., parameters={"data_source": cfg.data.source})   # declared from a config setting
    task(stage_data, cfg.data, source=p.parameters.data_source)              # taken whole by a step field

A parameter's validator is declared by that wiring, and the rendered manifest records it: stage-data's args hold
`--source={{workflow.parameters.data_source}}`, so a run keeps, in its state folder and on the Argo Server, which
step fields take each of its parameters. A value is held to
  - the rules for any text a run takes (eksflow.config.text_problem): no `{{` (Argo would evaluate it), no NUL,
    at most MAX_TEXT_BYTES (one argv item), no credential in a URL;
  - the whole rules (type, constraints and validators) of each step field taking it, read as the step reads its
    argv (StepArgs.from_argv). A step's Args extend the config section that configures it (stage_data's Args are
    StageSettings plus its wiring), so these are the config field's own rules: `--set data.source=s3://` and
    `retry -p data_source=s3://` are refused by the same validator, and the step would refuse it again.
The config applies both when it loads (the second through its section's own field), Pipeline the text rules to
the values it declares and schedules, and `parameter_problems` both to the `-p` values of `retry` and `resubmit`,
before a run starts, locally and on an Argo Server.

A manifest is text (a state folder's file, a server's answer): no module it names is imported to check it. The
step fields are those of the step modules the pipeline itself imported (its CLI runs the verbs); a template of any
other module is left to its own step, which checks its arguments when it starts.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from eksflow.config import text_problem
from eksflow.runtime.args import StepArgs, StepInputError, flag

_TAKEN_WHOLE = re.compile(r"\{\{workflow\.parameters\.([A-Za-z0-9_-]+)\}\}")


def parameter_problems(workflow: Mapping[str, Any], values: Mapping[str, str]) -> list[str]:
    """One line per `-p` value the run would refuse (`retry -p`, `resubmit -p`); [] when all pass.

    `workflow` is the run's Workflow: its own spec, or the WorkflowTemplate's that Argo stored in its status when
    it was started from one (a CronWorkflow's runs).
    """
    specs = [workflow.get("spec") or {}, (workflow.get("status") or {}).get("storedWorkflowTemplateSpec") or {}]
    declared = {p.get("name") for spec in specs for p in (spec.get("arguments") or {}).get("parameters") or []}
    takers = _takers(template for spec in specs for template in spec.get("templates") or [])
    problems = []
    for name, value in values.items():
        if name not in declared:
            problems.append(f"-p {name}: the workflow has no parameter {name!r}")
        elif why := text_problem(name, value):
            problems.append(f"-p {name}: {why}")
        elif why := next(filter(None, (_field_problem(*taker, value) for taker in takers.get(name, []))), ""):
            problems.append(f"-p {name}={_quoted(value)}: {why}")
    return problems


Taker = tuple[str, type[StepArgs], str]  # a step module, its Args, the flag that takes a parameter whole


def _takers(templates: Iterable[Mapping[str, Any]]) -> dict[str, list[Taker]]:
    """For each workflow parameter, every step container that takes it whole."""
    takers: dict[str, list[Taker]] = {}
    for template in templates:
        command = (template.get("container") or {}).get("command") or []
        module = command[2] if command[:2] == ["python", "-m"] and len(command) > 2 else ""
        args_type = getattr(sys.modules.get(module), "Args", None)
        if not (isinstance(args_type, type) and issubclass(args_type, StepArgs)):
            continue  # no step the pipeline imported: left to the step itself
        for item in template["container"].get("args") or []:
            option, _, value = str(item).partition("=")
            if taken := _TAKEN_WHOLE.fullmatch(value):
                takers.setdefault(taken[1], []).append((module, args_type, option))
    return takers


def _field_problem(module: str, args_type: type[StepArgs], option: str, value: str) -> str:
    """Why step `module` would refuse `option=value` (its field's type, constraints and validators), or ""."""
    field_name = option.removeprefix("--").replace("-", "_")
    try:
        args_type.from_argv([f"{flag(field_name)}={value}"])
    except StepInputError as err:
        return f"{module} {option}: {err}"
    except ValidationError as err:  # the other fields are missing here: only this one's rules count
        mine = [e["msg"] for e in err.errors() if e["loc"][:1] == (field_name,)]
        return f"{module} {option}: {mine[0]}" if mine else ""
    return ""


def _quoted(value: str, limit: int = 80) -> str:
    return repr(value) if len(value) <= limit else repr(value[: limit - 3]) + "..."
