"""A tokenized copy of a JSONL split on shared storage: built once per (data, tokenizer), memory-mapped by readers.

    <cache_dir>/<key>/tokens.arrow   Arrow IPC file, record batches of BATCH_ROWS rows: input_ids list<int32> (the
                                     example in its chat template, untruncated: encoding.encode_batch), spans
                                     list<int32> (the learned token spans [start, end), flattened: start, end, ...),
                                     line int64 (the example's 1-based line in the split file)
    <cache_dir>/<key>/meta.json      rows, tokens, bytes and sha256 of tokens.arrow, and what the key was made of
    <cache_dir>/<key>/COMMITTED      written last (after the data and meta.json are fsynced)

key = sha256 of (cache format, the split file's sha256, the tokenizer's fingerprint): changed data or another
tokenizer (or chat template) is another key, so a stale cache is never found, only a new one built. Rows are the
split's usable examples (eksflow.llm.steps.common.data.usable_examples) in file order, the rows `load_examples`
returns. A conversation the chat template cannot tokenize fails the build in one line naming its file and line.

Built by whoever needs it first (the train driver before its workers start, or validate_data counting tokens):
under an exclusive flock on <cache_dir>/<key>.lock, into a temporary sibling that is renamed into place, so two
builders never write the same folder and a reader never sees a half-built one; a builder killed midway leaves only
a temporary folder, removed by the next build. A reader waits on the lock only when no valid cache exists.

Every open verifies before anything is read: the marker, meta.json, the file's size and sha256, the Arrow footer
and the row count. A cache failing any of these raises CorruptCacheError; `ensure` then moves it aside and rebuilds
it, so a corrupt or partial cache is never loaded. Readers memory-map the file: workers on one node share its
pages, and a worker's own memory does not grow with the number of rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eksflow.llm.steps.common.data import Example, usable_examples
from eksflow.llm.steps.common.encoding import BATCH, ConversationError, Span, encode_batch, tokenizer_fingerprint
from eksflow.llm.steps.common.storage import exclusive, fsync, fsync_dir, sha256_file
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerBase

FORMAT = 2  # bump when the file layout changes: part of the key
DATA_FILE = "tokens.arrow"
META_FILE = "meta.json"
MARKER = "COMMITTED"
# Rows per Arrow record batch: a reader locates a row with one binary search over the batches' first rows (~120
# batches at a million rows), and a builder holds one batch as Python lists, ~36 bytes per token (a pointer and an
# int object): ~25 MB at this size with 80-token examples.
BATCH_ROWS = 4 * BATCH


SUBDIR = "tokenized"  # under the model cache: a tokenized copy is derived from a model's tokenizer


def default_cache_dir(model_cache_dir: Path) -> Path:
    """Where token caches live unless a step is told otherwise: <model_cache_dir>/tokenized (shared by runs)."""
    return model_cache_dir / SUBDIR


class CorruptCacheError(Exception):
    """A cache folder that is partial or damaged: it must be rebuilt, never read."""


def cache_key(split_sha256: str, fingerprint: str) -> str:
    """The folder name of the cache for a split file (by content) and a tokenizer (by fingerprint)."""
    text = json.dumps({"format": FORMAT, "split": split_sha256, "tokenizer": fingerprint}, sort_keys=True)
    return "tok-" + hashlib.sha256(text.encode()).hexdigest()[:32]


class TokenCache:
    """A verified, memory-mapped cache: row i is (token ids, learned token spans, source line)."""

    def __init__(self, folder: Path, meta: dict[str, Any], batches: list[Any]) -> None:
        import numpy as np

        self.folder = folder
        self.meta = meta
        self.rows = int(meta["rows"])
        # zero-copy numpy views into the mapped file, per record batch
        self._offsets = [b.column(0).offsets.to_numpy() for b in batches]
        self._values = [b.column(0).values.to_numpy(zero_copy_only=True) for b in batches]
        self._span_offsets = [b.column(1).offsets.to_numpy() for b in batches]
        self._span_values = [b.column(1).values.to_numpy(zero_copy_only=True) for b in batches]
        self._lines = [b.column(2).to_numpy(zero_copy_only=True) for b in batches]
        self._starts = np.cumsum([0, *(len(b) for b in batches)])

    @classmethod
    def open(cls, folder: Path) -> TokenCache:
        """Verify `folder` (marker, meta, size, sha256, Arrow footer, rows) and map it; CorruptCacheError if bad."""
        import pyarrow as pa

        if not (folder / MARKER).is_file():
            raise CorruptCacheError(f"{folder} has no {MARKER} marker: a build that did not finish")
        try:
            meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
            data = folder / DATA_FILE
            size = data.stat().st_size
            if meta["format"] != FORMAT or size != meta["bytes"]:
                raise CorruptCacheError(
                    f"{data} has {size} bytes in format {meta['format']}, meta.json says "
                    f"{meta['bytes']} in format {FORMAT}"
                )
            if sha256_file(data) != meta["sha256"]:
                raise CorruptCacheError(f"{data} does not match the sha256 in {META_FILE}")
            reader = pa.ipc.open_file(pa.memory_map(str(data), "r"))
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            if not reader.schema.equals(_schema()) or sum(len(b) for b in batches) != meta["rows"]:
                raise CorruptCacheError(f"{data} does not hold the {meta['rows']} rows meta.json lists")
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as err:
            raise CorruptCacheError(f"{folder} cannot be read: {err}") from err
        return cls(folder, meta, batches)

    def _locate(self, row: int) -> tuple[int, int]:
        import numpy as np

        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} of a {self.rows}-row cache")
        batch = int(np.searchsorted(self._starts, row, side="right")) - 1
        return batch, row - int(self._starts[batch])

    def example(self, row: int) -> tuple[np.ndarray, list[Span]]:
        """Token ids of `row` (a read-only view into the mapped file) and the spans [start, end) of them learned."""
        batch, i = self._locate(row)
        offsets, span_offsets = self._offsets[batch], self._span_offsets[batch]
        flat = self._span_values[batch][span_offsets[i] : span_offsets[i + 1]].tolist()
        return self._values[batch][offsets[i] : offsets[i + 1]], list(zip(flat[::2], flat[1::2], strict=True))

    def lengths(self) -> np.ndarray:
        """Tokens per row (untruncated), as int64, in row order."""
        import numpy as np

        if not self.rows:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.diff(o).astype(np.int64) for o in self._offsets])

    def lines(self) -> np.ndarray:
        """The 1-based source line of every row, in row order."""
        import numpy as np

        return np.concatenate(self._lines) if self.rows else np.zeros(0, dtype=np.int64)


def ensure(split_file: Path, tokenizer: PreTrainedTokenizerBase, cache_dir: Path) -> tuple[TokenCache, bool]:
    """The verified cache of `split_file` under `cache_dir`, built (or rebuilt) if needed; True when built now."""
    split_sha256 = sha256_file(split_file)
    key = cache_key(split_sha256, tokenizer_fingerprint(tokenizer))
    folder = cache_dir / key
    with contextlib.suppress(CorruptCacheError):
        return TokenCache.open(folder), False
    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive(cache_dir / f"{key}.lock"):
        try:
            return TokenCache.open(folder), False  # built by another process while this one waited
        except CorruptCacheError as err:
            if folder.exists():
                print(f"token cache: rebuilding, {err}", file=sys.stderr, flush=True)
                aside = cache_dir / f".{key}.corrupt-{uuid.uuid4().hex[:8]}"
                os.replace(folder, aside)  # readers holding its mapping keep reading it; nobody opens it again
                shutil.rmtree(aside, ignore_errors=True)
        for leftover in cache_dir.glob(f".{key}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a builder killed midway (we hold the lock: it is dead)
        started = time.monotonic()
        tmp = cache_dir / f".{key}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            rows, tokens = _build(split_file, split_sha256, tokenizer, tmp, key)
            os.replace(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (folder / MARKER).is_file():
                raise
            # a builder that could not take the lock (a file system ignoring flock) renamed its copy first
            return TokenCache.open(folder), False
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(cache_dir)
        print(
            f"token cache: built {folder.name} ({rows} rows, {tokens} tokens) from {split_file} in "
            f"{time.monotonic() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return TokenCache.open(folder), True


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("spans", pa.list_(pa.int32())), ("line", pa.int64())])


def _build(
    split_file: Path, split_sha256: str, tokenizer: PreTrainedTokenizerBase, into: Path, key: str
) -> tuple[int, int]:
    """Tokenize `split_file` into `into` (data, meta, then the marker, each fsynced); return (rows, tokens)."""
    import pyarrow as pa

    schema = _schema()
    data = into / DATA_FILE
    rows = tokens = 0
    with pa.OSFile(str(data), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        pending: list[tuple[int, Example]] = []

        def flush() -> None:
            nonlocal rows, tokens
            ids: list[list[int]] = []
            spans: list[list[int]] = []
            for start in range(0, len(pending), BATCH):
                part = pending[start : start + BATCH]
                try:
                    batch_ids, batch_spans = encode_batch(tokenizer, [e for _, e in part])
                except ConversationError as err:
                    raise StepInputError(f"{split_file}:{part[err.index][0]}: {err}") from err
                ids += batch_ids
                spans += [[bound for span in learned for bound in span] for learned in batch_spans]
            columns = [
                pa.array(ids, type=pa.list_(pa.int32())),
                pa.array(spans, type=pa.list_(pa.int32())),
                pa.array([n for n, _ in pending], type=pa.int64()),
            ]
            writer.write_batch(pa.record_batch(columns, schema=schema))
            rows += len(pending)
            tokens += sum(len(i) for i in ids)
            pending.clear()

        for example in usable_examples(split_file):
            pending.append(example)
            if len(pending) == BATCH_ROWS:
                flush()
        if pending or not rows:
            flush()  # an empty split still gets one (empty) batch: a valid file of 0 rows
    fsync(data)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "key": key,
        "rows": rows,
        "tokens": tokens,
        "bytes": data.stat().st_size,
        "sha256": sha256_file(data),
        "source": str(split_file),
        "source_sha256": split_sha256,
    }
    _write_synced(into / META_FILE, json.dumps(meta, indent=1) + "\n")
    _write_synced(into / MARKER, f"{meta['sha256']}\n")
    fsync(into)
    return rows, tokens


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
