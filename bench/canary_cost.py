"""The canary's requests per step, a fixed count (before issue 20) against the sized one, and the time it implies.

    .venv/bin/python bench/canary_cost.py [--weights 10,50,100] [--share-tolerance 0.25] [--probe-rows 16]
        [--fixed 40] [--seconds-per-request 1.04]

Counts only, nothing is served: the sized live requests come from eksflow.llm.steps.common.canary_sizing with the
default share_z limit; probes are the candidate's and the champion's `--probe-rows` each, sent at every step before and
at the first step only now (reused while nothing changed). The time is an estimate: requests x
`--seconds-per-request`, by default the 70-84 s a step of 40 live requests and 2 x 16 probes took on 2 cores
(~75 s / 72 requests), live and probe requests counted alike (a live answer is capped at 8 tokens, a probe's
date answer is about as long). The real cost is what the rollout e2e run measures.
"""

from __future__ import annotations

import argparse

from eksflow.llm.steps.canary import CanarySettings
from eksflow.llm.steps.common import canary_sizing


def main() -> None:
    """Print the per-step table and the totals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="10,50,100")
    parser.add_argument("--share-tolerance", type=float, default=CanarySettings().share_tolerance)
    parser.add_argument("--probe-rows", type=int, default=CanarySettings().probe_rows)
    parser.add_argument("--fixed", type=int, default=40, help="the former fixed live requests per step")
    parser.add_argument("--seconds-per-request", type=float, default=75 / 72)
    args = parser.parse_args()
    z = canary_sizing.share_z_limit(CanarySettings().thresholds)
    probes, s = 2 * args.probe_rows, args.seconds_per_request
    print("| step | before: live + probes | now: live + probes | estimated s before / now |")
    print("| --- | --- | --- | --- |")
    before_all = now_all = 0
    for i, weight in enumerate(float(w) for w in args.weights.split(",")):
        sized = canary_sizing.live_requests(weight / 100, args.share_tolerance, z).requests
        sent = probes if i == 0 else 0  # asked at the first step, reused after
        before, now = args.fixed + probes, sized + sent
        before_all, now_all = before_all + before, now_all + now
        print(f"| {weight:g}% | {args.fixed} + {probes} | {sized} + {sent} | {before * s:.0f} / {now * s:.0f} |")
    saved = 1 - now_all / before_all
    print(f"| all | {before_all} | {now_all} | {before_all * s:.0f} / {now_all * s:.0f} ({saved:.0%} less) |")


if __name__ == "__main__":
    main()
