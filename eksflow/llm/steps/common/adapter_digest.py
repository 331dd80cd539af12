"""The digest of a LoRA adapter's own files: register's idempotency key, and the probe cache's adapter key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eksflow.runtime.args import StepInputError

ADAPTER_CONFIG = "adapter_config.json"
SET_VALUED_CONFIG = frozenset({"target_modules", "exclude_modules", "modules_to_save"})  # sets in PEFT's LoraConfig


def checkpoint_digest(adapter_dir: Path) -> str:
    """sha256 over the adapter's own files (adapter_config.json, adapter_model.*), in name order.

    README files, markers and other extras are left out: they may carry timestamps and would give the same
    weights a new digest, hence a duplicate version. adapter_config.json is hashed in canonical form (see
    `canonical_adapter_config`); the weights are hashed byte for byte.
    """
    h = hashlib.sha256()
    for path in sorted(p for p in adapter_dir.iterdir() if p.is_file() and p.name.startswith("adapter_")):
        h.update(path.name.encode() + b"\0")
        if path.name == ADAPTER_CONFIG:
            h.update(canonical_adapter_config(path))
            continue
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def canonical_adapter_config(path: Path) -> bytes:
    """adapter_config.json with sorted keys and its set-valued lists sorted.

    PEFT keeps target_modules (and exclude_modules, modules_to_save) as Python sets and writes them in hash-seed
    order, so two saves of bit-identical weights differ in this file alone; hashing it as written would register
    identical weights as a new version on every run.
    """
    try:
        config = json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError) as err:
        raise StepInputError(f"{path} is not JSON ({err}); is the adapter folder complete?") from None
    if isinstance(config, dict):
        for key in SET_VALUED_CONFIG & config.keys():
            if isinstance(config[key], list):
                config[key] = sorted(config[key], key=lambda item: json.dumps(item, sort_keys=True))
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
