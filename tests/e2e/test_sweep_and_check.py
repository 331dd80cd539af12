"""The two other pipelines end to end: a LoRA sweep registers its best candidate, then the champion check
re-evaluates that version, records the verdict on it, and fails loudly when it regressed.

What these runs check is the pipelines' wiring (a fan-out of training jobs, selection, registration, the check's
verdict and alert), not what a model learns (the flagship's test does), so they fine-tune the session's tiny random
Llama (tests/e2e/conftest.py) against an eval-loss threshold any model meets, and the sweep's candidates train as
MPIJobs (`cluster.launcher=mpijob`, mpirun on this machine): a fan-out of resource templates, without two local
Ray clusters starting beside each other."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
TINY = ["--set", "evaluate.max_examples=4", "--set", "evaluate.batch_size=4"]


def run(pipeline: str, state: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / f"{pipeline}.py"), "run", "--state-dir", str(state), *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )


def outputs(state: Path, pipeline: str) -> dict[str, dict[str, str]]:
    (status,) = [p for p in (state / "runs").glob(f"{pipeline}-*/status.json")]
    nodes = json.loads(status.read_text())["status"]["nodes"]
    return {
        node["displayName"]: {p["name"]: p["value"] for p in node.get("outputs", {}).get("parameters", [])}
        for node in nodes.values()
    }


def test_sweep_registers_the_best_candidate_then_the_check_records_and_alerts(tmp_path, tiny_llama):
    state = tmp_path / "state"
    swept = run(
        "lora_sweep",
        state,
        "--set",
        f"base_model={tiny_llama}",
        *TINY,
        "--set",
        "cluster.launcher=mpijob",
        "--set",
        "sweep.ranks=[4,8]",
        "--set",
        "sweep.parallelism=2",  # both candidates at once: each trains as one rank, on one core
        "--set",
        "train.max_steps=2",
        "--set",
        "train.num_workers=1",
        "--set",
        "evaluate.thresholds=[{metric: eval_loss, op: '<=', value: 100.0}]",
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    found = outputs(state, "lora-sweep")
    assert found["select-best"]["found"] == "true"
    assert found["select-best"]["name"] in ("r4-lr0.001", "r8-lr0.001")
    assert found["select-best"]["reason"].startswith(found["select-best"]["name"] + " is best by exact_match: ")
    version = found["register"]["model_version"]
    (page,) = (state / "runs").glob("lora-sweep-*/report.html")  # the exit handler's report, every candidate on it
    assert all(f"r{rank}-lr0.001" in page.read_text() for rank in (4, 8))

    # a rollout would promote it; here the alias is set directly, as `rollback` or an operator would
    sys.path.insert(0, str(ROOT))
    from eksflow.llm.steps.common import tracking

    uri = f"sqlite:///{state / 'volumes' / 'fsx-claim' / 'mlflow' / 'mlflow.db'}"
    tracking.set_alias(tracking.client(uri), "llama-lora", tracking.CHAMPION, version)

    checked = run(  # the champion's base model is the one its version was registered with
        "champion_check",
        state,
        *TINY,
        "--set",
        "evaluate.thresholds=[{metric: eval_loss, op: '<=', value: 100.0}]",
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    regressed = run(  # the same store and volume: the adapter's artifacts live on this run's FSx
        "champion_check",
        state,
        *TINY,
        "--set",
        "evaluate.thresholds=[{metric: base_exact_match, op: '>=', value: 1.0}]",  # the base model answers in prose
    )
    assert regressed.returncode == 1
    assert len(list((state / "runs").glob("champion-check-*/report.html"))) == 2  # a failed run is reported too
    assert f"llama-lora version {version} REGRESSED" in regressed.stderr
    tags = tracking.client(uri).get_model_version("llama-lora", version).tags
    assert tags["check.passed"] == "false" and "exact_match" in tags["check.reason"]
