"""The canary's traffic: live requests through the proxy, and the probe set straight to the served adapters."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from eksflow.llm.steps.canary import STEP, Args
from eksflow.llm.steps.common import litellm_proxy, probe_cache, rollout, vllm_client
from eksflow.llm.steps.common.rollout import RolloutState
from eksflow.llm.steps.evaluate import metrics as task_metrics
from eksflow.llm.steps.evaluate.metrics import configured
from eksflow.runtime.args import StepInputError
from eksflow.runtime.metrics import Metric


class Probe(BaseModel):
    """One probe row: the prompt, its reference, what evaluate scored, and what the served models answered.

    A conversation's row carries the history evaluate asked (`messages`): the served models are asked with all of
    it, and `prompt` only shows it.
    """

    prompt: str
    messages: list[dict[str, Any]] = []
    reference: str
    evaluated: float
    candidate: str = ""
    candidate_score: float = math.nan
    candidate_latency_s: float = math.nan  # when this step asked it (not when its answer was reused)
    champion: str = ""
    champion_score: float = math.nan

    def asked(self) -> vllm_client.Prompt:
        """What the served models are asked: the whole history of a conversation, else the prompt."""
        return self.messages or self.prompt


@dataclass(frozen=True)
class Asked:
    """How one model's probe answers came at this step: sent now, or reused from the step that sent them."""

    sent: int  # probes sent by this step (0 when reused)
    errors: int  # of those, failed or empty
    reused_from: str = ""  # the step whose answers were reused


@dataclass(frozen=True)
class Measurement:
    """One measurement of the candidate: its live traffic, its probes and how they came, the metrics of both."""

    live: list[vllm_client.Answer]
    probes: list[Probe]
    asked: dict[str, Asked]
    metrics: dict[str, float]

    @property
    def failed(self) -> str:
        """`1 of 40 requests failed`: of the live requests and probes this measurement sent, those with no answer."""
        sent = len(self.live) + sum(a.sent for a in self.asked.values())
        errors = sum(not a.ok for a in self.live) + sum(a.errors for a in self.asked.values())
        return f"{errors} of {sent} requests failed"


def component_down(args: Args) -> str:
    """Which part of the fleet the analysis used is not running: the engine, else the proxy; "" when both run.

    The pre-traffic step sends nothing through the proxy, so only the engine counts there.
    """
    return vllm_client.engine_down(args.vllm_url) or (
        "" if args.pre_traffic else litellm_proxy.proxy_down(args.proxy_url)
    )


def served_metric(name: str, evaluated: Sequence[str], version: str) -> tuple[str, Metric]:
    """`canary.task_metric` as the key of evaluate's per-row scores, and the function that scores served answers.

    A short name is matched among the task metrics the version was evaluated with (its report lists them), so
    nothing the evaluation did not name is imported; the function is resolved as evaluate resolved it.
    """
    try:
        key = configured(name, evaluated) if evaluated else name  # an older report lists none: rows keyed in full
        if key is None:
            raise ValueError(
                f"{name!r} is not a task metric v{version} was evaluated with "
                f"({', '.join(evaluated) or 'none listed'}); name one of them"
            )
        return key, task_metrics.resolve(key)
    except ValueError as err:
        raise StepInputError(f"--task-metric: {err}") from err


def probe_set(rows: Sequence[Mapping[str, object]], count: int, metric: str = "exact_match") -> list[Probe]:
    """The first `count` rows evaluate scored with `metric`: prompt (and history), reference, the score it measured."""
    probes = [
        Probe(
            prompt=str(r["prompt"]),
            messages=rollout.evaluated_history(r),
            reference=str(r["reference"]),
            evaluated=float(r[metric]),  # type: ignore[arg-type]
        )
        for r in rows
        if {"prompt", "reference", metric} <= set(r)
    ][:count]
    if not probes:
        raise StepInputError(
            f"the evaluation report has no per-row {metric} scores with prompt and reference; re-evaluate the "
            "version with this version of eksflow.llm.steps.evaluate"
        )
    return probes


def send_live_traffic(args: Args, prompts: Sequence[vllm_client.Prompt], count: int) -> list[vllm_client.Answer]:
    """`count` requests to the public name through the proxy, `concurrency` at a time."""
    key = rollout.secret(args.secrets_dir, rollout.MASTER_KEY_FILE)

    def one(i: int) -> vllm_client.Answer:
        return vllm_client.chat(
            args.proxy_url,
            args.model_name,
            prompts[i % len(prompts)],
            api_key=key,
            max_tokens=args.traffic_max_tokens,
            timeout_s=args.request_timeout_s,
        )

    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, range(count)))


def send_probes(args: Args, state: RolloutState, probes: list[Probe], scorer: Metric) -> dict[str, Asked]:
    """The candidate's (and the champion's) answer and its `scorer` score on every probe, from the probe cache or asked.

    A model is asked unless the rollout's probe cache holds its answers for the same engine, adapter and prompts
    and this is not the pre-traffic step (a resumed analyze-0 measures again).
    """
    key = rollout.secret(args.secrets_dir, rollout.VLLM_KEY_FILE)
    cache_file = probe_cache.cache_path(args.state_file)
    cache = probe_cache.read(cache_file)
    prompts = [p.asked() for p in probes]
    models = {  # each on the fleet serving it: the same one for adapters, each its own for whole models
        "candidate": (state.candidate_adapter, state.candidate_version, args.vllm_url),
        "champion": (state.champion_adapter, state.champion_version, state.champion_vllm_url or args.vllm_url),
    }
    asked: dict[str, Asked] = {}
    for role, (name, version, url) in models.items():
        if not name:
            continue
        model = probe_cache.model_key(url, key, name, version, prompts, args.max_new_tokens)
        before = probe_cache.engine_requests(url, key) if model else None
        # The pre-traffic step always asks: it is the gate before any user, and it times the candidate's answers.
        if model and not args.pre_traffic and (entry := probe_cache.lookup(cache, model, before)):
            answers = [vllm_client.Answer(200, text, 0.0) for text in entry.answers]
            asked[role] = Asked(sent=0, errors=0, reused_from=entry.step)
            rollout.log(f"{role} {name}: probe answers reused from {entry.step} (same engine, adapter, prompts)")
        else:
            answers = _ask(args, url, key, name, prompts)
            asked[role] = Asked(sent=len(answers), errors=sum(not a.ok for a in answers))
            if role == "candidate":
                for probe, answer in zip(probes, answers, strict=True):
                    probe.candidate_latency_s = answer.latency_s if answer.status else math.nan
            probe_cache.remember(cache_file, model, key, before, f"{STEP}-{args.percent:g}", answers)
        for probe, answer in zip(probes, answers, strict=True):  # no answer, no score: NaN, never a 0 that averages
            score = scorer(answer.text, probe.reference) if answer.ok else math.nan
            setattr(probe, role, answer.text if answer.ok else f"<error: {answer.error or answer.status}>")
            setattr(probe, f"{role}_score", score)
    return asked


def _ask(args: Args, url: str, key: str, name: str, prompts: Sequence[vllm_client.Prompt]) -> list[vllm_client.Answer]:
    """Every prompt to the model served as `name`, straight to the engine at `url`, `concurrency` at a time."""

    def one(prompt: vllm_client.Prompt) -> vllm_client.Answer:
        return vllm_client.chat(
            url, name, prompt, api_key=key, max_tokens=args.max_new_tokens, timeout_s=args.request_timeout_s
        )

    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, prompts))
