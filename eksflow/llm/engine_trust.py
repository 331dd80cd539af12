"""What the engines' cache is trusted with: its path, its folders and files, and each engine checked against its lock.

The cache holds programs every local run executes, so nothing in it is taken on its word (eksflow.llm.engines):

- Its path ($EKSFLOW_ENGINES_DIR): one line, each name in it one a file system takes (255 bytes), or one line saying
  which is not (a longer name was a traceback, a newline was printed raw).
- Its folders and the files eksflow reads or writes there: never a symbolic link (a `litellm-<digest>.lock` link made
  the installer create the link's target), owned by this user or root, and writable by no one else (group or
  others): a folder another user planted, with a stamp and an executable `bin/litellm`, was reported installed and
  run. The installer's processes make files with umask 022 (engine_child.py), so its own folders pass.
- An engine's virtualenv, before it runs (`damage`): every distribution its lock pins installed at the pinned version
  and nothing else but what `python -m venv` puts there (pip, setuptools), every file their RECORDs list present with
  its recorded size (bytecode caches aside: Python rewrites them), and its program what its RECORD says (a script's
  sha256) or the link to this machine's Python that `python -m venv` made (vLLM's `python`). A stat per file, no
  hashing of the 2 GB: ~0.3 s for vLLM's ~34,000 files and ~0.15 s for LiteLLM's ~14,000 on a 2-core machine. So
  what pip verified at install (`--require-hashes` against the lock) is what is still there, file by file, unless
  someone with this user's rights rewrote a file at its own size.

Standard library only, as eksflow.llm.engines: `make setup` runs it before .venv exists.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import stat
import sys
from pathlib import Path

from eksflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EksflowError

NAME_MAX_BYTES = 255  # the longest file or folder name Linux file systems take (NAME_MAX)
PATH_MAX_BYTES = 4095  # the longest path the kernel takes (PATH_MAX, less its NUL)
_NOT_OURS = stat.S_IWGRP | stat.S_IWOTH  # a folder or file others could write is not the engine its lock made
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", re.MULTILINE)
_INSTALLER_OWN = {"pip", "setuptools"}  # what `python -m venv` installs (ensurepip's; 3.12 leaves setuptools out)


class EngineError(EksflowError):
    """An engine that cannot be installed or found; the message says which, why, and what to do."""

    label = "engine error"
    exit_code = EXIT_FAILED


class EngineCacheError(EngineError):
    """The engines' cache cannot be used as it is (its path, a link, another user's folder): the user must fix it."""

    label = "engine cache error"
    exit_code = EXIT_BAD_INPUT


def printable(text: str) -> str:
    r"""`text` as a message may carry it: a control character (a newline) escaped as `\n`, `\x1b`."""
    return text if text.isprintable() else repr(text)[1:-1]


def checked_path(text: str, source: str) -> Path:
    """`text` as a folder path, refused in one line (EngineCacheError) when no file system would take it."""
    if not text.isprintable():
        raise EngineCacheError(f"{source}={printable(text)}: a path with a control character is refused; set another")
    path = Path(text).expanduser()
    if len(os.fsencode(path)) > PATH_MAX_BYTES:
        raise EngineCacheError(f"{source}: the path is longer than {PATH_MAX_BYTES} bytes; set a shorter one")
    if long := next((part for part in path.parts if len(os.fsencode(part)) > NAME_MAX_BYTES), ""):
        raise EngineCacheError(
            f"{source}: the name {long[:40]}... is {len(os.fsencode(long))} bytes long, and a file system takes "
            f"{NAME_MAX_BYTES} at most; set a path of shorter names"
        )
    return path


def trusted(path: Path, kind: str = "folder") -> bool:
    """Whether `path` exists as a `kind` ("folder" or "file") this user may trust; EngineCacheError if it may not.

    False when nothing is there. Refused: a symbolic link, something of another kind, an owner other than this user
    or root, group or other write permission.
    """
    try:
        facts = path.lstat()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise EngineCacheError(f"cannot look at {printable(str(path))} ({err.strerror})") from None
    return _trusted_facts(facts, path, kind)


def trusted_descriptor(fd: int, path: Path) -> None:
    """The file open at `fd` (opened without following a link) is one this user may trust; EngineCacheError if not."""
    _trusted_facts(os.fstat(fd), path, "file")


def _trusted_facts(facts: os.stat_result, path: Path, kind: str) -> bool:
    shown = printable(str(path))
    if stat.S_ISLNK(facts.st_mode):
        raise EngineCacheError(f"{shown} is a symbolic link; the engines' cache takes none: remove it")
    if not (stat.S_ISDIR(facts.st_mode) if kind == "folder" else stat.S_ISREG(facts.st_mode)):
        raise EngineCacheError(f"{shown} is not a {kind}: remove it")
    if facts.st_uid not in (os.geteuid(), 0):
        raise EngineCacheError(
            f"{shown} belongs to uid {facts.st_uid}, not to you or root: an engine there could run anything as you; "
            "remove it, or set EKSFLOW_ENGINES_DIR to a folder of your own"
        )
    if facts.st_mode & _NOT_OURS:
        raise EngineCacheError(
            f"{shown} is writable by others (mode {stat.S_IMODE(facts.st_mode):o}): anyone could change the engine "
            f"there; `chmod go-w {shown}`, or remove it"
        )
    return True


def pins(lock: Path) -> dict[str, str]:
    """The lock's `name -> version`, names normalized (PEP 503)."""
    return {_normal(m[1]): m[2] for m in _PIN.finditer(lock.read_text(encoding="utf-8"))}


