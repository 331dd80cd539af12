"""Serving throughput of vLLM (the fleet's engine) against `transformers serve`, on the same model and prompts.

    .venv/bin/python bench/serve.py [--rounds 2] [--requests 16] [--max-tokens 32] [--clients 1,8]
    .venv/bin/python bench/serve.py --servers fleet,no-lora,block-128 --clients 1     # what a flag costs
    .venv/bin/python bench/serve.py --servers fleet,proxy,transformers                # the proxy's cost too

Every server serves the demo base model folder (SmolLM2-135M-Instruct, converted once into the model cache) with an
OpenAI-compatible chat API on 127.0.0.1; one server runs at a time (two engines on 2 cores stall each other),
the order reversed every other round so drift on a shared machine hits all alike:
    fleet          vLLM as the fleet starts it (eksflow.llm.steps.common.vllm_process.engine, from its virtualenv)
                   with the fleet's flags and environment (vllm.engine_args, vllm.engine_env: --enforce-eager,
                   bfloat16 on CPU, LoRA enabled, the key on every route, the filesystem LoRA resolver on an
                   empty adapters folder); vLLM binds its compute to one core and keeps the other for its API
                   server; a key made for the bench goes with every request
    proxy          the fleet's engine behind the fleet's LiteLLM proxy (the shipped config.yaml and routes callback,
                   the public name routed to the engine's base model by a routes file): its cost is proxy / fleet
    transformers   `transformers serve <folder>` from .venv (transformers[serving]) with OMP_NUM_THREADS=1: one
                   compute thread, like vLLM's one bound core; its dtype `auto` (the weights', bfloat16 here)
    transformers-fp32  the same in float32
and the fleet's engine with one thing changed, to find what a flag costs (VARIANTS): no-lora, block-128 (vLLM's
CPU default), fp32, no-key (no key middleware), no-resolver (no plugin), two-cores (no core kept for the API server),
worker-process (the model in a worker process of its own, as the CPU build does by default).

For each server and round it measures the time from process start to the first answer (the model load included),
then sends the same `--requests` held-out prompts (data/demo/eval.jsonl, greedy, `--max-tokens`, ignore_eos off)
with each number of concurrent clients, and reports completion tokens/s (from each response's `usage`, over the
wall time of the batch) and resident memory (RSS summed over the server's processes) after the run. Prints
per-round figures, then medians and each server's ratio to the first one named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eksflow.llm.engines import ENGINES  # noqa: E402  (bench scripts run from a checkout, like the steps)
from eksflow.llm.engines import command as engine_program  # noqa: E402
from eksflow.llm.serving.objects import CALLBACK_SOURCE  # noqa: E402
from eksflow.llm.steps.common import litellm_proxy, litellm_routes, vllm, vllm_process  # noqa: E402
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model  # noqa: E402
from eksflow.llm.steps.common.vllm_auth import KEY_ENV  # noqa: E402
from eksflow.runtime.ports import free_port  # noqa: E402

KEY = secrets.token_urlsafe(32)  # the vLLM engine's, for this bench's lifetime
MASTER_KEY = f"sk-{secrets.token_urlsafe(16)}"  # the proxy's
PUBLIC_NAME = "bench"  # the name the proxy serves
SERVED_NAME = "base"  # the engine's name for the base model


@dataclass(frozen=True)
class Variant:
    """The fleet's engine with flags dropped or added and environment added."""

    drop: tuple[str, ...] = ()  # flags starting with one of these are left out
    add: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resolver: bool = True  # the filesystem LoRA resolver plugin, as every fleet engine runs it


VARIANTS = {
    "fleet": Variant(),
    "no-lora": Variant(drop=("--enable-lora", "--max-lora-rank", "--max-loras"), resolver=False),
    "block-128": Variant(drop=("--block-size",), add=("--block-size=128",)),
    "fp32": Variant(drop=("--dtype",), add=("--dtype=float32",)),
    "no-key": Variant(drop=("--middleware",)),
    "no-resolver": Variant(resolver=False),
    "two-cores": Variant(env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}),
    "worker-process": Variant(env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),  # the CPU build's default
}
SERVERS = (*VARIANTS, "proxy", "transformers", "transformers-fp32")


def served_model(base_url: str, headers: dict[str, str]) -> str:
    """The model id the server answers to (transformers serve names it by the folder's path)."""
    import requests

    return str(requests.get(f"{base_url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"])


def ask(base_url: str, headers: dict[str, str], model: str, prompt: str, max_tokens: int) -> int:
    """One greedy completion; its completion token count (0 on failure)."""
    import requests

    request = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    try:
        response = requests.post(f"{base_url}/v1/chat/completions", json=request, headers=headers, timeout=600)
        return int(response.json()["usage"]["completion_tokens"]) if response.status_code == 200 else 0
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return 0


def tree_rss_mib(sessions: list[int]) -> float:
    """Resident memory of every process in these sessions, MiB (each server was started in its own session)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) not in sessions:
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


@dataclass
class Server:
    """A running server: where to ask, with which headers, and the sessions of its processes."""

    url: str
    headers: dict[str, str]
    sessions: list[int]
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def fleet_engine(model_dir: Path, variant: Variant, scratch: Path) -> Iterator[Server]:
    """The engine with the fleet's flags and environment, changed by `variant`, started as the fleet starts it."""
    port = free_port()
    settings = vllm.EngineSettings()
    flags = [*vllm.engine_args(str(model_dir), SERVED_NAME, port, settings), "--host=127.0.0.1"]
    flags = [f for f in flags if not f.startswith(variant.drop)]  # startswith(()) is False: none dropped
    adapters = scratch / "adapters"
    adapters.mkdir(exist_ok=True)
    env = vllm.engine_env(settings, cpu=True, adapters_dir=str(adapters) if variant.resolver else "")
    log = scratch / "vllm.log"
    with vllm_process.engine([*flags, *variant.add], {**env, **variant.env, KEY_ENV: KEY}, log_path=log) as process:
        yield Server(f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}, [process.pid], process, log)


