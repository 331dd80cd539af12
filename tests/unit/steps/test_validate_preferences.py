"""validate_data under method=dpo: preference files pass, each bad pair named as file:line, duplicates and overlap
counted, and a split of pairs or conversations refused in one line naming file:line and the method."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eksflow.llm.steps.validate_data import ValidateSettings
from eksflow.llm.steps.validate_data.step import main
from eksflow.llm.steps.validate_data.suite import validate
from eksflow.runtime.args import StepInputError
from tests.unit.steps.test_validate_checks import counts
from tests.unit.steps.test_validate_checks import write_dataset as write_splits


def line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


def preference(i: int, split: str = "train", **changes: Any) -> bytes:
    return line({"prompt": f"{split} question {i}?", "chosen": f"answer {i}", "rejected": f"wrong {i}", **changes})


def conversational(i: int) -> bytes:
    return line(
        {
            "prompt": [{"role": "user", "content": f"train chat {i}?"}],
            "chosen": [{"role": "assistant", "content": f"answer {i}"}],
            "rejected": [{"role": "assistant", "content": f"wrong {i}"}],
        }
    )


def test_preferences_pass_and_each_bad_pair_is_counted_and_named(tmp_path, capsys):
    train = [preference(i) for i in range(10)] + [conversational(i) for i in range(5)]
    data = write_splits(tmp_path / "ok", train, [preference(i, "eval") for i in range(2)])
    assert validate(data, ValidateSettings(), method="dpo").success

    train[3] = preference(3, chosen="wrong 3")  # chosen equals rejected
    train[5] = train[4]  # a duplicate pair
    data = write_splits(tmp_path / "bad", train, [preference(1, "train")])  # a train prompt held out
    report = validate(data, ValidateSettings(), method="dpo")
    assert counts(report) == {
        "train/no_duplicate": 1,
        "train/record_valid": 1,
        "eval/prompt_not_in_train": 1,
    }
    assert "train.jsonl:4: chosen equals rejected: a preference needs two different answers" in report.bad_rows


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (
            [line({"prompt": "2+3?", "completion": "5"})],
            "train.jsonl:1 is a prompt-completion record (prompt/completion); method=dpo trains on preference "
            "records (prompt/chosen/rejected)",
        ),
        (
            [line({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})],
            "train.jsonl:1 is a conversational record (messages); method=dpo trains on preference records "
            "(prompt/chosen/rejected)",
        ),
    ],
    ids=["pairs", "conversations"],
)
def test_dpo_refuses_sft_records_in_one_line_before_tokenizing(tmp_path, capsys, train, message):
    data = write_splits(tmp_path / "data", train, [preference(0, "eval")])

    def never(path: Any) -> Any:
        raise AssertionError(f"{path} was tokenized before its types were checked")

    with pytest.raises(StepInputError) as refused:
        validate(data, ValidateSettings(mostly=0.0), token_lengths=never, max_tokens=64, method="dpo")
    assert str(refused.value) == message
    argv = [f"--dataset-dir={data}", f"--report-dir={tmp_path / 'r'}", f"--outputs-dir={tmp_path / 'o'}"]
    assert main([*argv, "--method=dpo"]) == 2
    assert message in capsys.readouterr().err
