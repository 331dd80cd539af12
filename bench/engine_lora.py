"""vLLM's CPU engine serving the base model and a LoRA adapter, at each KV cache block size compared.

    .venv/bin/python bench/engine_lora.py [--block-sizes 128,32] [--requests 32] [--rounds 2] [--resolves 5]

For each block size one engine starts with the fleet's flags and environment (eksflow.llm.steps.common.vllm.engine_args
and engine_env, with `serving.engine.cpu_block_size` set to it) on the demo base model, its adapter folder holding an
adapter of the demo's shape (LoRA r16 on q/k/v/o; random weights, which throughput does not depend on), which it
resolves by name as the fleet's engines do (eksflow/llm/steps/common/adapters.py). First the resolver's cost:
`--resolves` times, a copy published under a new name is asked once (vLLM resolves, loads and answers) and then again
(loaded); the medians of both and their difference are printed. Each round sends `--requests` chat requests,
4 at a time and 8 tokens each (the canary's live traffic), to the base model and to the adapter: once with one
prompt repeated (the canary's live traffic repeats the probe prompts), once with every prompt different. Prints
each batch's wall time and median latency, and the engine's prefix-cache hit rate at the end. One engine runs at a time.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eksflow.llm.steps.common import vllm, vllm_auth, vllm_client, vllm_process  # noqa: E402  (bench scripts run from a checkout, like the steps)
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model  # noqa: E402
from eksflow.runtime.ports import free_port  # noqa: E402

PROMPT = "Rewrite this date in ISO 8601 format (YYYY-MM-DD). Answer with the date only.\nDate: July 4, {year}"
HIT_RATE = re.compile(r"Prefix cache hit rate: ([0-9.]+)%")


def make_adapter(model_dir: Path, out: Path) -> Path:
    """A LoRA adapter of the demo's shape with random weights (PEFT's folder layout), published for `model_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    config.init_lora_weights = False  # random A and B: the adapter changes the answers, as a trained one does
    get_peft_model(model, config).save_pretrained(out)
    config_file = out / "adapter_config.json"  # what vLLM's resolver compares with the engine's --model
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": str(model_dir)}), encoding="utf-8"
    )
    return out


def batch(url: str, model: str, key: str, requests: int, repeated: bool, seed: int) -> tuple[float, float]:
    """(wall seconds, median latency) of `requests` chat requests, 4 in flight."""

    def ask(i: int) -> vllm_client.Answer:
        year = 1976 if repeated else 1000 + 100 * seed + i
        return vllm_client.chat(url, model, PROMPT.format(year=year), api_key=key, max_tokens=8)

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(requests)))
    failed = [a for a in answers if not a.ok]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0].error or failed[0].status}")
    return time.monotonic() - started, statistics.median(a.latency_s for a in answers)


def resolver_cost(url: str, key: str, adapter: Path, resolves: int) -> None:
    """Median latency of a newly published adapter's first request (resolved and loaded) and of its second."""
    first, second = [], []
    for i in range(resolves):
        name = f"published-{i}"
        shutil.copytree(adapter, adapter.parent / name)
        for latencies in (first, second):
            answer = vllm_client.chat(url, name, PROMPT.format(year=1976), api_key=key, max_tokens=8)
            if not answer.ok:
                raise SystemExit(f"{name} did not answer: {answer.error or answer.status}")
            latencies.append(answer.latency_s)
    cost = statistics.median(first) - statistics.median(second)
    print(
        f"  resolver: first request of a published adapter {statistics.median(first):.3f} s, loaded "
        f"{statistics.median(second):.3f} s (median of {resolves}): a resolver load costs {cost:.3f} s",
        flush=True,
    )


def measure(block_size: int, model_dir: Path, adapter: Path, args: argparse.Namespace, log: Path) -> None:
    """One engine at `block_size`: start-up, the resolver's cost, every round's batches, the prefix-cache hit rate."""
    port = free_port()
    settings = vllm.EngineSettings(cpu_block_size=block_size)
    key = secrets.token_urlsafe(16)
    engine_env = vllm.engine_env(settings, cpu=True, adapters_dir=str(adapter.parent))
    flags = [*vllm.engine_args(str(model_dir), "base", port, settings), "--host=127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with vllm_process.engine(flags, {**engine_env, vllm_auth.KEY_ENV: key}, log_path=log) as engine:
        started = time.monotonic()
        vllm_client.wait_ready(url, "base", api_key=key, timeout_s=900, process=engine, log_path=log)
        print(f"block size {block_size}: ready in {time.monotonic() - started:.1f} s", flush=True)
        resolver_cost(url, key, adapter, args.resolves)
        for round_ in range(args.rounds):
            for repeated in (True, False):
                for model in ("base", "lora"):
                    wall, median = batch(url, model, key, args.requests, repeated, seed=2 * round_ + (model == "lora"))
                    prompts = "one prompt" if repeated else "all different"
                    print(
                        f"  round {round_} {model:4s} {prompts:13s} {args.requests} requests in {wall:5.1f} s, "
                        f"median latency {median:.2f} s",
                        flush=True,
                    )
    rates = HIT_RATE.findall(log.read_text(errors="replace"))
    print(f"  prefix-cache hit rate at the end: {rates[-1] if rates else '?'}%", flush=True)


def main() -> None:
    """Parse the flags, make the adapter, measure each block size in turn."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-sizes", default="128,32", help="comma-separated KV cache block sizes (tokens)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--resolves", type=int, default=5, help="adapters published and asked for the first time")
    args = parser.parse_args()
    model_dir = resolve_model(DEMO_MODEL, default_cache_dir())
    with tempfile.TemporaryDirectory(prefix="engine-lora-") as tmp:
        for size in (int(s) for s in args.block_sizes.split(",")):
            adapter = make_adapter(model_dir, Path(tmp) / f"adapters-{size}" / "lora")
            measure(size, model_dir, adapter, args, Path(tmp) / f"vllm-{size}.log")


if __name__ == "__main__":
    main()
