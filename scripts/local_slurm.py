"""A real one-node Slurm on this machine: munge, slurmctld, slurmd and slurmrestd on 127.0.0.1, idempotently.

    python scripts/local_slurm.py up      # install (as root, with apt-get) and start; prints the URL and token file
    python scripts/local_slurm.py down    # stop every daemon it started
    make slurm-up / make slurm-down

Debian 12's packages (Slurm 22.05: slurmctld, slurmd, slurmrestd, munge, slurm-client) are installed with apt-get
when missing, as root. Everything else stays in one folder ($EKSFLOW_SLURM_DIR, default .eksflow/slurm): its own
munge key and socket, a JWT key, slurm.conf, state, logs and pid files; nothing is written to /etc, so the
machine's own Slurm or munge, if any, is left alone. Every Slurm command finds the cluster through
SLURM_CONF=<folder>/slurm.conf.

This host is the one node (its short host name, at 127.0.0.1, with all its CPUs), partition `debug`, jobs
requeued on failure (JobRequeue=1), finished jobs kept for an hour (MinJobAge) so their end state can be read.
slurmrestd speaks openapi/v0.0.38 with JWT authentication on 127.0.0.1 only; it runs as `nobody` (it refuses
root), and the token (`scontrol token`, user root, valid a day) is written to <folder>/token, mode 0600, and to
<state>/secrets/eksflow-slurm/token ($EKSFLOW_STATE_DIR, default .eksflow), where a local run's Slurm task reads
the Secret it mounts. `up` prints the `--set` flags that point a run at this cluster.

Where Slurm cannot run (not root, no apt-get, a container without the privileges slurmd needs) `up` exits 3 with
the reason on one line; tests that need Slurm skip with it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "munge", "slurm-client")
BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sinfo")
CTLD_PORT, SLURMD_PORT, REST_PORT = 16817, 16818, 16820
API_VERSION = "v0.0.38"
TOKEN_SECRET = "eksflow-slurm"  # cluster.slurm.token_secret's default
EXIT_UNAVAILABLE = 3


class UnavailableError(Exception):
    """Slurm cannot run on this machine; the message says why."""


def folder() -> Path:
    """Where this cluster keeps everything."""
    return Path(os.environ.get("EKSFLOW_SLURM_DIR", ".eksflow/slurm")).resolve()


def rest_url() -> str:
    """slurmrestd's address."""
    return f"http://127.0.0.1:{os.environ.get('EKSFLOW_SLURM_REST_PORT', REST_PORT)}"


