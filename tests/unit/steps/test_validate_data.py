from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from eksflow.llm.steps.common.data import Example, load_examples
from eksflow.llm.steps.validate_data import Args, ValidateSettings
from eksflow.llm.steps.validate_data.step import main, run
from eksflow.llm.steps.validate_data.suite import Report, validate
from eksflow.runtime.args import StepInputError

DEMO = Path(__file__).resolve().parents[3] / "data" / "demo"


def record(i: int, split: str = "train") -> dict[str, object]:
    return {"prompt": f"{split} question {i}?", "completion": f"answer {i}"}


def line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


def write_dataset(folder: Path, train: list[bytes], eval_: list[bytes] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_bytes(b"".join(train))
    (folder / "eval.jsonl").write_bytes(b"".join(eval_ if eval_ is not None else [line(record(0, "eval"))]))
    return folder


def clean(n: int, split: str = "train") -> list[bytes]:
    return [line(record(i, split)) for i in range(n)]


def with_bad(n: int, bad: list[bytes], every: int = 10) -> tuple[list[bytes], list[int]]:
    """`n` lines of which len(bad) are replaced by `bad`, spread out; returns the lines and their 1-based numbers."""
    lines = clean(n)
    numbers = []
    for k, bad_line in enumerate(bad):
        index = 3 + k * every
        lines[index] = bad_line
        numbers.append(index + 1)
    return lines, numbers


def check(report: Report, split: str, name: str):
    return next(c for c in report.checks if c.split == split and c.check == name)


def failed(report: Report) -> set[str]:
    return {f"{c.split}/{c.check}" for c in report.failures}


def test_demo_data_passes(tmp_path):
    outputs = run(Args(dataset_dir=DEMO, report_dir=tmp_path / "reports"))
    assert (outputs.train_rows, outputs.eval_rows) == (480, 48)
    report = json.loads(Path(outputs.report).read_text())
    assert report["success"] is True
    assert report["overlap"] == 0
    assert {c["check"] for c in report["checks"]} >= {"row_count", "lines_parse", "prompt_not_in_train"}


def test_main_writes_outputs_and_report(tmp_path):
    out, reports = tmp_path / "out", tmp_path / "reports"
    code = main([f"--dataset-dir={DEMO}", f"--report-dir={reports}", f"--outputs-dir={out}", "--mostly=0.99"])
    assert code == 0
    assert (out / "train_rows").read_text() == "480"
    assert (out / "eval_rows").read_text() == "48"
    assert (out / "report").read_text() == str((reports / "validation.json").absolute())
    assert json.loads((reports / "validation.json").read_text())["settings"]["mostly"] == 0.99


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"], ids=["empty", "blank-lines"])
def test_empty_split_fails_with_exit_2(tmp_path, capsys, content):
    data = write_dataset(tmp_path / "data", [content])
    reports = tmp_path / "reports"
    code = main([f"--dataset-dir={data}", f"--report-dir={reports}", f"--outputs-dir={tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "train row_count" in err and "observed: 0" in err
    report = json.loads((reports / "validation.json").read_text())
    assert report["success"] is False
    assert report["rows"]["train"] == 0
    assert not (tmp_path / "out").exists()


BAD_ROWS = {
    "malformed-json": (b'{"prompt": "cut off", "completion\n', "lines_parse", "malformed JSON"),
    "non-utf8": (b'{"prompt": "caf\xe9", "completion": "x"}\n', "lines_parse", "not UTF-8: byte 0xe9"),
    "not-an-object": (b'["prompt", "completion"]\n', "lines_parse", "expected a JSON object"),
    "missing-field": (line({"prompt": "no answer?"}), "completion_not_null", "missing"),
    "null-field": (line({"prompt": "null answer?", "completion": None}), "completion_not_null", "missing"),
    "wrong-type": (line({"prompt": "number?", "completion": 5}), "completion_is_str", "5"),
    "empty-completion": (line({"prompt": "empty?", "completion": ""}), "completion_not_blank", "''"),
    "blank-completion": (line({"prompt": "blank?", "completion": " \n\t"}), "completion_not_blank", "' \\n\\t'"),
    "long-prompt": (line({"prompt": "x" * 4001, "completion": "y"}), "prompt_max_chars", "'xxxx"),
    "long-completion": (line({"prompt": "long?", "completion": "y" * 4001}), "completion_max_chars", "'yyyy"),
}


@pytest.mark.parametrize(("bad", "expected", "shown"), BAD_ROWS.values(), ids=BAD_ROWS.keys())
@pytest.mark.parametrize("injected", [1, 3])
def test_bad_rows_are_counted_once_with_line_numbers(tmp_path, bad, expected, shown, injected):
    lines, numbers = with_bad(100, [bad] * injected)
    report = validate(write_dataset(tmp_path / "data", lines), ValidateSettings())

    assert failed(report) == {f"train/{expected}"}
    result = check(report, "train", expected)
    assert result.unexpected_count == injected
    assert result.examples[0].startswith(f"line {numbers[0]}: ")
    assert shown in result.examples[0]
    assert len(result.examples) == min(injected, 3)
    assert all(len(e.split(": ", 1)[1]) <= 80 for e in result.examples)


def test_one_percent_of_each_class_is_counted_separately(tmp_path):
    classes = ["malformed-json", "non-utf8", "missing-field", "wrong-type", "empty-completion", "long-prompt"]
    lines, _ = with_bad(100, [BAD_ROWS[name][0] for name in classes])
    eval_lines = clean(100, "eval")
    eval_lines[42] = line(record(42))
    report = validate(write_dataset(tmp_path / "data", lines, eval_lines), ValidateSettings())

    counts = {f"{c.split}/{c.check}": c.unexpected_count for c in report.failures}
    assert counts == {
        "train/lines_parse": 2,
        "train/completion_not_null": 1,
        "train/completion_is_str": 1,
        "train/completion_not_blank": 1,
        "train/prompt_max_chars": 1,
        "eval/prompt_not_in_train": 1,
    }


def test_train_eval_overlap_is_counted(tmp_path):
    eval_lines = clean(20, "eval")
    eval_lines[4] = line({"prompt": record(7)["prompt"], "completion": "another answer"})
    eval_lines[9] = line(record(8))
    report = validate(write_dataset(tmp_path / "data", clean(50), eval_lines), ValidateSettings())

    assert failed(report) == {"eval/prompt_not_in_train"}
    assert check(report, "eval", "prompt_not_in_train").unexpected_count == 2
    assert report.overlap == 2


def test_renamed_field_is_named(tmp_path, capsys):
    renamed = [line({"prompt": f"q{i}", "response": "a"}) for i in range(5)]
    data = write_dataset(tmp_path / "data", renamed)
    code = main([f"--dataset-dir={data}", f"--report-dir={tmp_path}", f"--outputs-dir={tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "train completion_exists" in err
    assert "no record has a 'completion' field" in err
    assert "train/completion_exists" in err.splitlines()[-1]


@pytest.mark.parametrize(
    "bad",
    [BAD_ROWS["empty-completion"][0], BAD_ROWS["malformed-json"][0], BAD_ROWS["long-prompt"][0]],
    ids=["empty-completion", "malformed-json", "long-prompt"],
)
@pytest.mark.parametrize(("mostly", "passes"), [(0.99, True), (0.995, False)])
def test_mostly_is_exact_at_the_boundary(tmp_path, bad, mostly, passes):
    lines, _ = with_bad(100, [bad])
    report = validate(write_dataset(tmp_path / "data", lines), ValidateSettings(mostly=mostly))
    assert report.success is passes


@pytest.mark.parametrize(("mostly", "passes"), [(0.99, True), (0.995, False)])
def test_mostly_applies_to_overlap(tmp_path, mostly, passes):
    eval_lines = clean(100, "eval")
    eval_lines[50] = line(record(3))
    report = validate(write_dataset(tmp_path / "data", clean(10), eval_lines), ValidateSettings(mostly=mostly))
    assert report.success is passes


def test_min_rows_and_lengths_follow_settings(tmp_path):
    data = write_dataset(tmp_path / "data", [*clean(5), line({"prompt": "p" * 30, "completion": "c"})])
    report = validate(data, ValidateSettings(min_rows=10, max_prompt_chars=20))
    assert failed(report) == {"train/row_count", "eval/row_count", "train/prompt_max_chars"}


def test_failure_report_is_readable(tmp_path, capsys):
    lines, numbers = with_bad(100, [line({"prompt": "z" * 5000, "completion": "y"})] * 4)
    data = write_dataset(tmp_path / "data", lines)
    with pytest.raises(StepInputError, match=r"failed validation \(train/prompt_max_chars\)"):
        run(Args(dataset_dir=data, report_dir=tmp_path / "reports"))
    err = capsys.readouterr().err
    assert "1 of 27 checks" in err
    assert "train prompt_max_chars (expect_column_value_lengths_to_be_between)" in err
    assert "4 unexpected of 100 (4.00%; allowed 0.00%)" in err
    shown = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("line ")]
    assert [s.split(":")[0] for s in shown] == [f"line {n}" for n in numbers[:3]]
    assert all(s.endswith("…") and len(s.split(": ", 1)[1]) == 80 for s in shown)
    report = json.loads((tmp_path / "reports" / "validation.json").read_text())
    assert [c["unexpected_count"] for c in report["checks"] if not c["success"]] == [4]


def test_missing_split_file_is_an_input_error(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_bytes(b"".join(clean(3)))
    with pytest.raises(StepInputError, match=r"eval\.jsonl' does not exist"):
        validate(tmp_path / "data", ValidateSettings())


@pytest.mark.parametrize(
    "values",
    [{"mostly": 1.5}, {"mostly": -0.1}, {"min_rows": 0}, {"max_prompt_chars": 0}, {"typo": 1}],
    ids=["mostly-high", "mostly-low", "min-rows", "max-chars", "unknown-key"],
)
def test_settings_are_checked(values):
    with pytest.raises(ValidationError):
        ValidateSettings(**values)


def test_load_examples_reads_demo_and_skips_unusable_lines(tmp_path, capsys):
    assert len(load_examples(DEMO / "train.jsonl")) == 480
    lines, numbers = with_bad(20, [BAD_ROWS["malformed-json"][0], BAD_ROWS["wrong-type"][0]])
    path = write_dataset(tmp_path, lines) / "train.jsonl"
    examples = load_examples(path)
    assert len(examples) == 18
    assert examples[0] == Example(prompt="train question 0?", completion="answer 0")
    assert f"skipped 2 unusable line(s) in {path} (first: line {numbers[0]}: malformed JSON" in capsys.readouterr().err


def test_load_examples_refuses_a_file_without_examples(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(b"\n")
    with pytest.raises(StepInputError, match="no usable examples"):
        load_examples(tmp_path / "train.jsonl")
    with pytest.raises(StepInputError, match="does not exist"):
        load_examples(tmp_path / "eval.jsonl")
