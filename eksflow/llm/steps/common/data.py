"""The dataset format every step shares: JSON lines of records of one type, in two splits.

    <dataset_dir>/train.jsonl      one JSON object per line; blank lines are ignored
    <dataset_dir>/eval.jsonl       held out: no prompt of it occurs in train.jsonl
    <dataset_dir>/manifest.json    written by stage_data: key, size, ETag and sha256 of each source file, the files
                                   derived from them, and the dataset digest
    <dataset_dir>/raw/...          the source files as staged (train.jsonl and eval.jsonl are derived from them)

The types follow TRL's dataset formats, told apart per record by their fields (record_type):
    prompt-completion  {"prompt": str, "completion": str}
    conversational     {"messages": [...]}: an optional system turn, then user and assistant turns, any number,
                       ending with an assistant turn; an assistant turn may call tools (OpenAI's `tool_calls`,
                       content null) and `tool` messages answer it
    preference         {"prompt", "chosen", "rejected"}: strings, or a message list answered by lists of assistant
                       turns
stage_data normalizes instruction data ({"instruction", "input", "output"}) to a pair (normalize_record), keeps
every other record as it is, and splits a single data file by a hash of each record's split_key (split_of).
Supervised fine-tuning takes pairs and conversations (usable_examples); a preference record is refused.

Other keys in a record are allowed and ignored.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eksflow.runtime.args import StepInputError

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
MANIFEST_FILE = "manifest.json"
SPLITS = {"train": TRAIN_FILE, "eval": EVAL_FILE}  # split name -> file name inside the dataset folder
FIELDS = ("prompt", "completion")
# How a model is trained on a dataset, which decides the record type its splits must hold: sft takes prompt-completion
# or conversational records (usable_examples), dpo preference records (eksflow.llm.steps.common.preference).
Method = Literal["sft", "dpo"]


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


PROMPT_COMPLETION = "prompt-completion"
CONVERSATIONAL = "conversational"
PREFERENCE = "preference"
FIELDS_OF = {  # what a reader is shown of each type: the fields that make it
    PROMPT_COMPLETION: "prompt/completion",
    CONVERSATIONAL: "messages",
    PREFERENCE: "prompt/chosen/rejected",
}
CHAT_ROLES = ("system", "user", "assistant", "tool")


def record_type(record: dict[str, Any]) -> str | None:
    """The dataset type a record's fields make it (TRL's formats), or None when it has the fields of none.

    `messages` makes it conversational; `chosen` or `rejected` a preference; `prompt` or `completion` a pair. Which
    of these a record is decides how it is checked (record_error): a half-written record is still typed, so the
    error names the field it lacks.
    """
    if "messages" in record:
        return CONVERSATIONAL
    if "chosen" in record or "rejected" in record:
        return PREFERENCE
    if "prompt" in record or "completion" in record:
        return PROMPT_COMPLETION
    return None


def record_error(record: dict[str, Any]) -> str | None:
    """Why `record` is not a usable record of its type, naming the field (e.g. "messages[2].content is blank")."""
    kind = record_type(record)
    if kind == PROMPT_COMPLETION:
        return _text_error(record, "prompt") or _text_error(record, "completion")
    if kind == CONVERSATIONAL:
        return _turns_error(record["messages"], "messages", after=None, last=("assistant",))
    if kind == PREFERENCE:
        return _preference_error(record)
    known = ", ".join(f"{name} ({fields})" for name, fields in FIELDS_OF.items())
    return f"no known record type: expected the fields of one of {known}"


def _text_error(record: dict[str, Any], field: str, name: str | None = None) -> str | None:
    """Why record[field] is not a non-blank string; `name` is how the error calls the field."""
    name = name or field
    value = record.get(field)
    if value is None:
        return f"{name} is missing"
    if not isinstance(value, str):
        return f"{name} is a {type(value).__name__}, expected a string"
    return None if value.strip() else f"{name} is blank"


# The role each role may follow: a conversation opens with an optional system turn and a user turn, user and
# assistant alternate, and an assistant turn calling tools is followed by one `tool` message per answered call.
FOLLOWS = {
    "system": (None,),
    "user": (None, "system", "assistant"),
    "assistant": ("user", "tool"),
    "tool": ("assistant+tool_calls", "tool"),
}


def _turns_error(messages: Any, field: str, after: str | None, last: tuple[str, ...]) -> str | None:
    """Why `messages` (a list named `field`) is not a run of turns following `after` and ending with one of `last`.

    `after` is the turn before the first one (None: the conversation's start), as FOLLOWS spells it.
    """
    if not isinstance(messages, list) or not messages:
        return f"{field} is not a non-empty list of messages"
    previous: str | None = after
    call_ids: set[str] = set()
    for i, message in enumerate(messages):
        at = f"{field}[{i}]"
        if not isinstance(message, dict):
            return f"{at} is a {type(message).__name__}, expected an object"
        role = message.get("role")
        if role not in CHAT_ROLES:
            return f"{at}.role is {role!r}, expected one of {', '.join(CHAT_ROLES)}"
        if previous not in FOLLOWS[role]:
            return f"{at}: {_misplaced(role, previous)}"
        error = _message_error(message, at, call_ids)
        if error:
            return error
        if role == "assistant":
            call_ids = {c["id"] for c in message.get("tool_calls") or () if isinstance(c.get("id"), str)}
        previous = "assistant+tool_calls" if role == "assistant" and message.get("tool_calls") else role
    if previous not in last:
        return f"{field} ends with {_shown(previous)}, expected {' or '.join(last)}"
    return None


def _misplaced(role: str, previous: str | None) -> str:
    """Why a `role` turn may not follow `previous`."""
    if role == "system":
        return "a system turn after the first message"
    if role == "tool":
        return "a tool message answering no call (it follows an assistant turn with tool_calls)"
    expected = [name for name, before in FOLLOWS.items() if previous in before]
    return f"{role} after {_shown(previous)}, expected {' or '.join(expected)}"


def _shown(previous: str | None) -> str:
    """A turn as FOLLOWS names it, for a reader."""
    if previous is None:
        return "the start"
    return "assistant with tool_calls" if previous == "assistant+tool_calls" else previous


def _message_error(message: dict[str, Any], at: str, call_ids: set[str]) -> str | None:
    """Why one message's content, tool_calls or tool_call_id is malformed; `call_ids`: the ids the calls gave."""
    role = message["role"]
    if role == "assistant" and message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not calls:
            return f"{at}.tool_calls is not a non-empty list"
        for j, call in enumerate(calls):
            error = _call_error(call, f"{at}.tool_calls[{j}]")
            if error:
                return error
        content = message.get("content")
        return None if content is None or isinstance(content, str) else f"{at}.content is not a string or null"
    if role == "tool":
        if not isinstance(message.get("content"), str):
            return f"{at}.content is not a string"
        answered = message.get("tool_call_id")
        if answered is not None and (not isinstance(answered, str) or (call_ids and answered not in call_ids)):
            return f"{at}.tool_call_id {answered!r} names no call of the assistant turn before it"
        return None
    return _text_error(message, "content", f"{at}.content")


def _call_error(call: Any, at: str) -> str | None:
    """Why one tool call is not {"type": "function", "function": {"name": str, "arguments": str | object}}."""
    if not isinstance(call, dict):
        return f"{at} is a {type(call).__name__}, expected an object"
    if call.get("type", "function") != "function":
        return f"{at}.type is {call.get('type')!r}, expected 'function'"
    if "id" in call and not isinstance(call["id"], str):
        return f"{at}.id is not a string"
    function = call.get("function")
    if not isinstance(function, dict):
        return f"{at}.function is missing (expected an object with name and arguments)"
    error = _text_error(function, "name", f"{at}.function.name")
    if error:
        return error
    if not isinstance(function.get("arguments"), str | dict):
        return f"{at}.function.arguments is not a string or an object"
    return None


def _preference_error(record: dict[str, Any]) -> str | None:
    """Why a preference record is malformed: all strings, or a message list answered by assistant turn lists."""
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        error = _turns_error(prompt, "prompt", after=None, last=("user", "tool"))
        follows = "tool" if prompt and isinstance(prompt[-1], dict) and prompt[-1].get("role") == "tool" else "user"
        for field in ("chosen", "rejected"):
            error = error or _turns_error(record.get(field), field, after=follows, last=("assistant",))
    else:
        error = _text_error(record, "prompt") or _text_error(record, "chosen") or _text_error(record, "rejected")
    if error is None and record["chosen"] == record["rejected"]:
        return "chosen equals rejected: a preference needs two different answers"
    return error


def sft_refusal(path: Path, line: int) -> str:
    """The one line refusing a preference record to supervised fine-tuning."""
    return (
        f"{path.name}:{line} is a {PREFERENCE} record ({FIELDS_OF[PREFERENCE]}); supervised fine-tuning takes "
        f"{PROMPT_COMPLETION} or {CONVERSATIONAL} records"
    )


def example_of(record: dict[str, Any]) -> Example:
    """The Example of a usable prompt-completion or conversational record (record_error found nothing)."""
    if record_type(record) != CONVERSATIONAL:
        return Example(prompt=record["prompt"], completion=record["completion"])
    *history, answer = record["messages"]
    shown = [f"{m['role']}: {content_shown(m)}" for m in history]
    return Example(prompt="\n".join(shown), completion=answer["content"], messages=tuple(record["messages"]))


def content_shown(message: dict[str, Any]) -> str:
    """A message's content, or its tool calls as JSON when it has no content."""
    content = message.get("content")
    if isinstance(content, str) and content:
        return content
    return json.dumps(message.get("tool_calls"), ensure_ascii=False)


def usable_records(path: Path, refusal: Callable[[int, str], str | None]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of each usable line of a split file, in file order, streamed.

    Lines that are not usable are skipped with one warning on stderr: validate_data fails on them unless its
    `mostly` tolerance lets a few through, and then training must not trip over them. A record whose type the
    method cannot use refuses the whole file (StepInputError) at the first one, with `refusal(line, type)`'s line.
    """
    if not path.is_file():
        raise StepInputError(f"dataset file {str(path)!r} does not exist; did stage_data and validate_data run?")
    skipped, first = 0, ""
    for line in read_lines(path):
        record = line.record
        kind = record_type(record) if record is not None else None
        refused = refusal(line.number, kind) if kind is not None else None
        if refused is not None:
            raise StepInputError(refused)
        error = line.error if record is None else record_error(record)
        if error is None and record is not None:
            yield line.number, record
        else:
            skipped, first = skipped + 1, first or f"line {line.number}: {error}"
    if skipped:
        print(f"warning: skipped {skipped} unusable line(s) in {path} (first: {first})", file=sys.stderr)


def usable_examples(path: Path) -> Iterator[tuple[int, Example]]:
    """(line number, Example) of each usable line of a split file (usable_records).

    A preference record is no SFT example: it refuses the file.
    """

    def refusal(line: int, kind: str) -> str | None:
        return sft_refusal(path, line) if kind == PREFERENCE else None

    for number, record in usable_records(path, refusal):
        yield number, example_of(record)


def load_examples(path: Path) -> list[Example]:
    """The usable examples of a split file (usable_examples), refusing a file that holds none."""
    examples = [example for _, example in usable_examples(path)]
    if not examples:
        raise StepInputError(
            f"{str(path)!r} holds no usable examples; expected JSON lines of {FIELDS_OF[PROMPT_COMPLETION]} or "
            f"{FIELDS_OF[CONVERSATIONAL]}"
        )
    return examples


# Instruction data in the Alpaca shape; `input` is optional context appended to the instruction.
INSTRUCTION_FIELDS = ("instruction", "output")


def normalize_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """An instruction record ({"instruction", "input"?, "output"}) as a prompt-completion pair, else None.

    The prompt is the instruction, then the input after a blank line. Every other record (a pair, a conversation,
    a preference, a record of no known type) is kept as it is: a conversation keeps its turns, to be tokenized
    and asked with the model's own chat template, and validate_data names what is wrong with the rest.
    """
    if record_type(record) is not None:
        return None
    if all(isinstance(record.get(name), str) for name in INSTRUCTION_FIELDS):
        context = record.get("input")
        prompt = record["instruction"]
        if isinstance(context, str) and context.strip():
            prompt = f"{prompt}\n\n{context}"
        return {"prompt": prompt, "completion": record["output"]}
    return None


def split_key(record: dict[str, Any]) -> str | None:
    """What decides a record's split and what eval must not share with train, or None when it has no such thing.

    A pair's prompt (as split_of has always hashed it), a conversation's history (every turn but the last,
    _history_key) or a preference's prompt messages as canonical JSON: duplicates share a key, so they land in one
    split.
    """
    if record_type(record) == CONVERSATIONAL:
        messages = record["messages"]
        return _history_key(messages[:-1]) if isinstance(messages, list) and messages else None
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        return canonical_messages(prompt)
    return prompt if isinstance(prompt, str) else None


def _history_key(history: list[Any]) -> str:
    """The text a conversation's split hashes: what stage_data hashed when it still flattened conversations.

    Then one user turn after an optional system turn was hashed as its contents joined by a blank line, and a
    longer history as "role: content" lines; keeping those texts keeps every row of a dataset staged before in the
    split it had (a held-out row never moves into training on an upgrade). A history with tool calls, tool turns
    or content that is not text was not accepted then, and hashes as canonical JSON.
    """
    plain = all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
        and "tool_calls" not in m
        for m in history
    )  # fmt: skip
    if not plain:
        return canonical_messages(history)
    turns = [m for m in history if m["role"] != "system"]
    if len(turns) == 1 and turns[0]["role"] == "user":
        return "\n\n".join([*(m["content"] for m in history if m["role"] == "system"), turns[0]["content"]])
    return "\n".join(f"{m['role']}: {m['content']}" for m in history)


def canonical_messages(messages: list[Any]) -> str:
    """Messages as one JSON text whatever their key order or spacing."""
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def split_of(key: str, eval_fraction: float) -> str:
    """The split ("eval" or "train") from a hash of a record's split_key alone, never of other rows.

    Hashing the key (a prompt or a history, not the whole record) sends duplicate prompts to the same split: no
    train/eval overlap.
    """
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "eval" if bucket < eval_fraction else "train"
