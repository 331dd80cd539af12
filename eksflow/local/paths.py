"""Container paths and the host folders that stand in for them, mapped only where a path is meant.

A step sees its volumes at their mount paths on a cluster (/fsx, /tmp/outputs); here they are folders of the state
directory. A value is mapped only when it is a path as a whole: the mount path itself, a path under it, or a URI
without a host whose path is one (`file:///fsx/x`, `sqlite:////fsx/mlflow/mlflow.db`). `s3://bucket/fsx` has a
host, and `Copy /fsx/data` is text: neither is touched.

Which values are paths is said by the manifest: the annotations `eksflow.dev/path-args` (argv flags, comma-
separated, e.g. `--dataset-dir,--tracking-uri`) and `eksflow.dev/path-env` (env var names) in a template's
`metadata.annotations`. With them, exactly those values are mapped (a flag's value given as `--flag=value` or as
the next argv item) and every other value reaches the step byte-identical. Without them (a hand-written manifest),
whole argv items, the values of `--flag=value` items and env values are mapped when they are whole paths.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from eksflow.local.model import PathRules

PATH_ARGS = "eksflow.dev/path-args"
PATH_ENV = "eksflow.dev/path-env"
UNANNOTATED = PathRules(None, None)
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*:)(/+)(.*)", re.DOTALL)
_SHELL_SAFE = re.compile(r"[\w@%+=:,./\-]+")  # what a shell word carries unquoted (shlex's safe set)
_SHELL_OPERATORS = frozenset(";&|<>()")
_FLAG = re.compile(r"(-{1,2}[\w\-.]+)=(.*)", re.DOTALL)


def path_rules(annotations: Mapping[str, str]) -> PathRules:
    """The PathRules a template's annotations declare."""

    def names(key: str) -> frozenset[str] | None:
        if key not in annotations:
            return None
        return frozenset(part.strip() for part in str(annotations[key]).split(",") if part.strip())

    return PathRules(names(PATH_ARGS), names(PATH_ENV))


