"""The dataset format every step shares: JSON lines of {"prompt": str, "completion": str}, in two splits.

    <dataset_dir>/train.jsonl      one JSON object per line; blank lines are ignored
    <dataset_dir>/eval.jsonl       held out: no prompt of it occurs in train.jsonl
    <dataset_dir>/manifest.json    written by stage_data: key, size, ETag and sha256 of each source file, the files
                                   derived from them, and the dataset digest
    <dataset_dir>/raw/...          the source files as staged (train.jsonl and eval.jsonl are derived from them)

stage_data normalizes instruction data ({"instruction", "input", "output"}) and chat data ({"messages": [...]})
to this form (normalize_record) and splits a single data file by a hash of each prompt (split_of).

Other keys in a record are allowed and ignored.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.runtime.args import StepInputError

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
MANIFEST_FILE = "manifest.json"
SPLITS = {"train": TRAIN_FILE, "eval": EVAL_FILE}  # split name -> file name inside the dataset folder
FIELDS = ("prompt", "completion")


@dataclass(frozen=True)
class Example:
    """One training or evaluation example: a prompt-completion pair, or a conversation.

    A conversation (`messages`: every turn in OpenAI's chat shape, the last one the assistant's answer) keeps its
    turns: it is tokenized, asked and served with the model's own chat template, and every assistant turn is
    learned. `prompt` is then the history shown as "role: content" lines (reports, logs) and `completion` the last
    assistant turn's content (the reference a held-out answer is scored against).
    """

    prompt: str
    completion: str
    messages: tuple[dict[str, Any], ...] = ()

    def history(self) -> list[dict[str, Any]]:
        """The chat messages a model is asked with: the turns before the answer (one user turn for a pair)."""
        if self.messages:
            return [dict(m) for m in self.messages[:-1]]
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class Line:
    """One non-blank line of a JSONL file: the parsed object, or why it could not be parsed."""

    number: int  # 1-based, as an editor shows it
    record: dict[str, Any] | None
    error: str | None


def read_lines(path: Path) -> Iterator[Line]:
    """Parse `path` line by line; malformed JSON, non-UTF-8 bytes and non-objects become `Line.error`, never raise."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: editors on Windows prepend a byte-order mark
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                yield Line(number, None, f"not UTF-8: byte 0x{raw[err.start]:02x} at column {err.start + 1}")
                continue
            try:
                value = json.loads(text.rstrip("\r\n"))  # so error columns count within the line
            except json.JSONDecodeError as err:
                yield Line(number, None, f"malformed JSON: {err.msg} at column {err.colno}")
                continue
            if not isinstance(value, dict):
                yield Line(number, None, f"expected a JSON object, got {type(value).__name__}")
                continue
            yield Line(number, value, None)


def example_error(record: dict[str, Any]) -> str | None:
    """Why `record` is not a usable Example (missing, non-string or blank field), or None."""
    for field in FIELDS:
        if field not in record or record[field] is None:
            return f"missing {field!r}"
        if not isinstance(record[field], str):
            return f"{field!r} is a {type(record[field]).__name__}, expected a string"
        if not record[field].strip():
            return f"{field!r} is blank"
    return None


def load_examples(path: Path) -> list[Example]:
    """The usable examples of a split file.

    Lines that are not usable are skipped with one warning on stderr: validate_data fails on them unless its
    `mostly` tolerance lets a few through, and then training must not trip over them.
    """
    if not path.is_file():
        raise StepInputError(f"dataset file {str(path)!r} does not exist; did stage_data and validate_data run?")
    examples: list[Example] = []
    skipped: list[str] = []
    for line in read_lines(path):
        error = line.error if line.record is None else example_error(line.record)
        if error is not None or line.record is None:
            skipped.append(f"line {line.number}: {error}")
            continue
        examples.append(Example(prompt=line.record["prompt"], completion=line.record["completion"]))
    if skipped:
        print(f"warning: skipped {len(skipped)} unusable line(s) in {path} (first: {skipped[0]})", file=sys.stderr)
    if not examples:
        raise StepInputError(f"{str(path)!r} holds no usable examples; expected JSON lines of prompt/completion")
    return examples


# Instruction data in the Alpaca shape; `input` is optional context appended to the instruction.
INSTRUCTION_FIELDS = ("instruction", "output")
CHAT_ROLES = ("system", "user", "assistant")


def normalize_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """`record` in the internal prompt/completion form, or None when it is already in it or in no known form.

    Known forms: {"instruction", "input"?, "output"} (prompt = instruction, then the input after a blank line) and
    chat {"messages": [{"role", "content"}, ...]} ending with an assistant turn (prompt = the turns before it;
    a single user turn, after an optional system turn, is used as is, longer histories are rendered as
    "role: content" lines). Chat records keep `messages` so validate_data can check the role order. Records in
    no known form are left to validate_data, which names what is missing.
    """
    if "prompt" in record or "completion" in record:
        return None
    if all(isinstance(record.get(name), str) for name in INSTRUCTION_FIELDS):
        context = record.get("input")
        prompt = record["instruction"]
        if isinstance(context, str) and context.strip():
            prompt = f"{prompt}\n\n{context}"
        return {"prompt": prompt, "completion": record["output"]}
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        *history, last = messages
        if last.get("role") != "assistant" or not isinstance(last.get("content"), str):
            return {"messages": messages}  # no answer to learn: validate_data reports the role order
        turns = [m for m in history if m.get("role") != "system"]
        system = [str(m.get("content", "")) for m in history if m.get("role") == "system"]
        if len(turns) == 1 and turns[0].get("role") == "user":
            prompt = "\n\n".join([*system, str(turns[0].get("content", ""))])
        else:
            prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in history)
        return {"prompt": prompt, "completion": last["content"], "messages": messages}
    return None


def role_order_error(messages: Any) -> str | None:
    """Why a chat `messages` list is out of order (system first, then user/assistant alternating, assistant last)."""
    if not isinstance(messages, list) or not messages:
        return "messages is not a non-empty list"
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    unknown = [r for r in roles if r not in CHAT_ROLES]
    if unknown:
        return f"unknown role {unknown[0]!r} (expected one of {', '.join(CHAT_ROLES)})"
    turns = roles[1:] if roles[0] == "system" else roles
    if "system" in turns:
        return "a system message after the first turn"
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(turns))]
    if turns != expected or not turns or turns[-1] != "assistant":
        return f"roles {'>'.join(str(r) for r in roles)}: expected user/assistant alternating, ending with assistant"
    return None


def split_of(prompt: str, eval_fraction: float) -> str:
    """The split ("eval" or "train") from a hash of the prompt alone, so a row's split never depends on other rows.

    Hashing the prompt (not the whole record) sends duplicate prompts to the same split: no train/eval overlap.
    """
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") / 2**64
    return "eval" if bucket < eval_fraction else "train"
