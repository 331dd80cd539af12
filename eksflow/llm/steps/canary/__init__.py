r"""Canary analysis: does the served candidate behave at its current share of traffic? One task per canary step.

    python -m eksflow.llm.steps.canary --percent=10 --report-dir=/fsx/runs/<wf>/reports --model-name=llama-lora \
        --tracking-uri=... --vllm-url=... --proxy-url=... --state-file=...

`--percent=0` is the pre-traffic analysis (analyze-0): it runs after load-candidate, while the candidate's weight
is still 0, so a candidate that fails it never answers a user. It sends no live traffic and applies every rule
but the routing ones (candidate_share, share_z): served vs evaluated, errors, the champion comparison, and
p95_latency_s over the candidate's probe answers, asked straight from the engine.

Two kinds of traffic, both real requests to the running fleet:
- live traffic through the proxy: chat requests to the public model name, `concurrency` at a time,
  `traffic_max_tokens` each; which slot answered is read from each response's x-litellm-model-id header. Their
  number is sized per step from `share_tolerance`, the step's weight and the share_z limit of the rules
  (eksflow/llm/steps/common/canary_sizing.py: 24, 64 and 34 requests at 10, 50 and 100 % by default); the report states
  it and the bound it came from;
- the probe set: the first `probe_rows` rows of the held-out split as `evaluate` scored them for this version
  (its report in the version's MLflow run holds each row's prompt, reference and score), sent straight to the
  candidate's adapter and, when one is served, to the champion's (greedy, the evaluation's token budget). The
  live traffic uses the same prompts. Each model answers them once per rollout: a later step reuses the answers
  while the engine, the adapter and the prompts are unchanged (eksflow/llm/steps/common/probe_cache.py), else asks
  again.

Metrics (declarative rules like evaluate.thresholds, judged by the same code: eksflow.llm.steps.common.gate; missing
or NaN fails):
    served_score          `task_metric` of the served candidate on the probe rows: any task metric the version was
                          evaluated with (its report lists them), a built-in or the project's own, which scores
                          the served answers as evaluate scored its own (eksflow.llm.steps.evaluate.metrics.resolve)
    evaluated_score       what `evaluate` measured for this version on the same rows (its report's per-row scores)
    served_gap            |served_score - evaluated_score|: a wrong adapter, base model or chat template shows
                          here (RO3); bfloat16 serving vs float32 evaluation flips a row now and then
    error_rate            failed or empty answers / requests sent by this step: its live traffic and the
                          candidate probes it sent (reused probe answers are no request: a set is reused
                          only if every probe was answered in the step that sent it)
    p95_latency_s         95th percentile of the live requests' latency through the proxy
    candidate_share       share of the live requests the candidate's slot answered
    share_z               |candidate_share - weight| in binomial standard errors, sqrt(w (1 - w) / n): the
                          routing tolerance (4: a correct router fails it about once in 16 000 steps); at 0 % or
                          100 % any deviation is infinite
    champion_score, score_vs_champion   the champion on the same probes, and candidate - champion
                                        (champion_thresholds, applied only when a champion is served)
    champion_error_rate   failed champion probes / champion probes sent by this step (0 for a reused set)

With no champion served, every step gives the candidate all traffic: a step below 100 % then passes at once,
saying so, and the 100 % step is the one analysis.

The decision is one pure function (analysis.decide): every rule's result, printed by the reports as judged there.
Writes canary-<percent>.json and .md to --report-dir and to the candidate's MLflow run (artifacts canary/,
metrics canary_<percent>_<name>). Exits 1 naming the failing rule, and first the part of the fleet that died when
one did (the vLLM engine, or the LiteLLM proxy the live traffic goes through): the exit handler then rolls back. 2
for bad input (no evaluation report for the version, no probe rows, a task_metric the version was not evaluated
with).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from eksflow.llm.steps.common import canary_sizing
from eksflow.llm.steps.common.gate import Threshold
from eksflow.llm.steps.common.rollout import FleetArgs
from eksflow.llm.steps.evaluate import metrics as task_metrics
from eksflow.llm.steps.evaluate.gate import LOSS_METRICS
from eksflow.runtime.args import Settings

STEP = "analyze"
CANARY_METRICS = (
    "served_score",
    "evaluated_score",
    "served_gap",
    "error_rate",
    "p95_latency_s",
    "candidate_share",
    "share_z",
    "champion_score",
    "score_vs_champion",
    "champion_error_rate",
)
ROUTING_METRICS = ("candidate_share", "share_z")  # measured on live traffic, which the pre-traffic step sends none of
# The probes' scores and their differences, in the units of the task metric they are measured by (canary.task_metric).
SCORE_METRICS = ("served_score", "evaluated_score", "served_gap", "champion_score", "score_vs_champion")


def metric_labels(task_metric: str) -> dict[str, str]:
    """How reports and reasons show each score metric: with the task metric it is in, `served_score (sql_exact)`."""
    return {name: f"{name} ({task_metric})" for name in SCORE_METRICS}


def step_label(percent: float) -> str:
    """The canary step's name in its tasks (shift-<label>, analyze-<label>): 10.0 -> '10', 2.5 -> '2-5'."""
    return f"{percent:g}".replace(".", "-")


