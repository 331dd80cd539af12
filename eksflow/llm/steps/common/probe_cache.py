"""The probe answers of a rollout, kept so that each served model answers the probe set once, not at every step.

A probe is a greedy (temperature 0) chat completion: for given weights, engine and prompt its answer does not
change, so the 50 % and 100 % steps would ask the candidate's and the champion's adapter again for nothing. An
answer set is reused only when everything it depends on is unchanged, else the model is asked again:
- the engine: its address and its base model card (served name, folder, max_model_len), and that it did not
  restart: vLLM's finished-request counter (vllm:request_success_total) only grows while the engine runs and
  starts from 0 after a restart, so a counter below the one read before the answers means a new engine;
- the model: the slot name it is served under, the registered version, the folder the engine loaded the adapter
  from (GET /v1/models) and the checkpoint digest of the files there (register's: steps/common/adapter_digest.py);
  an adapter reloaded from other files changes the folder or the digest, one reloaded from the same files answers
  the same;
- the probe prompts (their digest; a conversation's whole history, which decides its answer) and the answer cap
  (max_new_tokens).
Anything that cannot be read (the engine does not answer, the adapter is not listed, its folder is unreadable)
means no reuse and nothing stored. Only a set in which every probe was answered is stored: a failed request is
never replayed. The cache is `probe-answers.json` next to the rollout's state file, replaced in one rename; a
file that does not parse is ignored with a note, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eksflow.llm.steps.common import rollout, vllm, vllm_client
from eksflow.llm.steps.common.adapter_digest import checkpoint_digest
from eksflow.runtime.args import StepInputError
from eksflow.runtime.outputs import atomic_write_text

CACHE_FILE = "probe-answers.json"
FINISHED_METRIC = "vllm:request_success_total"


class ModelKey(BaseModel):
    """What one served model's greedy answers to the probe set depend on."""

    model_config = ConfigDict(frozen=True)

    engine: str
    base_model: str
    base_root: str
    max_model_len: int | None
    served_name: str
    version: str
    adapter_root: str
    adapter_digest: str
    prompts_digest: str
    max_new_tokens: int


class Entry(BaseModel):
    """One model's answers, and the engine's finished-request count read before they were asked."""

    key: ModelKey
    engine_requests: float
    step: str
    answers: list[str]


class Cache(BaseModel):
    """The file: every model's answer set this rollout stored."""

    entries: list[Entry] = []


def cache_path(state_file: Path) -> Path:
    """Where a rollout keeps its probe answers: next to its state file."""
    return state_file.parent / CACHE_FILE


def model_key(
    vllm_url: str,
    api_key: str,
    served_name: str,
    version: str,
    prompts: Sequence[vllm_client.Prompt],
    max_new_tokens: int,
) -> ModelKey | None:
    """The key of `served_name`'s answers on the engine now; None when part of it cannot be read."""
    try:
        base = vllm_client.base_model_card(vllm_url, api_key=api_key)
        root = vllm_client.loaded_adapters(vllm_url, api_key=api_key).get(served_name)
        digest = checkpoint_digest(Path(root)) if root else ""
    except (vllm.ServingError, StepInputError, OSError) as err:  # unreadable: ask the model, store nothing
        rollout.log(f"probe answers of {served_name} not reused: {type(err).__name__}: {err}")
        return None
    if base is None or not root or not digest:
        return None
    max_len = base.get("max_model_len")
    # a str prompt as before (a pair's key is unchanged), a history as its messages
    asked = [p if isinstance(p, str) else vllm_client.chat_messages(p) for p in prompts]
    return ModelKey(
        engine=vllm_url,
        base_model=str(base.get("id", "")),
        base_root=str(base.get("root", "")),
        max_model_len=max_len if isinstance(max_len, int) else None,
        served_name=served_name,
        version=version,
        adapter_root=root,
        adapter_digest=digest,
        prompts_digest=hashlib.sha256(json.dumps(asked).encode()).hexdigest(),
        max_new_tokens=max_new_tokens,
    )


def engine_requests(vllm_url: str, api_key: str) -> float | None:
    """The engine's finished requests since it started (the sum of vllm:request_success_total); None: unknown."""
    try:
        text = vllm_client.metrics_text(vllm_url, api_key=api_key)
    except vllm.ServingError:
        return None
    samples = re.findall(rf"^{re.escape(FINISHED_METRIC)}(?:{{[^}}]*}})? (\S+)", text, re.MULTILINE)
    try:
        return sum(float(s) for s in samples) if samples else None
    except ValueError:
        return None


def read(path: Path) -> Cache:
    """The stored answer sets; an absent file is an empty cache, and so is a corrupt one (with a note)."""
    try:
        return Cache.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Cache()
    except (OSError, ValueError, ValidationError) as err:
        rollout.log(f"ignoring the probe answers in {path} ({type(err).__name__}): every model is asked again")
        return Cache()


def lookup(cache: Cache, key: ModelKey, requests_now: float | None) -> Entry | None:
    """The stored answers for `key`, if the engine has not restarted since they were asked."""
    if requests_now is None:
        return None
    return next((e for e in cache.entries if e.key == key and requests_now >= e.engine_requests), None)


def remember(
    path: Path,
    key: ModelKey | None,
    api_key: str,
    before: float | None,
    step: str,
    answers: Sequence[vllm_client.Answer],
) -> None:
    """Store a set in which every probe was answered, if the engine and the adapter held still while it was asked.

    `before` is the engine's finished-request count read before the probes were sent: a restart during them
    leaves a count below it, an adapter reloaded from elsewhere another folder, and the set is not stored.
    """
    if key is None or before is None or not answers or not all(a.ok for a in answers):
        return
    now = engine_requests(key.engine, api_key)
    try:
        root = vllm_client.loaded_adapters(key.engine, api_key=api_key).get(key.served_name)
    except vllm.ServingError:
        return
    if now is not None and now >= before and root == key.adapter_root:
        store(path, Entry(key=key, engine_requests=before, step=step, answers=[a.text for a in answers]))


def store(path: Path, entry: Entry) -> None:
    """Add (or replace) one model's answer set, rewriting the file in one rename."""
    cache = read(path)
    kept = [e for e in cache.entries if e.key.served_name != entry.key.served_name]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, Cache(entries=[*kept, entry]).model_dump_json(indent=2))
