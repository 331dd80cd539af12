"""A tokenized copy of a JSONL split on shared storage: built once per (data, tokenizer), memory-mapped by readers.

    <cache_dir>/<key>/tokens.arrow   Arrow IPC file, record batches of BATCH_ROWS rows: input_ids list<int32> (the
                                     example in its chat template, untruncated: encoding.encode_batch), spans
                                     list<int32> (the learned token spans [start, end), flattened: start, end, ...),
                                     line int64 (the example's 1-based line in the split file)
                                     a preference split's cache (method dpo) has two more columns, rejected_ids and
                                     rejected_spans: input_ids/spans are then the chosen answer's sequence, and a row
                                     holds both sequences of one pair (eksflow.llm.steps.common.preference)
    <cache_dir>/<key>/meta.json      rows, tokens, bytes and sha256 of tokens.arrow, records ("preference" for a
                                     preference split), and what the key was made of
    <cache_dir>/<key>/COMMITTED      written last (after the data and meta.json are fsynced)

key = sha256 of (cache format, the split file's sha256, the tokenizer's fingerprint, and "records": "preference"
for a preference split): changed data or another tokenizer (or chat template) is another key, so a stale cache is
never found, only a new one built. Rows are the split's usable examples (eksflow.llm.steps.common.data.usable_examples)
in file order, the rows `load_examples` returns, or its usable preferences (preference.usable_preferences). A
conversation the chat template cannot tokenize fails the build in one line naming its file and line.

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

from eksflow.llm.steps.common.data import PREFERENCE, Example, usable_examples
from eksflow.llm.steps.common.encoding import BATCH, ConversationError, Span, encode_batch, tokenizer_fingerprint
from eksflow.llm.steps.common.preference import Preference, answer_spans, usable_preferences
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


def cache_key(split_sha256: str, fingerprint: str, preference: bool = False) -> str:
    """The folder name of the cache for a split file (by content) and a tokenizer (by fingerprint).

    A preference split's key says so (its rows hold two sequences); an SFT split's key is what it always was.
    """
    made_of = {"format": FORMAT, "split": split_sha256, "tokenizer": fingerprint}
    text = json.dumps({**made_of, "records": PREFERENCE} if preference else made_of, sort_keys=True)
    return "tok-" + hashlib.sha256(text.encode()).hexdigest()[:32]


class TokenCache:
    """A verified, memory-mapped cache: row i is (token ids, learned token spans, source line).

    In a preference cache (`preference`), row i is a pair: `example(i)` its chosen sequence, `rejected(i)` its
    rejected one.
    """

    def __init__(self, folder: Path, meta: dict[str, Any], batches: list[Any]) -> None:
        import numpy as np

        self.folder = folder
        self.meta = meta
        self.rows = int(meta["rows"])
        self.preference = meta.get("records") == PREFERENCE
        # zero-copy numpy views into the mapped file, per record batch
        self._offsets = [b.column(0).offsets.to_numpy() for b in batches]
        self._values = [b.column(0).values.to_numpy(zero_copy_only=True) for b in batches]
        self._span_offsets = [b.column(1).offsets.to_numpy() for b in batches]
        self._span_values = [b.column(1).values.to_numpy(zero_copy_only=True) for b in batches]
        self._lines = [b.column(2).to_numpy(zero_copy_only=True) for b in batches]
        self._rejected = [(b.column(3), b.column(4)) for b in batches] if self.preference else []
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
            schema = _schema(meta.get("records") == PREFERENCE)
            if not reader.schema.equals(schema) or sum(len(b) for b in batches) != meta["rows"]:
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

    def rejected(self, row: int) -> tuple[np.ndarray, list[Span]]:
        """A preference cache's rejected sequence of `row`: its token ids and learned spans, as `example` gives."""
        if not self.preference:
            raise ValueError(f"token cache {self.folder} holds examples, not preference pairs")
        batch, i = self._locate(row)
        ids, spans = self._rejected[batch]
        flat = spans[i].values.to_numpy(zero_copy_only=True).tolist()
        return ids[i].values.to_numpy(zero_copy_only=True), list(zip(flat[::2], flat[1::2], strict=True))

    def lengths(self) -> np.ndarray:
        """Tokens per row (untruncated; a pair's longer sequence), as int64, in row order."""
        import numpy as np

        if not self.rows:
            return np.zeros(0, dtype=np.int64)
        lengths = np.concatenate([np.diff(o).astype(np.int64) for o in self._offsets])
        if self.preference:
            rejected = np.concatenate([np.diff(ids.offsets.to_numpy()).astype(np.int64) for ids, _ in self._rejected])
            lengths = np.maximum(lengths, rejected)
        return lengths

    def lines(self) -> np.ndarray:
        """The 1-based source line of every row, in row order."""
        import numpy as np

        return np.concatenate(self._lines) if self.rows else np.zeros(0, dtype=np.int64)


