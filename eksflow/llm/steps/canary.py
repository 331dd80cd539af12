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

Metrics (declarative rules like evaluate.thresholds, the same code: eksflow.llm.steps.evaluate.gate; missing or NaN
fails):
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

Writes canary-<percent>.json and .md to --report-dir and to the candidate's MLflow run (artifacts canary/,
metrics canary_<percent>_<name>). Exits 1 naming the failing rule, and first the part of the fleet that died when
one did (the vLLM engine, or the LiteLLM proxy the live traffic goes through): the exit handler then rolls back. 2
for bad input (no evaluation report for the version, no probe rows, a task_metric the version was not evaluated
with).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from eksflow.llm.steps.common import canary_sizing, litellm_proxy, probe_cache, rollout, tracking, vllm
from eksflow.llm.steps.common.canary_sizing import Sizing
from eksflow.llm.steps.common.rollout import FleetArgs, RolloutState
from eksflow.llm.steps.evaluate import metrics as task_metrics
from eksflow.llm.steps.evaluate.gate import COMPARISONS, LOSS_METRICS, Threshold, gate
from eksflow.llm.steps.evaluate.metrics import configured
from eksflow.llm.steps.evaluate.report import evaluation
from eksflow.runtime.args import Settings, StepFailedError, StepInputError, run_step
from eksflow.runtime.metrics import Metric

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
REPORT_ARTIFACTS = "canary"
ROUTING_METRICS = ("candidate_share", "share_z")  # measured on live traffic, which the pre-traffic step sends none of


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
    max_new_tokens: int = Field(16, ge=1, description="answer length cap: evaluate.max_new_tokens")

    @property
    def pre_traffic(self) -> bool:
        """The analysis at weight 0 (analyze-0): no live request, the probes straight to the candidate."""
        return self.percent == 0


class Outputs(BaseModel):
    """Argo output parameters (written only when the analysis passed)."""

    reason: str
    metrics: dict[str, float]
    report: str


class Probe(BaseModel):
    """One probe row: the prompt, its reference, what evaluate scored, and what the served models answered."""

    prompt: str
    reference: str
    evaluated: float
    candidate: str = ""
    candidate_score: float = math.nan
    candidate_latency_s: float = math.nan  # when this step asked it (not when its answer was reused)
    champion: str = ""
    champion_score: float = math.nan


@dataclass(frozen=True)
class Asked:
    """How one model's probe answers came at this step: sent now, or reused from the step that sent them."""

    sent: int  # probes sent by this step (0 when reused)
    errors: int  # of those, failed or empty
    reused_from: str = ""  # the step whose answers were reused


def run(args: Args) -> Outputs:
    """Send live traffic and the probe set, compute the metrics, apply the rules, report."""
    with rollout.recording_failures(args.state_file, f"{STEP}-{args.percent:g}"):
        return _run(args)


def _run(args: Args) -> Outputs:
    state = rollout.read_state(args.state_file)
    if state.candidate_slot is None or not state.candidate_version:
        raise StepInputError(f"--state-file={args.state_file} names no candidate: run load-candidate first")
    if state.percent == 100 and args.percent < 100:
        # No champion: the shift gave the candidate all traffic, the same as the last step, which measures it (as
        # Argo Rollouts skips the steps of a first deploy). Measuring it at every step would say nothing more.
        reason = f"no champion served: the candidate already takes all traffic; analyze-{step_label(100)} measures it"
        rollout.log(reason)
        rollout.write_state(args.state_file, state.model_copy(update={"stage": f"{STEP}-{args.percent:g}"}))
        return Outputs(reason=reason, metrics={}, report="")
    evaluated = evaluation(args.tracking_uri, args.model_name, state.candidate_version)
    metric, scorer = served_metric(args.task_metric, evaluated.task_metrics, state.candidate_version)
    probes = probe_set(evaluated.rows, args.probe_rows, metric)
    rules = [*args.thresholds, *(args.champion_thresholds if state.champion_slot else ())]
    if args.pre_traffic:  # the candidate answers no user yet, only the probes below
        rules = [r for r in rules if r.metric not in ROUTING_METRICS]
    sizing = canary_sizing.live_requests(
        args.percent / 100, args.share_tolerance, canary_sizing.share_z_limit(args.thresholds)
    )
    rollout.log(f"canary at {args.percent:g}%: {sizing.describe()}")
    live = send_live_traffic(args, [p.prompt for p in probes], sizing.requests)
    asked = send_probes(args, state, probes, scorer)
    metrics = analyse(args, state, live, probes, asked)
    passed, reason = gate(metrics, rules)
    if not passed and (down := component_down(args)):
        reason = f"{down}; {reason}"  # the cause first: every metric failing after it is its effect
    report = write_report(args, state, metrics, rules, passed, reason, sizing, live, probes, asked)
    _log_to_mlflow(args, state.candidate_version, metrics, report)
    if not passed:
        raise StepFailedError(
            f"canary analysis at {args.percent:g}% failed for v{state.candidate_version}: {reason} "
            f"(report: {report}); the exit handler routes traffic back to the champion"
        )
    rollout.write_state(args.state_file, state.model_copy(update={"stage": f"{STEP}-{args.percent:g}"}))
    return Outputs(reason=reason, metrics=metrics, report=str(report))


