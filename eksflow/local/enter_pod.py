"""Enter a simulated pod, then exec its command: `python enter_pod.py NETNS HOSTNAME HOSTS -- ARGV...`.

A pod of the simulated nodes (pod_network.py) is a network namespace with its own eth0 and address. Its processes
also get what a container runtime gives them: their own host name (a UTS namespace) and the run's /etc/hosts (a
mount namespace in which HOSTS is bound over /etc/hosts, as kubelet writes a pod's). Run as a file with `-I -S`
and the standard library only: it costs one short interpreter start before the pod's command replaces it.
Every value arrives as its own argv item; nothing here goes through a shell.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
NETNS_DIR = "/run/netns"  # where `ip netns add` keeps a namespace open


def enter(netns: str, hostname: str, hosts: str) -> None:
    """Join network namespace `netns`, take `hostname` and see `hosts` as /etc/hosts; OSError if the kernel refuses."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWUTS | CLONE_NEWNS), "unshare")
    # mounts made here stay here: / becomes a slave of the host's tree before /etc/hosts is covered
    check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    check(libc.mount(hosts.encode(), b"/etc/hosts", None, MS_BIND, None), f"bind {hosts} over /etc/hosts")
    name = hostname.encode()
    check(libc.sethostname(name, len(name)), "sethostname")


def main(argv: list[str]) -> int:
    """Enter the pod and exec its command; 127 with one line if it cannot."""
    if len(argv) < 5 or argv[3] != "--":
        print("usage: enter_pod.py NETNS HOSTNAME HOSTS -- ARGV...", file=sys.stderr)
        return 2
    netns, hostname, hosts, command = argv[0], argv[1], argv[2], argv[4:]
    try:
        enter(netns, hostname, hosts)
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot start pod {hostname}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