def ensure(
    split_file: Path, tokenizer: PreTrainedTokenizerBase, cache_dir: Path, preference: bool = False
) -> tuple[TokenCache, bool]:
    """The verified cache of `split_file` under `cache_dir`, built (or rebuilt) if needed; True when built now.

    `preference` (method dpo): the split's preference pairs, refusing any other record; else its SFT examples.
    """
    split_sha256 = sha256_file(split_file)
    key = cache_key(split_sha256, tokenizer_fingerprint(tokenizer), preference)
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
            rows, tokens = _build(split_file, split_sha256, tokenizer, tmp, key, preference)
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


def _schema(preference: bool = False) -> Any:
    import pyarrow as pa

    tokens = [("input_ids", pa.list_(pa.int32())), ("spans", pa.list_(pa.int32())), ("line", pa.int64())]
    if preference:
        tokens += [("rejected_ids", pa.list_(pa.int32())), ("rejected_spans", pa.list_(pa.int32()))]
    return pa.schema(tokens)


def _sequences(
    split_file: Path, tokenizer: PreTrainedTokenizerBase, part: list[tuple[int, Example | Preference]], which: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Sequence `which` of each row of `part`: encode_batch's ids and flattened spans.

    0 is an example, or a pair's chosen answer; 1 a pair's rejected one, an answer learning its own assistant turns
    only. A conversation the template refuses is named as file:line.
    """
    examples = [p if isinstance(p, Example) else p.answers()[which] for _, p in part]
    try:
        ids, spans = encode_batch(tokenizer, examples)
    except ConversationError as err:
        raise StepInputError(f"{split_file}:{part[err.index][0]}: {err}") from err
    for i, (_, row) in enumerate(part):
        if isinstance(row, Preference):
            spans[i] = answer_spans(spans[i], row.chosen_turns if which == 0 else row.rejected_turns)
    return ids, [[bound for span in learned for bound in span] for learned in spans]


def _build(
    split_file: Path,
    split_sha256: str,
    tokenizer: PreTrainedTokenizerBase,
    into: Path,
    key: str,
    preference: bool,
) -> tuple[int, int]:
    """Tokenize `split_file` into `into` (data, meta, then the marker, each fsynced); return (rows, tokens)."""
    import pyarrow as pa

    schema = _schema(preference)
    data = into / DATA_FILE
    rows = tokens = 0
    with pa.OSFile(str(data), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        pending: list[tuple[int, Example | Preference]] = []

        def flush() -> None:
            nonlocal rows, tokens
            # per sequence of a row (an example; or a pair's chosen, then rejected): its ids and flattened spans
            encoded: list[tuple[list[list[int]], list[list[int]]]] = [([], []) for _ in range(2 if preference else 1)]
            for start in range(0, len(pending), BATCH):
                part = pending[start : start + BATCH]
                for which, (ids, spans) in enumerate(encoded):
                    more_ids, more_spans = _sequences(split_file, tokenizer, part, which)
                    ids.extend(more_ids)
                    spans.extend(more_spans)
            columns = [
                pa.array(encoded[0][0], type=pa.list_(pa.int32())),
                pa.array(encoded[0][1], type=pa.list_(pa.int32())),
                pa.array([n for n, _ in pending], type=pa.int64()),
            ]
            for ids, spans in encoded[1:]:
                columns += [pa.array(ids, type=pa.list_(pa.int32())), pa.array(spans, type=pa.list_(pa.int32()))]
            writer.write_batch(pa.record_batch(columns, schema=schema))
            rows += len(pending)
            tokens += sum(len(i) for ids, _ in encoded for i in ids)
            pending.clear()

        records = usable_preferences(split_file) if preference else usable_examples(split_file)
        for record in records:
            pending.append(record)
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
        **({"records": PREFERENCE} if preference else {}),
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
