"""Where a command's CPU goes, by kind of process: a vLLM engine, a train step, Ray's helper actors, a pytest worker.

    sudo .venv/bin/python bench/cpu_by_process.py record --out /tmp/cpu -- make test
    .venv/bin/python bench/cpu_by_process.py report /tmp/cpu

`record` turns on the kernel's process accounting (acct(2), so it needs root) for the length of the command: every
process that ends writes its user and system CPU time, its name and its pid. Beside it, a sampler notes each new
process's command line once a second, so an accounting record can be named by what the process ran (a Ray worker
and a train step are both `python` to the kernel). `report` adds the CPU time up by kind (KINDS) and prints the
kinds, largest first, then the largest processes. Processes shorter than the sampler's second are named by the
kernel's 15-character name only.

Measured with it (issue 20's closing notes): which fixed costs of the test session are worth sharing.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
# utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]; 64 bytes.
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
TICKS_PER_S = 100  # AHZ
# (kind, pattern on the command line); the first match names the process. Ray's own processes are named by the
# kernel name they set (ray::<actor class>, raylet, gcs_server).
KINDS = (
    ("step {}", re.compile(r"-m steps\.(\w+)")),
    ("vllm", re.compile(r"vllm")),
    ("litellm proxy", re.compile(r"litellm")),
    ("moto S3 server", re.compile(r"moto_server")),
    ("mlflow server", re.compile(r"mlflow")),
    ("pipeline CLI {}", re.compile(r"pipelines/(\w+)\.py")),
    ("pytest worker", re.compile(r"pytest|xdist|exec\(eval\(sys\.stdin")),
    ("ray (other)", re.compile(r"/ray/")),
)
RAY_NAMES = re.compile(r"^(ray::|ray-dashboard|raylet$|gcs_server$)")


@dataclass(frozen=True)
class Process:
    """One accounting record: the kernel's name for the process, its pid, when it started, its CPU time."""

    name: str
    pid: int
    started: float
    cpu_s: float


def _comp_t(value: int) -> int:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(path: Path) -> list[Process]:
    """Every record of an acct(2) file (version 3, the Linux default)."""
    data = path.read_bytes()
    found = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        fields = ACCT_V3.unpack_from(data, offset)
        if fields[1] != 3:
            raise SystemExit(f"{path}: not acct v3 records (version {fields[1]})")
        utime, stime, comm = fields[10], fields[11], fields[18]
        cpu = (_comp_t(utime) + _comp_t(stime)) / TICKS_PER_S
        found.append(Process(comm.split(b"\0", 1)[0].decode(errors="replace"), fields[6], float(fields[8]), cpu))
    return found


def _sample(out: Path, stop: threading.Event) -> None:
    """One line per new process: pid, start time (epoch seconds), command line."""
    stat = Path("/proc/stat").read_text().splitlines()
    boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    seen: set[tuple[str, int]] = set()
    with open(out, "a", encoding="utf-8") as log:
        while not stop.wait(1.0):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
                    if (pid, started) in seen:
                        continue
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                seen.add((pid, started))
                log.write(f"{pid}\t{boot + started / TICKS_PER_S:.2f}\t{' '.join(command.split())[:400]}\n")
            log.flush()


def record(out_dir: Path, command: list[str]) -> int:
    """Run `command` with process accounting into out_dir/pacct and command lines into out_dir/commands.tsv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    accounting, commands = out_dir / "pacct", out_dir / "commands.tsv"
    accounting.write_bytes(b"")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(accounting).encode()) != 0:
        raise SystemExit(f"acct({accounting}): {os.strerror(ctypes.get_errno())} (process accounting needs root)")
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(commands, stop), daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        code = subprocess.call(command)
    finally:
        libc.acct(None)
        stop.set()
        sampler.join()
    print(
        f"{' '.join(command)}: exit {code}, {time.monotonic() - started:.0f} s; report: {sys.argv[0]} report {out_dir}"
    )
    return code


def _command_lines(path: Path) -> dict[int, list[tuple[float, str]]]:
    lines: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[0].isdigit():
            lines[int(parts[0])].append((float(parts[1]), parts[2]))
    return lines


def kind_of(process: Process, command: str) -> str:
    """The kind a process is counted under: Ray's by their kernel name, the others by their command line."""
    if RAY_NAMES.match(process.name):
        return f"ray: {process.name}"
    for kind, pattern in KINDS:
        if match := pattern.search(command):
            return kind.format(*match.groups())
    return f"other: {process.name}"


def report(out_dir: Path, top: int) -> None:
    """Print CPU seconds by kind, largest first, then the `top` largest processes."""
    processes = read_accounting(out_dir / "pacct")
    lines = _command_lines(out_dir / "commands.tsv")

    def command(process: Process) -> str:
        near = [(abs(t - process.started), c) for t, c in lines.get(process.pid, []) if abs(t - process.started) < 2.5]
        return min(near)[1] if near else ""

    cpu: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    named = [(p, command(p)) for p in processes]
    for process, line in named:
        kind = kind_of(process, line)
        cpu[kind] += process.cpu_s
        count[kind] += 1
    print(f"{sum(cpu.values()):.0f} CPU seconds in {len(processes)} processes that ended")
    print(f"{'CPU s':>9} {'procs':>6}  kind")
    for kind, seconds in cpu.most_common():
        if seconds >= 1:
            print(f"{seconds:9.1f} {count[kind]:6d}  {kind}")
    print(f"\nthe {top} largest processes")
    for process, line in sorted(named, key=lambda pair: -pair[0].cpu_s)[:top]:
        print(f"{process.cpu_s:9.1f}  {process.name:<16} {line[:140]}")


def main(argv: list[str] | None = None) -> int:
    """`record --out DIR -- COMMAND...` or `report DIR`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run a command with process accounting on (root)")
    rec.add_argument("--out", type=Path, required=True, help="folder for the accounting file and command lines")
    rec.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    rep = sub.add_parser("report", help="CPU seconds by kind of process")
    rep.add_argument("out", type=Path, help="the folder `record` wrote")
    rep.add_argument("--top", type=int, default=25, help="how many of the largest processes to list")
    args = parser.parse_args(argv)
    if args.verb == "record":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("record: give the command after --")
        return record(args.out, command)
    report(args.out, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
