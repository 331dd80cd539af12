"""Reading a split for validation at any size: one pass for what needs the whole file, then frames of bounded size.

Pass 1 (`scan`) parses every line and keeps a few fixed-size facts per row: its line number, a 16-byte digest of its
(prompt, completion) pair or its conversation when the duplicate check looks at it, a digest of its split_key (a
pair's prompt, a conversation's history) and its token count; and per file, the first line of each record type and
the first BAD_ROWS_LISTED malformed rows with why. Duplicates (each row that repeats an earlier line, and which
line) and train/eval overlap are then found with numpy sorts over the digests: about 50 bytes per row in all, where
rows held as Python objects took about 1 KB. Pass 2 (`frames`) parses the lines again and yields DataFrames of at
most `chunk_rows` rows with the columns the suite checks, those facts included; great-expectations validates one
frame at a time and eksflow.llm.steps.validate_data.merge adds up the results, so memory is bounded by the chunk,
not the file.

Digests are BLAKE2b-128: the chance that two different pairs in a billion rows share one is below 1e-20, so a
digest match is taken as a match.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eksflow.llm.steps.common.data import (
    CONVERSATIONAL,
    FIELDS,
    FIELDS_OF,
    PREFERENCE,
    Line,
    Method,
    canonical_messages,
    read_lines,
    record_error,
    record_type,
    sft_refusal,
    split_key,
)
from eksflow.llm.steps.common.preference import dpo_refusal
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

LINE = "line"  # column holding the 1-based line number: the index GE reports unexpected rows by
PARSE_ERROR = "parse_error"  # column holding why a line is not a JSON object, None when it is
DUPLICATE = "duplicate_of"  # column: which earlier line a row repeats, None for a first occurrence
RECORD_ERROR = "record_error"  # column (conversation and preference files): why a row is not a usable record, or None
TOKENS = "tokens"  # column: the row's length in tokens as training encodes it, NaN for unusable rows
OVERLAP = "in_train"  # column (eval): the train line holding the same prompt, None when train does not have it
EXPLAINED = (PARSE_ERROR, DUPLICATE, RECORD_ERROR, OVERLAP)  # columns whose values are sentences: shown unquoted

# (prompts, completions) -> token count of each pair
TokenCounter = Callable[[Sequence[str], Sequence[str]], list[int]]
# split file -> (line numbers, token counts) of its usable rows, e.g. from the token cache
TokenLengths = Callable[[Path], tuple["np.ndarray", "np.ndarray"]]
COUNT_BATCH = 2048  # pairs per TokenCounter call
BAD_ROWS_LISTED = 100  # malformed rows a split names one by one in the log; the checks count them all


@dataclass
class Scan:
    """What pass 1 learned about one split; arrays have one entry per non-blank line unless said otherwise."""

    path: Path
    lines: np.ndarray  # int64: the 1-based line number of each row
    fields: frozenset[str]  # the FIELDS that at least one record has (a column per field in every frame)
    types: dict[str, int]  # record type -> the line of its first record (record_type), in order of appearance
    bad_rows: list[str]  # "<file>:<line>: why" of the first BAD_ROWS_LISTED unparsed or malformed rows
    bad_count: int  # how many rows are unparsed or malformed
    duplicate_of: np.ndarray  # int64: the line a row repeats, 0 for none
    prompt_rows: np.ndarray  # int64: the rows whose prompt is a string
    prompt_keys: np.ndarray  # V16: the digest of each of those prompts
    tokens: np.ndarray | None = None  # float64: token count, NaN for unusable rows; None when not counted
    overlap: np.ndarray | None = field(default=None)  # int64 (eval): the train line with the same prompt, 0: none

    @property
    def rows(self) -> int:
        """Non-blank lines."""
        return len(self.lines)

    @property
    def conversational(self) -> bool:
        """The file holds conversations: a row's split key is its history."""
        return CONVERSATIONAL in self.types

    @property
    def checked_whole(self) -> bool:
        """The file holds conversations or preferences: rows checked whole (RECORD_ERROR), not field by field."""
        return CONVERSATIONAL in self.types or PREFERENCE in self.types


def _digest(text: str) -> bytes:
    # surrogatepass: JSON may hold a lone surrogate ("\ud800"), which strict UTF-8 cannot encode
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _keys(buffer: bytearray) -> np.ndarray:
    import numpy as np

    return np.frombuffer(bytes(buffer), dtype="V16")


