"""How each step's cost grows with the data: 10k, 100k and 1M rows of the demo format, one run, ratios and growth.

    .venv/bin/python bench/scale.py                           # 10k, 100k, 1M; data under /tmp/eksflow-scale
    .venv/bin/python bench/scale.py --sizes 10000,100000 --skip-eval --skip-s3 --skip-packing   # a quicker run

Per size (scripts/make_scale_data.py writes the rows once and keeps them), each step as its own process, timed
wall-clock with its peak RSS (GNU time's %M):
    stage           python -m eksflow.llm.steps.stage_data from a local folder (copies, hashes and fsyncs every byte,
                    parses every line to derive the splits)
    validate cold   python -m eksflow.llm.steps.validate_data with the real SmolLM2 tokenizer counting tokens (max 256):
                    the token cache is built here (the tokenization of both splits)
    validate warm   the same again: the token cache is verified and reused
    train cold/warm python -m eksflow.llm.steps.train --launcher=local --max-steps=1: start-up is the time to the first
                    step (the `[train] 0/1` line), with an empty token cache, then with the one the cold run built
    sampling        in this process: median time of one micro-batch's indices
                    (eksflow.llm.steps.train.data.batch_indices) and of a whole micro-batch (indices, gather from the
                    mapped cache, tensors), over 2,000 micro-batches; and the sampler this replaced (a list of n indices
                    shuffled per example)
    evaluate        python -m eksflow.llm.steps.evaluate on a seeded sample of 48 eval rows: seconds per 1k rows scored,
                    from its `[evaluate] 0/...` progress line (models loaded) to the end
Once: staging 10,000 objects from a local moto_server (and the unchanged re-stage), a single data.jsonl of
`--big-rows` rows split by hash (peak RSS flat), and training tokens/s with and without sequence packing on demo
rows and on rows of varied length (--spread). Prints a markdown table; growth = log10 of the cost ratio between
sizes ten times apart (1.0 is linear). Wall-clock numbers on a shared machine are noisy: read ratios and growth.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MODEL = "smollm2-135m-instruct"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run(command: list[str], marker: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `command`; its wall seconds, the seconds until a line holding `marker`, and its peak RSS in MB.

    The peak RSS is GNU time's (%M) of the command alone: a child forked from this process would carry this
    process's own high-water mark through exec (Linux keeps the larger of the two), and this process holds torch.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(
        ["/usr/bin/time", "-f", "MAXRSS_KB %M", *command],
        cwd=REPO,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[tuple[float, str]] = []
    for line in proc.stdout:
        lines.append((time.perf_counter() - started, line))
    code = proc.wait()
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{''.join(text for _, text in lines[-30:])}")
    rss = next(int(text.split()[1]) for _, text in reversed(lines) if text.startswith("MAXRSS_KB"))
    reached = next((at for at, text in lines if marker and marker in text), math.nan)
    return {"s": seconds, "to_marker": reached, "rss_mb": rss / 1024}


def make_data(root: Path, rows: int, *extra: str) -> Path:
    """Rows of scripts/make_scale_data.py under `root`, written once and kept (a stamp marks them complete)."""
    folder = root / f"{rows}{''.join(extra).replace('-', '')}"
    stamp = folder / ".complete"
    if not stamp.is_file():
        subprocess.run(
            [PY, "scripts/make_scale_data.py", "--out", str(folder), "--train", str(rows), *extra],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        stamp.write_text("")
    return folder


def previous_sampler(position: int, n: int, seed: int = 0) -> int:
    """The sampler this replaced, for one example: a list of n indices shuffled (what every example cost)."""
    import random

    order = list(range(n))
    random.Random(seed * 100_003 + position // n).shuffle(order)
    return order[position % n]


def sampling(cache_folder: Path, n: int) -> dict[str, float]:
    """Median seconds per micro-batch (8 examples): indices alone, then indices + gather + tensors; and the old one."""
    import torch

    from eksflow.llm.steps.common.token_cache import TokenCache
    from eksflow.llm.steps.train import TrainSettings
    from eksflow.llm.steps.train.data import MicroBatches, batch_indices, epoch_order

    settings = TrainSettings(micro_batch_size=8, max_seq_len=256)
    epoch_order.cache_clear()
    started = time.perf_counter()
    batch_indices(0, 0, 0, settings, 1, n)
    first = time.perf_counter() - started  # includes the epoch's permutation
    indices, batches = [], []
    micro = MicroBatches(TokenCache.open(cache_folder), settings, 0)
    for step in range(1, 2001):
        t0 = time.perf_counter()
        batch_indices(step, 0, 0, settings, 1, n)
        t1 = time.perf_counter()
        micro.get(step, 0, 0, 1, torch.device("cpu"))
        indices.append(t1 - t0)
        batches.append(time.perf_counter() - t1)
    old = []
    for position in range(2 if n >= 1_000_000 else 5):
        t0 = time.perf_counter()
        for j in range(8):
            previous_sampler(position * 8 + j, n)
        old.append(time.perf_counter() - t0)
    return {
        "indices_ms": 1e3 * statistics.median(indices),
        "batch_ms": 1e3 * statistics.median(batches),
        "first_ms": 1e3 * first,
        "old_ms": 1e3 * statistics.median(old),
    }


def evaluate_per_1k(data: Path, adapter: str, work: Path, rows: int = 48) -> float:
    """Seconds per 1,000 eval rows scored (loss and answers, base and tuned), start-up left out.

    Timed from the step's `[evaluate] 0/...` line (written once the models are loaded) to its end.
    """
    command = [
        PY,
        "-m",
        "eksflow.llm.steps.evaluate",
        f"--dataset-dir={data}",
        f"--adapter-dir={adapter}",
        f"--base-model={MODEL}",
        f"--report-dir={work / 'eval'}",
        f"--outputs-dir={work / 'eval-out'}",
        f"--sample-size={rows}",
        "--model-name=",
    ]
    result = run(command, marker="[evaluate] 0/")
    return (result["s"] - result["to_marker"]) / rows * 1000


def per_size(rows: int, root: Path, work: Path, skip_eval: bool) -> dict[str, Any]:
    """Every per-size measurement (see the module docstring) on `rows` train rows."""
    data = make_data(root, rows)
    size_dir = work / str(rows)
    cache = size_dir / "tokens"
    result: dict[str, Any] = {"rows": rows, "mb": (data / "train.jsonl").stat().st_size / 1e6}
    staged = size_dir / "staged"
    result["stage"] = run(
        [
            PY,
            "-m",
            "eksflow.llm.steps.stage_data",
            f"--source={data}",
            f"--dest-dir={staged}",
            f"--outputs-dir={size_dir / 'stage-out'}",
        ]
    )
    validate = [
        PY,
        "-m",
        "eksflow.llm.steps.validate_data",
        f"--dataset-dir={staged}",
        f"--report-dir={size_dir / 'reports'}",
        f"--base-model={MODEL}",
        "--max-tokens=256",
        f"--token-cache-dir={cache}",
        f"--outputs-dir={size_dir / 'validate-out'}",
    ]
    result["validate_cold"] = run(validate)
    result["validate_warm"] = run(validate)
    train_cache = size_dir / "train-tokens"
    for kind in ("cold", "warm"):
        out = size_dir / f"train-{kind}"
        result[f"train_{kind}"] = run(
            [
                PY,
                "-m",
                "eksflow.llm.steps.train",
                "--launcher=local",
                f"--dataset-dir={staged}",
                f"--base-model={MODEL}",
                f"--output-dir={out}",
                f"--outputs-dir={out / 'outputs'}",
                f"--token-cache-dir={train_cache}",
                "--max-steps=1",
                "--max-seq-len=256",
                "--micro-batch-size=8",
                "--num-workers=1",
                "--cpus-per-worker=2",
            ],
            marker="[train] 0/1",
        )
    folder = next(p for p in train_cache.iterdir() if p.is_dir() and p.name.startswith("tok-"))
    result["sampling"] = sampling(folder, json.loads((folder / "meta.json").read_text())["rows"])
    if not skip_eval:
        adapter = (size_dir / "train-warm" / "outputs" / "adapter_dir").read_text()
        result["eval_per_1k_s"] = evaluate_per_1k(staged, adapter, size_dir)
    return result


def s3_many(work: Path, objects: int) -> dict[str, float]:
    """Stage `objects` small objects from a local moto_server, then again with nothing changed."""
    sys.path.insert(0, str(Path(__file__).parent))
    from stage import CREDS, start_moto  # bench/stage.py: moto on a free port

    proc, url = start_moto(work / "moto.log")
    env = {**ENV, **CREDS, "AWS_ENDPOINT_URL": url}
    os.environ.update(CREDS)
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket="scale")
        bodies = {f"data/shards/{i // 1000:02d}/{i:05d}.json": b'{"i": %d}\n' % i for i in range(objects - 2)}
        bodies.update(
            {
                "data/train.jsonl": b'{"prompt": "p", "completion": "c"}\n',
                "data/eval.jsonl": b'{"prompt": "q", "completion": "c"}\n',
            }
        )
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda kv: client.put_object(Bucket="scale", Key=kv[0], Body=kv[1]), bodies.items()))
        command = [
            PY,
            "-m",
            "eksflow.llm.steps.stage_data",
            "--source=s3://scale/data",
            f"--dest-dir={work / 's3-staged'}",
            f"--outputs-dir={work / 's3-out'}",
        ]
        first = run(command, env=env)
        again = run(command, env=env)
        copied = int((work / "s3-out" / "copied_files").read_text())
        return {
            "objects": objects,
            "s": first["s"],
            "rss_mb": first["rss_mb"],
            "again_s": again["s"],
            "again_copied": copied,
        }
    finally:
        proc.terminate()
        proc.wait()


def big_split(root: Path, work: Path, rows: int) -> dict[str, float]:
    """Stage one data.jsonl of `rows` rows (split by a hash of each prompt as it streams)."""
    data = make_data(root, rows, "--single")
    mb = (data / "data.jsonl").stat().st_size / 1e6
    result = run(
        [
            PY,
            "-m",
            "eksflow.llm.steps.stage_data",
            f"--source={data / 'data.jsonl'}",
            f"--dest-dir={work / 'big'}",
            f"--outputs-dir={work / 'big-out'}",
        ]
    )
    return {"mb": mb, **result}


def packing(root: Path, work: Path) -> list[dict[str, Any]]:
    """Training tokens/s (real tokens, all steps after the first) with and without packing, on two kinds of rows."""
    found = []
    for label, extra, seq in (
        ("demo rows (~80 tokens)", (), 256),
        ("varied rows (~80-330 tokens)", ("--spread", "24"), 512),
    ):
        data = make_data(root, 2000, *extra)
        for packed in (False, True):
            out = work / f"pack-{len(found)}"
            run(
                [
                    PY,
                    "-m",
                    "eksflow.llm.steps.train",
                    "--launcher=local",
                    f"--dataset-dir={data}",
                    f"--base-model={MODEL}",
                    f"--output-dir={out}",
                    f"--outputs-dir={out / 'outputs'}",
                    f"--token-cache-dir={work / 'pack-tokens'}",
                    "--max-steps=6",
                    f"--max-seq-len={seq}",
                    "--micro-batch-size=8",
                    "--num-workers=1",
                    "--cpus-per-worker=2",
                    "--log-every=6",
                    f"--pack-sequences={str(packed).lower()}",
                ]
            )
            tokens_per_s = float((out / "outputs" / "tokens_per_s").read_text())
            found.append({"data": label, "packed": packed, "tokens_per_s": tokens_per_s})
    return found


def growth(a: float, b: float) -> str:
    """log10 of b / a: the exponent of the cost's growth between sizes ten times apart (1.0: linear)."""
    return f"{math.log10(b / a):.2f}" if a > 0 and b > 0 else "-"


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of bench/README.md: one column per size, growth between neighbouring sizes."""
    rows = [
        ("stage s", lambda r: r["stage"]["s"]),
        ("stage peak RSS MB", lambda r: r["stage"]["rss_mb"]),
        ("validate, cold token cache s", lambda r: r["validate_cold"]["s"]),
        ("validate, warm token cache s", lambda r: r["validate_warm"]["s"]),
        ("validate peak RSS MB (cold)", lambda r: r["validate_cold"]["rss_mb"]),
        ("train start-up, cold cache s", lambda r: r["train_cold"]["to_marker"]),
        ("train start-up, warm cache s", lambda r: r["train_warm"]["to_marker"]),
        ("train peak RSS MB (warm, 1 worker)", lambda r: r["train_warm"]["rss_mb"]),
        ("sampler per micro-batch of 8, ms", lambda r: r["sampling"]["indices_ms"]),
        ("micro-batch from the cache (indices, gather, tensors), ms", lambda r: r["sampling"]["batch_ms"]),
        ("first micro-batch of an epoch (its permutation), ms", lambda r: r["sampling"]["first_ms"]),
        ("previous sampler per micro-batch, ms", lambda r: r["sampling"]["old_ms"]),
        ("evaluate per 1k rows s", lambda r: r.get("eval_per_1k_s", math.nan)),
    ]
    head = "| | " + " | ".join(f"{r['rows']:,} rows ({r['mb']:.0f} MB)" for r in results)
    head += " | growth per 10x |" if len(results) > 1 else " |"
    lines = [head, "|" + "---|" * (len(results) + 1 + (len(results) > 1))]
    for name, get in rows:
        values = [get(r) for r in results]
        cells = " | ".join(f"{v:.3g}" if not math.isnan(v) else "-" for v in values)
        grown = " / ".join(growth(a, b) for a, b in itertools.pairwise(values))
        lines.append(f"| {name} | {cells} |" + (f" {grown} |" if len(results) > 1 else ""))
    return "\n".join(lines)


def main() -> None:
    """Parse the options, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--data", type=Path, default=Path("/tmp/eksflow-scale"), help="generated data (kept)")
    parser.add_argument("--objects", type=int, default=10_000, help="S3 objects for the many-objects stage")
    parser.add_argument("--big-rows", type=int, default=2_000_000, help="rows of the single data.jsonl")
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--skip-packing", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        work = Path(tmp)
        results = []
        for rows in (int(s) for s in opts.sizes.split(",")):
            results.append(per_size(rows, opts.data, work, opts.skip_eval))
            print(f"{rows:,} rows: {json.dumps(results[-1])}", flush=True)
        print("\n" + table(results) + "\n")
        if not opts.skip_s3:
            print(f"S3 prefix of many objects: {json.dumps(s3_many(work, opts.objects))}", flush=True)
        print(f"single data.jsonl split by hash: {json.dumps(big_split(opts.data, work, opts.big_rows))}", flush=True)
        if not opts.skip_packing:
            for found in packing(opts.data, work):
                print(f"packing: {json.dumps(found)}", flush=True)


if __name__ == "__main__":
    main()
