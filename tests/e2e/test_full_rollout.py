"""A full fine-tune through the whole flagship: `python pipelines/llama_lora.py run` with `train.finetune=full`
trains every weight, gates and registers the model (kind `model`), and rolls it out as a model of its own over a
whole-model champion: two vLLM Deployments (each version's own fleet, started by the run: nothing here can be
adopted) serve during the canary behind the one LiteLLM proxy, and promote retires the champion's, so one serves
after.

The champion is the demo base model's own weights, registered as a whole model before the run (alias `champion`):
a version of kind `model` with no evaluation report, which the canary asks its generic readiness prompt and the
probe rows. The candidate beats it on the demo task, as the canary's champion rule checks on the same probes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eksflow.llm.steps import register
from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model
from tests.e2e.test_local_run import fsx, nodes, only_run, outputs, pipeline, registered_versions

pytestmark = pytest.mark.slow
# Its run starts two engines (whole models are never adopted): it runs with the modules that start engines, one at a
# time (ENGINE_MODULES in tests/conftest.py; tests/unit/test_engine_modules.py reads this line)
STARTS_ITS_OWN_ENGINES = True
HELD_OUT = 16  # evaluate.max_examples and the canary's probe rows alike
# Full fine-tuning's rate: the LoRA default (1e-3) would wreck every weight; at 1e-4 the 12 demo steps take the
# held-out exact_match from 0.15 to 0.96.
LEARNING_RATE = 1e-4


def register_champion(state: Path, model_cache: Path, tmp_path: Path) -> str:
    """The base model's weights as a whole-model version holding `champion`, in the registry the run will use."""
    folder = tmp_path / "champion-model"
    shutil.copytree(resolve_model(DEMO_MODEL, model_cache), folder)
    (fsx(state) / "mlflow").mkdir(parents=True)
    uri = f"sqlite:///{fsx(state) / 'mlflow' / 'mlflow.db'}"
    args = register.Args.model_validate(
        {"adapter_dir": folder, "base_model": DEMO_MODEL, "metrics": {"exact_match": 0.0}, "tracking_uri": uri,
         "dataset_digest": "sha256:" + "0" * 64, "workflow_name": "by-hand", "outputs_dir": tmp_path / "out"}
    )  # fmt: skip
    registered = register.run(args)
    assert registered.model_kind == "model"
    tracking.client(uri).set_registered_model_alias("llama-lora", tracking.CHAMPION, registered.model_version)
    return registered.model_version


def test_a_full_fine_tune_is_rolled_out_on_a_fleet_of_its_own_and_retires_the_whole_model_champions(
    tmp_path, model_cache
):
    state = tmp_path / "state"
    champion = register_champion(state, model_cache, tmp_path)
    sets = [
        "train.finetune=full", f"train.learning_rate={LEARNING_RATE}", f"evaluate.max_examples={HELD_OUT}",
        f"canary.probe_rows={HELD_OUT}", "canary.weights=[50, 100]",
    ]  # fmt: skip
    result = pipeline("run", *(a for s in sets for a in ("--set", s)), state_dir=state, model_cache=model_cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run_dir = only_run(state)
    status = nodes(run_dir)
    for task in ("train", "evaluate", "register", "publish-champion", "champion-vllm", "serve-champion",
                 "publish-candidate", "candidate-vllm", "load-candidate", "analyze-0", "analyze-50", "analyze-100",
                 "promote", "retire-deployment", "retire-service", "retire-poddisruptionbudget"):  # fmt: skip
        assert status[task]["phase"] == "Succeeded", (task, status[task].get("message"))
    assert all(status[f"onExit.discard-{k}"]["phase"] == "Skipped" for k in ("deployment", "service"))
    assert "prepare-fleet" not in status and "vllm" not in status  # no base model fleet

    # Trained every weight and registered a whole model, gated on the demo task.
    assert json.loads(outputs(status["evaluate"])["metrics"])["exact_match"] >= 0.6
    candidate = outputs(status["register"])["model_version"]
    assert outputs(status["register"])["model_kind"] == "model"

    # Two fleets of their own, each its own engine: the champion's and the candidate's, named by their models.
    champion_fleet = outputs(status["publish-champion"])
    candidate_fleet = outputs(status["publish-candidate"])
    assert (champion_fleet["version"], champion_fleet["own_fleet"]) == (champion, "true")
    assert (candidate_fleet["version"], candidate_fleet["own_fleet"]) == (candidate, "true")
    assert champion_fleet["fleet"] != candidate_fleet["fleet"]
    for fleet in (champion_fleet, candidate_fleet):
        log = (run_dir / "logs" / f"fleet-{fleet['fleet']}.log").read_text(errors="replace")
        assert fleet["served_name"] in log  # each engine served its own published model
    rollout_state = json.loads((fsx(state) / "runs" / run_dir.name / "rollout" / "state.json").read_text())
    assert rollout_state["champion_vllm_url"] != rollout_state["vllm_url"]  # two engines during the canary

    # The pre-traffic analysis asked both models, each on its own engine, and the candidate beat the champion.
    pre = json.loads((fsx(state) / Path(outputs(status["analyze-0"])["report"]).relative_to("/fsx")).read_text())
    assert pre["probes_asked"]["candidate"]["errors"] == 0 and pre["probes_asked"]["champion"]["errors"] == 0
    assert pre["probes_asked"]["champion"]["sent"] == HELD_OUT and pre["metrics"]["score_vs_champion"] > 0

    # Promoted; the former champion's fleet retired: deleted after promote, so one fleet serves after.
    promoted = outputs(status["promote"])
    assert (promoted["champion_version"], promoted["previous_version"]) == (candidate, champion)
    assert promoted["retired"] == champion_fleet["fleet"] and promoted["retires"] == "true"
    assert status["retire-deployment"]["message"].startswith(f"Deployment {champion_fleet['fleet']}")
    versions = {str(v.version): v for v in registered_versions(state)}
    assert versions[candidate].tags["kind"] == "model" and versions[candidate].tags["rollout.phase"] == "Healthy"
    assert outputs(status["onExit.finish-rollout"])["reason"] == "promoted"
