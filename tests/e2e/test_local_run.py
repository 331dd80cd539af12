"""The whole pipeline, as a user runs it: `python pipelines/llama_lora.py run` on the real SmolLM2 on CPU.

Real components throughout: Ray Train (2 DDP workers), great-expectations, MLflow (sqlite on the run volume),
and the serving fleet: a real vLLM engine (the CPU build) and a real LiteLLM proxy, started by the run.
"""

import contextlib
import io
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from rich.console import Console

from eksflow.local import run_workflow
from eksflow.local.resources import nvidia_gpus
from eksflow.runtime.ports import free_port
from tests import flagship
from tests.e2e.conftest import DEMO_STEPS, DemoAdapter
from tests.e2e.processes import serving_processes

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "llama_lora.py"
ANSWER_TOKENS = 32  # a demo answer (an ISO date) ends with EOS in far fewer


def pipeline(command_name, *args, state_dir: Path, model_cache: Path | None = None, timeout: int = 1500, env=None):
    command = [sys.executable, str(PIPELINE), command_name, *args]
    if command_name == "run":
        command += ["--state-dir", str(state_dir)]
    if model_cache is not None:
        command += ["--set", f"storage.model_cache={model_cache}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=env)


FLAGSHIP_TASKS = (
    "champion", "stage-data", "validate-data", "train", "evaluate", "register", "prepare-fleet", "vllm",
    "vllm-service", "vllm-pdb", "proxy-config", "proxy", "proxy-service", "proxy-pdb", "vllm-policy", "proxy-policy",
    "serve-champion", "load-candidate", "analyze-0", "shift-10", "analyze-10", "shift-50", "analyze-50",
    "shift-100", "analyze-100", "promote",
    "onExit", "onExit.finish-rollout", "onExit.report",  # the exit handler's DAG node, as Argo names it, and its tasks
)  # fmt: skip


def fsx(state_dir: Path) -> Path:
    return state_dir / "volumes" / "fsx-claim"


def on_host(state_dir: Path, path: str) -> Path:
    """Where a task's /fsx path (an output of the run) lies on this machine."""
    return fsx(state_dir) / Path(path).relative_to("/fsx")


def fleet_name(status: dict) -> str:
    return outputs(status["prepare-fleet"])["fleet"]


@contextlib.contextmanager
def serving(
    state_dir: Path,
    model_cache: Path,
    model_name: str = "llama-lora",
    python: Path = Path(sys.executable),
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Iterator[tuple[str, str]]:
    """`python -m eksflow.llm.steps.serve` of the run's champion (what `make serve` runs), its curl line answered by
    the model it names; the chat completions URL and the key it printed. Ctrl-C stops it, with its engine's every
    process. The demo's curl line asks the demo task: a llama-lora champion answers it right."""
    db = fsx(state_dir) / "mlflow" / "mlflow.db"
    command = [
        str(python), "-m", "eksflow.llm.steps.serve", f"--model-name={model_name}", f"--tracking-uri=sqlite:///{db}",
        f"--model-cache-dir={model_cache}", f"--serve-dir={state_dir / 'serve'}", f"--port={free_port()}",
    ]  # fmt: skip
    before = serving_processes()
    serve = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        while not any(line.strip().startswith("curl ") for line in lines):
            line = serve.stdout.readline()
            if not line:
                pytest.fail(f"serve exited ({serve.wait()}) without a curl line:\n{serve.stderr.read()[-5000:]}")
            lines.append(line)
        curl = next(line.strip() for line in lines if line.strip().startswith("curl "))
        answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=300, check=True).stdout
        assert f'"model":"{model_name}"' in answer.replace(" ", "")
        if model_name == "llama-lora":
            assert "1976-07-04" in json.loads(answer)["choices"][0]["message"]["content"]
        words = shlex.split(curl)
        yield words[2], words[words.index("-H") + 1].removeprefix("Authorization: Bearer ")
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C: the engine and its processes stop with it
        assert serve.wait(timeout=120) in (0, 130)
    assert serving_processes() <= before  # the engine and its core and worker processes are gone


def assert_serve_answers_through_the_adapter(state_dir: Path, model_cache: Path, eval_report: Path) -> None:
    with serving(state_dir, model_cache) as (url, key):
        adapter = state_dir / "serve" / "llama-lora" / "v1"  # what serve downloaded: the registered adapter
        assert_answers_as_evaluate(url, key, model_cache, adapter, json.loads(eval_report.read_text())["rows"])


def assert_answers_as_evaluate(url: str, key: str, model_cache: Path, adapter: Path, rows: list[dict]) -> None:
    """Greedy decoding, served as evaluated: a held-out row's answer is the one in evaluate's report, and a two-turn
    conversation (a held-out row, evaluate's answer to it, then another row's prompt) gets the answer evaluate's
    generation (modeling.generate, the adapter merged, as scoring does) gives its history."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from eksflow.llm.steps.common import modeling
    from eksflow.llm.steps.common.base_model import DEMO_MODEL, resolve_model

    def served(messages: list[dict[str, str]]) -> str:
        body = {"model": "llama-lora", "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0}
        answer = requests.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["choices"][0]["message"]["content"]).strip()

    first, second = [row for row in rows if row["answer"] == row["reference"]][:2]  # answers that ended (EOS)
    history = [
        {"role": "user", "content": first["prompt"]},
        {"role": "assistant", "content": first["answer"]},
        {"role": "user", "content": second["prompt"]},
    ]
    model_dir = resolve_model(DEMO_MODEL, model_cache)
    tokenizer = modeling.load_tokenizer(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()
    with torch.inference_mode():
        (evaluated,), _ = modeling.generate(model, tokenizer, [history], batch_size=1, max_new_tokens=ANSWER_TOKENS)
    assert served([{"role": "user", "content": second["prompt"]}]) == second["answer"]  # the report's answer
    assert served(history) == evaluated, (history, evaluated)


def only_run(state_dir: Path) -> Path:
    (run_dir,) = (state_dir / "runs").iterdir()
    return run_dir


def nodes(run_dir: Path) -> dict:
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"]["phase"] in {"Succeeded", "Failed", "Error"}
    return status["status"]["nodes"]


def outputs(node: dict) -> dict:
    return {p["name"]: p["value"] for p in node.get("outputs", {}).get("parameters", [])}


def registered_versions(state_dir: Path) -> list:
    from mlflow import MlflowClient

    db = state_dir / "volumes" / "fsx-claim" / "mlflow" / "mlflow.db"
    if not db.exists():
        return []
    uri = f"sqlite:///{db}"
    # registry_uri too: MlflowClient's default is the process's registry URI, which an in-process step of another
    # module (test_rollout's register.run) may have set to its own database
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return client.search_model_versions("name = 'llama-lora'")


def training_client(state_dir: Path):
    from mlflow import MlflowClient

    db = state_dir / "volumes" / "fsx-claim" / "mlflow" / "mlflow.db"
    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def training_run(state_dir: Path, run_id: str):
    return training_client(state_dir).get_run(run_id)


def start_run(*args: str, state_dir: Path, model_cache: Path) -> subprocess.Popen[str]:
    command = [sys.executable, str(PIPELINE), "run", *args, "--state-dir", str(state_dir)]
    command += ["--set", f"storage.model_cache={model_cache}"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the run ended (exit {proc.returncode}) before the condition held:\n{err[-5000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(1)


@pytest.mark.slow
def test_full_run_survives_an_interrupt_then_skips_training_on_unchanged_data(
    tmp_path, model_cache, demo_adapter: DemoAdapter
):
    """Ctrl-C during training, `run --resume`, a fine-tuned model served; then a cron-style run on the same data.

    The default steps: 12 steps of 16 examples teach the date format (what is asserted); scored on the 16 held-out
    rows the canary probes with. The adapter it trains is the session's demo adapter
    (tests/e2e/conftest.py)."""
    # Every later command gives them again (a resume with other values is refused).
    steps = ("--set", f"train.max_steps={DEMO_STEPS}", "--set", "evaluate.max_examples=16")
    proc = start_run(*steps, state_dir=tmp_path, model_cache=model_cache)
    committed = lambda: any((tmp_path / "volumes").glob("fsx-claim/runs/*/train/checkpoints/step-*"))  # noqa: E731
    wait_for(committed, proc, timeout_s=1200)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends: the executor stops the train task (SIGTERM)
    _, interrupted = proc.communicate(timeout=300)
    assert proc.returncode == 130  # 128 + SIGINT, like a shell reports Ctrl-C
    run_dir = only_run(tmp_path)
    assert nodes(run_dir)["train"]["phase"] == "Failed"
    assert f"--resume {run_dir.name}" in interrupted
    # Ctrl-C's promise kept: the workers (Ray's processes, which the stop no longer signals) committed, then went
    interrupted_log = (run_dir / "logs" / "train.log").read_text()
    stopped = re.search(r"rank 0: stop requested; checkpoint step (\d+) committed", interrupted_log)
    assert stopped, interrupted_log[-3000:]

    result = pipeline("run", "--resume", run_dir.name, *steps, state_dir=tmp_path, model_cache=model_cache)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    status = nodes(run_dir)
    assert {name: node["phase"] for name, node in status.items()} == {name: "Succeeded" for name in FLAGSHIP_TASKS}
    train_log = (run_dir / "logs" / "train.log").read_text()
    # the retry continued from the checkpoint committed at Ctrl-C, and the loss curve has each step once
    assert f"resumed from step-{int(stopped[1]):08d} (step {stopped[1]})" in train_log, train_log[-3000:]
    run_id = outputs(status["train"])["mlflow_run_id"]
    logged = [m.step for m in training_client(tmp_path).get_metric_history(run_id, "loss")]
    assert logged and len(logged) == len(set(logged)), logged
    scores = outputs(status["evaluate"])
    metrics = json.loads(scores["metrics"])
    assert scores["passed"] == "true"
    assert metrics["exact_match"] >= metrics["base_exact_match"] + 0.2  # the fine-tune clearly helps held-out
    demo_adapter.trained = (
        on_host(tmp_path, outputs(status["train"])["adapter_dir"]),
        on_host(tmp_path, scores["report"]),
    )
    version = outputs(status["register"])["model_version"]
    # Deployed through vLLM: no champion yet, so every canary step gave the candidate all traffic and passed.
    assert outputs(status["promote"])["champion_version"] == version
    assert outputs(status["onExit.finish-rollout"]) == {
        "phase": "Healthy",
        "reason": "promoted",
        "champion_serving": "",
        "candidate_left_on": "",  # promoted: every replica serves it as the champion now
        "discarded": "",  # an adapter: no fleet of its own to delete
        "discards": "false",
    }
    # The pre-traffic analysis asks the candidate the 16 probe rows at weight 0. No champion: every step gives the
    # candidate all traffic, so the 100 % step is the one live analysis, sized to see a 0.25 leak at z = 4 (34
    # requests), reusing the probe answers; the steps before it pass at once and say why.
    pre = json.loads(on_host(tmp_path, outputs(status["analyze-0"])["report"]).read_text())
    assert pre["passed"] and pre["live_traffic"]["requests"] == 0
    assert (pre["probes_asked"]["candidate"]["sent"], pre["probes_asked"]["candidate"]["errors"]) == (16, 0)
    assert pre["metrics"]["served_gap"] <= 0.125  # served == evaluated on the probe rows (RO3)
    for percent in (10, 50):
        assert outputs(status[f"analyze-{percent}"])["reason"].startswith("no champion served: "), percent
    report = json.loads(on_host(tmp_path, outputs(status["analyze-100"])["report"]).read_text())
    assert report["passed"] and report["live_traffic"]["served_by"] == {"llama-lora-blue": 34}
    assert report["probes_asked"]["candidate"]["reused_from"] == "analyze-0"
    assert report["metrics"]["served_gap"] <= 0.125
    assert "vllm.entrypoints.openai.api_server" in (run_dir / "logs" / f"fleet-{fleet_name(status)}.log").read_text()

    # What the user sees at the end: base and tuned scores, the decision, the version, the champion.
    for shown in ("base_exact_match", "passed = true", f"model_version = {version}", f"champion_version = {version}"):
        assert shown in result.stderr

    # `make serve`: vLLM serves the champion's adapter as `llama-lora`; the curl line it prints works.
    assert_serve_answers_through_the_adapter(tmp_path, model_cache, on_host(tmp_path, scores["report"]))

    # The run's page, printed as a host path; the train run it plots was ended by the exit handler.
    page = run_dir / "report.html"
    assert f"report: {page}" in result.stderr
    assert page.read_text().count("<polyline class='series'") >= 2  # loss and learning rate
    assert training_run(tmp_path, outputs(status["train"])["mlflow_run_id"]).info.status == "FINISHED"

    # The manifest that ran is the one `render` prints (for the data folder `run` resolved from the caller's
    # folder: data/demo as an absolute path), and lineage reached the registry.
    source = f"data.source={ROOT / 'data' / 'demo'}"
    rendered = pipeline("render", "--set", source, *steps, state_dir=tmp_path, model_cache=model_cache)
    assert yaml.safe_load((run_dir / "manifest.yaml").read_text()) == yaml.safe_load(rendered.stdout)
    (registered,) = registered_versions(tmp_path)
    assert registered.tags["workflow_name"] == run_dir.name
    dataset_digest = outputs(status["stage-data"])["dataset_digest"]
    assert registered.tags["dataset_digest"] == dataset_digest

    # A scheduled run (retrain=if-data-changed) on the same data: nothing after validation runs.
    again = pipeline("run", *steps, "--set", "retrain=if-data-changed", state_dir=tmp_path, model_cache=model_cache)
    assert again.returncode == 0, again.stderr[-5000:]
    (second,) = [d for d in (tmp_path / "runs").iterdir() if d != run_dir]
    status = nodes(second)
    assert outputs(status["champion"]) == {"version": version, "dataset_digest": dataset_digest}
    assert outputs(status["stage-data"])["changed"] == "false"
    assert status["train"]["phase"] == "Skipped" and status["prepare-fleet"]["phase"] == "Skipped"  # no engine
    unchanged = f"data unchanged since champion v{version} (sha256:{dataset_digest.removeprefix('sha256:')[:12]})"
    assert status["train"]["message"] == status["prepare-fleet"]["message"] == unchanged  # not the when expression
    assert unchanged in (second / "report.html").read_text()
    assert {status[t]["phase"] for t in ("evaluate", "register", "vllm", "load-candidate", "promote")} == {"Omitted"}
    assert outputs(status["onExit.finish-rollout"])["reason"] == "no candidate"
    assert len(registered_versions(tmp_path)) == 1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.learning_rate=-1", "train.learning_rate: Input should be greater than 0 (got -1)"),
        ("train.lr=0.1", "train.lr: unknown key; valid keys in train:"),
        ("data.source=/no/such/dataset", "data.source: '/no/such/dataset' does not exist"),
    ],
    ids=["out-of-range", "unknown-key", "missing-dataset"],
)
def test_bad_config_exits_2_before_anything_runs(tmp_path, override, expected):
    result = pipeline("run", "--set", override, state_dir=tmp_path)
    assert result.returncode == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.skipif(nvidia_gpus()[0] >= 4, reason="this machine has the 4 GPUs the g5.12xlarge RayJob asks for")
def test_gpu_workflow_runs_here_until_train_asks_for_gpus(tmp_path, model_cache, adopt_engine):
    """The g5.12xlarge variant stages and validates here; its RayJob is refused with the way out. Its fleet adopts
    the session's engine: the engine is not what this run is about."""
    result = run_workflow(
        flagship.rendered(["cluster.instance_type=g5.12xlarge", f"storage.model_cache={model_cache}"]),
        tmp_path / "state",
        cwd=ROOT,
        console=Console(file=io.StringIO()),
    )
    assert result.nodes["stage-data"].phase == "Succeeded"
    assert result.nodes["validate-data"].phase == "Succeeded"
    train = result.nodes["train"]
    assert train.phase == "Failed"
    assert train.message.startswith("the RayJob needs 4 NVIDIA GPUs (workerGroupSpecs[0] 'gpu': 1 pod x 4 ")
    assert "`run --variant cpu`" in train.message
    assert result.nodes["train-outputs"].phase == "Omitted"
    assert result.phase == "Failed"
