"""An MPIJob on simulated nodes, as the MPI Operator runs it: sshd in each worker pod, mpirun over ssh in the launcher.

The operator makes a key pair for the job (a Secret mounted in every pod), starts each worker pod
`<job>-worker-<i>` with sshd, gives the pods the job's headless Service as their subdomain (so
`<job>-worker-<i>.<job>` resolves to the worker's pod address), writes the hostfile naming those workers with
`slotsPerWorker` slots each, and, once every sshd is up, starts the launcher pod, whose mpirun starts the remote
daemons (prted) in the workers over ssh, which start the ranks. Here the same happens on the run's simulated nodes
(sim_nodes.py): the key pair and the workers' host keys are made for the attempt (ssh-keygen, mode 0600, in the
task's folder), each worker pod runs this machine's OpenSSH sshd (as root: pods here run as root) accepting that key
alone, the run's /etc/hosts gives each worker its name and FQDN, and the launcher's command runs as its pod's first
process, with the hostfile and the ssh options in its environment as the operator puts them there.

The ranks get what mpirun forwards (`-x`, as on the cluster: sshd passes no container environment on) and find
mpirun's daemons and `python` on the PATH the workers' sshd gives every session: this environment's, as the image's
is on EKS. A worker whose node is lost takes its daemons and ranks with it: mpirun fails, the attempt fails, and
Argo's retry resumes from the checkpoint on the nodes left and a replacement (as Karpenter adds one).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from eksflow.errors import EXIT_FAILED, EksflowError
from eksflow.local.ray_pods import Reap, Spawn
from eksflow.local.resources import MpiLayout
from eksflow.local.sim_nodes import PlacedPod, SimulatedCluster

SSH_PORT = 22
_SSHD_WAIT_S = 30.0
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SSH_OPTIONS = (
    "-F /dev/null -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes "
    "-o LogLevel=ERROR -o ConnectionAttempts=10"
)
INSTALL_SSHD = "an MPIJob on simulated nodes needs OpenSSH's sshd in its worker pods: apt-get install openssh-server"


class MpiPodsError(EksflowError):
    """The MPIJob's pods could not start; the message says which and why."""

    label = "mpi pods error"
    exit_code = EXIT_FAILED


def sshd() -> str | None:
    """OpenSSH's sshd (it must be started by its absolute path), or None."""
    found = shutil.which("sshd", path=os.pathsep.join(["/usr/sbin", "/usr/local/sbin", os.environ.get("PATH", "")]))
    return os.path.abspath(found) if found else None


