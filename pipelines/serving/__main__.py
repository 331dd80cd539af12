"""`python -m pipelines.serving [-o FILE] [--config FILE] [--set k=v ...]`: the flagship's serving objects as YAML."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from eksflow.config import ConfigError, load_config
from pipelines.llama_lora import LlamaLoraConfig
from pipelines.serving.rollout import gitops_objects


def main(argv: Sequence[str] | None = None) -> int:
    """Write the fleet's and the proxy's objects for the configured base model as one YAML stream."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.serving", description=gitops_objects.__doc__)
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument("--config", type=Path, help="YAML file overriding the flagship's defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(LlamaLoraConfig, args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    text = yaml.safe_dump_all(gitops_objects(cfg), sort_keys=False)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
