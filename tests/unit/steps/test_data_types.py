"""Dataset types told apart per record (TRL's formats), each malformed shape named, and what SFT reads of a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps.common.data import (
    CONVERSATIONAL,
    PREFERENCE,
    PROMPT_COMPLETION,
    Example,
    load_examples,
    record_error,
    record_type,
    usable_examples,
)
from eksflow.runtime.args import StepInputError


def user(text: str = "2+3?") -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None = "5") -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def system(text: str = "Be brief.") -> dict[str, Any]:
    return {"role": "system", "content": text}


CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
}
ANSWER = {"role": "tool", "content": "5", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        ({"prompt": "2+3?", "completion": "5"}, PROMPT_COMPLETION),
        ({"messages": [user(), assistant()]}, CONVERSATIONAL),
        ({"messages": [system(), user(), assistant(), user("times 2?"), assistant("10")]}, CONVERSATIONAL),
        ({"messages": [user(), CALL, ANSWER, assistant()]}, CONVERSATIONAL),
        (  # arguments as an object, no id, no tool_call_id, content absent: all allowed by OpenAI's shape
            {
                "messages": [
                    user(),
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": {}}}],
                    },
                    {"role": "tool", "content": "5"},
                    assistant(),
                ]
            },
            CONVERSATIONAL,
        ),
        ({"prompt": "2+3?", "chosen": "5", "rejected": "6"}, PREFERENCE),
        ({"prompt": [system(), user()], "chosen": [assistant("5")], "rejected": [assistant("6")]}, PREFERENCE),
        ({"prompt": [user(), CALL, ANSWER], "chosen": [assistant("5")], "rejected": [assistant("6")]}, PREFERENCE),
    ],
    ids=["pair", "chat", "multi-turn", "tool-calls", "tool-calls-loose", "preference", "preference-chat", "pref-tool"],
)
def test_each_type_is_recognized_and_well_formed(record, kind):
    assert record_type(record) == kind
    assert record_error(record) is None


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"prompt": "p"}, "completion is missing"),
        ({"prompt": "p", "completion": 5}, "completion is a int, expected a string"),
        ({"prompt": " ", "completion": "c"}, "prompt is blank"),
        ({"question": "q", "answer": "a"}, "no known record type"),
        ({"messages": []}, "messages is not a non-empty list of messages"),
        ({"messages": [user(), "hi"]}, "messages[1] is a str, expected an object"),
        ({"messages": [user(), {"role": "bot", "content": "x"}]}, "messages[1].role is 'bot'"),
        ({"messages": [assistant(), user()]}, "messages[0]: assistant after the start, expected system or user"),
        ({"messages": [user(), user(), assistant()]}, "messages[1]: user after user, expected assistant"),
        ({"messages": [user(), system(), assistant()]}, "messages[1]: a system turn after the first message"),
        ({"messages": [user(), assistant(), user()]}, "messages ends with user, expected assistant"),
        ({"messages": [system()]}, "messages ends with system, expected assistant"),
        ({"messages": [user(" "), assistant()]}, "messages[0].content is blank"),
        ({"messages": [user(), assistant(None)]}, "messages[1].content is missing"),
        ({"messages": [user(), ANSWER, assistant()]}, "messages[1]: a tool message answering no call"),
        ({"messages": [user(), CALL]}, "messages ends with assistant with tool_calls, expected assistant"),
        ({"messages": [user(), {**CALL, "tool_calls": []}, ANSWER, assistant()]}, "messages[1].tool_calls is not a"),
        (
            {"messages": [user(), {**CALL, "tool_calls": [{"type": "function"}]}, ANSWER, assistant()]},
            "messages[1].tool_calls[0].function is missing",
        ),
        (
            {
                "messages": [
                    user(),
                    {**CALL, "tool_calls": [{"type": "retrieval", "function": {}}]},
                    ANSWER,
                    assistant(),
                ]
            },
            "messages[1].tool_calls[0].type is 'retrieval', expected 'function'",
        ),
        (
            {
                "messages": [
                    user(),
                    {**CALL, "tool_calls": [{"function": {"name": " ", "arguments": "{}"}}]},
                    assistant(),
                ]
            },
            "messages[1].tool_calls[0].function.name is blank",
        ),
        (
            {"messages": [user(), {**CALL, "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}, assistant()]},
            "messages[1].tool_calls[0].function.arguments is not a string or an object",
        ),
        ({"messages": [user(), CALL, {**ANSWER, "tool_call_id": "call_9"}, assistant()]}, "'call_9' names no call"),
        ({"messages": [user(), CALL, {**ANSWER, "content": None}, assistant()]}, "messages[2].content is not a string"),
        ({"prompt": "p", "chosen": "a", "rejected": "a"}, "chosen equals rejected"),
        ({"prompt": "p", "chosen": " ", "rejected": "a"}, "chosen is blank"),
        ({"prompt": "p", "chosen": "a"}, "rejected is missing"),
        ({"prompt": [user()], "chosen": [user("x")], "rejected": [assistant()]}, "chosen[0]: user after user"),
        ({"prompt": [user()], "chosen": "5", "rejected": [assistant()]}, "chosen is not a non-empty list"),
        ({"prompt": [user(), assistant()], "chosen": [assistant()], "rejected": [assistant("6")]}, "prompt ends with"),
    ],
)
def test_each_malformed_shape_is_named(record, error):
    assert error in str(record_error(record))


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_usable_examples_keep_conversations_and_skip_bad_lines_with_one_warning(tmp_path, capsys):
    chat = {"messages": [system(), user(), CALL, ANSWER, assistant("5"), user("times 2?"), assistant("10")]}
    path = write(tmp_path / "train.jsonl", [chat, "{bad", {"messages": [user()]}, {"prompt": "p", "completion": "c"}])
    found = list(usable_examples(path))
    assert [n for n, _ in found] == [1, 4]
    conversation = found[0][1]
    assert conversation.messages == tuple(chat["messages"])
    assert conversation.completion == "10"
    assert conversation.history() == chat["messages"][:-1]
    assert conversation.prompt.splitlines()[2].startswith('assistant: [{"id": "call_1"')  # a call shown as JSON
    assert found[1][1] == Example("p", "c")
    warning = capsys.readouterr().err
    assert warning.count("warning") == 1
    assert "skipped 2 unusable line(s)" in warning and "line 2: malformed JSON" in warning


def test_a_preference_record_is_refused_for_supervised_fine_tuning(tmp_path):
    path = write(
        tmp_path / "train.jsonl",
        [{"prompt": "a", "completion": "b"}, {"prompt": "a"}, {"prompt": "2+3?", "chosen": "5", "rejected": "6"}],
    )
    with pytest.raises(StepInputError) as refused:
        load_examples(path)
    assert str(refused.value) == (
        "train.jsonl:3 is a preference record (prompt/chosen/rejected); supervised fine-tuning takes "
        "prompt-completion or conversational records"
    )
