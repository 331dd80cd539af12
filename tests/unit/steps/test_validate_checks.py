"""Duplicates, token length, per-check `mostly`, and the Data Docs kept with the run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.validate_data import Args, ValidateSettings
from eksflow.llm.steps.validate_data.step import run
from eksflow.llm.steps.validate_data.suite import Report, validate
from eksflow.runtime.args import StepInputError


def line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


def clean(n: int, split: str = "train") -> list[bytes]:
    return [line({"prompt": f"{split} question {i}?", "completion": f"answer {i}"}) for i in range(n)]


def write_dataset(folder: Path, train: list[bytes], eval_: list[bytes] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_bytes(b"".join(train))
    (folder / "eval.jsonl").write_bytes(b"".join(eval_ if eval_ is not None else clean(1, "eval")))
    return folder


def counts(report: Report) -> dict[str, int | None]:
    return {f"{c.split}/{c.check}": c.unexpected_count for c in report.failures}


def words(prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
    """A stand-in tokenizer: one token per word."""
    return [len(p.split()) + len(c.split()) for p, c in zip(prompts, completions, strict=True)]


def test_duplicates_are_counted_after_the_first(tmp_path):
    lines = clean(100)
    for i in (10, 20, 30):
        lines[i] = lines[5]
    report = validate(write_dataset(tmp_path / "data", lines), ValidateSettings())
    assert counts(report) == {"train/no_duplicate": 3}
    duplicate = next(c for c in report.failures)
    assert duplicate.examples == ("line 11: repeats line 6", "line 21: repeats line 6", "line 31: repeats line 6")


@pytest.mark.parametrize(("mostly", "passes"), [(0.97, True), (0.98, False)])
def test_mostly_by_check_is_exact_at_the_boundary(tmp_path, mostly, passes):
    lines = clean(100)
    for i in (10, 20, 30):
        lines[i] = lines[5]
    settings = ValidateSettings(mostly_by_check={"no_duplicate": mostly})
    report = validate(write_dataset(tmp_path / "data", lines), settings)
    assert report.success is passes
    assert next(c for c in report.checks if c.check == "no_duplicate").mostly == mostly


def test_token_length_is_counted_with_the_given_counter(tmp_path):
    lines = clean(100)
    for i in (7, 70):
        lines[i] = line({"prompt": "word " * 20, "completion": f"long {i}"})
    data = write_dataset(tmp_path / "data", lines)
    report = validate(data, ValidateSettings(), count_tokens=words, max_tokens=10)
    assert counts(report) == {"train/max_tokens": 2}
    assert validate(data, ValidateSettings(), count_tokens=words, max_tokens=22).success


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (
            {"malformed": 1, "empty": 1, "long": 1, "non_utf8": 1, "duplicate": 1, "overlap": 1},
            {
                "train/lines_parse": 2,
                "train/completion_not_blank": 1,
                "train/max_tokens": 1,
                "train/no_duplicate": 1,
                "eval/prompt_not_in_train": 1,
            },
        ),
    ],
)
def test_dv3_one_percent_of_each_class_reports_injected_counts(tmp_path, classes, expected):
    lines = clean(100)
    lines[3] = b'{"prompt": "cut off", "completion\n'
    lines[13] = line({"prompt": "empty?", "completion": ""})
    lines[23] = line({"prompt": "word " * 30, "completion": "y"})
    lines[33] = b'{"prompt": "caf\xe9", "completion": "x"}\n'
    lines[43] = lines[44]
    eval_lines = clean(100, "eval")
    eval_lines[50] = clean(60)[59]
    report = validate(
        write_dataset(tmp_path / "data", lines, eval_lines), ValidateSettings(), count_tokens=words, max_tokens=20
    )
    assert counts(report) == expected


def test_run_keeps_data_docs_and_the_json_report(tmp_path, capsys):
    data = write_dataset(tmp_path / "data", clean(20))
    run(Args(dataset_dir=data, report_dir=tmp_path / "reports"))
    docs = tmp_path / "reports" / "data_docs"
    assert (docs / "index.html").is_file()
    pages = [p.read_text() for p in docs.rglob("*.html") if "validations" in p.parts]
    assert len(pages) == 2 and all("completion" in p for p in pages)
    assert json.loads((tmp_path / "reports" / "validation.json").read_text())["success"] is True


@pytest.mark.parametrize(("base_model", "max_tokens"), [("smollm2-135m-instruct", 0), ("", 512)])
def test_token_check_needs_model_and_limit(tmp_path, base_model, max_tokens):
    data = write_dataset(tmp_path / "data", clean(5))
    with pytest.raises(StepInputError, match="go together"):
        run(Args(dataset_dir=data, report_dir=tmp_path / "r", base_model=base_model, max_tokens=max_tokens))


def test_unknown_check_in_mostly_by_check_is_refused():
    with pytest.raises(ValidationError, match="unknown check 'no_dupes'"):
        ValidateSettings(mostly_by_check={"no_dupes": 0.9})
    with pytest.raises(ValidationError, match="between 0 and 1"):
        ValidateSettings(mostly_by_check={"no_duplicate": 1.5})


@pytest.mark.slow
def test_token_length_with_the_model_tokenizer(tmp_path, capsys):
    lines = clean(50)
    lines[9] = line({"prompt": "tell me " * 200, "completion": "no"})
    data = write_dataset(tmp_path / "data", lines)
    with pytest.raises(StepInputError, match=r"train/max_tokens"):
        run(Args(dataset_dir=data, report_dir=tmp_path / "r", base_model="smollm2-135m-instruct", max_tokens=128))
    shown = [ln.strip() for ln in capsys.readouterr().err.splitlines() if ln.strip().startswith("line 10: ")]
    assert len(shown) == 1 and int(shown[0].removeprefix("line 10: ")) > 400  # 400 words and the chat template
