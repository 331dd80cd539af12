"""The canary's decision, pure: the metrics of a step's traffic and probes, and the verdict on them.

`decide` alone judges a step: which rules apply (the champion's only with a champion served, the routing ones
only on live traffic), every rule's result (eksflow.llm.steps.common.gate, the same code as evaluate's), and the
no-champion shortcut. The reports print its results; nothing judges a rule again.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

from eksflow.llm.steps.canary import ROUTING_METRICS, Args, metric_labels, step_label
from eksflow.llm.steps.canary.traffic import Asked, Probe
from eksflow.llm.steps.common import canary_sizing, litellm_proxy, vllm_client
from eksflow.llm.steps.common.gate import Threshold, Verdict, gate
from eksflow.llm.steps.common.rollout import RolloutState


def no_champion_shortcut(percent: float, state: RolloutState) -> str:
    """Why a step passes without measuring, "" when it measures.

    No champion: the shift gave the candidate all traffic, the same as the last step, which measures it (as Argo
    Rollouts skips the steps of a first deploy). Measuring it at every step would say nothing more.
    """
    if state.percent == 100 and percent < 100:
        return f"no champion served: the candidate already takes all traffic; analyze-{step_label(100)} measures it"
    return ""


def applicable_rules(args: Args, state: RolloutState) -> list[Threshold]:
    """The rules this step applies: the champion's only with one served; the routing ones only on live traffic."""
    rules = [*args.thresholds, *(args.champion_thresholds if state.champion_slot else ())]
    if args.pre_traffic:  # the candidate answers no user yet, only the probes
        rules = [r for r in rules if r.metric not in ROUTING_METRICS]
    return rules


def decide(args: Args, state: RolloutState, metrics: Mapping[str, float], task_metric: str) -> Verdict:
    """The step's verdict: passed, why, and every applicable rule's result; the no-champion shortcut passes.

    The reason names the task metric the scores are in (`served_gap (sql_exact) = 0.2500 fails ...`).
    """
    if reason := no_champion_shortcut(args.percent, state):
        return Verdict(passed=True, reason=reason)
    return gate(metrics, applicable_rules(args, state), metric_labels(task_metric))


def analyse(
    args: Args,
    state: RolloutState,
    live: Sequence[vllm_client.Answer],
    probes: Sequence[Probe],
    asked: Mapping[str, Asked],
) -> dict[str, float]:
    """The canary metrics (see the module docstring); NaN where there is nothing to measure.

    With no live traffic (the pre-traffic step), p95_latency_s is over the candidate's probe answers.
    """
    answered = [a for a in live if a.ok]
    candidate_id = litellm_proxy.slot_id(args.model_name, state.candidate_slot or "blue")
    share = sum(a.served_by == candidate_id for a in answered) / len(answered) if answered else math.nan
    # Scores only from probes that were answered: a metric with no answer behind it is missing (fails closed).
    scored = [p for p in probes if math.isfinite(p.candidate_score)]
    candidate = asked["candidate"]
    timed = [p for p in probes if math.isfinite(p.candidate_latency_s)]
    served = _mean(p.candidate_score for p in scored)
    evaluated = _mean(p.evaluated for p in scored)
    metrics = {
        "served_score": served,
        "evaluated_score": evaluated,
        "served_gap": abs(served - evaluated),
        "error_rate": (len(live) - len(answered) + candidate.errors) / (len(live) + candidate.sent),
        "p95_latency_s": _percentile(
            [p.candidate_latency_s for p in timed] if args.pre_traffic else [a.latency_s for a in live if a.status],
            canary_sizing.PERCENTILE,
        ),
        "candidate_share": share,
        "share_z": share_z(share, state.percent / 100, len(answered)),
    }
    if state.champion_slot is not None:
        both = [p for p in scored if math.isfinite(p.champion_score)]
        champion = asked["champion"]
        metrics.update(
            champion_score=_mean(p.champion_score for p in probes if math.isfinite(p.champion_score)),
            score_vs_champion=_mean(p.candidate_score - p.champion_score for p in both),
            champion_error_rate=champion.errors / champion.sent if champion.sent else 0.0,
        )
    return {k: round(v, 6) if math.isfinite(v) else v for k, v in metrics.items()}


def _mean(values: Iterable[float]) -> float:
    """The mean, NaN for no value (a metric with nothing behind it)."""
    found = list(values)
    return statistics.fmean(found) if found else math.nan


def share_z(share: float, weight: float, n: int) -> float:
    """|share - weight| in binomial standard errors; infinite for any deviation from a 0 or 1 weight."""
    if n == 0 or math.isnan(share):
        return math.nan
    if weight in (0.0, 1.0):
        return 0.0 if share == weight else math.inf
    return abs(share - weight) / math.sqrt(weight * (1 - weight) / n)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
