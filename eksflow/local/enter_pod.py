"""Enter a simulated pod and run its command: `python enter_pod.py NETNS HOSTNAME HOSTS -- ARGV...`.

A pod of the simulated nodes (pod_network.py) is a network namespace with its own eth0 and address. Its processes
also get what a container runtime gives them: their own host name (a UTS namespace), the run's /etc/hosts (a mount
namespace in which HOSTS is bound over /etc/hosts, as kubelet writes a pod's) and their own process IDs (a PID
namespace with its own /proc: a program that looks for its node's processes, as Ray does for its raylet, finds
this pod's only). The command runs as the namespace's PID 1 in a child; this process stays as the pod's handle
on the host: it passes SIGTERM, SIGINT and SIGHUP on, and exits as the command does. When the command ends, the
kernel ends everything else in the pod, as when a container's first process exits.

Run as a file with `-I -S` and the standard library only. Every value arrives as its own argv item; nothing here
goes through a shell.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
NETNS_DIR = "/run/netns"  # where `ip netns add` keeps a namespace open


def enter(libc: ctypes.CDLL, netns: str, hostname: str, hosts: str) -> None:
    """Join network namespace `netns`, take `hostname` and see `hosts` as /etc/hosts; OSError if the kernel refuses.

    The next child forked becomes PID 1 of a new PID namespace.
    """

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWUTS | CLONE_NEWNS | CLONE_NEWPID), "unshare")
    # mounts made here stay here: / becomes a slave of the host's tree before /etc/hosts is covered
    check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    check(libc.mount(hosts.encode(), b"/etc/hosts", None, MS_BIND, None), f"bind {hosts} over /etc/hosts")
    name = hostname.encode()
    check(libc.sethostname(name, len(name)), "sethostname")


def run_as_init(libc: ctypes.CDLL, command: list[str]) -> int:
    """Run `command` as PID 1 of the new PID namespace, with its own /proc; its exit status, as a shell gives it."""
    child = os.fork()  # the first process forked after unshare: nothing else may fork before it (find_library does)
    if child == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the pod goes with its handle
            if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
                raise OSError(ctypes.get_errno(), "mount /proc: " + os.strerror(ctypes.get_errno()))
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"cannot start {command[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    for signum in FORWARDED:
        signal.signal(signum, lambda received, _: os.kill(child, received))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        except InterruptedError:
            continue


def main(argv: list[str]) -> int:
    """Enter the pod and run its command there; 127 with one line if it cannot."""
    if len(argv) < 5 or argv[3] != "--":
        print("usage: enter_pod.py NETNS HOSTNAME HOSTS -- ARGV...", file=sys.stderr)
        return 2
    netns, hostname, hosts, command = argv[0], argv[1], argv[2], argv[4:]
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    try:
        enter(libc, netns, hostname, hosts)
    except OSError as exc:
        print(f"cannot start pod {hostname}: {exc}", file=sys.stderr)
        return 127
    return run_as_init(libc, command)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
