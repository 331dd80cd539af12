"""`python -m pipelines.<objects> [-o FILE] [--config FILE] [--set k=v ...]`: the flagship config's objects as YAML."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from eksflow.config import ConfigError, load_config


def write_objects(prog: str, objects: Callable[[Any], list[dict[str, Any]]], argv: Sequence[str] | None) -> int:
    """Load the flagship's config (with `--config`/`--set`), write `objects(cfg)` as one YAML stream; exit code."""
    from pipelines.llama_lora import LlamaLoraConfig

    parser = argparse.ArgumentParser(prog=prog, description=objects.__doc__)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument("--config", type=Path, help="YAML file overriding the flagship's defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(LlamaLoraConfig, args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    text = yaml.safe_dump_all(objects(cfg), sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0
