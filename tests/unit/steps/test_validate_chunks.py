"""Chunked validation: the counts, `mostly` decisions and examples of one validation of the whole split."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from eksflow.llm.steps.common.data import Example
from eksflow.llm.steps.common.encoding import encode_batch
from eksflow.llm.steps.common.token_cache import ensure
from eksflow.llm.steps.validate_data import ValidateSettings
from eksflow.llm.steps.validate_data.suite import validate


def line(value: object) -> bytes:
    return json.dumps(value).encode() + b"\n"


def words(prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
    return [len(p.split()) + len(c.split()) for p, c in zip(prompts, completions, strict=True)]


def messy(folder: Path) -> Path:
    """Bad rows of every class spread over the file; repeats and overlap reaching across chunk boundaries."""
    train = [line({"prompt": f"train question {i}?", "completion": f"answer {i}"}) for i in range(100)]
    train[2] = b'{"prompt": "cut off", "completion\n'
    train[11] = b'{"prompt": "caf\xe9", "completion": "x"}\n'
    train[20] = line({"prompt": "no answer?"})
    train[29] = line({"prompt": "number?", "completion": 5})
    train[38] = line({"prompt": "empty?", "completion": " "})
    train[47] = line({"prompt": "x" * 50, "completion": "y"})
    train[56] = line({"prompt": "word " * 30, "completion": "long"})
    for i in (60, 75, 99):
        train[i] = train[4]  # the first occurrence is in the first chunk, the repeats in later ones
    train[80] = line({"prompt": "hi", "completion": "hi", "note": "other keys are ignored"})
    train[90] = b"\n"  # blank: not a row
    eval_ = [line({"prompt": f"eval question {i}?", "completion": f"answer {i}"}) for i in range(30)]
    for i, j in ((3, 97), (17, 8), (29, 8)):
        eval_[i] = line({"prompt": f"train question {j}?", "completion": "another"})
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(b"".join(train))
    (folder / "eval.jsonl").write_bytes(b"".join(eval_))
    return folder


def test_chunks_report_what_one_whole_validation_reports(tmp_path):
    data = messy(tmp_path / "data")
    settings = ValidateSettings(max_prompt_chars=40)
    whole = validate(data, settings, count_tokens=words, max_tokens=20)
    chunked = validate(data, settings.model_copy(update={"chunk_rows": 13}), count_tokens=words, max_tokens=20)
    assert chunked.checks == whole.checks
    assert (chunked.rows, chunked.overlap) == (whole.rows, whole.overlap) == ({"train": 99, "eval": 30}, 3)
    failed = {f"{c.split}/{c.check}": c.unexpected_count for c in whole.failures}
    assert failed == {
        "train/lines_parse": 2,
        "train/completion_not_null": 1,
        "train/completion_is_str": 1,
        "train/completion_not_blank": 1,
        "train/prompt_max_chars": 2,  # "x" * 50 and "word " * 30
        "train/no_duplicate": 3,
        "train/max_tokens": 1,
        "eval/no_duplicate": 1,  # eval lines 18 and 30 are the same pair
        "eval/prompt_not_in_train": 3,
    }
    duplicates = next(c for c in chunked.checks if c.check == "no_duplicate")
    assert duplicates.examples == ("line 61: repeats line 5", "line 76: repeats line 5", "line 100: repeats line 5")
    overlap = next(c for c in chunked.checks if c.check == "prompt_not_in_train")
    assert overlap.examples == (
        "line 4: prompt of train line 98",
        "line 18: prompt of train line 9",
        "line 30: prompt of train line 9",
    )


@pytest.mark.parametrize(("mostly", "passes"), [(0.97, True), (0.98, False)])
def test_mostly_over_chunks_is_exact_at_the_boundary(tmp_path, mostly, passes):
    """3 repeats in 100 rows, spread over 4 chunks: the decision is on 97/100, not on any chunk's share."""
    rows = [line({"prompt": f"q {i}", "completion": "a"}) for i in range(100)]
    for i in (10, 50, 90):
        rows[i] = rows[0]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_bytes(b"".join(rows))
    (tmp_path / "data" / "eval.jsonl").write_bytes(line({"prompt": "e", "completion": "a"}))
    settings = ValidateSettings(mostly_by_check={"no_duplicate": mostly}, chunk_rows=30)
    report = validate(tmp_path / "data", settings)
    assert report.success is passes
    duplicates = next(c for c in report.checks if c.check == "no_duplicate")
    assert (duplicates.unexpected_count, duplicates.checked_count) == (3, 100)


def test_token_counts_from_the_cache_equal_counting_pairs(tmp_path, tiny_tokenizer):
    data = messy(tmp_path / "data")

    def pairs(prompts: Sequence[str], completions: Sequence[str]) -> list[int]:
        examples = [Example(p, c) for p, c in zip(prompts, completions, strict=True)]
        return [len(ids) for ids in encode_batch(tiny_tokenizer, examples)[0]]

    def cached(path: Path):
        cache, _ = ensure(path, tiny_tokenizer, tmp_path / "cache")
        return cache.lines(), cache.lengths()

    by_pairs = validate(data, ValidateSettings(), count_tokens=pairs, max_tokens=12)
    by_cache = validate(data, ValidateSettings(), token_lengths=cached, max_tokens=12)
    assert by_cache.checks == by_pairs.checks
    tokens = next(c for c in by_cache.checks if c.split == "train" and c.check == "max_tokens")
    assert tokens.unexpected_count == 1  # "word " * 30 (the 50 x are one word, one token)


def test_data_docs_show_one_combined_result_per_split(tmp_path):
    data = messy(tmp_path / "data")
    docs = tmp_path / "docs"
    validate(data, ValidateSettings(chunk_rows=10), docs_dir=docs)
    pages = [p for p in docs.rglob("*.html") if "validations" in p.parts]
    assert len(pages) == 2
    train_page = next(p.read_text() for p in pages if "train_data" in str(p))
    assert "repeats line 5" in train_page  # examples from several chunks on one page
