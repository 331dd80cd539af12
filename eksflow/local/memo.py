"""Argo's template memoization, locally: outputs of a successful node saved under a key, reused by a later run.

A template with `memoize: {key, maxAge, cache: {configMap: {name}}}` looks up its key (after substitution, so it
can name the task's inputs) in the cache before running; an entry younger than maxAge is a hit: the node Succeeds
at once with the saved outputs and `memoizationStatus.hit: true`, as the controller does. A miss runs the task and
saves its outputs when it succeeds. Argo keeps a cache in a ConfigMap of that name, one entry per key; here it is
`state_dir/memoize/<configMap name>/<key>.json`, holding the entry as Argo writes it (nodeID, outputs,
creationTimestamp, lastHitTimestamp). An entry that cannot be written raises StateWriteError (rundir.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from eksflow.local.model import Memoize
from eksflow.local.parse_templates import MEMO_KEY
from eksflow.local.rundir import atomic_write, writing
from eksflow.local.status import Memoization, now, parse_time


@dataclass(frozen=True)
class Lookup:
    """The outcome of a cache lookup: the node's memoizationStatus, and the saved outputs on a hit."""

    status: Memoization
    outputs: dict[str, str] | None


class MemoCache:
    """The memoization caches of one state directory."""

    def __init__(self, root: Path, *, read: bool = True) -> None:
        self.root = root
        self.read = read  # False: every task runs (fresh outputs are still saved, as `docker build --no-cache`)

    def _entry(self, cache: str, key: str) -> Path:
        return self.root / cache / f"{key}.json"

    @staticmethod
    def check_key(key: str, where: str) -> str:
        """The substituted key, or ValueError if Argo would refuse it as a ConfigMap cache key."""
        if not MEMO_KEY.fullmatch(key):
            raise ValueError(
                f"{where}.key rendered to {key[:80]!r}, which is not a cache key Argo accepts (letters, digits and "
                "'-', starting with a letter or digit); hash long or free-text inputs into the key"
            )
        return key

    def lookup(self, memoize: Memoize, key: str) -> Lookup:
        """Whether `key` has a valid entry in the template's cache (and its outputs)."""
        miss = Lookup(Memoization(False, key, memoize.cache), None)
        if not self.read:
            return miss
        path = self._entry(memoize.cache, key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            created = parse_time(entry["creationTimestamp"])
            outputs = {p["name"]: p["value"] for p in entry["outputs"].get("parameters", [])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return miss  # no entry, or one this version cannot read: run the task and write a fresh one
        if created is None or not entry.get("nodeID"):
            return miss
        age_s = (datetime.now(timezone.utc) - created).total_seconds()
        if memoize.max_age_s is not None and age_s > memoize.max_age_s:
            return miss
        entry["lastHitTimestamp"] = now()
        atomic_write(path, json.dumps(entry, indent=2, ensure_ascii=False))
        return Lookup(Memoization(True, key, memoize.cache), outputs)

    def save(self, memoize: Memoize, key: str, node_id: str, outputs: dict[str, str]) -> None:
        """Save a successful node's outputs under `key`."""
        path = self._entry(memoize.cache, key)
        with writing(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
        stamp = now()
        entry = {
            "nodeID": node_id,
            "outputs": {"parameters": [{"name": k, "value": v} for k, v in outputs.items()]},
            "creationTimestamp": stamp,
            "lastHitTimestamp": stamp,
        }
        atomic_write(path, json.dumps(entry, indent=2, ensure_ascii=False))
