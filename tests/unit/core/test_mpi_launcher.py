"""The MPIJob launcher's wrapper of mpirun (eksflow.runtime.mpi_launcher): exit 0 counts only with the outputs."""

import signal
import subprocess
import sys
from pathlib import Path

from eksflow.runtime import mpi_launcher

WRAPPER = [sys.executable, "-m", "eksflow.runtime.mpi_launcher"]


def test_an_exit_0_without_every_expected_output_fails_the_launcher_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "final_loss").write_text("0.5")
    wrote_one = [f"--outputs-dir={tmp_path}", "--expect=final_loss", "--expect=checkpoint", "--"]
    assert mpi_launcher.main([*wrote_one, sys.executable, "-c", "pass"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mpirun exited 0 but the step wrote no checkpoint in" in err
    (tmp_path / "checkpoint").write_text("/fsx/x")
    assert mpi_launcher.main([*wrote_one, sys.executable, "-c", "pass"]) == 0


def test_mpiruns_own_failure_is_the_launchers_exit_code_and_the_signal_handlers_are_put_back(tmp_path: Path) -> None:
    before = {signum: signal.getsignal(signum) for signum in mpi_launcher.FORWARDED}
    argv = [f"--outputs-dir={tmp_path}", "--expect=final_loss", "--", sys.executable, "-c", "raise SystemExit(213)"]
    assert mpi_launcher.main(argv) == 213
    assert {signum: signal.getsignal(signum) for signum in mpi_launcher.FORWARDED} == before


def test_no_command_or_one_that_cannot_start_is_one_line(tmp_path: Path, capsys) -> None:
    assert mpi_launcher.main([f"--outputs-dir={tmp_path}", "--"]) == 2
    assert mpi_launcher.main([f"--outputs-dir={tmp_path}", "--", str(tmp_path / "no-mpirun")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("bad input: no command after `--`") and lines[1].startswith("error: cannot start")


def test_sigterm_to_the_launcher_reaches_mpirun(tmp_path: Path) -> None:
    """Kubernetes stops the launcher pod with SIGTERM; mpirun passes it on to the ranks, which checkpoint."""
    stand_in = (
        "import pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        f"    pathlib.Path({str(tmp_path / 'final_loss')!r}).write_text('0.5'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = [*WRAPPER, f"--outputs-dir={tmp_path}", "--expect=final_loss", "--", sys.executable, "-c", stand_in]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert (tmp_path / "final_loss").read_text() == "0.5"