class MpiPods:
    """The worker pods (sshd) and the launcher pod of one MPIJob attempt; `close` ends them."""

    def __init__(
        self,
        cluster: SimulatedCluster,
        layout: MpiLayout,
        *,
        folder: Path,
        logs: Path,
        path: str,
        spawn: Spawn,
        reap: Reap,
        changed: Callable[[list[dict[str, str]]], None],
    ) -> None:
        if not _DNS_LABEL.fullmatch(layout.name) or len(layout.name) > 50:
            raise MpiPodsError(f"the MPIJob's name {layout.name[:80]!r} is not a DNS label its pods' names can start")
        self.cluster = cluster
        self.layout = layout
        self.folder = folder  # the attempt's keys, sshd_config and hostfile
        self.logs = logs
        self.path = path  # what every ssh session's PATH is: mpirun's daemons and `python` on it
        self._spawn = spawn
        self._reap = reap
        self._changed = changed
        self._workers: list[tuple[PlacedPod, subprocess.Popen[bytes], IO[bytes]]] = []
        self.launcher: PlacedPod | None = None

    def start(self) -> dict[str, str]:
        """Keys, the worker pods with sshd up, the hostfile and the launcher pod; the launcher's environment."""
        daemon = sshd()
        if daemon is None:
            raise MpiPodsError(INSTALL_SSHD)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, mode=0o700)
        key, config = self._keys_and_config()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        self.cluster.replace_lost()  # a lost node's replacement, as Karpenter adds one for pods left Pending
        name = self.layout.name
        for i in range(self.layout.workers):
            host = f"{name}-worker-{i}"
            pod = self.cluster.create_pod(name, "worker", self.layout.worker, host, (f"{host}.{name}",))
            self.logs.mkdir(parents=True, exist_ok=True)
            log = open(self.logs / f"{host}.log", "ab")  # noqa: SIM115 (closed when the pod ends)
            try:
                proc = self._spawn([*pod.network.enter(self.cluster.hosts), daemon, "-D", "-e", "-f", str(config)],
                                   dict(os.environ), log)  # fmt: skip
            except BaseException:
                log.close()
                self.cluster.delete_pod(pod)
                raise
            self._workers.append((pod, proc, log))
        self._changed(self.documents())
        for pod, proc, _ in self._workers:
            self._wait_sshd(pod, proc)
        hostfile = self.folder / "hostfile"
        hostfile.write_text(
            "".join(f"{name}-worker-{i}.{name} slots={self.layout.slots}\n" for i in range(self.layout.workers)),
            encoding="utf-8",
        )
        self.launcher = self.cluster.create_pod(name, "launcher", self.layout.launcher, f"{name}-launcher")
        self._changed(self.documents())
        ssh_args = f"-i {key} {_SSH_OPTIONS}"
        return {
            # what the operator sets in the launcher: the hostfile and the ssh options (Open MPI 5's and 4's names)
            "PRTE_MCA_prte_default_hostfile": str(hostfile),
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "PRTE_MCA_plm_ssh_args": ssh_args,
            "OMPI_MCA_plm_rsh_args": ssh_args,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",  # the pods here run as root
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }

    def in_launcher(self) -> list[str]:
        """The argv prefix that runs the launcher's command as its pod's first process."""
        assert self.launcher is not None
        return self.launcher.network.enter(self.cluster.hosts)

    def documents(self) -> list[dict[str, str]]:
        """The pods now running, as status.json lists them."""
        pods = [pod for pod, _, _ in self._workers]
        return [pod.document() for pod in ([self.launcher] if self.launcher else []) + pods]

    def close(self) -> None:
        """End every pod: its processes killed, the pod removed; the keys go with the attempt's folder."""
        if self.launcher is not None:
            self.cluster.delete_pod(self.launcher)
            self.launcher = None
        workers, self._workers = self._workers, []
        for pod, proc, log in workers:
            if not pod.network.exists():  # its sandbox went without the pod ending: its node is gone
                self.cluster.lose(pod.node)
            self.cluster.delete_pod(pod)  # kills sshd and whatever its sessions left
            self._reap(proc)
            log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        self._changed(self.documents())

    def _keys_and_config(self) -> tuple[Path, Path]:
        key, host_key = self.folder / "id_ed25519", self.folder / "ssh_host_ed25519_key"
        for path, comment in ((key, "eksflow-mpijob"), (host_key, "eksflow-mpijob-host")):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                check=True, capture_output=True,
            )  # fmt: skip
        authorized = self.folder / "authorized_keys"
        shutil.copyfile(f"{key}.pub", authorized)
        authorized.chmod(0o600)
        config = self.folder / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {SSH_PORT}",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {authorized}",  # the job's key alone
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the key lives in the attempt's 0700 folder, below a world-writable /tmp
                    "PidFile none",
                    "PrintMotd no",
                    f"SetEnv PATH={self.path}",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        return key, config

    def _wait_sshd(self, pod: PlacedPod, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _SSHD_WAIT_S
        while True:
            try:
                with socket.create_connection((pod.address, SSH_PORT), timeout=1.0):
                    return
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise MpiPodsError(f"sshd did not start in worker pod {pod.name} (see {self.logs / pod.name}.log)")
            time.sleep(0.1)