@contextmanager
def litellm(engine: Server, scratch: Path) -> Iterator[Server]:
    """The fleet's LiteLLM proxy on the shipped files, its public name routed to the engine's base model."""
    folder = scratch / "proxy"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(litellm_proxy.proxy_config(PUBLIC_NAME, 600), sort_keys=False))
    (folder / CALLBACK_SOURCE.name).write_text(CALLBACK_SOURCE.read_text(encoding="utf-8"))
    routes = litellm_proxy.RoutesFile(folder / "routes.json", PUBLIC_NAME)
    routes.assign("blue", SERVED_NAME, engine.url)
    routes.set_weights(litellm_proxy.weights_for(PUBLIC_NAME, None, "blue", 100))
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": MASTER_KEY,
        litellm_proxy.VLLM_KEY_ENV: KEY,
        litellm_routes.ROUTES_FILE_ENV: str(routes.path),
        litellm_routes.UPSTREAMS_ENV: re.escape(engine.url),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    argv = [engine_program(ENGINES["litellm"]), "--config=config.yaml", f"--port={port}", "--host=127.0.0.1"]
    log = scratch / "proxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*argv, "--num_workers=1"], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        yield Server(url, {"Authorization": f"Bearer {MASTER_KEY}"}, [*engine.sessions, process.pid], process, log)
    finally:
        vllm_process.stop(process)


@contextmanager
def transformers_serve(model_dir: Path, scratch: Path, dtype: str) -> Iterator[Server]:
    """`transformers serve` with one compute thread."""
    port = free_port()
    cli = str(Path(sys.executable).with_name("transformers"))
    argv = [cli, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
    log = scratch / "transformers.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
            start_new_session=True,
        )  # fmt: skip
    try:
        yield Server(f"http://127.0.0.1:{port}", {}, [process.pid], process, log)
    finally:
        vllm_process.stop(process)


def measure(kind: str, model_dir: Path, prompts: list[str], clients: list[int], max_tokens: int) -> dict[str, float]:
    """Start one server, time its first answer, run each client level, record RSS; always stop it."""
    with tempfile.TemporaryDirectory(prefix=f"bench-serve-{kind}-") as scratch, ExitStack() as stack:
        started = time.monotonic()
        if kind.startswith("transformers"):
            dtype = "float32" if kind == "transformers-fp32" else "auto"
            server = stack.enter_context(transformers_serve(model_dir, Path(scratch), dtype))
        else:
            server = stack.enter_context(fleet_engine(model_dir, VARIANTS.get(kind, Variant()), Path(scratch)))
            if kind == "proxy":
                server = stack.enter_context(litellm(server, Path(scratch)))
        model = PUBLIC_NAME if kind == "proxy" else ""
        while True:
            if server.process.poll() is not None:
                raise SystemExit(f"{kind} exited with {server.process.returncode}:\n{server.log.read_text()[-3000:]}")
            try:
                model = model or served_model(server.url, server.headers)
                if ask(server.url, server.headers, model, prompts[0], 4):
                    break
            except Exception:  # not listening yet: the model is still loading
                pass
            time.sleep(0.25)
        figures = {"first_answer_s": time.monotonic() - started}
        for n in clients:
            t0 = time.monotonic()
            with ThreadPoolExecutor(n) as pool:
                tokens = list(pool.map(lambda p: ask(server.url, server.headers, model, p, max_tokens), prompts))
            wall = time.monotonic() - t0
            if not all(tokens):
                raise SystemExit(f"{kind}: {tokens.count(0)} of {len(tokens)} requests failed at {n} clients")
            figures[f"tok_s_{n}"] = sum(tokens) / wall
        figures["rss_mib"] = tree_rss_mib(server.sessions)
        return figures


def main() -> None:
    """Run the interleaved rounds and print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16, help="prompts per client level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--servers", default="fleet,transformers", help=f"comma-separated, of {', '.join(SERVERS)}")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    servers = args.servers.split(",")
    if unknown := set(servers) - set(SERVERS):
        parser.error(f"unknown servers {sorted(unknown)}; known: {', '.join(SERVERS)}")
    rows = [json.loads(line) for line in (REPO / "data" / "demo" / "eval.jsonl").read_text().splitlines() if line]
    prompts = [str(r["prompt"]) for r in rows][: args.requests]
    model_dir = resolve_model(DEMO_MODEL, default_cache_dir())
    results: dict[str, list[dict[str, float]]] = {k: [] for k in servers}
    for round_no in range(args.rounds):
        for kind in servers if round_no % 2 == 0 else servers[::-1]:
            figures = measure(kind, model_dir, prompts, clients, args.max_tokens)
            results[kind].append(figures)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"round {round_no + 1} {kind:12} {shown}", flush=True)
    medians = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    print("\nmedians over rounds:")
    for kind, figures in medians.items():
        print(f"  {kind:12} " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    first = servers[0]
    for kind in servers[1:]:
        print(f"\n{first} / {kind}:")
        for metric in medians[first]:
            print(f"  {metric:16} {medians[first][metric] / medians[kind][metric]:.2f}x")


if __name__ == "__main__":
    main()