def _rows(values: array[int]) -> np.ndarray:
    import numpy as np

    return np.frombuffer(values, dtype=np.int64).copy() if len(values) else np.zeros(0, dtype=np.int64)


def scan(
    path: Path,
    max_chars: dict[str, int],
    count_tokens: TokenCounter | None = None,
    token_lengths: TokenLengths | None = None,
    method: Method = "sft",
) -> Scan:
    """Pass 1 over `path`: lines, fields and types present, malformed rows, duplicates, keys, token counts.

    A pair is checked for duplicates when both fields are non-blank strings within `max_chars`, a conversation or
    a preference when it is well formed, so a bad row repeated is counted once, by its own check. Tokens are counted
    for usable pairs by `count_tokens` in batches, or read for every usable row from `token_lengths`. A record type
    `method` cannot train on refuses the file (refuse_types).
    """
    import numpy as np

    lines, pair_rows, prompt_rows, counted_rows = array("q"), array("q"), array("q"), array("q")
    pair_keys, prompt_keys = bytearray(), bytearray()
    counts: list[int] = []
    pending: list[tuple[str, str]] = []
    fields: set[str] = set()
    types: dict[str, int] = {}
    bad_rows: list[str] = []
    bad_count = 0

    def flush() -> None:
        if count_tokens is not None and pending:
            counts.extend(count_tokens([p for p, _ in pending], [c for _, c in pending]))
        pending.clear()

    for row, line in enumerate(read_lines(path)):
        lines.append(line.number)
        record = line.record
        error = line.error if record is None else record_error(record)
        if error is not None:
            bad_count += 1
            if len(bad_rows) < BAD_ROWS_LISTED:
                bad_rows.append(f"{path.name}:{line.number}: {error}")
        if record is None:
            continue
        fields.update(name for name in FIELDS if name in record)
        kind = record_type(record)
        if kind is not None:
            types.setdefault(kind, line.number)
        key = split_key(record)
        if key is not None:
            prompt_rows.append(row)
            prompt_keys += _digest(key)
        if kind == CONVERSATIONAL:
            if error is None:
                pair_rows.append(row)
                pair_keys += _digest(canonical_messages(record["messages"]))
            continue
        if kind == PREFERENCE:
            if error is None:
                pair_rows.append(row)
                pair_keys += _digest(canonical_messages([record[name] for name in ("prompt", "chosen", "rejected")]))
            continue
        prompt, completion = record.get("prompt"), record.get("completion")
        if not (isinstance(prompt, str) and isinstance(completion, str) and prompt.strip() and completion.strip()):
            continue
        if len(prompt) <= max_chars.get("prompt", len(prompt)) and len(completion) <= max_chars.get(
            "completion", len(completion)
        ):
            pair_rows.append(row)
            pair_keys += _digest(f"{len(prompt)}:{prompt}{completion}")  # the length keeps the boundary
        if count_tokens is not None:
            counted_rows.append(row)
            pending.append((prompt, completion))
            if len(pending) == COUNT_BATCH:
                flush()
    flush()

    numbers = _rows(lines)
    result = Scan(
        path=path,
        lines=numbers,
        fields=frozenset(fields),
        types=types,
        bad_rows=bad_rows,
        bad_count=bad_count,
        duplicate_of=_first_occurrences(numbers, _rows(pair_rows), _keys(pair_keys)),
        prompt_rows=_rows(prompt_rows),
        prompt_keys=_keys(prompt_keys),
    )
    refuse_types(result, method)  # before any token is counted: the token cache reads no file of the wrong type
    if count_tokens is not None:
        result.tokens = np.full(len(numbers), np.nan)
        result.tokens[_rows(counted_rows)] = np.asarray(counts, dtype=np.float64)
    elif token_lengths is not None:
        counted_lines, lengths = token_lengths(path)
        result.tokens = np.full(len(numbers), np.nan)
        result.tokens[np.searchsorted(numbers, counted_lines)] = lengths  # both in line order
    return result


