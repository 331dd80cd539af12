"""`make check-images`: run every step inside its built image as its pod runs it.

    python -m images.check [--image steps=TAG] [--image serve-cpu=TAG] [--config FILE]

Each command runs in a working container of the image (buildah, chroot isolation) as the pods run it: uid 1000
and gid 0 (the restricted security context sets runAsUser and no runAsGroup), no capability, the env the rendered
template gives the container, FSx at its mount path. The templates are the rendered ones that ship
(workflow-templates/, kept fresh by `make check-templates`), so a check runs each step with the pod's own args.

- every image: its own USER is the pods' user and its WORKDIR /app; nothing of the build's pip configuration
  stayed in it, and its history records no credential and no address of this machine's pip configuration;
- steps: every step's `--help`; validate_data on the demo data, then evaluate on a tiny model, both with the
  args of their templates in the flagship WorkflowTemplate;
- a user's project built FROM the steps image (tests/fixtures/text2sql, its Containerfile): its own step's
  `--help`; eksflow's stage_data on the project's data, then the project's own step on what it staged, then
  eksflow's evaluate scoring with the project's own metric, each with the args of the project's rendered template;
- serve-cpu: the `--help` of what the vLLM Deployment runs (vLLM's OpenAI server, the readiness probe's module),
  then the engine itself with the Deployment's command and env, until the readiness probe gets a real answer
  (steps first: validate_data converts the demo model onto FSx, where the engine reads it).

One line per check; exit 1 when any failed, naming each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eksflow.local.process import stop_tree
from eksflow.runtime.shown import url_credential
from images import buildah, pipconf
from images.build import ROOT, STATE, images
from images.buildah import Build, Container, ImagesError, last_line, without_trailer

TEMPLATES = ROOT / "workflow-templates"
PROJECT = ROOT / "tests" / "fixtures" / "text2sql"  # a user's project: its own steps, metric and Containerfile
PROJECT_TAG = "localhost/eksflow-check/text2sql:check"
CHECKS = ROOT / "images" / "checks"
FSX = "/fsx"
OUTPUTS = "/tmp/outputs"
ENGINE_START_S = 600  # the Deployment's startupProbe allows 20 minutes; the demo model on 2 cores starts in ~1
POD_GROUP = "0"  # no runAsGroup in the pods' security context: the runtime's primary group is root's


@dataclass
class Result:
    """One check: what it ran, and why it failed ("" when it passed)."""

    image: str
    what: str
    failure: str = ""


def step_modules() -> list[str]:
    """Every step of eksflow/llm/steps/: a module with a main(), or a package with a __main__."""
    steps = ROOT / "eksflow" / "llm" / "steps"
    found = [f"eksflow.llm.steps.{p.stem}" for p in steps.glob("*.py") if "def main(" in p.read_text(encoding="utf-8")]
    found += [f"eksflow.llm.steps.{p.parent.name}" for p in steps.glob("*/__main__.py")]
    return sorted(found)


def workflow_template(name: str) -> dict[str, Any]:
    """The rendered WorkflowTemplate workflow-templates/<name>.yaml."""
    loaded: dict[str, Any] = yaml.safe_load((TEMPLATES / f"{name}.yaml").read_text(encoding="utf-8"))
    return loaded


def container_of(workflow: dict[str, Any], template: str) -> dict[str, Any]:
    """The container of `template` in `workflow`."""
    for found in workflow["spec"]["templates"]:
        if found["name"] == template and "container" in found:
            container: dict[str, Any] = found["container"]
            return container
    raise ImagesError(f"no container template {template!r} in {workflow['metadata']['name']}: run `make templates`")


def substituted(text: str, values: dict[str, str]) -> str:
    """`text` with Argo's `{{name}}` placeholders filled from `values`; ImagesError on one it does not know."""

    def fill(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise ImagesError(f"the check has no value for {{{{{match[1]}}}}} in {text!r}")
        return values[match[1]]

    return re.sub(r"\{\{\s*([\w.\-]+)\s*\}\}", fill, text)


def pod_command(workflow: dict[str, Any], template: str, values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a template's container with its placeholders filled: the workflow's parameters, then `values`."""
    container = container_of(workflow, template)
    defaults = {f"workflow.parameters.{p['name']}": str(p.get("value", "")) for p in
                workflow["spec"].get("arguments", {}).get("parameters", [])}  # fmt: skip
    known = {**defaults, "workflow.name": "check-images", **values}
    argv = [substituted(part, known) for part in [*container["command"], *container.get("args", [])]]
    return argv, container_env(container)


def evaluate_inputs(tiny: str) -> dict[str, str]:
    """The evaluate template's values in a check: the tiny model and adapter at `tiny`, and no champion yet."""
    return {"inputs.parameters.adapter_dir": f"{tiny}/adapter", "inputs.parameters.mlflow_run_id": "",
            "inputs.parameters.champion_version": "", "workflow.parameters.base_model": f"{tiny}/model"}  # fmt: skip


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's literal env (values from Secrets are left out: no check reads them)."""
    return {item["name"]: str(item["value"]) for item in container.get("env", []) if "value" in item}


def pod_user(container: dict[str, Any], pod: dict[str, Any] | None = None) -> str:
    """The uid the container runs as: its own security context's runAsUser, else its pod's."""
    for context in (container.get("securityContext", {}), (pod or {}).get("securityContext", {})):
        if "runAsUser" in context:
            return str(context["runAsUser"])
    raise ImagesError(f"container {container.get('name')!r} sets no runAsUser: it would run as the image's user")


class Checker:
    """The checks of one image, run in one working container; results gathered, never raised."""

    def __init__(self, name: str, image: str, fsx: Path) -> None:
        self.name = name
        self.image = image
        self.fsx = fsx  # one FSx volume for every image of a check run, as in the cluster
        self.results: list[Result] = []
        self.work = STATE / "check" / name
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "outputs").mkdir(parents=True)

    def record(self, what: str, failure: str = "") -> bool:
        """Note and print a check's result; whether it passed."""
        self.results.append(Result(self.name, what, failure))
        print(f"  {'FAIL' if failure else 'ok  '}  {what}{': ' + failure if failure else ''}", flush=True)
        return not failure

    def image_config(self, user: str) -> None:
        """The image's own USER and WORKDIR: a pod without runAsUser, or `docker run`, gets the image's."""
        config = buildah.inspect(self.image).get("OCIv1", {}).get("config", {})
        own = str(config.get("User", "")) or "root"
        self.record(f"USER is {user}", "" if own.split(":")[0] == user else f"the image runs as {own!r}")
        workdir = str(config.get("WorkingDir", ""))
        self.record("WORKDIR is /app", "" if workdir == "/app" else f"the image's workdir is {workdir!r}")

    def history(self, host_pip: dict[str, str]) -> None:
        """The image's history, which records every build argument a RUN step saw: no credential, no host index."""
        found = buildah.inspect(self.image)
        entries = [*(found.get("History") or []), *(found.get("OCIv1", {}).get("history") or [])]
        recorded = [str(entry.get("created_by", "")) for entry in entries]
        self.record("no credential or host index in the image's history", history_problem(recorded, host_pip))

    def run(self, container: Container, what: str, argv: list[str], user: str, env: dict[str, str],
            check: Callable[[], str] | None = None, timeout_s: float = 900) -> bool:  # fmt: skip
        """Run `argv` as the pod would; `check` (after exit 0) says what is wrong with its results, "" if nothing."""
        done = container.run(argv, user=f"{user}:{POD_GROUP}", env=env, mounts=self.mounts(), timeout_s=timeout_s)
        if done.returncode != 0:
            return self.record(what, f"exit {done.returncode}: {last_line(done.stderr or done.stdout)}")
        return self.record(what, check() if check else "")

    def give(self, user: str) -> None:
        """Give FSx and the outputs folder, as this check prepared them, to the pod's user.

        As fsGroup and an emptyDir do in a pod; what the steps write there is theirs already.
        """
        for folder in (self.fsx, self.work / "outputs"):
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, int(user), -1, follow_symlinks=False)

    def mounts(self) -> list[tuple[Path, str]]:
        """FSx, the outputs folder and the checks' own files, where the pod (and the check) has them."""
        return [(self.fsx, FSX), (self.work / "outputs", OUTPUTS), (CHECKS, "/checks:ro")]

    def output(self, name: str) -> str:
        """An output parameter the last step wrote ("" when it wrote none)."""
        path = self.work / "outputs" / name
        return path.read_text(encoding="utf-8") if path.is_file() else ""


