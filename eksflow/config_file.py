"""Reading a config file (`--config`): bounded in bytes and in values, safe YAML, every problem one line.

A config file is a regular file of a few KiB: anything else (a FIFO, whose opening waits for a writer; a device
such as /dev/zero, which never ends) is refused before a byte is read, one over MAX_CONFIG_BYTES before it is read
whole, and one whose YAML aliases expand past MAX_CONFIG_NODES values (an alias bomb) after parsing. A key given
twice in one mapping is an error, not YAML's silent last-one-wins.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from eksflow.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024  # a config file; the largest real one is a few KiB
MAX_CONFIG_NODES = 100_000  # values in a config file with its aliases expanded (a 700-byte alias bomb has millions)
_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


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


def _read_regular_file(path: Path) -> bytes:
    """The bytes of `path`, a regular file of at most MAX_CONFIG_BYTES; ConfigError for anything else.

    It is opened without blocking and checked on the open descriptor before a byte is read (no race with a file
    swapped in between): opening a FIFO waits for a writer that may never come, and a device may never end.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"--config {path}: is a folder; give a YAML file")
        if not stat.S_ISREG(mode):
            raise ConfigError(f"--config {path}: is {_KINDS.get(stat.S_IFMT(mode), 'not a file')}; give a YAML file")
        with open(fd, "rb", closefd=False) as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # one byte past the limit tells a file over it, unread beyond
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--config {path}: more than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few KiB")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """The sections of config file `path` (--config); ConfigError, one line naming the file, when it has none."""
    try:
        text = _read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: file not found") from None
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
