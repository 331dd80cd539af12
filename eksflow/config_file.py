"""Reading a config file (`--config`): bounded in bytes and in values, safe YAML, every problem one line.

A config file is a few KiB: one over MAX_CONFIG_BYTES is refused before it is read whole (`--config /dev/zero`
must not fill the memory), and one whose YAML aliases expand past MAX_CONFIG_NODES values (an alias bomb) is
refused after parsing. A key given twice in one mapping is an error, not YAML's silent last-one-wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024  # a config file; the largest real one is a few KiB
MAX_CONFIG_NODES = 100_000  # values in a config file with its aliases expanded (a 700-byte alias bomb has millions)


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML merges them silently: the last wins)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[str, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line + 1
            if key_node.value in first:
                raise ConfigError(
                    f"key {key_node.value!r} is given twice (lines {first[key_node.value]} and {line}); keep one"
                )
            first[key_node.value] = line
        return super().construct_mapping(node, deep)


def _expanded_nodes(value: object, budget: int) -> int:
    """How many nodes `value` has with every YAML alias expanded, counting no further than `budget`."""
    count, stack = 0, [value]
    while stack and count <= budget:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def read_yaml(path: Path) -> dict[str, Any]:
    """The sections of config file `path` (--config); ConfigError, one line naming the file, when it has none."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # bounded: `--config /dev/zero` must not fill the memory
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"--config {path}: more than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few KiB")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a folder; give a YAML file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror})") from None
    try:
        loaded = yaml.load(text, Loader=_ConfigLoader) or {}
    except ConfigError as err:
        raise ConfigError(f"--config {path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"--config {path}: invalid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    if _expanded_nodes(loaded, MAX_CONFIG_NODES) > MAX_CONFIG_NODES:  # YAML aliases can expand exponentially
        raise ConfigError(
            f"--config {path}: more than {MAX_CONFIG_NODES:,} values once its aliases (*name) are expanded; "
            "write the values out"
        )
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: expected a mapping of sections, got {type(loaded).__name__}")
    return loaded