class CanarySettings(Settings):
    """Canary steps and their analysis (config section `canary`)."""

    weights: tuple[float, ...] = Field(
        (10.0, 50.0, 100.0), min_length=1, description="the candidate's share at each step, percent; ends at 100"
    )
    share_tolerance: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="deviation of the candidate's routed share a step must detect: sizes its live requests",
    )
    concurrency: int = Field(4, ge=1, le=64, description="live requests in flight at once")
    traffic_max_tokens: int = Field(8, ge=1, description="answer length of a live request (routing, errors, latency)")
    probe_rows: int = Field(16, ge=1, description="held-out rows sent to candidate and champion")
    task_metric: str = Field(
        "exact_match",
        description="how served answers are scored, as evaluate scored them: one of evaluate.task_metrics, a custom "
        "one by its function's name or module:function",
    )
    thresholds: tuple[Threshold, ...] = Field(
        (
            Threshold(metric="served_gap", op="<=", value=0.125),
            Threshold(metric="error_rate", op="<=", value=0.0),
            Threshold(metric="p95_latency_s", op="<=", value=60.0),
            Threshold(metric="share_z", op="<=", value=4.0),
        ),
        description="every rule must hold at every step",
    )
    champion_thresholds: tuple[Threshold, ...] = Field(
        (Threshold(metric="score_vs_champion", op=">=", value=-0.125),),
        description="rules against the champion on the same probes, applied when a champion is served",
    )
    request_timeout_s: int = Field(120, ge=1, description="seconds one request may take before it counts as failed")

    @field_validator("weights")
    @classmethod
    def _increasing_to_100(cls, weights: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < w <= 100 for w in weights) or list(weights) != sorted(set(weights)) or weights[-1] != 100:
            raise ValueError(f"weights must increase within (0, 100] and end at 100, e.g. (10, 50, 100); got {weights}")
        labels = [step_label(w) for w in weights]
        if same := sorted({f"{w!r}" for w, label in zip(weights, labels, strict=True) if labels.count(label) > 1}):
            raise ValueError(
                f"weights {', '.join(same)} would name the same canary step; give weights that differ within 6 digits"
            )
        return weights

    @field_validator("task_metric")
    @classmethod
    def _scores_answers(cls, name: str) -> str:
        if name in LOSS_METRICS:
            raise ValueError(f"{name} is not a score of an answer; name a task metric (evaluate.task_metrics)")
        # A short name is matched among the task metrics the version was evaluated with (see served_metric), as
        # the pipeline matches it among evaluate.task_metrics; a full one is checked as evaluate checks its own.
        if name not in task_metrics.BUILT_IN and not name.isidentifier():
            task_metrics.resolve(name)
        return name

    @field_validator("thresholds", "champion_thresholds")
    @classmethod
    def _known_metrics(cls, rules: tuple[Threshold, ...]) -> tuple[Threshold, ...]:
        for rule in rules:
            if rule.metric not in CANARY_METRICS:
                raise ValueError(f"unknown canary metric {rule.metric!r}; known: {', '.join(CANARY_METRICS)}")
        return rules

    @model_validator(mode="after")
    def _traffic_within_reach(self) -> CanarySettings:
        z = canary_sizing.share_z_limit(self.thresholds)
        for w in self.weights:
            sizing = canary_sizing.live_requests(w / 100, self.share_tolerance, z)
            if sizing.requests > canary_sizing.MAX_LIVE_REQUESTS:
                raise ValueError(
                    f"share_tolerance={self.share_tolerance:g} with share_z <= {z:g} needs {sizing.bound:.0f} live "
                    f"requests at the {w:g}% step, more than {canary_sizing.MAX_LIVE_REQUESTS}; give a larger "
                    "share_tolerance"
                )
        return self


class Args(CanarySettings, FleetArgs):
    """Canary settings, the fleet, and what this analysis checks against."""

    percent: float = Field(
        ge=0, le=100, description="the share the shift task just gave the candidate, percent; 0: pre-traffic"
    )
    report_dir: Path = Field(description="where canary-<percent>.json and .md are written")
    max_new_tokens: int = Field(
        16, ge=1, description="the probes' answer cap where the version's evaluation report records none"
    )

    @property
    def pre_traffic(self) -> bool:
        """The analysis at weight 0 (analyze-0): no live request, the probes straight to the candidate."""
        return self.percent == 0


class Outputs(BaseModel):
    """Argo output parameters (written only when the analysis passed)."""

    reason: str
    metrics: dict[str, float]
    report: str
