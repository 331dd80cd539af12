"""The train step's token cache: the driver builds it once, later runs reuse it, workers never load a bad one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.llm.steps.train import Args
from eksflow.llm.steps.train.data import open_cache, prepare_cache
from eksflow.runtime.args import StepInputError


def write_split(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": f"what is {i} plus {i}", "completion": str(2 * i)} for i in range(n)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder / "train.jsonl"


def test_a_worker_rebuilds_a_cache_damaged_after_the_driver_checked_it(tmp_path, tiny_tokenizer, capsys):
    model_dir = tmp_path / "model"
    tiny_tokenizer.save_pretrained(model_dir)  # what load_tokenizer reads
    train_file = write_split(tmp_path / "data", 20)
    cache, _ = token_cache.ensure(train_file, tiny_tokenizer, tmp_path / "cache")
    expected = [cache.example(r)[0].tolist() for r in range(cache.rows)]
    data = cache.folder / token_cache.DATA_FILE
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))

    reopened, pad_token_id = open_cache(str(cache.folder), train_file, model_dir)
    assert "does not match the sha256" in capsys.readouterr().err
    assert pad_token_id == tiny_tokenizer.pad_token_id
    assert [reopened.example(r)[0].tolist() for r in range(reopened.rows)] == expected
    assert reopened.folder == cache.folder

    built, _ = open_cache("", train_file, model_dir)  # no driver (a bare LoopConfig): beside the train file
    assert built.folder.parent == train_file.parent / token_cache.SUBDIR


@pytest.mark.slow
def test_the_driver_builds_once_reuses_across_runs_and_rebuilds_for_new_data_or_tokenizer(tmp_path, capsys):
    """With the real SmolLM2 tokenizer, as eksflow.llm.steps.train's driver runs it before any worker starts."""
    model_dir = resolve_model(DEMO_MODEL, default_cache_dir())
    caches = tmp_path / "tokenized"

    def driver(run: str, data: Path, tokenizer_dir: Path = model_dir) -> tuple[Path, str]:
        args = Args(
            dataset_dir=data,
            base_model=DEMO_MODEL,
            output_dir=tmp_path / run,
            outputs_dir=tmp_path / run / "outputs",
            token_cache_dir=caches,
        )
        folder, _ = prepare_cache(args, tokenizer_dir)
        return folder, capsys.readouterr().err

    data = write_split(tmp_path / "run-1" / "data", 30).parent
    first, log = driver("run-1", data)
    assert f"token cache: built {first}" in log
    copy = write_split(tmp_path / "run-2" / "data", 30).parent  # the same rows staged again by a later run
    again, log = driver("run-2", copy)
    assert again == first and f"token cache: reused {first}" in log
    meta = json.loads((first / token_cache.META_FILE).read_text())
    assert meta["rows"] == 30 and meta["source"] == str(data / "train.jsonl")  # built by run 1, used by run 2

    changed = write_split(tmp_path / "run-3" / "data", 31).parent
    new_data, log = driver("run-3", changed)
    assert new_data != first and "token cache: built" in log

    other = tmp_path / "other-tokenizer"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(model_dir / name, other / name)
    template = other / "chat_template.jinja"
    template.write_text(template.read_text().replace("helpful AI assistant", "terse assistant"))
    new_tokenizer, log = driver("run-4", data, other)
    assert new_tokenizer not in (first, new_data) and "token cache: built" in log

    empty = tmp_path / "run-5" / "data"
    empty.mkdir(parents=True)
    (empty / "train.jsonl").write_text('{"prompt": "no answer"}\n')
    with pytest.raises(StepInputError, match="holds no usable examples"):
        driver("run-5", empty)
