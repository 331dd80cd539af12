"""Which LoRA adapters vLLM can serve: a PEFT adapter folder read and checked before any engine is asked.

Called vllm_lora, not vllm_adapters, to stay apart from adapters.py (the fleet's folder of published adapters,
whatever they hold) and next to vllm.py, vllm_client.py and vllm_process.py: what it checks are the limits of vLLM's
LoRA layers (vllm.py's docstring says when only merged weights will do) and the shapes of the base model served.
It reads adapter_config.json and safetensors headers only, no weights.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eksflow.llm.steps.common.vllm import VLLM_RANKS
from eksflow.runtime.args import StepInputError

ADAPTER_CONFIG = "adapter_config.json"
SAFETENSORS_HEADER_LIMIT = 100_000_000  # bytes: safetensors refuses a larger header (its MAX_HEADER_SIZE)
# Modules of Llama-style models that vLLM can apply a LoRA to (it fuses q/k/v and gate/up, adapters included).
LORA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
_PEFT_PREFIX = "base_model.model."
_LORA_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[\w]+)?\.weight$")


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


def read_adapter(path: Path, field: str, *, weights: bool = True) -> AdapterSpec:
    """Read adapter_config.json and the tensor shapes; StepInputError naming `field` if it is no adapter.

    `weights=False` reads the config alone (no shapes): what the adapter is, for register's tags, where the weight
    files are checked later, by check_adapter before an engine loads them.
    """
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
    # all-linear makes peft record each module's full path (model.layers.0.mlp.down_proj); a name matches by suffix
    names = {target.rsplit(".", 1)[-1] for target in targets} if isinstance(targets, list) else {str(targets)}
    return AdapterSpec(
        path=path,
        rank=rank,
        target_modules=tuple(sorted(names)),
        base_model=str(config.get("base_model_name_or_path") or ""),
        use_dora=bool(config.get("use_dora")),
        modules_to_save=tuple(config.get("modules_to_save") or ()),
        shapes=_adapter_shapes(path, field) if weights else {},
    )


def unservable_setting(use_dora: bool, target_modules: Sequence[str] | str) -> tuple[str, str, str] | None:
    """The LoRA setting of an adapter vLLM cannot serve as one, as (train.lora's field, why, fix); None if it can.

    What check_adapter refuses once the adapter exists, known from the config: DoRA (vLLM 0.32's PEFTHelper
    refuses use_dora: vllm/lora/peft_helper.py, _validate_features), or a target module with no vLLM LoRA layer.
    all-linear adapts exactly LORA_MODULES on a Llama-style base; check_adapter checks the names peft found.
    """
    if use_dora:
        return "use_dora", "the pinned vLLM cannot serve a DoRA adapter as a LoRA", "set use_dora=false"
    unknown = [] if isinstance(target_modules, str) else sorted(set(target_modules) - LORA_MODULES)
    if unknown:
        fix = f"adapt {', '.join(sorted(LORA_MODULES))} or all-linear"
        return "target_modules", f"modules {unknown} have no vLLM LoRA layer", fix
    return None


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
            # a damaged or foreign file's first 8 bytes can name any length: read none the file does not hold
            if length > min(os.fstat(f.fileno()).st_size - 8, SAFETENSORS_HEADER_LIMIT):
                raise ValueError(f"its header length {length} is beyond the file")
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as err:
        raise StepInputError(f"{path} is not a readable safetensors file ({err})") from err
    return {name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}
