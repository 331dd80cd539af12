"""validate_data checks record types: each malformed conversation named as file:line, mixed files and preference
records refused in one line, `mostly` tolerating bad rows but never a mix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps.validate_data import Args, ValidateSettings
from eksflow.llm.steps.validate_data.step import main, run
from eksflow.llm.steps.validate_data.suite import validate
from eksflow.runtime.args import StepInputError
from tests.unit.steps import test_validate_checks
from tests.unit.steps.test_validate_checks import counts


def line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


def chat(i: int, split: str = "train", *extra: dict[str, Any]) -> bytes:
    return line(
        {
            "messages": [
                {"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": f"{split} question {i}?"},
                *extra,
                {"role": "assistant", "content": f"answer {i}"},
            ]
        }
    )


def chats(n: int, split: str = "train") -> list[bytes]:
    return [chat(i, split) for i in range(n)]


TOOL_TURNS = (
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look_up", "arguments": "{}"}}],
    },
    {"role": "tool", "content": "found", "tool_call_id": "c1"},
)


def write_dataset(folder: Path, train: list[bytes], eval_: list[bytes] | None = None) -> Path:
    """test_validate_checks' dataset folder, its held-out split two conversations unless given."""
    return test_validate_checks.write_dataset(folder, train, eval_ if eval_ is not None else chats(2, "eval"))


def test_conversations_with_tool_calls_pass(tmp_path):
    train = chats(20) + [chat(i, "train", *TOOL_TURNS) for i in range(20, 30)]
    report = validate(write_dataset(tmp_path / "data", train), ValidateSettings())
    assert report.success, counts(report)
    assert report.rows == {"train": 30, "eval": 2}
    assert {c.check for c in report.checks} >= {"record_valid", "no_duplicate", "prompt_not_in_train"}
    assert not {c.check for c in report.checks} & {"prompt_exists", "completion_not_blank"}  # no pair fields here


def bad_conversations() -> list[bytes]:
    lines = chats(100)
    lines[9] = line({"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]})
    lines[29] = line({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]})
    lines[49] = line({"no": "type"})
    lines[69] = b"{cut"
    lines[89] = lines[88]  # a repeated conversation
    return lines


def test_each_bad_conversation_is_counted_and_named_as_file_and_line(tmp_path, capsys):
    data = write_dataset(tmp_path / "data", bad_conversations())
    report = validate(data, ValidateSettings())
    assert counts(report) == {"train/lines_parse": 1, "train/record_valid": 3, "train/no_duplicate": 1}
    assert report.bad_rows == [
        "train.jsonl:10: messages[0]: assistant after the start, expected system or user",
        "train.jsonl:30: messages[1]: a tool message answering no call (it follows an assistant turn with tool_calls)",
        "train.jsonl:50: no known record type: expected the fields of one of prompt-completion (prompt/completion), "
        "conversational (messages), preference (prompt/chosen/rejected)",
        "train.jsonl:70: malformed JSON: Expecting property name enclosed in double quotes at column 2",
    ]
    with pytest.raises(StepInputError) as failed:
        run(Args(dataset_dir=data, report_dir=tmp_path / "reports"))
    assert "\n" not in str(failed.value) and "train/record_valid" in str(failed.value)
    logged = capsys.readouterr().err.splitlines()
    assert [ln for ln in logged if ln.startswith("bad row: ")] == [f"bad row: {row}" for row in report.bad_rows]


@pytest.mark.parametrize(("mostly", "passes"), [(0.97, True), (0.98, False)])
def test_mostly_tolerates_bad_conversations_exactly(tmp_path, mostly, passes):
    lines = bad_conversations()
    lines[69], lines[89] = chat(69), chat(89)  # 3 bad rows of 100 left
    report = validate(
        write_dataset(tmp_path / "data", lines), ValidateSettings(mostly_by_check={"record_valid": mostly})
    )
    assert report.success is passes


def test_eval_history_seen_in_train_is_overlap(tmp_path):
    eval_ = [chat(3, "train"), chat(0, "eval")]  # same history as train line 4, another answer is no excuse
    eval_[0] = eval_[0].replace(b"answer 3", b"another answer")
    report = validate(write_dataset(tmp_path / "data", chats(10), eval_), ValidateSettings())
    assert counts(report) == {"eval/prompt_not_in_train": 1}
    assert next(c for c in report.failures).examples == ("line 1: history of train line 4",)


PAIR = line({"prompt": "2+3?", "completion": "5"})
PREFERENCE = line({"prompt": "2+3?", "chosen": "5", "rejected": "6"})


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (
            [PAIR, PAIR, *chats(3)],
            "train.jsonl mixes prompt-completion records (prompt/completion, first at line 1) and conversational "
            "records (messages, first at line 3); a split file holds records of one type",
        ),
        (
            [*chats(3), PREFERENCE],
            "train.jsonl mixes conversational records (messages, first at line 1) and preference records "
            "(prompt/chosen/rejected, first at line 4); a split file holds records of one type",
        ),
        (
            [PREFERENCE, PREFERENCE],
            "train.jsonl:1 is a preference record (prompt/chosen/rejected); supervised fine-tuning takes "
            "prompt-completion or conversational records",
        ),
    ],
    ids=["pairs-and-conversations", "preference-beside-sft", "preference"],
)
def test_mixed_or_preference_files_are_refused_in_one_line_whatever_mostly(tmp_path, capsys, train, message):
    data = write_dataset(tmp_path / "data", train)

    def never(path: Path) -> Any:
        raise AssertionError(f"{path} was tokenized before its types were checked")

    with pytest.raises(StepInputError) as refused:
        validate(data, ValidateSettings(mostly=0.0), token_lengths=never, max_tokens=64)
    assert str(refused.value) == message
    assert main([f"--dataset-dir={data}", f"--report-dir={tmp_path / 'r'}", f"--outputs-dir={tmp_path / 'o'}"]) == 2
    assert message in capsys.readouterr().err
