"""manifest.json: what a published version holds (key, size, ETag, sha256), its digest, and reuse of unchanged files."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.data import MANIFEST_FILE

RAW_DIR = "raw"  # the source files inside the dataset folder


MANIFEST_VERSION = 2  # a manifest of another version is not reused: everything is copied again


@dataclass(frozen=True)
class ManifestEntry:
    """One staged file as manifest.json records it."""

    path: str
    size: int
    sha256: str
    etag: str = ""


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """`sha256:<hex>` over the (path, sha256) pairs sorted by path; JSON-encoded so no path can fake a boundary."""
    pairs = sorted((e.path, e.sha256) for e in entries)
    return "sha256:" + hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


def previous_manifest(dest: Path, source: str) -> dict[str, Any]:
    """The manifest of the published version at `dest` if it may be reused (same source and version), else {}."""
    try:
        manifest = json.loads((dest / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(manifest, dict) or (manifest.get("version"), manifest.get("source")) != (
        MANIFEST_VERSION,
        source,
    ):
        return {}
    return manifest


def previous_entries(manifest: dict[str, Any]) -> dict[str, ManifestEntry]:
    """The source files a previous manifest lists, by path."""
    entries = {}
    for item in manifest.get("files", []):
        entry = ManifestEntry(str(item["key"]), int(item["size"]), str(item["sha256"]), str(item.get("etag", "")))
        entries[entry.path] = entry
    return entries
