"""Serving throughput of vLLM (the fleet's engine) against `transformers serve`, on the same model and prompts.

    .venv/bin/python bench/serve.py [--rounds 2] [--requests 16] [--max-tokens 32] [--clients 1,8]

Both serve the demo base model folder (SmolLM2-135M-Instruct, converted once into the model cache) with an
OpenAI-compatible chat API on 127.0.0.1; one server runs at a time (two engines on 2 cores stall each other),
alternating per round so drift on a shared machine hits both alike:
    vllm           `python -m vllm.entrypoints.openai.api_server` from its virtualenv (eksflow.llm.engines) with the
                   fleet's flags (eksflow.llm.steps.common.vllm.engine_args: --enforce-eager, bfloat16 on CPU, LoRA
                   enabled); it binds
                   its compute to one core and keeps the other for its API server; every route asks for a key
                   (eksflow.llm.steps.common.vllm_auth), one made for the bench and sent with every request
    transformers   `transformers serve <folder>` from .venv (transformers[serving]) with OMP_NUM_THREADS=1: one
                   compute thread, like vLLM's one bound core
For each server and round it measures the time from process start to the first answer (the model load included),
then sends the same `--requests` held-out prompts (data/demo/eval.jsonl, greedy, `--max-tokens`, ignore_eos off)
with 1 client and with 8 concurrent clients, and reports completion tokens/s (from each response's `usage`, over
the wall time of the batch) and the servers' resident memory (RSS summed over the process tree) after the run.
Prints per-round figures, then medians and the ratios vLLM / transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eksflow.llm.steps.common import vllm  # noqa: E402  (bench scripts run from a checkout, like the steps)
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model  # noqa: E402
from eksflow.llm.steps.common.vllm_auth import KEY_ENV  # noqa: E402

KEY = secrets.token_urlsafe(32)  # the vLLM engine's, for this bench's lifetime
HEADERS = {"Authorization": f"Bearer {KEY}"}  # transformers serve ignores it

SERVERS = ("vllm", "transformers")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(kind: str, model_dir: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The server's argv and extra environment."""
    if kind == "vllm":
        settings = vllm.EngineSettings()
        args = [*vllm.engine_args(str(model_dir), "base", port, settings), "--host=127.0.0.1"]
        python = vllm.vllm_python()
        return [python, "-m", vllm.ENGINE_MODULE, *args], {
            **vllm.engine_process_env(vllm.engine_env(settings, cpu=True), python),
            KEY_ENV: KEY,
        }
    cli = str(Path(sys.executable).with_name("transformers"))
    return [cli, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)], {"OMP_NUM_THREADS": "1"}


def served_model(base_url: str) -> str:
    """The model id the server answers to (transformers serve names it by the folder's path)."""
    import requests

    return str(requests.get(f"{base_url}/v1/models", headers=HEADERS, timeout=30).json()["data"][0]["id"])


def ask(base_url: str, model: str, prompt: str, max_tokens: int) -> int:
    """One greedy completion; its completion token count (0 on failure)."""
    import requests

    request = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    try:
        response = requests.post(f"{base_url}/v1/chat/completions", json=request, headers=HEADERS, timeout=600)
        return int(response.json()["usage"]["completion_tokens"]) if response.status_code == 200 else 0
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return 0


def tree_rss_mib(pid: int) -> float:
    """Resident memory of `pid` and every process in its session, MiB."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != pid:  # session id: the server was started in its own session
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def measure(kind: str, model_dir: Path, prompts: list[str], clients: list[int], max_tokens: int) -> dict[str, float]:
    """Start one server, time its first answer, run each client level, record RSS; always stop it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv, env = command(kind, model_dir, port)
    with tempfile.NamedTemporaryFile(prefix=f"bench-{kind}-", suffix=".log", delete=False) as log:
        started = time.monotonic()
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )
    try:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{kind} exited with {process.returncode}; see {log.name}")
            try:
                model = served_model(base)
                if ask(base, model, prompts[0], 4):
                    break
            except Exception:  # not listening yet: the model is still loading
                pass
            time.sleep(0.5)
        figures = {"first_answer_s": time.monotonic() - started}
        for n in clients:
            t0 = time.monotonic()
            with ThreadPoolExecutor(n) as pool:
                tokens = list(pool.map(lambda p: ask(base, model, p, max_tokens), prompts))
            wall = time.monotonic() - t0
            if not all(tokens):
                raise SystemExit(f"{kind}: {tokens.count(0)} of {len(tokens)} requests failed at {n} clients")
            figures[f"tok_s_{n}"] = sum(tokens) / wall
        figures["rss_mib"] = tree_rss_mib(process.pid)
        return figures
    finally:
        vllm.stop(process)


def main() -> None:
    """Run the interleaved rounds and print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16, help="prompts per client level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrency levels")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    rows = [json.loads(line) for line in (REPO / "data" / "demo" / "eval.jsonl").read_text().splitlines() if line]
    prompts = [str(r["prompt"]) for r in rows][: args.requests]
    model_dir = resolve_model(DEMO_MODEL, default_cache_dir())
    results: dict[str, list[dict[str, float]]] = {k: [] for k in SERVERS}
    for round_no in range(args.rounds):
        order = SERVERS if round_no % 2 == 0 else SERVERS[::-1]
        for kind in order:
            figures = measure(kind, model_dir, prompts, clients, args.max_tokens)
            results[kind].append(figures)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"round {round_no + 1} {kind:12} {shown}", flush=True)
    medians = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print("\nmedians over rounds:")
    for kind, figures in medians.items():
        print(f"  {kind:12} " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    print("\nvLLM / transformers serve:")
    for metric in medians["vllm"]:
        ratio = medians["vllm"][metric] / medians["transformers"][metric]
        print(f"  {metric:16} {ratio:.2f}x")


if __name__ == "__main__":
    main()