def check_steps(image: str, fsx: Path) -> list[Result]:
    """The steps image: its config, every step's --help, validate_data and evaluate run for real."""
    flagship = workflow_template("llama-lora")
    validate = container_of(flagship, "validate-data")
    user, env = pod_user(validate), container_env(validate)
    checker = Checker("steps", image, fsx)
    checker.image_config(user)
    checker.history(pipconf.host_settings())
    data = fsx / "check" / "data"
    data.mkdir(parents=True)
    for split in ("train.jsonl", "eval.jsonl"):
        shutil.copyfile(ROOT / "data" / "demo" / split, data / split)
    checker.give(user)
    with Container(image) as container:
        checker.run(container, "no build configuration left", ["python", "/checks/no_build_config.py"], user, env)
        for module in step_modules():
            checker.run(container, f"{module} --help", ["python", "-m", module, "--help"], user, env, timeout_s=300)
        inputs = {"inputs.parameters.dataset_dir": f"{FSX}/check/data"}
        argv, env = pod_command(flagship, "validate-data", inputs)
        if checker.run(container, "validate_data on the demo data", argv, user, env, lambda: validated(checker)):
            tiny = f"{FSX}/check/tiny"
            demo = f"{flag(argv, '--model-cache-dir')}/{flag(argv, '--base-model')}"  # converted there by validate_data
            made = checker.run(container, "a tiny model and adapter", ["python", "/checks/tiny_model.py", demo, tiny],
                               user, env)  # fmt: skip
            inputs |= evaluate_inputs(tiny)
            argv, env = pod_command(flagship, "evaluate", inputs)
            if made:
                checker.run(container, "evaluate on the tiny model", argv, user, env, lambda: evaluated(checker))
    return checker.results


