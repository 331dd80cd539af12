"""Preference tuning through the whole flagship: `python pipelines/llama_lora.py run` with `train.method=dpo` on
preference pairs stages, validates and trains them, gates the adapter on preference_accuracy, registers it, and the
canary rolls it out and promotes it through the real vLLM engine and LiteLLM proxy.

The pairs are the demo's date rows (data/demo), made here: each prompt's ISO date is `chosen`, and `rejected` is the
date as the prompt wrote it, which the base model often echoes (it ranks it above the ISO date on most held-out
pairs). The canary asks the served candidate each held-out prompt and scores its answer against `chosen`, as
evaluate scored its own. The run adopts the session's engine (tests/e2e/conftest.py); its LiteLLM proxy is its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_local_run import nodes, on_host, only_run, outputs, pipeline, registered_versions, training_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TRAIN_PAIRS = 128  # 8 steps' worth at 16 pairs a step: the run trains DPO_STEPS of them
DPO_STEPS = 4  # the held-out preference_accuracy goes from ~0.3 (base) to ~1.0 in 4 steps
# A DPO learning rate (the demo's SFT one, 1e-3, ranked every held-out pair right in 4 steps while its answers went
# from 3 of 16 right to none, running on past the date)
LEARNING_RATE = 3e-4
HELD_OUT = 16  # evaluate.max_examples and the canary's probe rows alike


def preference_pairs(folder: Path) -> Path:
    """train.jsonl and eval.jsonl of the demo's rows as preference pairs (see the module docstring)."""
    folder.mkdir()
    for split, count in (("train", TRAIN_PAIRS), ("eval", None)):
        lines = (ROOT / "data" / "demo" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()][:count]
        pairs = [
            {"prompt": r["prompt"], "chosen": r["completion"], "rejected": r["prompt"].rsplit("Date: ", 1)[1]}
            for r in rows
        ]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    return folder


def test_a_dpo_run_is_gated_on_preference_accuracy_registered_and_promoted_by_the_canary(
    tmp_path, model_cache, adopt_engine
):
    data = preference_pairs(tmp_path / "prefs")
    rules = "{metric: preference_accuracy_gain, value: 0.2}, {metric: preference_accuracy, value: 0.75}"
    sets = [
        f"data.source={data}", "train.method=dpo", f"train.max_steps={DPO_STEPS}",
        f"train.learning_rate={LEARNING_RATE}", f"evaluate.max_examples={HELD_OUT}", f"evaluate.thresholds=[{rules}]",
        f"canary.probe_rows={HELD_OUT}",
    ]  # fmt: skip
    result = pipeline(
        "run", *(a for s in sets for a in ("--set", s)), state_dir=tmp_path / "state", model_cache=model_cache
    )
    state = tmp_path / "state"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    status = nodes(only_run(state))
    for task in ("validate-data", "train", "evaluate", "register", "load-candidate", "analyze-0", "analyze-100"):
        assert status[task]["phase"] == "Succeeded", (task, status[task].get("message"))

    # The gate: DPO taught the held-out pairs' ranking the base model mostly got wrong.
    scores = outputs(status["evaluate"])
    metrics = json.loads(scores["metrics"])
    assert scores["passed"] == "true"
    assert metrics["base_preference_accuracy"] <= 0.5 and metrics["preference_accuracy"] >= 0.75, metrics
    assert metrics["preference_accuracy_gain"] == pytest.approx(
        metrics["preference_accuracy"] - metrics["base_preference_accuracy"]
    )
    # Registered with the metrics that gated it, and trained as DPO (the version's training run says how).
    (version,) = registered_versions(state)
    assert float(version.tags["metric.preference_accuracy"]) == pytest.approx(metrics["preference_accuracy"], abs=1e-6)
    assert version.tags["gate.decision"] == "passed" and version.tags["kind"] == "adapter"
    assert training_run(state, version.run_id).data.params["method"] == "dpo"

    # Evaluate scored each held-out prompt's answer against `chosen`; the canary asked the served candidate the same
    # prompts, up to the same answer cap, and its score on them is the evaluated one (RO3).
    pairs = [json.loads(line) for line in (data / "eval.jsonl").read_text().splitlines()][:HELD_OUT]
    evaluated = json.loads(on_host(state, scores["report"]).read_text())
    assert [(r["prompt"], r["reference"]) for r in evaluated["rows"]] == [(p["prompt"], p["chosen"]) for p in pairs]
    pre = json.loads(on_host(state, outputs(status["analyze-0"])["report"]).read_text())
    assert (pre["probes_asked"]["candidate"]["sent"], pre["probes_asked"]["candidate"]["errors"]) == (HELD_OUT, 0)
    assert [(p["prompt"], p["reference"]) for p in pre["probes"]] == [(p["prompt"], p["chosen"]) for p in pairs]
    assert pre["metrics"]["served_gap"] <= 0.125 and pre["passed"]  # within noise: bfloat16 served, float32 evaluated
    assert outputs(status["promote"])["champion_version"] == outputs(status["register"])["model_version"]
    assert outputs(status["onExit.finish-rollout"])["reason"] == "promoted"