def damage(venv: Path, lock: Path, program: str) -> str:
    """How the virtualenv at `venv` differs from what its lock installed ("" when it does not).

    Checked: the distributions (names and versions against the lock), each file their RECORDs list (present, at its
    size), and the program in bin/ (its RECORD's sha256, or for the interpreter a link to a trusted Python).
    """
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    try:
        records = {_dist_info_name(info): info / "RECORD" for info in site.glob("*.dist-info")}
    except OSError as err:
        return f"its packages cannot be read ({err.strerror})"
    wanted = pins(lock)
    installed = {name: version for name, version in records if name in wanted or name not in _INSTALLER_OWN}
    if missing := sorted(set(wanted) - {name for name, _ in installed.items()}):
        return f"{missing[0]} {wanted[missing[0]]} is not installed ({len(missing)} of the lock's packages missing)"
    if other := sorted((n, v) for n, v in installed.items() if wanted.get(n) != v):
        name, version = other[0]
        pinned = f"the lock pins {wanted[name]}" if name in wanted else "which the lock does not pin"
        return f"{name} {version} is installed, {pinned}"
    program_path = os.path.normpath(venv / "bin" / program)
    program_digest = ""
    for (name, _), record in records.items():
        try:
            rows = list(csv.reader(record.read_text(encoding="utf-8").splitlines()))
        except (OSError, UnicodeDecodeError, csv.Error):
            return f"the file list of {name} ({record.name}) cannot be read"
        for row in rows:
            if len(row) < 3 or not row[2] or "__pycache__" in row[0] or row[0].endswith(".pyc"):
                continue  # a folder, RECORD itself, or bytecode Python rewrites as it likes
            path = os.path.normpath(site / row[0])
            try:
                size = os.lstat(path).st_size
            except OSError:
                return f"{os.path.relpath(path, venv)} of {name} is missing"
            if size != int(row[2]):
                return f"{os.path.relpath(path, venv)} of {name} has {size} bytes, not the {row[2]} it was made with"
            if path == program_path:
                program_digest = row[1]
    return _program_damage(venv / "bin" / program, program_digest)


def _program_damage(program: Path, recorded: str) -> str:
    """How the engine's program differs from what was installed ("" when it does not)."""
    if not recorded:  # the interpreter: a link `python -m venv` made to this machine's Python
        try:
            target = program.resolve(strict=True)
            if not program.is_symlink():
                return f"bin/{program.name} is not the link to Python that `python -m venv` made"
            trusted(target, "file")
        except (OSError, RuntimeError):
            return f"bin/{program.name} does not lead to a Python"
        except EngineCacheError as err:
            return f"bin/{program.name} leads to {err}"
        return ""
    try:
        trusted(program, "file")
        digest = hashlib.sha256(program.read_bytes()).digest()
    except OSError:
        return f"bin/{program.name} cannot be read"
    algorithm, _, expected = recorded.partition("=")
    actual = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    if algorithm != "sha256" or actual != expected:
        return f"bin/{program.name} is not the program that was installed (its sha256 differs from its RECORD's)"
    return ""


def _dist_info_name(info: Path) -> tuple[str, str]:
    """(normalized name, version) of a `<name>-<version>.dist-info` folder."""
    name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
    return _normal(name), version


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