def check_project(steps_image: str, fsx: Path) -> list[Result]:
    """A user's project image FROM the steps image: its own step and metric run beside eksflow's steps."""
    Build(PROJECT / "Containerfile", PROJECT, PROJECT_TAG, {"STEPS_IMAGE": steps_image}).run(STATE / "text2sql.log")
    rendered = subprocess.run(
        [sys.executable, "-m", "pipelines.text2sql", "render", "--kind", "WorkflowTemplate", "--set",
         f"image={PROJECT_TAG}"],
        cwd=PROJECT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if rendered.returncode != 0:
        raise ImagesError(f"the project's pipeline does not render: {last_line(rendered.stderr)}")
    project = yaml.safe_load(rendered.stdout)
    checker = Checker("text2sql", PROJECT_TAG, fsx)
    stage = container_of(project, "stage-data")
    user, env = pod_user(stage), container_env(stage)
    checker.image_config(user)
    (fsx / "check" / "text2sql").mkdir(parents=True)
    shutil.copyfile(PROJECT / "data" / "shop.jsonl", fsx / "check" / "text2sql" / "shop.jsonl")
    checker.give(user)
    tiny = f"{FSX}/check/tiny"  # made by the steps image's check
    values = {"workflow.parameters.data_source": f"{FSX}/check/text2sql/shop.jsonl",
              "workflow.parameters.base_model": f"{tiny}/model"}  # fmt: skip
    with Container(PROJECT_TAG) as container:
        checker.run(container, "steps.check_sql --help", ["python", "-m", "steps.check_sql", "--help"], user, env)
        argv, env = pod_command(project, "stage-data", values)
        if not checker.run(container, "stage_data on the project's data", argv, user, env, lambda: staged(checker)):
            return checker.results
        values["inputs.parameters.dataset_dir"] = checker.output("dataset_dir").strip()
        argv, env = pod_command(project, "check-sql", values)
        checker.run(container, "the project's own step on the staged data", argv, user, env,
                    lambda: "" if checker.output("queries").strip().isdigit() else "no queries output")  # fmt: skip
        if not fsx_path(fsx, f"{tiny}/adapter").is_dir():
            checker.record("evaluate with the project's metric", "no tiny model: the steps image's check makes it")
            return checker.results
        values |= evaluate_inputs(tiny)
        argv, env = pod_command(project, "evaluate", values)
        checker.run(container, "evaluate with the project's metric", argv, user, env,
                    lambda: evaluated(checker, "steps.sql_metrics:same_rows"))  # fmt: skip
    return checker.results


def staged(checker: Checker) -> str:
    """What is wrong with stage_data's outputs ("" if nothing): the folder it staged into."""
    return "" if checker.output("dataset_dir").strip() else "no dataset_dir output"


def history_problem(recorded: list[str], host_pip: dict[str, str]) -> str:
    """What of the build's inputs the history `recorded` shows that it must not ("" if nothing).

    A URL holding a credential, or any remote address of this machine's pip configuration: those reach a build as
    a mounted pip.conf only (images.pipconf), and a build argument holding one would ship in every copy of the image.
    """
    for line in recorded:
        for url in re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+", line):
            if found := url_credential(url):
                return f"a build step records a URL holding a credential ({found})"
    addresses = {value for values in host_pip.values() for value in values.split() if "://" in value}
    addresses -= {os.environ.get("TORCH_INDEX_URL", "")}  # a build argument on purpose (images.build)
    leaked = sorted(a for a in addresses if not a.startswith("file:") and any(a in line for line in recorded))
    return f"a build step records this machine's pip address {leaked[0]!r}" if leaked else ""


def flag(argv: list[str], name: str) -> str:
    """The value of `--name=value` in `argv`; ImagesError when the template passes no such flag."""
    found = [part.split("=", 1)[1] for part in argv if part.startswith(f"{name}=")]
    if not found:
        raise ImagesError(f"the rendered command {' '.join(argv[:3])} has no {name}: run `make templates`")
    return found[-1]


def validated(checker: Checker) -> str:
    """What is wrong with validate_data's outputs ("" if nothing): the rows it counted."""
    return "" if checker.output("train_rows").strip().isdigit() else "no train_rows output"


def evaluated(checker: Checker, metric: str = "exact_match") -> str:
    """What is wrong with evaluate's outputs ("" if nothing): a gate decision and the metric it rests on."""
    if checker.output("passed").strip() not in ("true", "false"):
        return "no gate decision in its `passed` output"
    metrics = json.loads(checker.output("metrics") or "{}")
    return "" if metric in metrics else f"no {metric} among its metrics"


def serving_containers(image: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of each container of the rendered serving objects that runs `image`."""
    for document in yaml.safe_load_all((TEMPLATES / "serving.yaml").read_text(encoding="utf-8")):
        pod = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
        yield from ((pod, c) for c in pod.get("containers", []) if c.get("image") == image)


def check_serve(image: str, tag_in_templates: str, fsx: Path) -> list[Result]:
    """The CPU serve image: its config, what the vLLM Deployment runs, and the engine answering its probe.

    Each module of the Deployment's container (the engine, the probes) shows its --help, then the engine starts
    with the Deployment's command and the readiness probe must answer on it.
    """
    containers = list(serving_containers(tag_in_templates))
    if not containers:
        raise ImagesError(f"no container of workflow-templates/serving.yaml runs {tag_in_templates}")
    checker = Checker("serve-cpu", image, fsx)
    checker.image_config(pod_user(containers[0][1], containers[0][0]))
    checker.history(pipconf.host_settings())
    with Container(image) as container:
        for pod, spec in containers:
            user, env = pod_user(spec, pod), container_env(spec)
            for name, value in env.items():  # the folders on FSx the fleet reads, which prepare-fleet makes
                if name.endswith("_DIR") and value.startswith(f"{FSX}/"):
                    (fsx / value.removeprefix(f"{FSX}/")).mkdir(parents=True, exist_ok=True)
            checker.give(user)
            checker.run(container, "no build configuration left", ["python3", "/checks/no_build_config.py"], user, env)
            probes = [spec.get(p, {}).get("exec", {}).get("command", []) for p in ("startupProbe", "readinessProbe")]
            for command in {tuple(c[:3]) for c in [spec["command"], *probes] if c[1:2] == ["-m"]}:
                checker.run(container, f"{command[2]} --help", [*command, "--help"], user, env, timeout_s=300)
            serve_and_probe(checker, container, spec, user, env)
    return checker.results


def serve_and_probe(checker: Checker, container: Container, spec: dict[str, Any], user: str,
                    env: dict[str, str]) -> None:  # fmt: skip
    """Start the engine as the Deployment's container does, and run its readiness probe until it answers.

    The probe asks for a real generation, through the API key the Secret would hold, as the startupProbe does.
    """
    # A pod has a network namespace of its own; here the engine shares this machine's, so it listens on loopback
    # only (and, as in the pod, answers nothing without the key).
    argv = [*spec["command"], *spec.get("args", []), "--host=127.0.0.1"]
    probe = spec["readinessProbe"]["exec"]["command"]
    what = f"the readiness probe ({' '.join(probe[:3])}) answers on the engine the Deployment runs"
    model, port = flag(argv, "--model"), int(flag(argv, "--port"))
    if not (fsx_path(checker.fsx, model) / "config.json").is_file():
        checker.record(what, f"no base model at {model} on FSx (the steps image's check converts it there)")
        return
    with socket.socket() as taken:
        if taken.connect_ex(("127.0.0.1", port)) == 0:
            checker.record(what, f"port {port}, where the engine listens as in its pod, is in use on this machine")
            return
    env = {**env, "VLLM_API_KEY": secrets.token_hex(16)}  # the serving Secret's vllm-api-key
    user_group = f"{user}:{POD_GROUP}"
    log = checker.work / "engine.log"
    engine = container.start(argv, user=user_group, env=env, mounts=checker.mounts(), log=log)
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while True:
            answered = container.run(probe, user=user_group, env=env, mounts=checker.mounts(), timeout_s=120)
            if answered.returncode == 0:
                checker.record(what)
                return
            if engine.poll() is not None:
                said = last_line(without_trailer(log.read_text(errors="replace")))
                checker.record(what, f"the engine exited {engine.returncode}: {said}")
                return
            if time.monotonic() > deadline:
                checker.record(what, f"no answer in {ENGINE_START_S} s: {last_line(answered.stderr)} (engine: {log})")
                return
            time.sleep(5)
    finally:
        stop_tree(engine, grace_s=60)  # as a pod ends: SIGTERM, then SIGKILL for what is left


def fsx_path(fsx: Path, inside: str) -> Path:
    """The host path of `inside`, a path under the pods' FSx mount."""
    return fsx / inside.removeprefix(FSX).lstrip("/")


def main(argv: list[str] | None = None) -> int:
    """Check the chosen images; 0, or 1 after one line naming each failed check."""
    parser = argparse.ArgumentParser(prog="python -m images.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", action="append", default=[], metavar="NAME=TAG",
                        help="check TAG as image NAME (steps or serve-cpu) instead of the built one")  # fmt: skip
    parser.add_argument("--config", type=Path, help="the config file whose image names tag the builds")
    options = parser.parse_args(argv)
    try:
        buildah.require_tools()
        tags = {image.name: image.tag for image in images(options.config)}
        chosen = dict(item.partition("=")[::2] for item in options.image) or tags
        for name, tag in chosen.items():
            if name not in tags or not tag:
                raise ImagesError(f"--image {name}={tag}: give NAME=TAG with NAME one of {', '.join(tags)}")
        results: list[Result] = []
        fsx = STATE / "check" / "fsx"
        shutil.rmtree(fsx, ignore_errors=True)
        fsx.mkdir(parents=True)
        for name, tag in chosen.items():  # steps first: its validate_data converts the base model the engine serves
            print(f"{name}: checking {tag}", flush=True)
            results += check_steps(tag, fsx) if name == "steps" else check_serve(tag, tags[name], fsx)
            if name == "steps":  # a user's project image builds FROM it
                print(f"text2sql: checking a project image FROM {tag}", flush=True)
                results += check_project(tag, fsx)
    except ImagesError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    failed = [r for r in results if r.failure]
    if failed:
        print(f"error: {len(failed)} of {len(results)} image checks failed: "
              + "; ".join(f"{r.image}: {r.what} ({r.failure})" for r in failed), file=sys.stderr)  # fmt: skip
        return 1
    print(f"all {len(results)} image checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
