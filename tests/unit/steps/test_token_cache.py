"""The tokenized cache: built once, reused, rebuilt on new data or tokenizer, never loaded when partial or corrupt."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.modeling import encode_example, truncated
from eksflow.llm.steps.common.token_cache import MARKER, CorruptCacheError, TokenCache, ensure


def write_split(path: Path, n: int, bad_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps({"prompt": f"what is {i} plus {i}", "completion": str(2 * i)}) for i in range(n)]
    for index, text in (bad_lines or {}).items():
        lines[index] = text
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_built_once_then_reused_and_equal_to_encode_example(tmp_path, tiny_tokenizer, capsys):
    split = write_split(tmp_path / "train.jsonl", 40, {3: "{not json", 7: json.dumps({"prompt": "q"})})
    cache, built = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert built
    again, built_again = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert not built_again and again.folder == cache.folder
    assert cache.rows == 38  # the unusable lines 4 and 8 are skipped, as load_examples skips them
    assert "skipped 2 unusable line(s)" in capsys.readouterr().err
    assert cache.lines().tolist() == [n for n in range(1, 41) if n not in (4, 8)]
    for row, line in enumerate(cache.lines().tolist()):
        i = line - 1
        ids, spans = cache.example(row)
        expected = encode_example(tiny_tokenizer, f"what is {i} plus {i}", str(2 * i), 10_000)
        assert truncated(ids, spans, 10_000) == expected and spans[0][1] == len(ids)
    assert cache.lengths().tolist() == [len(cache.example(r)[0]) for r in range(cache.rows)]


def test_new_data_or_another_tokenizer_builds_another_cache(tmp_path, tiny_tokenizer, tokenizer_factory):
    split = write_split(tmp_path / "train.jsonl", 10)
    first, _ = ensure(split, tiny_tokenizer, tmp_path / "cache")
    write_split(split, 11)
    changed, built = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert built and changed.folder != first.folder and changed.rows == 11
    other = tokenizer_factory(template="{% for m in messages %}{{ m['content'] }} {% endfor %}")
    retokenized, built = ensure(split, other, tmp_path / "cache")
    assert built and retokenized.folder not in (first.folder, changed.folder)
    assert len(retokenized.example(0)[0]) < len(changed.example(0)[0])  # no role words in this template


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    ["flip-token-byte", "truncate", "no-marker", "no-meta"],
)
def test_a_damaged_cache_is_detected_and_rebuilt_never_loaded(tmp_path, tiny_tokenizer, capsys, damage):
    split = write_split(tmp_path / "train.jsonl", 30)
    cache, _ = ensure(split, tiny_tokenizer, tmp_path / "cache")
    expected = [cache.example(r)[0].tolist() for r in range(cache.rows)]
    data = cache.folder / token_cache.DATA_FILE
    if damage == "flip-token-byte":
        flip_byte(data, data.stat().st_size // 2)  # inside the token values: only the checksum notices
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    elif damage == "no-marker":
        (cache.folder / MARKER).unlink()  # what a build killed before its commit would look like
    else:
        (cache.folder / token_cache.META_FILE).unlink()
    with pytest.raises(CorruptCacheError):
        TokenCache.open(cache.folder)
    rebuilt, built = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert built and rebuilt.folder == cache.folder
    assert "token cache: rebuilding" in capsys.readouterr().err
    assert [rebuilt.example(r)[0].tolist() for r in range(rebuilt.rows)] == expected
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # nothing left aside


def test_a_killed_build_leaves_only_a_temporary_folder_that_the_next_build_removes(
    tmp_path, tiny_tokenizer, monkeypatch
):
    split = write_split(tmp_path / "train.jsonl", 5)
    calls = {"n": 0}

    class Killed(BaseException):
        pass

    def dying(*args, **kwargs):
        calls["n"] += 1
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(token_cache, "_write_synced", dying)  # dies after the data file, before meta.json and marker
        with pytest.raises(Killed):
            ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert calls["n"] == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # the temporary folder was removed
    tmp_left = tmp_path / "cache" / ".tok-left.tmp-x"
    tmp_left.mkdir()  # as if the process had been SIGKILLed mid-build
    cache, built = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert built and cache.rows == 5


def test_concurrent_builders_build_once(tmp_path, tiny_tokenizer, monkeypatch):
    """Two workers asking at once: one builds under the lock, the other waits and maps the same cache."""
    split = write_split(tmp_path / "train.jsonl", 200)
    builds = []
    original = token_cache._build
    started = threading.Event()

    def slow_build(*args, **kwargs):
        builds.append(threading.get_ident())
        started.set()
        threading.Event().wait(0.3)  # long enough for the other worker to find no cache and queue on the lock
        return original(*args, **kwargs)

    monkeypatch.setattr(token_cache, "_build", slow_build)
    results: list[tuple[TokenCache, bool]] = []
    workers = [
        threading.Thread(target=lambda: results.append(ensure(split, tiny_tokenizer, tmp_path / "cache")))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert len(builds) == 1
    assert sorted(built for _, built in results) == [False, True]
    assert results[0][0].folder == results[1][0].folder


def test_an_empty_split_gives_an_empty_cache(tmp_path, tiny_tokenizer):
    split = tmp_path / "train.jsonl"
    split.write_text("\n", encoding="utf-8")
    cache, built = ensure(split, tiny_tokenizer, tmp_path / "cache")
    assert built and cache.rows == 0 and cache.lengths().tolist() == []
