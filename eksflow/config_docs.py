"""The configuration as users read it: `config` prints the effective config, every key, or the JSON schema.

The effective config is YAML that `--config` reads back to the same config. `--keys` (and the generated
reference in docs/) lists every key with its type, default and description, straight from the pydantic models.
"""

from __future__ import annotations

import json
import sys
import typing
from collections.abc import Iterator
from types import UnionType
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from eksflow.config import PipelineConfig, config_type


def print_config(cfg: PipelineConfig, *, keys: bool = False, schema: bool = False) -> int:
    """Write the effective config (YAML), its keys (a table), or its JSON schema to stdout."""
    if schema:
        sys.stdout.write(json.dumps(type(cfg).model_json_schema(), indent=2) + "\n")
    elif keys:
        sys.stdout.write(keys_table(type(cfg)) + "\n")
    else:
        sys.stdout.write(effective_yaml(cfg))
    return 0


def effective_yaml(cfg: BaseModel) -> str:
    """The config as a YAML file `--config` reads back to the same values."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def rows(model: type[BaseModel], prefix: str = "", values: BaseModel | None = None) -> Iterator[tuple[str, ...]]:
    """(key, type, default, description) of every leaf key; `values` is the section's default instance."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _model(field.annotation)
        if values is not None:
            default: object = getattr(values, name)
        elif field.default is not PydanticUndefined:
            default = field.default
        elif field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
        else:
            default = "(required)"
        if section is not None:
            yield from rows(section, f"{key}.", default if isinstance(default, BaseModel) else None)
            continue
        yield key, type_name(field.annotation), _shown(default), field.description or ""


def keys_table(model: type[BaseModel]) -> str:
    """A markdown table of every key (what `config --keys` prints and docs/configuration.md holds)."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, kind, default, description in rows(model):
        cells = [key, kind, default, description]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `str`, `list[Threshold]`, `ddp | fsdp`, `Path | None`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner = typing.get_args(annotation)
        return "location" if any(repr(a) == "Location" for a in inner[1:]) else type_name(inner[0])
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _shown(value: object) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(mode="json") for v in value]
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def reference(modules: list[str]) -> str:
    """docs/configuration.md: the keys of each pipeline's config, generated from its models (`make docs`)."""
    import importlib

    parts = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models by `make docs`; tests/unit/test_docs.py fails when it is stale. Override",
        "any key with `--set key=value` or a `--config` YAML file; `python pipelines/<name>.py config` prints the",
        "effective config, `config --keys` this table, `config --schema` a JSON schema for editors.",
    ]
    for name in modules:
        module = importlib.import_module(name)
        model = config_type(module.build)
        title = (module.__doc__ or name).strip().splitlines()[0]
        parts += ["", f"## {name.rsplit('.', 1)[-1]}", "", title, "", keys_table(model)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference(sys.argv[1:]))
