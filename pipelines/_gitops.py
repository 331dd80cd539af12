"""`python -m pipelines.<objects> [-o FILE] [--config FILE] [--set k=v ...]`: a pipeline config's objects as YAML.

A shared helper imports no pipeline: the caller names the config type (the flagship's, for the GitOps objects).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from eksflow.config import PipelineConfig, load_config
from eksflow.errors import ConfigError


def write_objects(
    prog: str,
    config: type[PipelineConfig],
    objects: Callable[[Any], list[dict[str, Any]]],
    argv: Sequence[str] | None,
) -> int:
    """Load a `config` (its defaults, `--config`, `--set`), write `objects(cfg)` as one YAML stream; exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=objects.__doc__)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument("--config", type=Path, help="YAML file overriding the config's defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(config, args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    text = yaml.safe_dump_all(objects(cfg), sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0
