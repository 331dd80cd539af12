"""Instruction and chat records normalized to prompt/completion; a single data file split by a hash of each prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps.common.data import load_examples, normalize_record, role_order_error, split_of
from eksflow.llm.steps.stage_data import Args
from eksflow.llm.steps.stage_data.step import run


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"instruction": "Add", "input": "2 and 3", "output": "5"}, {"prompt": "Add\n\n2 and 3", "completion": "5"}),
        ({"instruction": "Say hi", "input": "", "output": "hi"}, {"prompt": "Say hi", "completion": "hi"}),
        ({"instruction": "Say hi", "output": "hi"}, {"prompt": "Say hi", "completion": "hi"}),
        (
            {"messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]},
            {"prompt": "2+3?", "completion": "5"},
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "2+3?"},
                    {"role": "assistant", "content": "5"},
                ]
            },
            {"prompt": "Be brief.\n\n2+3?", "completion": "5"},
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "2+3?"},
                    {"role": "assistant", "content": "5"},
                    {"role": "user", "content": "times 2?"},
                    {"role": "assistant", "content": "10"},
                ]
            },
            {"prompt": "user: 2+3?\nassistant: 5\nuser: times 2?", "completion": "10"},
        ),
    ],
    ids=["instruction-input", "instruction-empty-input", "instruction-no-input", "chat", "chat-system", "multi-turn"],
)
def test_known_forms_are_normalized(record, expected):
    normalized = normalize_record(record)
    assert normalized is not None
    assert {k: normalized[k] for k in ("prompt", "completion")} == expected
    assert ("messages" in normalized) == ("messages" in record)


@pytest.mark.parametrize(
    "record",
    [{"prompt": "p", "completion": "c"}, {"prompt": "p"}, {"question": "q", "answer": "a"}, {"instruction": "x"}],
    ids=["internal", "half-internal", "unknown", "no-output"],
)
def test_internal_and_unknown_records_are_left_alone(record):
    assert normalize_record(record) is None


@pytest.mark.parametrize(
    ("roles", "error"),
    [
        (["user", "assistant"], None),
        (["system", "user", "assistant", "user", "assistant"], None),
        (["assistant", "user"], "expected user/assistant alternating"),
        (["user", "user", "assistant"], "expected user/assistant alternating"),
        (["user", "assistant", "user"], "ending with assistant"),
        (["user", "system", "assistant"], "system message after the first turn"),
        (["user", "bot"], "unknown role 'bot'"),
    ],
)
def test_role_order(roles, error):
    found = role_order_error([{"role": r, "content": "x"} for r in roles])
    assert found == error if error is None else error in str(found)


def test_stage_normalizes_instruction_and_chat_splits(tmp_path):
    write_jsonl(tmp_path / "src/train.jsonl", [{"instruction": "Add", "input": "1 and 1", "output": "2"}, "{bad json"])
    chat = {"messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]}
    write_jsonl(tmp_path / "src/eval.jsonl", [chat])

    run(Args(source=str(tmp_path / "src"), dest_dir=tmp_path / "data"))

    assert (tmp_path / "data/train.jsonl").read_text().splitlines() == [
        json.dumps({"prompt": "Add\n\n1 and 1", "completion": "2"}),
        "{bad json",  # left for validate_data to count and show
    ]
    assert rows_of(tmp_path / "data/eval.jsonl") == [{"prompt": "2+3?", "completion": "5", **chat}]
    assert load_examples(tmp_path / "data/eval.jsonl")[0].completion == "5"
    assert (tmp_path / "data/raw/eval.jsonl").read_text() == json.dumps(chat) + "\n"


def rows(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"prompt": f"question {i}", "completion": f"answer {i}"} for i in range(start, start + n)]


def test_single_file_split_is_stable_when_rows_are_added(tmp_path):
    source = write_jsonl(tmp_path / "v1/data.jsonl", rows(400))
    run(Args(source=str(source), dest_dir=tmp_path / "a", eval_fraction=0.25))
    grown = write_jsonl(tmp_path / "v2/data.jsonl", rows(100, start=400) + rows(400)[::-1])  # new rows first
    run(Args(source=str(grown), dest_dir=tmp_path / "b", eval_fraction=0.25))

    first_eval = rows_of(tmp_path / "a/eval.jsonl")
    second_eval = rows_of(tmp_path / "b/eval.jsonl")
    assert 60 <= len(first_eval) <= 140  # 25% of 400, give or take the hash
    assert len(first_eval) + len(rows_of(tmp_path / "a/train.jsonl")) == 400
    assert [r for r in second_eval if int(r["prompt"].split()[1]) < 400] == first_eval[::-1]
    assert all(split_of(r["prompt"], 0.25) == "eval" for r in second_eval)


def test_duplicate_prompts_land_in_one_split(tmp_path):
    data = rows(200) + [{"prompt": f"question {i}", "completion": "another answer"} for i in range(200)]
    write_jsonl(tmp_path / "src/data.jsonl", data)  # a folder holding data.jsonl is a single-file source too
    run(Args(source=str(tmp_path / "src"), dest_dir=tmp_path / "data", eval_fraction=0.3))
    train = {r["prompt"] for r in rows_of(tmp_path / "data/train.jsonl")}
    held_out = {r["prompt"] for r in rows_of(tmp_path / "data/eval.jsonl")}
    assert held_out and not train & held_out


def test_unchanged_local_restage_reuses_files_and_split(tmp_path):
    source = write_jsonl(tmp_path / "src/data.jsonl", rows(50))
    first = run(Args(source=str(source), dest_dir=tmp_path / "data"))
    again = run(Args(source=str(source), dest_dir=tmp_path / "data", previous_digest=first.dataset_digest))
    assert (first.copied_files, again.copied_files, again.changed) == (1, 0, False)
    assert json.loads((tmp_path / "data/manifest.json").read_text())["derived"][0]["path"] == "train.jsonl"
    train_inode = (tmp_path / "data/train.jsonl").stat().st_ino
    run(Args(source=str(source), dest_dir=tmp_path / "data"))
    assert (tmp_path / "data/train.jsonl").stat().st_ino == train_inode  # the split was linked, not redone
    other = run(Args(source=str(source), dest_dir=tmp_path / "data", eval_fraction=0.5))
    assert other.dataset_digest != first.dataset_digest  # the split is part of the data