def component_down(args: Args) -> str:
    """Which part of the fleet the analysis used is not running: the engine, else the proxy; "" when both run.

    The pre-traffic step sends nothing through the proxy, so only the engine counts there.
    """
    return vllm.engine_down(args.vllm_url) or ("" if args.pre_traffic else litellm_proxy.proxy_down(args.proxy_url))


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
    """The first `count` rows evaluate scored with `metric`: prompt, reference, and the score it measured."""
    probes = [
        Probe(prompt=str(r["prompt"]), reference=str(r["reference"]), evaluated=float(r[metric]))  # type: ignore[arg-type]
        for r in rows
        if {"prompt", "reference", metric} <= set(r)
    ][:count]
    if not probes:
        raise StepInputError(
            f"the evaluation report has no per-row {metric} scores with prompt and reference; re-evaluate the "
            "version with this version of eksflow.llm.steps.evaluate"
        )
    return probes


def send_live_traffic(args: Args, prompts: Sequence[str], count: int) -> list[vllm.Answer]:
    """`count` requests to the public name through the proxy, `concurrency` at a time."""
    key = rollout.secret(args.secrets_dir, rollout.MASTER_KEY_FILE)

    def one(i: int) -> vllm.Answer:
        return vllm.chat(
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
    prompts = [p.prompt for p in probes]
    models = {
        "candidate": (state.candidate_adapter, state.candidate_version),
        "champion": (state.champion_adapter, state.champion_version),
    }
    asked: dict[str, Asked] = {}
    for role, (name, version) in models.items():
        if not name:
            continue
        model = probe_cache.model_key(args.vllm_url, key, name, version, prompts, args.max_new_tokens)
        before = probe_cache.engine_requests(args.vllm_url, key) if model else None
        # The pre-traffic step always asks: it is the gate before any user, and it times the candidate's answers.
        if model and not args.pre_traffic and (entry := probe_cache.lookup(cache, model, before)):
            answers = [vllm.Answer(200, text, 0.0) for text in entry.answers]
            asked[role] = Asked(sent=0, errors=0, reused_from=entry.step)
            rollout.log(f"{role} {name}: probe answers reused from {entry.step} (same engine, adapter, prompts)")
        else:
            answers = _ask(args, key, name, prompts)
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


def _ask(args: Args, key: str, name: str, prompts: Sequence[str]) -> list[vllm.Answer]:
    """Every prompt to the adapter served as `name`, straight to the engine, `concurrency` at a time."""

    def one(prompt: str) -> vllm.Answer:
        return vllm.chat(
            args.vllm_url, name, prompt, api_key=key, max_tokens=args.max_new_tokens, timeout_s=args.request_timeout_s
        )

    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, prompts))


