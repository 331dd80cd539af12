"""The engines' installer on a one-package lock: installed once per machine, waited for, never half-made.

The lock pins six 1.17.0 by its wheel's sha256 (PyPI's file; pip's cache or the index serves it), so each install
is a real virtualenv and a real `pip install --no-deps --require-hashes`, in seconds.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from eksflow.llm import engines

SIX = "six==1.17.0 --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(engines.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def six_engine(tmp_path: Path, lock_text: str = SIX) -> engines.Engine:
    lock = tmp_path / f"six-{abs(hash(lock_text))}.txt"
    lock.write_text(lock_text)
    return engines.Engine("six", "the six engine", lock, "python", "import six", "EKSFLOW_TEST_SIX")


def test_an_engine_is_installed_once_while_a_second_installer_waits_for_it(tmp_path: Path, cache: Path):
    engine = six_engine(tmp_path)
    said: list[str] = []
    programs: list[str] = []
    installers = [threading.Thread(target=lambda: programs.append(engines.install(engine, said.append))) for _ in "ab"]
    for installer in installers:
        installer.start()
    for installer in installers:
        installer.join()
    assert programs[0] == programs[1] == str(engines.folder(engine) / "bin" / "python")
    assert sum(line.startswith("installing the six engine") for line in said) == 1  # the second found it made
    assert engines.folder(engine).parent == cache and (engines.folder(engine) / engines.STAMP).is_file()
    assert engines.command(engine) == programs[0]
    engines.ensure([], said.append)  # nothing asked, nothing done
    commented = six_engine(tmp_path, "# a new comment\n" + SIX)
    assert engines.folder(commented) == engines.folder(engine)  # a comment changes nothing that is installed
    changed = six_engine(tmp_path, SIX.replace("1.17.0", "1.16.0"))
    assert engines.folder(changed) != engines.folder(engine) and engines.installed(changed) == ""


def test_a_half_made_engine_is_made_again_and_a_bad_file_leaves_nothing(tmp_path: Path, cache: Path):
    engine = six_engine(tmp_path)
    half = engines.folder(engine)
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("an install killed before its stamp")
    assert engines.installed(engine) == ""
    with pytest.raises(engines.EngineError, match=r"the six engine is not installed in .*engines install six"):
        engines.command(engine)
    assert engines.install(engine, lambda line: None) == str(half / "bin" / "python")
    assert (half / "lib").is_dir() and (half / engines.STAMP).is_file()

    tampered = six_engine(tmp_path, SIX.replace("4721f3", "0000f3"))
    with pytest.raises(engines.EngineError, match=r"installing the six engine failed \(pip exit 1\): ") as failed:
        engines.install(tampered, lambda line: None)
    assert len(str(failed.value).splitlines()) == 1
    assert not engines.folder(tampered).exists()


def test_an_engine_named_by_its_variable_is_used_and_a_wrong_name_is_one_line(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
):
    engine = six_engine(tmp_path)
    monkeypatch.setenv("EKSFLOW_TEST_SIX", str(tmp_path / "elsewhere" / "python"))
    with pytest.raises(engines.EngineError, match=r"\$EKSFLOW_TEST_SIX=.*elsewhere/python: no such file"):
        engines.command(engine)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "python").write_text("")
    assert engines.ensure([], print) == {} and engines.command(engine) == str(tmp_path / "elsewhere" / "python")
    assert not cache.exists()  # nothing installed for an engine found elsewhere


def test_the_command_line_refuses_an_unknown_engine(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as refused:
        engines.main(["install", "tgi"])
    assert refused.value.code == 2 and "no engine named tgi; the engines: vllm, litellm" in capsys.readouterr().err
