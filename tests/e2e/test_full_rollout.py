"""A full fine-tune through the whole flagship: `python pipelines/llama_lora.py run` with `train.finetune=full`
trains every weight, gates and registers the model (kind `model`), and rolls it out as a model of its own over a
whole-model champion: two vLLM Deployments (each version's own fleet, started by the run: nothing here can be
adopted) serve during the canary behind the one LiteLLM proxy, and promote retires the champion's, so one serves
after. `make serve` then serves the promoted model as it is.

The champion is a DoRA adapter on the demo base registered before the run (alias `champion`): register merges it
into its base (vLLM cannot serve DoRA as a LoRA), a version of kind `model` served by a fleet of its own, with no
evaluation report. Its update is zero, so it answers as the base does, and the candidate beats it on the demo task,
as the canary's champion rule checks on the same probes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from eksflow.llm.steps import register
from eksflow.llm.steps.common import tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model
from tests.e2e.test_local_run import (
    ANSWER_TOKENS,
    fsx,
    nodes,
    on_host,
    only_run,
    outputs,
    pipeline,
    registered_versions,
    serving,
)

pytestmark = pytest.mark.slow
# Its run starts two engines (whole models are never adopted): it runs with the modules that start engines, one at a
# time (ENGINE_MODULES in tests/conftest.py; tests/unit/test_engine_modules.py reads this line)
STARTS_ITS_OWN_ENGINES = True
HELD_OUT = 16  # evaluate.max_examples and the canary's probe rows alike
# Full fine-tuning's rate: the LoRA default (1e-3) would wreck every weight; at 1e-4 the 12 demo steps take the
# held-out exact_match from 0.15 to 0.96.
LEARNING_RATE = 1e-4


def register_champion(state: Path, model_cache: Path, tmp_path: Path) -> str:
    """A DoRA adapter on the demo base, as peft makes it (its update zero: the base's own answers), registered in the
    registry the run will use and given `champion`: register merges it into its base (vLLM cannot serve DoRA as a
    LoRA), so it is served as a whole model, by a fleet of its own."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from eksflow.llm.steps.train import LoraSettings

    base = AutoModelForCausalLM.from_pretrained(resolve_model(DEMO_MODEL, model_cache))
    dora = LoraSettings(use_dora=True, rank=4)
    get_peft_model(base, dora.peft_config()).save_pretrained(tmp_path / "dora")
    (fsx(state) / "mlflow").mkdir(parents=True)
    uri = f"sqlite:///{fsx(state) / 'mlflow' / 'mlflow.db'}"
    args = register.Args.model_validate(
        {"adapter_dir": tmp_path / "dora", "base_model": DEMO_MODEL, "model_cache_dir": model_cache,
         "metrics": {"exact_match": 0.0}, "tracking_uri": uri, "dataset_digest": "sha256:" + "0" * 64,
         "workflow_name": "by-hand", "outputs_dir": tmp_path / "out"}
    )  # fmt: skip
    registered = register.run(args)
    assert registered.model_kind == "model"  # merged: served as a model of its own
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
    pre = json.loads(on_host(state, outputs(status["analyze-0"])["report"]).read_text())
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

    # `make serve` serves the promoted whole model as it is: a held-out row gets the answer evaluate's report holds.
    rows = json.loads(on_host(state, outputs(status["evaluate"])["report"]).read_text())["rows"]
    row = next(r for r in rows if r["answer"] == r["reference"])  # an answer that ended (EOS)
    with serving(state, model_cache) as (url, key):
        body = {"model": "llama-lora", "messages": [{"role": "user", "content": row["prompt"]}],
                "max_tokens": ANSWER_TOKENS, "temperature": 0}  # fmt: skip
        answer = requests.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        assert answer.status_code == 200, answer.text
        assert str(answer.json()["choices"][0]["message"]["content"]).strip() == row["answer"]
