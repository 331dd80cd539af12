"""Instruction records made pairs, conversations kept as turns; a single data file split by a hash of each prompt."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from eksflow.llm.steps.common.data import load_examples, normalize_record, split_key, split_of
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
    ],
    ids=["instruction-input", "instruction-empty-input", "instruction-no-input"],
)
def test_instruction_records_become_pairs(record, expected):
    assert normalize_record(record) == expected


MULTI_TURN = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "times 2?"},
        {"role": "assistant", "content": "10"},
    ]
}


@pytest.mark.parametrize(
    "record",
    [
        {"prompt": "p", "completion": "c"},
        {"prompt": "p"},
        {"question": "q", "answer": "a"},
        {"instruction": "x"},
        MULTI_TURN,
        {"prompt": "p", "chosen": "a", "rejected": "b"},
    ],
    ids=["internal", "half-internal", "unknown", "no-output", "conversation", "preference"],
)
def test_other_records_are_left_alone(record):
    assert normalize_record(record) is None


def test_stage_keeps_conversations_unflattened(tmp_path):
    write_jsonl(tmp_path / "src/train.jsonl", [{"instruction": "Add", "input": "1 and 1", "output": "2"}, "{bad json"])
    write_jsonl(tmp_path / "src/eval.jsonl", [MULTI_TURN])

    run(Args(source=str(tmp_path / "src"), dest_dir=tmp_path / "data"))

    assert (tmp_path / "data/train.jsonl").read_text().splitlines() == [
        json.dumps({"prompt": "Add\n\n1 and 1", "completion": "2"}),
        "{bad json",  # left for validate_data to count and show
    ]
    assert rows_of(tmp_path / "data/eval.jsonl") == [MULTI_TURN]  # its turns, no "role: content" prompt
    (example,) = load_examples(tmp_path / "data/eval.jsonl")
    assert example.messages == tuple(MULTI_TURN["messages"])
    assert (example.prompt, example.completion) == ("system: Be brief.\nuser: 2+3?\nassistant: 5\nuser: times 2?", "10")
    assert example.history() == MULTI_TURN["messages"][:-1]


def conversation(history: list[dict[str, str]], answer: str) -> dict[str, Any]:
    return {"messages": [*history, {"role": "assistant", "content": answer}]}


def test_conversations_split_by_their_history(tmp_path):
    histories = [[{"role": "user", "content": f"question {i}"}] for i in range(200)]
    data = [conversation(h, "one answer") for h in histories] + [conversation(h, "another") for h in histories]
    # the same history spelled with other key order and spacing is the same history
    data += [
        json.dumps(
            {"messages": [{"content": f"question {i}", "role": "user"}, {"content": "x", "role": "assistant"}]},
            indent=None,
            separators=(", ", ":  "),
        )
        for i in range(200)
    ]
    write_jsonl(tmp_path / "src/data.jsonl", data)
    run(Args(source=str(tmp_path / "src"), dest_dir=tmp_path / "data", eval_fraction=0.3))

    def histories_in(split: str) -> list[str]:
        return [json.dumps(r["messages"][:-1], sort_keys=True) for r in rows_of(tmp_path / f"data/{split}.jsonl")]

    train, held_out = histories_in("train"), histories_in("eval")
    assert len(train) + len(held_out) == 600
    assert held_out and not set(train) & set(held_out)
    assert all(split_of(split_key(r) or "", 0.3) == "eval" for r in rows_of(tmp_path / "data/eval.jsonl"))


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


DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"


def test_demo_split_is_unchanged(tmp_path):
    """The demo's pairs split as before conversations were kept (digests from dae8c7c): cached scores hold."""
    source = tmp_path / "src/data.jsonl"
    source.parent.mkdir()
    source.write_bytes((DEMO / "train.jsonl").read_bytes() + (DEMO / "eval.jsonl").read_bytes())
    run(Args(source=str(source.parent), dest_dir=tmp_path / "single", eval_fraction=0.1))
    digests = {name: hashlib.sha256((tmp_path / "single" / name).read_bytes()).hexdigest() for name in SPLIT_DIGESTS}
    assert digests == SPLIT_DIGESTS
    run(Args(source=str(DEMO), dest_dir=tmp_path / "split"))
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "split" / name).read_bytes() == (DEMO / name).read_bytes()


SPLIT_DIGESTS = {
    "train.jsonl": "400d8755e0dd61a442b9cadca83ab9fc74e43a7281a9a8a0e496e4f450cbf34d",
    "eval.jsonl": "3e8dd9c6356bb4be5070e02362183357d0c5149aeb839efdf3e87f69c776e722",
}


TEXT2SQL = Path(__file__).resolve().parents[2] / "fixtures" / "text2sql" / "data" / "shop.jsonl"
# The questions of the guide's project whose one-turn rows went to eval before conversations kept their turns
# (dae8c7c, eval_fraction 0.2): staged again, each row keeps its split.
TEXT2SQL_HELD_OUT = {
    "What is the average price of the kitchen products?", "Which kitchen product is the most expensive?",
    "Which kitchen product is the cheapest?", "List the kitchen products that cost less than 150.",
    "What is the average price of the living products?", "Which living product is the cheapest?",
    "List the living products that cost less than 50.", "List the living products that cost less than 200.",
    "Which office product is the cheapest?", "List the office products that cost less than 250.",
    "How many products cost more than 30?", "List the names of the products that cost more than 30.",
    "How many products cost more than 50?", "List the names of the products that cost more than 150.",
    "List the names of the products that cost more than 250.", "Which products have fewer than 4 items in stock?",
    "Which products have fewer than 12 items in stock?", "How many products have at least 12 items in stock?",
}  # fmt: skip


def test_conversations_staged_before_keep_their_split(tmp_path):
    """Conversations now stay turns, but hash the text they were flattened to: no held-out row moves to train."""
    source = tmp_path / "shop.jsonl"
    source.write_bytes(TEXT2SQL.read_bytes())
    run(Args(source=str(source), dest_dir=tmp_path / "out", eval_fraction=0.2))

    def one_turn_questions(split: str) -> set[str]:
        rows = [json.loads(line)["messages"] for line in (tmp_path / "out" / split).read_text().splitlines()]
        return {m[0]["content"].split("Question: ")[1] for m in rows if len(m) == 2}  # kept as conversations

    assert one_turn_questions("eval.jsonl") == TEXT2SQL_HELD_OUT
    assert not one_turn_questions("train.jsonl") & TEXT2SQL_HELD_OUT
    system_first = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, ANSWER]}
    two_turns = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    longer = {"messages": [*two_turns, {"role": "user", "content": "u2"}, ANSWER]}
    assert (split_key(system_first), split_key(longer)) == ("S\n\nU", "user: u1\nassistant: a1\nuser: u2")


ANSWER = {"role": "assistant", "content": "A"}
