"""The engines' installer on a one-package lock: installed once per machine, waited for, never half-made.

The lock pins six 1.17.0 by its wheel's sha256 (PyPI's file; pip's cache or the index serves it), so each install
is a real virtualenv and a real `pip install --no-deps --require-hashes`, in seconds.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
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


def lock_path(engine: engines.Engine) -> Path:
    return engines.folder(engine).with_name(engines.folder(engine).name + ".lock")


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_never_made(tmp_path: Path, cache: Path):
    """A `litellm-<digest>.lock` link made the installer create the file it names (as whoever runs the install)."""
    engine = six_engine(tmp_path)
    cache.mkdir()
    target = tmp_path / "elsewhere" / "made-by-the-installer"
    target.parent.mkdir()
    lock_path(engine).symlink_to(target)
    with pytest.raises(engines.EngineCacheError, match=r"six-\w+\.lock is a symbolic link; .* remove it") as refused:
        engines.install(engine, lambda line: None)
    assert len(str(refused.value).splitlines()) == 1 and refused.value.exit_code == 2
    assert not target.exists() and not engines.folder(engine).exists()


def plant(engine: engines.Engine, program: str = "#!/bin/sh\necho planted\n") -> Path:
    """A folder with the stamp and an executable program, as an install would leave them."""
    venv = engines.folder(engine)
    (venv / "bin").mkdir(parents=True)
    (venv / engines.STAMP).write_text('{"lock": "six.txt"}\n')
    (venv / "bin" / engine.program).write_text(program)
    (venv / "bin" / engine.program).chmod(0o755)
    return venv


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's folder takes root (chown)")
def test_a_folder_another_user_planted_in_the_cache_is_refused_not_run(tmp_path: Path, cache: Path):
    engine = six_engine(tmp_path)
    venv = plant(engine)
    for path in (venv, venv / "bin", venv / "bin" / "python", venv / engines.STAMP):
        os.chown(path, 4321, 4321)
    with pytest.raises(engines.EngineCacheError, match=r"six-\w+ belongs to uid 4321, not to you or root"):
        engines.installed(engine)
    with pytest.raises(engines.EngineCacheError):
        engines.ready(engine, print)
    assert (venv / "bin" / "python").read_text() == "#!/bin/sh\necho planted\n"  # neither run nor removed


def test_a_cache_folder_others_may_write_is_refused(tmp_path: Path, cache: Path):
    engine = six_engine(tmp_path)
    venv = plant(engine)
    venv.chmod(0o777)
    with pytest.raises(engines.EngineCacheError, match=r"is writable by others \(mode 777\).*chmod go-w"):
        engines.command(engine)


def test_an_engine_is_checked_against_its_lock_before_it_runs_and_made_again_when_it_differs(
    tmp_path: Path, cache: Path
):
    """A planted folder of ours (stamp, executable program) and a damaged install are not what the lock installed."""
    engine = six_engine(tmp_path)
    venv = plant(engine)
    with pytest.raises(engines.EngineError, match=r"is not what its lock installed \(six 1.17.0 is not installed"):
        engines.command(engine)
    said: list[str] = []
    assert engines.ready(engine, said.append) == str(venv / "bin" / "python")  # installed again, for real
    assert any("is not what its lock installed" in line and "installing it again" in line for line in said)
    assert engines.command(engine) == str(venv / "bin" / "python")

    scripted = engines.Engine("six", "the six engine", engine.lock, "pip", "import six", "EKSFLOW_TEST_SIX")
    pip = venv / "bin" / "pip"
    installed_pip = pip.read_bytes()
    size = len(installed_pip)
    pip.write_text("#!/bin/sh\necho 'ImportError: planted'; exit 1\n")  # a program replaced
    with pytest.raises(engines.EngineError, match=r"bin/pip of pip has 46 bytes, not the \d+ it was made with"):
        engines.command(scripted)
    pip.write_text("#!/bin/sh\necho 'ImportError: planted'; exit 1\n".ljust(size - 1, "#") + "\n")  # at its size
    with pytest.raises(engines.EngineError, match=r"bin/pip is not the program that was installed \(its sha256"):
        engines.command(scripted)
    pip.write_bytes(installed_pip)

    module = next(venv.glob("lib/python3.*/site-packages/six.py"))
    module.write_text(module.read_text()[:-100])  # a file cut short
    with pytest.raises(engines.EngineError, match=r"lib/python3.\d+/site-packages/six.py of six has \d+ bytes"):
        engines.command(engine)
    module.unlink()
    with pytest.raises(engines.EngineError, match=r"six.py of six is missing"):
        engines.command(engine)


@pytest.mark.parametrize(
    ("configured", "refusal"),
    [
        (
            "/tmp/" + "e" * 300 + "/engines",
            r"the name e{40}\.\.\. is 300 bytes long, and a file system takes 255",
        ),
        ("/tmp/eng\nines", r"\$EKSFLOW_ENGINES_DIR=/tmp/eng\\nines: a path with a control character is refused"),
    ],
    ids=["name-over-255", "newline"],
)
def test_an_unusable_cache_path_is_one_line_exit_2(
    configured: str, refusal: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv(engines.CACHE_ENV, configured)
    for verb in ("where", "install"):
        assert engines.main([verb]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and re.match(rf"engine cache error: .*{refusal}", err), err


def test_an_engine_larger_than_the_room_left_fails_before_anything_is_written(tmp_path: Path, cache: Path):
    engine = six_engine(tmp_path)
    huge = engines.Engine("six", "the six engine", engine.lock, "python", "import six", "EKSFLOW_TEST_SIX", {}, 2**40)
    with pytest.raises(
        engines.EngineError, match=r"no space left on the disk of .* for the six engine \(~\d+ MB; \d+ MB free"
    ):
        engines.install(huge, lambda line: None)
    assert not engines.folder(huge).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk of its own takes root (a small tmpfs)")
def test_a_cache_that_fills_up_during_the_install_says_no_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """ensurepip on a full disk: `python -m venv` says only `... returned non-zero exit status 1`."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(small)], check=True)
    try:
        monkeypatch.setenv(engines.CACHE_ENV, str(small / "engines"))
        engine = six_engine(tmp_path)
        with pytest.raises(engines.EngineError, match=r"no space left on the disk of .*small/engines for the six"):
            engines.install(engine, lambda line: None)
        assert not engines.folder(engine).exists()
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_kill_9_of_the_installer_ends_its_pip(tmp_path: Path):
    """`kill -9` of `install` left pip running under init, writing into the virtualenv."""
    with socket.socket() as silent:  # an index that takes the connection and never answers: pip waits on it
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {
            **os.environ,
            engines.CACHE_ENV: str(tmp_path / "cache"),
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_INDEX_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/simple",
            "PIP_FIND_LINKS": "",
            "PIP_DEFAULT_TIMEOUT": "300",
        }
        lock = tmp_path / "six.txt"
        lock.write_text(SIX)
        script = (
            "import sys; from pathlib import Path; from eksflow.llm import engines; "
            "engines.install(engines.Engine('six', 'six', Path(sys.argv[1]), 'python', 'import six', 'X'))"
        )
        installer = subprocess.Popen([sys.executable, "-c", script, str(lock)], env=env, cwd=ROOT)
        try:
            silent.settimeout(120)
            asking, _ = silent.accept()  # pip has said what it does and waits for the index: silent from now on
            pip = pip_under(tmp_path / "cache")
        finally:
            installer.kill()
            installer.wait()
        with asking:
            assert pip is not None
            assert wait_for(lambda: not os.path.exists(f"/proc/{pip}"), 20), f"pip {pip} outlived its installer"


ROOT = Path(__file__).resolve().parents[2]


def pip_under(cache: Path) -> int | None:
    """The pid of a running `pip install` into a virtualenv under `cache`."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and b"pip" in argv and argv[0].startswith(str(cache).encode()):
            return int(proc.name)
    return None


def wait_for(found, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := found():
            return value
        time.sleep(0.1)
    return None