class PathMap:
    """Container path prefixes <-> host folders, applied to whole values only."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        pairs = [(c.rstrip("/") or "/", h.rstrip("/") or "/") for c, h in pairs]
        # Longest prefix first, so /tmp/outputs/sub wins over /tmp/outputs.
        self._forward = sorted(pairs, key=lambda p: len(p[0]), reverse=True)
        backward: dict[str, str] = {}
        for container, host in pairs:
            backward.setdefault(host, container)
        self._backward = sorted(backward.items(), key=lambda p: len(p[0]), reverse=True)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """(container prefix, host folder), longest prefix first."""
        return list(self._forward)

    def to_host(self, value: str) -> str:
        """`value` with its container path replaced by the host path, if it is a path as a whole."""
        return _map_whole(value, self._forward)

    def to_container(self, value: str) -> str:
        """`value` with its host path replaced by the container path, if it is a path as a whole."""
        return _map_whole(value, self._backward)


def _map_prefix(path: str, prefixes: list[tuple[str, str]]) -> str | None:
    for prefix, replacement in prefixes:
        if path == prefix or path.startswith(prefix + "/"):
            return replacement + path[len(prefix) :]
    return None


def _map_whole(value: str, prefixes: list[tuple[str, str]]) -> str:
    if value.startswith("/"):
        mapped = _map_prefix(value, prefixes)
        return value if mapped is None else mapped
    uri = _URI.fullmatch(value)
    # Two slashes start an authority (s3://bucket/...): a host, not a local path. One, or three and more, do not.
    if uri is None or len(uri.group(2)) == 2:
        return value
    scheme, slashes, rest = uri.groups()
    mapped = _map_prefix("/" + rest, prefixes)
    return value if mapped is None else f"{scheme}{slashes[:-1]}{mapped}"


def map_argv(argv: list[str], paths: PathMap, rules: PathRules) -> list[str]:
    """Argv with container paths mapped where the rules say a path is (argv[0], the program, always)."""
    if not argv:
        return argv
    mapped = [paths.to_host(argv[0])]
    flags = rules.args
    previous_is_path_flag = False
    for item in argv[1:]:
        if flags is None:
            flag = _FLAG.fullmatch(item)
            mapped.append(f"{flag.group(1)}={paths.to_host(flag.group(2))}" if flag else paths.to_host(item))
            continue
        if previous_is_path_flag:
            mapped.append(paths.to_host(item))
            previous_is_path_flag = False
            continue
        flag = _FLAG.fullmatch(item)
        if flag and flag.group(1) in flags:
            mapped.append(f"{flag.group(1)}={paths.to_host(flag.group(2))}")
        else:
            mapped.append(item)
            previous_is_path_flag = item in flags
    return mapped


def map_env(env: Iterable[tuple[str, str]], paths: PathMap, rules: PathRules) -> dict[str, str]:
    """Env values mapped where the rules say a path is."""
    names = rules.env
    return {name: paths.to_host(value) if names is None or name in names else value for name, value in env}


def shell_words(command: str) -> list[tuple[int, int, bool]]:
    """(start, end, plain) of each word of a shell command line; plain: no quoting or expansion in it.

    Unquoted blanks and operators (`; & | < > ( )`) end a word, so `> /fsx/out;` holds the word `/fsx/out`.
    """
    words: list[tuple[int, int, bool]] = []
    i, n = 0, len(command)
    while i < n:
        if command[i].isspace() or command[i] in _SHELL_OPERATORS:
            i += 1
            continue
        start, plain, quote = i, True, ""
        while i < n and (quote or not (command[i].isspace() or command[i] in _SHELL_OPERATORS)):
            char = command[i]
            if quote:
                if char == "\\" and quote == '"':
                    i += 1
                elif char == quote:
                    quote = ""
            elif char in "'\"":
                quote, plain = char, False
            elif char == "\\":
                plain = False
                i += 1
            elif not _SHELL_SAFE.fullmatch(char):
                plain = False
            i += 1
        words.append((start, min(i, n), plain))
    return words


def map_shell_words(command: str, paths: PathMap, rules: PathRules) -> tuple[str, str]:
    """A shell command line (a RayJob entrypoint) with its path words mapped, and any unsafe host folder used.

    Only plain words (no quotes, `$`, backslashes or shell operators) and words that are one single-quoted string
    (`'--output-dir=/fsx/runs/{{workflow.name}}'`, as shlex.quote writes a value with braces) are candidates, so
    the mapping never changes what the shell does with the rest of the line: a single-quoted word's text is
    literal, and its mapped value is quoted again. A plain word's mapped value replaces it in place; one that is
    no plain shell word itself (a state directory with a space) is returned second, for the caller to refuse ("" if
    none).
    """
    pieces: list[str] = []
    position = 0
    previous_is_path_flag = False
    unsafe = ""
    for start, end, plain in shell_words(command):
        word = command[start:end]
        quoted = not plain and len(word) >= 2 and word[0] == word[-1] == "'" and "'" not in word[1:-1]
        text = word[1:-1] if quoted else word
        replacement = text
        flags = rules.args
        if plain or quoted:
            flag = _FLAG.fullmatch(text)
            if previous_is_path_flag or (flags is None and not flag):
                replacement = paths.to_host(text)
            elif flag and (flags is None or flag.group(1) in flags):
                replacement = f"{flag.group(1)}={paths.to_host(flag.group(2))}"
        if quoted:
            replacement = word if replacement == text else shlex.quote(replacement)
        elif replacement != word and not _SHELL_SAFE.fullmatch(replacement):
            unsafe = unsafe or replacement
        previous_is_path_flag = (plain or quoted) and flags is not None and text in flags
        pieces.append(command[position:start])
        pieces.append(replacement)
        position = end
    pieces.append(command[position:])
    return "".join(pieces), unsafe
