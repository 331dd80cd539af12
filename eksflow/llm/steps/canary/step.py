"""The canary step: measure the candidate at its share of traffic, decide, report; exits 1 when it fails."""

from __future__ import annotations

from dataclasses import replace

from eksflow.llm.steps.canary import STEP, Args, Outputs, fleet
from eksflow.llm.steps.canary.analysis import analyse, decide, no_champion_shortcut
from eksflow.llm.steps.canary.fleet import FleetNote
from eksflow.llm.steps.canary.report import log_to_mlflow, write_report
from eksflow.llm.steps.canary.traffic import (
    Measurement,
    Probe,
    component_down,
    probe_set,
    send_live_traffic,
    send_probes,
    served_metric,
)
from eksflow.llm.steps.common import canary_sizing, rollout
from eksflow.llm.steps.common.evaluation import evaluation
from eksflow.llm.steps.common.rollout import RolloutState
from eksflow.runtime.args import StepFailedError, StepInputError, run_step
from eksflow.runtime.metrics import Metric


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
    # The probes are asked as evaluate asked them, up to the answer cap it generated under (it sizes one from the
    # references when evaluate.max_new_tokens is 0): a model that does not stop early says more under a larger cap.
    args = args.model_copy(update={"max_new_tokens": evaluated.max_new_tokens or args.max_new_tokens})
    metric, scorer = served_metric(args.task_metric, evaluated.task_metrics, state.candidate_version)
    sizing = canary_sizing.live_requests(
        args.percent / 100, args.share_tolerance, canary_sizing.share_z_limit(args.thresholds)
    )
    rollout.log(f"canary at {args.percent:g}%: {sizing.describe()}; the scores are {metric} on the probe rows")
    key = rollout.secret(args.secrets_dir, rollout.VLLM_KEY_FILE)
    discarded: list[str] = []  # each measurement the fleet disturbed, and how
    for attempt in range(1, fleet.MEASUREMENTS + 1):
        before = fleet.snapshot(args, key)
        measured = _measure(args, state, probe_set(evaluated.rows, args.probe_rows, metric), scorer, sizing.requests)
        verdict = decide(args, state, measured.metrics, metric)
        lost = fleet.losses(args, before, key)
        if verdict.passed or not lost or not fleet.serving(args):
            break
        # The fleet lost a replica while the candidate was measured, and still serves: the failures say nothing
        # of the candidate. Measure again once every ready replica answers.
        discarded.append(f"measurement {attempt} ({measured.failed}): {'; '.join(lost)}")
        rollout.log(
            f"not judging v{state.candidate_version} on {discarded[-1]}: the fleet lost a replica while it measured, "
            "so its failures are not the candidate's"
        )
        if attempt == fleet.MEASUREMENTS:
            verdict = replace(
                verdict,
                reason=f"the fleet lost a replica during each of {attempt} measurements, so v"
                f"{state.candidate_version} was not judged: {' | '.join(discarded)}",
            )
            break
        rollout.log(fleet.wait_whole(args) + "; measuring again")
    if not verdict.passed and (down := component_down(args)):
        # The cause first: every metric failing after it is its effect.
        verdict = replace(verdict, reason=f"{down}; {verdict.reason}")
    report = write_report(args, state, metric, verdict, sizing, measured, FleetNote(before.ready, lost, discarded))
    log_to_mlflow(args, state.candidate_version, measured.metrics, report)
    if not verdict.passed:
        raise StepFailedError(
            f"canary analysis at {args.percent:g}% failed for v{state.candidate_version}: {verdict.reason} "
            f"(report: {report}); the exit handler routes traffic back to the champion"
        )
    rollout.write_state(args.state_file, state.model_copy(update={"stage": f"{STEP}-{args.percent:g}"}))
    again = f" (the fleet lost a replica, so measured again: {' | '.join(discarded)})" if discarded else ""
    return Outputs(reason=verdict.reason + again, metrics=measured.metrics, report=str(report))


def _measure(args: Args, state: RolloutState, probes: list[Probe], scorer: Metric, requests: int) -> Measurement:
    """Send the live traffic and the probes, and compute the metrics of both."""
    live = send_live_traffic(args, [p.asked() for p in probes], requests)
    asked = send_probes(args, state, probes, scorer)
    return Measurement(live, probes, asked, analyse(args, state, live, probes, asked))


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m eksflow.llm.steps.canary --name=value ...`."""
    return run_step(Args, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