def analyse(
    args: Args, state: RolloutState, live: Sequence[vllm.Answer], probes: Sequence[Probe], asked: Mapping[str, Asked]
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


def write_report(
    args: Args,
    state: RolloutState,
    metrics: Mapping[str, float],
    rules: Sequence[Threshold],
    passed: bool,
    reason: str,
    sizing: Sizing,
    live: Sequence[vllm.Answer],
    probes: Sequence[Probe],
    asked: Mapping[str, Asked],
) -> Path:
    """canary-<percent>.json (everything) and .md (the table), in --report-dir; prints the table."""
    args.report_dir.mkdir(parents=True, exist_ok=True)
    stem = args.report_dir / f"canary-{args.percent:g}"
    served_by: dict[str, int] = {}
    for answer in live:
        key = answer.served_by or f"error {answer.status}"
        served_by[key] = served_by.get(key, 0) + 1
    report = {
        "passed": passed,
        "reason": reason,
        "percent": args.percent,
        "candidate": {"version": state.candidate_version, "slot": state.candidate_slot},
        "champion": {"version": state.champion_version, "slot": state.champion_slot},
        "metrics": {k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()},
        "rules": [{**r.model_dump(), "actual": metrics.get(r.metric)} for r in rules],
        "live_traffic": {"requests": len(live), "sized": sizing.describe(), "served_by": served_by},
        "probes_asked": {role: asdict(a) for role, a in asked.items()},
        "probes": [p.model_dump() for p in probes],
    }
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    evidence = [f"live traffic: {sizing.describe()}", "probes: " + describe_asked(asked)]
    table = render_table(args.percent, state, metrics, rules, passed, reason, served_by, evidence)
    stem.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return json_path


def render_table(
    percent: float,
    state: RolloutState,
    metrics: Mapping[str, float],
    rules: Sequence[Threshold],
    passed: bool,
    reason: str,
    served_by: Mapping[str, int],
    evidence: Sequence[str] = (),
) -> str:
    """The markdown summary: traffic split, what was sent and why, every rule with its value, the decision."""
    champion = f"v{state.champion_version} ({state.champion_slot})" if state.champion_slot else "none served"
    lines = [
        f"canary at {percent:g}%: candidate v{state.candidate_version} ({state.candidate_slot}), champion {champion}",
        "",
        "live traffic served by: " + ", ".join(f"{k} {v}" for k, v in sorted(served_by.items())),
        *(part for line in evidence for part in ("", line)),
        "",
        "| rule | actual | result |",
        "|---|---|---|",
    ]
    for rule in rules:
        value = metrics.get(rule.metric, math.nan)
        ok = not math.isnan(value) and COMPARISONS[rule.op](value, rule.value)
        lines.append(f"| {rule.describe()} | {value:.4f} | {'pass' if ok else 'FAIL'} |")
    others = [k for k in metrics if k not in {r.metric for r in rules}]
    lines += ["", ", ".join(f"{k} = {metrics[k]:.4f}" for k in others)]
    lines += ["", f"analysis: {'PASSED' if passed else 'FAILED'} ({reason})"]
    return "\n".join(lines)


def describe_asked(asked: Mapping[str, Asked]) -> str:
    """`candidate 16 sent (0 failed), champion reused from analyze-10`."""
    return ", ".join(
        f"{role} reused from {a.reused_from}" if a.reused_from else f"{role} {a.sent} sent ({a.errors} failed)"
        for role, a in asked.items()
    )


def _log_to_mlflow(args: Args, version: str, metrics: Mapping[str, float], report: Path) -> None:
    """Metrics and both report files on the version's run (best effort: the analysis already decided)."""
    try:
        run_id = str(tracking.client(args.tracking_uri).get_model_version(args.model_name, version).run_id)
    except Exception as err:  # a report that cannot be logged must not change the decision
        rollout.log(f"warning: not logging the canary report to MLflow: {err}")
        return
    prefix = f"canary_{args.percent:g}_"
    tracking.log_metrics(args.tracking_uri, run_id, {prefix + k: v for k, v in metrics.items() if math.isfinite(v)})
    tracking.log_files(args.tracking_uri, run_id, [report, report.with_suffix(".md")], REPORT_ARTIFACTS)


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.canary --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
