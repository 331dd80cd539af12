"""A launcher registered by a package outside eksflow renders, plans and runs, named by `cluster.launcher`.

The project lives in tmp_path, as a user's would: `labelled/` (a launcher: the step as one container task whose pod
carries a label), `echo_steps/` (a distributed step) and `echo_pipeline.py`. Importing the pipeline imports the
launcher's package, whose registration makes `cluster.launcher=labelled` a valid config value.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eksflow import plan
from eksflow.cluster import LAUNCHERS
from eksflow.config import config_type, load_config
from eksflow.errors import ConfigError
from eksflow.render import manifest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = {
    "labelled/__init__.py": '''
        """A project's own launcher: the step as one container task whose pod is labelled with the launcher."""

        from eksflow.launchers.base import Launcher, register
        from eksflow.templates import task

        LABEL = "example.com/launcher"


        class Labelled(Launcher):
            name = "labelled"
            kinds = frozenset({"cpu"})

            def pods(self, cfg, job):
                return "1 labelled pod"

            def attempts(self, cfg, job):
                return cfg.retry.limit + 1

            def add(self, request):
                return task(
                    request.step,
                    request.settings,
                    *request.sections,
                    task_name=request.task,
                    after=request.after,
                    when=request.when,
                    memoize=request.memoize,
                    labels={LABEL: self.name},
                    **request.values,
                )


        register(Labelled())
    ''',
    "echo_steps/__init__.py": "",
    "echo_steps/echo.py": '''
        """Echo a message: the distributed step, on one worker."""

        from pydantic import BaseModel

        from eksflow import Settings, StepArgs, run_step


        class EchoSettings(Settings):
            num_workers: int = 1
            cpus_per_worker: int = 1
            use_gpu: bool = False


        class Args(EchoSettings, StepArgs):
            message: str


        class Outputs(BaseModel):
            echoed: str


        def main(argv=None):
            return run_step(Args, lambda args: Outputs(echoed=args.message), argv)


        if __name__ == "__main__":
            raise SystemExit(main())
    ''',
    "echo_pipeline.py": '''
        """One distributed step, run by whichever launcher `cluster.launcher` names."""

        import labelled  # noqa: F401  # registers the `labelled` launcher

        from echo_steps import echo
        from echo_steps.echo import EchoSettings
        from eksflow import ClusterSettings, Pipeline, PipelineConfig, distributed, main, name_field


        class EchoConfig(PipelineConfig):
            name: str = name_field("echo")
            image: str = "ghcr.io/example/echo:0.1.0"
            cluster: ClusterSettings = ClusterSettings()
            echo: EchoSettings = EchoSettings()


        def build(cfg: EchoConfig) -> Pipeline:
            with Pipeline(cfg, title="echo") as p:
                distributed(echo, cfg.echo, message="hello from outside")
            return p


        if __name__ == "__main__":
            main(build)
    ''',
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The project on sys.path and imported; afterwards its modules and its launcher are gone again."""
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import echo_pipeline

    yield tmp_path, echo_pipeline.build
    LAUNCHERS.pop("labelled", None)
    for module in [m for m in sys.modules if m.split(".")[0] in ("labelled", "echo_steps", "echo_pipeline")]:
        del sys.modules[module]


def test_a_launcher_from_outside_eksflow_renders_and_plans(project):
    _, build = project
    pipeline = build(load_config(config_type(build), None, ["cluster.launcher=labelled"]))
    (job,) = pipeline.jobs
    assert type(job.launcher).__module__ == "labelled"
    (echo,) = [t for t in manifest(pipeline)["spec"]["templates"] if t["name"] == "echo"]
    assert echo["metadata"]["labels"]["example.com/launcher"] == "labelled"
    rows = dict(plan.check(pipeline).rows)
    assert rows["echo: pods"] == "1 labelled pod"


def test_an_unregistered_launcher_is_refused_when_the_config_loads_naming_the_registered_ones(project):
    _, build = project
    with pytest.raises(ConfigError, match=r"cluster\.launcher: .*no launcher 'pbs'; registered: .*labelled"):
        load_config(config_type(build), None, ["cluster.launcher=pbs"])


def test_a_launcher_from_outside_eksflow_runs_locally(project):
    folder, _ = project
    state = folder / "state"
    done = subprocess.run(
        [sys.executable, "echo_pipeline.py", "run", "--state-dir", str(state), "--set", "cluster.launcher=labelled"],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (run,) = (state / "runs").iterdir()
    nodes = json.loads((run / "status.json").read_text())["status"]["nodes"]
    (echo,) = [n for n in nodes.values() if n["displayName"] == "echo"]
    assert echo["phase"] == "Succeeded"
    assert echo["outputs"]["parameters"] == [{"name": "echoed", "value": "hello from outside"}]
