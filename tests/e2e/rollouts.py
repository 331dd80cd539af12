"""What the rollout tests share: the demo adapter, the registry of its versions, a rollout run in a thread."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eksflow.llm.serving.rollout import rollout_pipeline
from eksflow.llm.steps import register
from eksflow.llm.steps.common import adapters, rollout, tracking
from eksflow.llm.steps.common.base_model import DEMO_MODEL
from eksflow.local import run_workflow
from eksflow.render import manifest
from tests.e2e.conftest import DEMO_STEPS, DemoAdapter
from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-lora"
PROMPT = "Rewrite this date in ISO 8601 format (YYYY-MM-DD). Answer with the date only.\nDate: July 4, 1976"


def step(*argv: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False
    )
    assert result.returncode == 0, result.stderr[-5000:]


def demo_adapter_trained(
    tmp_path_factory: pytest.TempPathFactory, model_cache: Path, demo_adapter: DemoAdapter
) -> tuple[Path, Path]:
    """(adapter folder, evaluate's report on it): the session's demo adapter, trained here unless a run made it."""
    if demo_adapter.trained is not None:
        return demo_adapter.trained
    root = tmp_path_factory.mktemp("trained")
    common = [f"--base-model={DEMO_MODEL}", f"--model-cache-dir={model_cache}", f"--dataset-dir={ROOT / 'data/demo'}"]
    step("eksflow.llm.steps.train", *common, f"--output-dir={root / 'train'}", "--launcher=local",
         f"--max-steps={DEMO_STEPS}", f"--outputs-dir={root / 'train-out'}")  # fmt: skip
    adapter = Path((root / "train-out" / "adapter_dir").read_text())
    step("eksflow.llm.steps.evaluate", *common, f"--adapter-dir={adapter}", f"--report-dir={root / 'reports'}",
         "--max-examples=16", "--champion-version=", f"--outputs-dir={root / 'eval-out'}")  # fmt: skip
    demo_adapter.trained = (adapter, root / "reports" / "eval_report.json")
    return demo_adapter.trained


def perturbed(adapter: Path, out: Path, scale: float, seed: int) -> Path:
    """A copy of `adapter` with noise of `scale` added to every LoRA weight (fixed seed)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, out)
    weights = out / "adapter_model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in tensors.items():
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
        tensors[name] = (tensor.float() + scale * noise).to(tensor.dtype)
    save_file(tensors, weights)
    return out


def register_versions(state: Path, adapter: Path, report: Path, root: Path) -> str:
    """The registry's URI: v1 (champion, blue), v2 and v4 (tiny perturbations of v1), v3 (broken), each with
    evaluate's report on `adapter`."""
    db = state / "volumes" / "fsx-claim" / "mlflow" / "mlflow.db"
    uri = f"sqlite:///{db}"
    folders = [
        adapter,
        perturbed(adapter, root / "v2", 1e-7, seed=2),
        perturbed(adapter, root / "v3", 0.5, seed=3),
        perturbed(adapter, root / "v4", 1e-7, seed=4),
    ]
    for i, folder in enumerate(folders, start=1):
        out = register.run(
            register.Args.model_validate(
                {
                    "adapter_dir": folder,
                    "base_model": DEMO_MODEL,
                    "metrics": {"exact_match": 0.9},
                    "dataset_digest": "sha256:" + "d" * 64,
                    "workflow_name": f"llama-lora-v{i}",
                    "tracking_uri": uri,
                    "outputs_dir": root / f"out-{i}",
                }
            )
        )
        assert out.model_version == str(i)
        assert tracking.log_files(uri, out.mlflow_run_id, [report], "eval")  # what evaluate logs to the run
    tracking.promote(uri, MODEL, "1")  # an earlier rollout made v1 champion, in the blue slot
    rollout.tag_version(uri, MODEL, "1", {rollout.SLOT_TAG: "blue"})
    return uri


class Run:
    """A rollout workflow running in a thread, and where to look at it."""

    def __init__(self, state: Path, model_cache: Path, version: str, *overrides: str, nodes: int = 1) -> None:
        cfg = config([f"storage.model_cache={model_cache}", *overrides])
        self.state = state
        self.known = set((state / "runs").glob("*")) if (state / "runs").exists() else set()
        self.result = None
        workflow = manifest(rollout_pipeline(cfg))

        def execute() -> None:
            self.result = run_workflow(workflow, state, cwd=ROOT, parameters={"model_version": version}, nodes=nodes)

        self.thread = threading.Thread(target=execute, daemon=True)
        self.thread.start()

    @property
    def run_dir(self) -> Path:
        deadline = time.monotonic() + 60
        while not (found := set((self.state / "runs").glob("*")) - self.known):
            assert time.monotonic() < deadline, "the run folder did not appear"
            time.sleep(0.2)
        (run_dir,) = found
        return run_dir

    def node(self, name: str) -> dict:
        try:
            return json.loads((self.run_dir / "status.json").read_text())["status"]["nodes"].get(name, {})
        except (OSError, ValueError):
            return {}

    def wait_for(self, name: str, phase: str, timeout_s: float = 1800) -> None:
        deadline = time.monotonic() + timeout_s
        while self.node(name).get("phase") != phase:
            assert self.thread.is_alive() or self.node(name).get("phase") == phase, f"{name} never reached {phase}"
            assert time.monotonic() < deadline, f"{name} not {phase} after {timeout_s} s"
            time.sleep(0.2)

    def finish(self, timeout_s: float = 1800):
        self.thread.join(timeout_s)
        assert self.result is not None, "the run did not finish"
        return self.result

    def report(self, percent: int) -> dict:
        reports = self.state / "volumes" / "fsx-claim" / "runs" / self.run_dir.name / "reports"
        return json.loads((reports / f"canary-{percent}.json").read_text())


def outputs(node: dict) -> dict:
    return {p["name"]: p["value"] for p in node.get("outputs", {}).get("parameters", [])}


def published(registry: str, version: str) -> str:
    """The name a version's adapter is published and served under."""
    return adapters.published_name(MODEL, version, str(adapters.registered_version(registry, MODEL, version).run_id))
