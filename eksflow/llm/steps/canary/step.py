"""The canary step: measure the candidate at its share of traffic, decide, report; exits 1 when it fails."""

from __future__ import annotations

from dataclasses import replace

from eksflow.llm.steps.canary import STEP, Args, Outputs
from eksflow.llm.steps.canary.analysis import analyse, decide, no_champion_shortcut
from eksflow.llm.steps.canary.report import log_to_mlflow, write_report
from eksflow.llm.steps.canary.traffic import component_down, probe_set, send_live_traffic, send_probes, served_metric
from eksflow.llm.steps.common import canary_sizing, rollout
from eksflow.llm.steps.common.evaluation import evaluation
from eksflow.runtime.args import StepFailedError, StepInputError, run_step


@rollout.records_failures(lambda args: f"{STEP}-{args.percent:g}")
def run(args: Args) -> Outputs:
    """Send live traffic and the probe set, compute the metrics, decide, report."""
    state = rollout.read_state(args.state_file)
    if state.candidate_slot is None or not state.candidate_version:
        raise StepInputError(f"--state-file={args.state_file} names no candidate: run load-candidate first")
    if reason := no_champion_shortcut(args.percent, state):
        rollout.log(reason)
        rollout.write_state(args.state_file, state.model_copy(update={"stage": f"{STEP}-{args.percent:g}"}))
        return Outputs(reason=reason, metrics={}, report="")
    evaluated = evaluation(args.tracking_uri, args.model_name, state.candidate_version)
    metric, scorer = served_metric(args.task_metric, evaluated.task_metrics, state.candidate_version)
    probes = probe_set(evaluated.rows, args.probe_rows, metric)
    sizing = canary_sizing.live_requests(
        args.percent / 100, args.share_tolerance, canary_sizing.share_z_limit(args.thresholds)
    )
    rollout.log(f"canary at {args.percent:g}%: {sizing.describe()}")
    live = send_live_traffic(args, [p.prompt for p in probes], sizing.requests)
    asked = send_probes(args, state, probes, scorer)
    metrics = analyse(args, state, live, probes, asked)
    verdict = decide(args, state, metrics)
    if not verdict.passed and (down := component_down(args)):
        # The cause first: every metric failing after it is its effect.
        verdict = replace(verdict, reason=f"{down}; {verdict.reason}")
    report = write_report(args, state, metrics, verdict, sizing, live, probes, asked)
    log_to_mlflow(args, state.candidate_version, metrics, report)
    if not verdict.passed:
        raise StepFailedError(
            f"canary analysis at {args.percent:g}% failed for v{state.candidate_version}: {verdict.reason} "
            f"(report: {report}); the exit handler routes traffic back to the champion"
        )
    rollout.write_state(args.state_file, state.model_copy(update={"stage": f"{STEP}-{args.percent:g}"}))
    return Outputs(reason=verdict.reason, metrics=metrics, report=str(report))


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.canary --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