def install() -> None:
    """Debian's Slurm and munge packages, unless every daemon is already on the PATH."""
    if all(shutil.which(b) for b in BINARIES):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise UnavailableError("Slurm is not installed and installing it needs root with apt-get (Debian's slurm-wlm)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL)


def write_config(root: Path) -> Path:
    """Keys (once), slurm.conf (every time: the host's name and CPUs may change); returns slurm.conf."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # slurmrestd, as nobody, reads slurm.conf here; the keys stay private (0400, 0600)
    closed = [str(p) for p in (root, *root.parents) if not p.stat().st_mode & 0o001]
    if closed:
        raise UnavailableError(
            f"slurmrestd runs as nobody and cannot reach {root / 'slurm.conf'} ({closed[0]} is closed to others): "
            "set EKSFLOW_SLURM_DIR to a folder whose parents others may enter"
        )
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    munge_key, jwt_key = root / "munge" / "munge.key", root / "jwt.key"
    for key, size in ((munge_key, 1024), (jwt_key, 32)):
        if not key.exists():
            key.write_bytes(secrets.token_bytes(size))
            key.chmod(0o400 if key == munge_key else 0o600)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=eksflow",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={os.environ.get('EKSFLOW_SLURM_CTLD_PORT', CTLD_PORT)}",
                f"SlurmdPort={os.environ.get('EKSFLOW_SLURM_SLURMD_PORT', SLURMD_PORT)}",
                "AuthType=auth/munge",
                f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
                "AuthAltTypes=auth/jwt",
                f"AuthAltParameters=jwt_key={jwt_key}",
                "CredType=cred/munge",
                "ProctrackType=proctrack/linuxproc",  # no cgroup delegation needed (containers, CI)
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "MinJobAge=3600",
                "JobRequeue=1",
                "ReturnToService=2",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return conf


def running(pid_file: Path) -> bool:
    """True when the pid file names a live process."""
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def start(root: Path, conf: Path) -> None:
    """Start each daemon that is not running."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = root / "munge"
    if not running(munge / "munged.pid"):
        subprocess.run(
            ["munged", f"--key-file={munge / 'munge.key'}", f"--socket={munge / 'munge.socket'}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}", "--force"],
            check=True,
        )  # fmt: skip
    for daemon, pid_file in (("slurmctld", root / "slurmctld.pid"), ("slurmd", root / "slurmd.pid")):
        if not running(pid_file):
            subprocess.run([daemon, "-f", str(conf)], check=True, env=env)
    if not running(root / "slurmrestd.pid"):
        port = rest_url().rsplit(":", 1)[1]
        with open(root / "log" / "slurmrestd.log", "ab") as log:
            rest = subprocess.Popen(
                ["slurmrestd", "-f", str(conf), "-a", "rest_auth/jwt", "-u", "nobody", "-g", "nogroup",
                 "-s", f"openapi/{API_VERSION}", f"127.0.0.1:{port}"],
                env={**env, "SLURM_JWT": "daemon"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        (root / "slurmrestd.pid").write_text(str(rest.pid))


def wait_ready(root: Path, conf: Path, timeout_s: float = 60) -> str:
    """Wait for the node to be idle and slurmrestd to answer; write and return the token file."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    deadline = time.monotonic() + timeout_s
    while True:
        sinfo = ["sinfo", "-h", "-o", "%T"]
        state = subprocess.run(sinfo, check=False, env=env, capture_output=True, text=True).stdout.strip()
        if state in ("idle", "mixed", "allocated"):
            break
        if state.startswith(("down", "drain")):
            subprocess.run(
                ["scontrol", "update", f"nodename={socket.gethostname().split('.')[0]}", "state=resume"],
                check=False, env=env, capture_output=True,
            )  # fmt: skip
        if time.monotonic() > deadline:
            raise UnavailableError(f"the node did not come up (sinfo: {state or 'no answer'}); see {root / 'log'}")
        time.sleep(1)
    out = subprocess.run(
        ["scontrol", "token", "username=root", "lifespan=86400"], env=env, capture_output=True, text=True, check=True
    ).stdout
    token_file = root / "token"
    token_file.write_text(out.strip().split("=", 1)[1])
    token_file.chmod(0o600)
    while True:
        request = urllib.request.Request(
            f"{rest_url()}/slurm/{API_VERSION}/ping",
            headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token_file.read_text()},
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                return str(token_file)
        except (urllib.error.URLError, OSError) as err:
            if time.monotonic() > deadline:
                why = f"slurmrestd at {rest_url()} does not answer ({err}); see {root / 'log'}"
                raise UnavailableError(why) from err
            time.sleep(0.5)


def up() -> None:
    """Install if needed, start what is not running, print where the cluster is."""
    if os.geteuid() != 0:
        raise UnavailableError("a local Slurm runs its daemons as root here (slurmd, munged): run as root")
    install()
    root = folder()
    conf = write_config(root)
    start(root, conf)
    token_file = wait_ready(root, conf)
    # Where a local run reads the Secret its Slurm task mounts (eksflow.local: <state>/secrets/<Secret name>).
    secret = Path(os.environ.get("EKSFLOW_STATE_DIR", ".eksflow")).resolve() / "secrets" / TOKEN_SECRET
    secret.mkdir(parents=True, exist_ok=True)
    secret.chmod(0o700)
    shutil.copyfile(token_file, secret / "token")
    (secret / "token").chmod(0o600)
    print(f"SLURM_CONF={conf}")
    print(f"EKSFLOW_SLURM_URL={rest_url()}")
    print(f"EKSFLOW_SLURM_TOKEN_FILE={token_file}")
    print(
        f"run with: --set cluster.launcher=slurm --set cluster.slurm.url={rest_url()} "
        f"--set cluster.slurm.api_version={API_VERSION} --set cluster.slurm.user=root",
        file=sys.stderr,
    )


def down() -> None:
    """Stop every daemon this folder's pid files name (slurmrestd, slurmd, slurmctld, munged)."""
    root = folder()
    for pid_file in (
        root / "slurmrestd.pid",
        root / "slurmd.pid",
        root / "slurmctld.pid",
        root / "munge" / "munged.pid",
    ):
        if running(pid_file):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            deadline = time.monotonic() + 15
            while running(pid_file) and time.monotonic() < deadline:
                time.sleep(0.2)
        pid_file.unlink(missing_ok=True)


def main() -> int:
    """`up` or `down`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down"))
    command = parser.parse_args().command
    try:
        up() if command == "up" else down()
    except UnavailableError as err:
        print(f"local Slurm unavailable: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
