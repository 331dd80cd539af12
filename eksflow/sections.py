"""Sections: the groups of arguments a task takes whole, so that a value several tasks share is written once.

Two kinds, both passed positionally to `task(step, *sections, **values)` and `distributed(...)`:

- a config section: the step's own Settings model (`cfg.train`, `cfg.evaluate`). Every field is an argument of
  the step (its Args extends the Settings), so the pipeline and the step check the same rules.
- a shared Section: a frozen dataclass of values many steps take, literals or Refs, declared once by the pipeline
  author:

      @dataclass(frozen=True)
      class Tracking(Section):
          tracking_uri: str
          mlflow_ui_url: str = ""

      tracking = Tracking(cfg.mlflow.tracking_uri, cfg.mlflow.ui_url)
      task(evaluate, cfg.evaluate, tracking, adapter_dir=trained.adapter_dir)

  A task gives its step the fields of the Section its Args declares, matched by name: a report step takes the
  tracking URI and the UI link, a train step only the URI. A Section the step takes nothing of is refused, as is
  a field two sections both give. A keyword argument wins over any section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from eksflow.errors import PipelineError


@dataclasses.dataclass(frozen=True)
class Section:
    """The base of a shared group of task arguments: subclass it as a frozen dataclass (see the module's text)."""


def section_values(sections: Sequence[Any], fields: Mapping[str, Any], where: str) -> dict[str, object]:
    """The arguments `sections` give a step whose Args has `fields`; PipelineError naming what does not fit."""
    given: dict[str, object] = {}
    source: dict[str, str] = {}
    for section in sections:
        label = type(section).__name__
        if isinstance(section, BaseModel):  # the step's own settings: every field is one of its arguments
            values = {name: getattr(section, name) for name in type(section).model_fields}
        elif isinstance(section, Section) and dataclasses.is_dataclass(section):
            values = {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name in fields}
            if not values:
                names = ", ".join(f.name for f in dataclasses.fields(section)) or "none"
                raise PipelineError(f"{where}: takes nothing of section {label} (its fields: {names}); leave it out")
        else:
            raise PipelineError(
                f"{where}: {section!r} is not a section: give a config section (a Settings model) or a Section "
                "dataclass, and other values as keywords"
            )
        if twice := sorted(set(values) & set(given)):
            name = twice[0]
            raise PipelineError(f"{where}: argument {name} is given by both {source[name]} and {label}; give it once")
        given.update(values)
        source.update(dict.fromkeys(values, label))
    return given
