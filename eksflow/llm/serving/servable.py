"""What a pipeline's fleet can serve once trained, checked when its config loads (ServingConfig's validator).

A setting that trains something the rollout cannot serve would train, pass the gate and register, and then be
refused by load-candidate: each is refused instead at its own key, wherever the config is loaded (plan, render,
run, submit, config): a LoRA rank above the engine's --max-lora-rank, and trainings that register both adapters and
whole models (one rollout serves one kind). A full fine-tune, and an adapter vLLM cannot serve as a LoRA (DoRA
among them: merged into its base when it registers), are served as whole models, each by a vLLM fleet of its own
(eksflow/llm/steps/publish_model.py): their LoRA settings are not checked against the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from eksflow.llm.steps.common import vllm
from eksflow.llm.steps.common.trained import ModelKind
from eksflow.llm.steps.train import LoraSettings, TrainSettings

ENGINE_RANK_LIMIT = "serving.engine.max_lora_rank"  # the largest LoRA rank the fleet's engine loads


def _sections(section: BaseModel, kind: type[BaseModel], key: str = "") -> dict[str, BaseModel]:
    """Every section of type `kind` in a config (at any depth), by dotted key."""
    if isinstance(section, kind):
        return {key: section}
    found: dict[str, BaseModel] = {}
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            found |= _sections(value, kind, f"{key}.{name}" if key else name)
    return found


def registered_kind(config: BaseModel) -> ModelKind:
    """What the config's training registers (TrainSettings.registers), so how its rollout serves it.

    ValidationError, at the setting, for a config whose trainings register both kinds: one rollout serves one.
    """
    kinds: dict[str, ModelKind] = {key: train.registers for key, train in _sections(config, TrainSettings).items()
                                   if isinstance(train, TrainSettings)}  # fmt: skip
    first: ModelKind = next(iter(kinds.values()), "adapter")
    for key, kind in kinds.items():
        if kind != first:
            problem = (
                f"it registers {'whole models' if kind == 'model' else 'adapters'} and another training of this "
                f"config {'whole models' if first == 'model' else 'adapters'}: one rollout serves one kind; give "
                "them the same train.finetune (and LoRA settings vLLM serves alike)"
            )
            error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
            details = InitErrorDetails(type=error, loc=(*key.split("."), "finetune"), input=kind)
            raise ValidationError.from_exception_data("trainings", [details])
    return first


def lora_sections(section: BaseModel, key: str = "") -> dict[str, LoraSettings]:
    """Every LoRA adapter's settings a config serves as an adapter (each LoraSettings in it, at any depth), by key.

    Those of a training that registers a whole model are left out: a full fine-tune trains no adapter, and an
    adapter vLLM cannot serve as a LoRA is merged into its base (TrainSettings.registers).
    """
    models = [k for k, train in _sections(section, TrainSettings, key).items()
              if isinstance(train, TrainSettings) and train.registers == "model"]  # fmt: skip
    return {
        k: lora
        for k, lora in _sections(section, LoraSettings, key).items()
        if isinstance(lora, LoraSettings) and not any(k.startswith(f"{t}.") or not t for t in models)
    }


def lora_ranks(section: BaseModel) -> dict[str, int]:
    """The rank of every LoRA adapter a config trains, by the dotted key of its setting."""
    return {f"{key}.rank": lora.rank for key, lora in lora_sections(section).items()}


def refuse_unservable_ranks(
    trained: Mapping[str, int | Sequence[int]], max_lora_rank: int, limit: str = ENGINE_RANK_LIMIT
) -> None:
    """Refuse (ValidationError) a LoRA rank the serving engine cannot load, at the key of the setting that holds it.

    vLLM sizes its LoRA buffers by --max-lora-rank and refuses a larger adapter, which load-candidate finds only
    after training: a config's validator calls this, so the config is refused wherever it is loaded (plan, render,
    run, submit, config). `trained` maps each setting to its rank, or to its ranks (a grid: the largest must fit);
    `limit` names where `max_lora_rank` comes from: the config's own serving.engine.max_lora_rank (the fix may
    raise it), or an engine the config does not hold.
    """
    errors = []
    for key, value in trained.items():
        rank = max(value) if isinstance(value, Sequence) else value
        if rank > max_lora_rank:
            fit = next((r for r in vllm.VLLM_RANKS if r >= rank), None)  # the smallest --max-lora-rank that holds it
            raise_limit = f", or raise {limit} to {fit}" if limit == ENGINE_RANK_LIMIT and fit else ""
            problem = (
                f"rank {rank} is above {limit} ({max_lora_rank}), so vLLM could not load the trained adapter; "
                f"train at rank {max_lora_rank} or less{raise_limit}"
            )
            error = PydanticCustomError("value_error", "{problem}", {"problem": problem})
            errors.append(InitErrorDetails(type=error, loc=tuple(key.split(".")), input=value))
    if errors:
        raise ValidationError.from_exception_data("LoRA ranks", errors)