def refuse_types(found: Scan, method: Method = "sft") -> None:
    """Refuse (StepInputError) a file mixing record types, or holding records `method` cannot train on.

    sft takes prompt-completion or conversational records, dpo preference records.

    Never tolerated by `mostly`: a type decides how every row is tokenized and learned, so a mix is no share of
    bad rows but a file built wrong.
    """
    if len(found.types) > 1:
        (first, first_line), (second, second_line) = list(found.types.items())[:2]
        raise StepInputError(
            f"{found.path.name} mixes {first} records ({FIELDS_OF[first]}, first at line {first_line}) and {second} "
            f"records ({FIELDS_OF[second]}, first at line {second_line}); a split file holds records of one type"
        )
    if method == "sft" and PREFERENCE in found.types:
        raise StepInputError(sft_refusal(found.path, found.types[PREFERENCE]))
    if method == "dpo" and found.types and PREFERENCE not in found.types:
        kind, line = next(iter(found.types.items()))
        raise StepInputError(dpo_refusal(found.path, line, kind))


def _first_occurrences(lines: np.ndarray, rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per row of the split: the line of the first row with the same key (among `rows`), 0 for a first occurrence."""
    import numpy as np

    duplicate_of = np.zeros(len(lines), dtype=np.int64)
    if len(keys):
        _, first, group = np.unique(keys, return_index=True, return_inverse=True)  # first: stable, earliest row
        repeats = first[group] != np.arange(len(keys))
        duplicate_of[rows[repeats]] = lines[rows[first[group][repeats]]]
    return duplicate_of


def find_overlap(eval_scan: Scan, train_scan: Scan) -> int:
    """Mark the eval rows whose prompt occurs in train (with the first train line) and return how many there are."""
    import numpy as np

    eval_scan.overlap = np.zeros(eval_scan.rows, dtype=np.int64)
    if not len(train_scan.prompt_keys) or not len(eval_scan.prompt_keys):
        return 0
    unique, first = np.unique(train_scan.prompt_keys, return_index=True)
    at = np.minimum(np.searchsorted(unique, eval_scan.prompt_keys), len(unique) - 1)
    found = unique[at] == eval_scan.prompt_keys
    train_lines = train_scan.lines[train_scan.prompt_rows[first[at[found]]]]
    eval_scan.overlap[eval_scan.prompt_rows[found]] = train_lines
    return int(found.sum())


def frames(found: Scan, chunk_rows: int) -> Iterator[pd.DataFrame]:
    """Pass 2: the split as DataFrames of at most `chunk_rows` rows (one empty frame for an empty split)."""
    lines = read_lines(found.path)
    first = 0
    while True:
        chunk = list(islice(lines, chunk_rows))
        if chunk or first == 0:
            yield _frame(chunk, found, first)
        first += len(chunk)
        if len(chunk) < chunk_rows:
            return


def _frame(chunk: list[Line], found: Scan, first: int) -> pd.DataFrame:
    """One row per line: line number, parse error, the fields and their `<field>_type` names, the derived columns."""
    import pandas as pd

    records: list[dict[str, Any]] = [line.record or {} for line in chunk]
    end = first + len(chunk)
    frame = pd.DataFrame(
        {
            LINE: pd.Series([line.number for line in chunk], dtype="int64"),
            PARSE_ERROR: pd.Series([line.error for line in chunk], dtype=object),
        }
    )
    for name in FIELDS:
        if name in found.fields:  # a field absent from every record stays absent: column_exists fails
            # object dtype keeps each value as JSON gave it, so the type check sees every row
            frame[name] = pd.Series([r.get(name) for r in records], dtype=object)
        frame[f"{name}_type"] = pd.Series([type(r.get(name)).__name__ for r in records], dtype=object)
    frame[DUPLICATE] = pd.Series(
        [f"repeats line {n}" if n else None for n in found.duplicate_of[first:end].tolist()], dtype=object
    )
    if found.checked_whole:  # every parsed row, typed or not: one check counts what is wrong with each
        errors = [record_error(line.record) if line.record is not None else None for line in chunk]
        frame[RECORD_ERROR] = pd.Series(errors, dtype=object)
    if found.tokens is not None:
        frame[TOKENS] = pd.Series(found.tokens[first:end], dtype="float64")  # NaN for unusable rows: GE skips them
    if found.overlap is not None:
        shared = "history" if found.conversational else "prompt"
        frame[OVERLAP] = pd.Series(
            [f"{shared} of train line {n}" if n else None for n in found.overlap[first:end].tolist()], dtype=object
        )
    return frame
