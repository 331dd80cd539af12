"""Preference records (TRL's preference type) as what DPO trains and evaluate scores: two answers to one prompt.

    {"prompt": "Normalize: 3rd of May 2021", "chosen": "2021-05-03", "rejected": "05/03/2021"}
    {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello."}],
     "rejected": [{"role": "assistant", "content": "Go away."}]}

Each answer is an Example asked with the prompt's history, so that it is tokenized through the chat template as SFT
tokenizes its records (encoding.encode_batch): a string prompt is one user turn and a string answer its completion;
a message-list prompt is the history and the chosen or rejected turns follow it. Only the answer's own assistant
turns are learned (scored): an assistant turn inside the prompt's history is context, like a user turn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eksflow.llm.steps.common.data import (
    FIELDS_OF,
    PREFERENCE,
    Example,
    content_shown,
    usable_records,
)
from eksflow.llm.steps.common.encoding import Span
from eksflow.runtime.args import StepInputError


@dataclass(frozen=True)
class Preference:
    """A prompt's chosen and rejected answers, each an Example, and how many assistant turns each answer is."""

    chosen: Example
    rejected: Example
    chosen_turns: int = 1  # a string answer is one completion; a conversational one its assistant turns
    rejected_turns: int = 1

    def answers(self) -> tuple[Example, Example]:
        """(chosen, rejected): the two sequences a DPO step scores."""
        return self.chosen, self.rejected


def preference_of(record: dict[str, Any]) -> Preference:
    """The Preference of a usable preference record (record_error found nothing)."""
    prompt = record["prompt"]
    if isinstance(prompt, str):
        return Preference(Example(prompt, record["chosen"]), Example(prompt, record["rejected"]))
    shown = "\n".join(f"{m['role']}: {content_shown(m)}" for m in prompt)

    def answer(turns: list[dict[str, Any]]) -> Example:
        return Example(prompt=shown, completion=turns[-1].get("content") or "", messages=tuple([*prompt, *turns]))

    return Preference(
        answer(record["chosen"]),
        answer(record["rejected"]),
        chosen_turns=_assistant_turns(record["chosen"]),
        rejected_turns=_assistant_turns(record["rejected"]),
    )


def _assistant_turns(turns: list[dict[str, Any]]) -> int:
    return sum(1 for m in turns if m.get("role") == "assistant")


def answer_spans(spans: Sequence[Span], turns: int) -> list[Span]:
    """The learned spans of an answer: its own `turns` assistant turns, the last spans encode_batch gives."""
    return list(spans[-turns:])


def dpo_refusal(path: Path, line: int, kind: str) -> str:
    """The one line refusing a pair or conversation to preference tuning."""
    return (
        f"{path.name}:{line} is a {kind} record ({FIELDS_OF[kind]}); method=dpo trains on {PREFERENCE} records "
        f"({FIELDS_OF[PREFERENCE]})"
    )


def usable_preferences(path: Path) -> Iterator[tuple[int, Preference]]:
    """(line number, Preference) of each usable line of a split file (data.usable_records).

    A record of another type refuses the file.
    """

    def refusal(line: int, kind: str) -> str | None:
        return dpo_refusal(path, line, kind) if kind != PREFERENCE else None

    for number, record in usable_records(path, refusal):
        yield number, preference_of(record)


def load_preferences(path: Path) -> list[Preference]:
    """The usable preferences of a split file, refusing a file that holds none."""
    found = [preference for _, preference in usable_preferences(path)]
    if not found:
        raise StepInputError(
            f"{str(path)!r} holds no usable {PREFERENCE} records; method=dpo expects JSON lines of "
            f"{FIELDS_OF[PREFERENCE]}"
        )
    return found
