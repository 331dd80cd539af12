"""The logic of `make images` and `make check-images` that needs no buildah.

What a build is given of this machine's pip configuration, and how a check fills a rendered template's command.
"""

from pathlib import Path

import pytest

from images import build as build_module
from images import pipconf
from images.build import ROOT
from images.buildah import Build, ImagesError, without_trailer
from images.check import (
    FSX,
    container_of,
    evaluate_inputs,
    history_problem,
    pod_command,
    step_modules,
    substituted,
    workflow_template,
)


def test_the_environment_wins_over_pip_config_files():
    listed = "global.cert='/etc/ca.crt'\n:env:.cert='/run/other.crt'\nglobal.timeout='60'\nnoise\n"
    assert pipconf.parse_config_list(listed) == {"cert": "/run/other.crt", "timeout": "60"}


def test_local_paths_are_mounted_read_only_and_rewritten(tmp_path: Path):
    (tmp_path / "mirror" / "simple").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "ca.crt").write_text("certificate")
    build = pipconf.for_build({
        "index-url": "https://pypi.example.com/simple",
        "extra-index-url": f"file://{tmp_path}/mirror/simple https://more.example.com/simple",
        "find-links": str(tmp_path / "wheels"),
        "cert": str(tmp_path / "ca.crt"),
        "timeout": "60",
        "user": "ignored",  # not a setting of where packages come from
    })  # fmt: skip
    assert build.settings["index-url"] == "https://pypi.example.com/simple"  # remote: in the mounted pip.conf
    inside = dict(build.mounts)
    # a local index goes in with its parent: its pages link to ../../files/<wheel>
    assert build.settings["extra-index-url"].split() == [
        f"file://{inside[tmp_path / 'mirror']}/simple",
        "https://more.example.com/simple",
    ]
    assert build.settings["find-links"] == inside[tmp_path / "wheels"]
    assert build.settings["cert"] == inside[tmp_path / "ca.crt"]
    assert all(path.startswith(f"{pipconf.INSIDE}/") for path in inside.values())
    assert build.find_links == [tmp_path / "wheels"]
    assert "user" not in build.settings
    assert "[global]" in build.conf_text() and "timeout = 60" in build.conf_text()


def test_a_configured_path_that_does_not_exist_is_one_clear_error(tmp_path: Path):
    with pytest.raises(ImagesError, match=r"names .*gone, which does not exist"):
        pipconf.for_build({"find-links": str(tmp_path / "gone")})


def test_a_machine_without_a_pip_configuration_passes_nothing():
    build = pipconf.for_build({})
    assert (build.settings, build.mounts) == ({}, [])


def test_no_index_url_of_this_machine_becomes_a_build_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The image's history records every build argument: the host's index (and its token) go in the mount only."""
    monkeypatch.setattr(build_module, "base_image", lambda dockerfile: "python:3.11-slim-bookworm")
    monkeypatch.setattr(build_module, "resolved_torch_index", lambda *args: "")  # the index did not answer
    monkeypatch.delenv("TORCH_INDEX_URL", raising=False)
    secret = "https://builder:s3cret-token@pypi.corp.example/simple"
    pip = pipconf.for_build({"index-url": secret, "extra-index-url": f"{secret}-more"})
    image = build_module.Image("steps", ROOT / "images" / "steps.Dockerfile", "steps:test")
    made = build_module.image_build(image, pip, tmp_path / "pip.conf")
    assert "s3cret-token" not in " ".join(made.argv())
    assert set(made.build_args) == {"BASE_IMAGE", "TORCH_INDEX_URL", "PIP_CONFIG_FILE"}
    assert (tmp_path / "pip.conf", pipconf.CONFIG_INSIDE) in made.mounts
    assert secret in pip.conf_text()


def test_a_torch_index_holding_a_credential_is_refused_before_any_build(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TORCH_INDEX_URL", "https://builder:s3cret-token@torch.corp.example/cpu")
    with pytest.raises(ImagesError, match="TORCH_INDEX_URL holds a credential") as refused:
        build_module.torch_index(ROOT / "images" / "steps.Dockerfile", pipconf.BuildPip())
    assert "s3cret-token" not in str(refused.value)


@pytest.mark.parametrize(
    ("recorded", "problem"),
    [
        (["/bin/sh -c #(nop) ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"], ""),
        (["|1 PIP_INDEX_URL=https://u:tok@mirror.example/simple /bin/sh -c pip install x"], "holding a credential"),
        (["|1 X=https://mirror.example/simple?token=abc /bin/sh -c pip install x"], "holding a credential"),
        (["|1 PIP_INDEX_URL=https://mirror.example/simple /bin/sh -c pip install x"], "pip address"),
    ],
    ids=["public-default", "userinfo", "query-token", "host-index"],
)
def test_the_image_history_check_finds_what_a_build_argument_leaked(recorded: list[str], problem: str):
    found = history_problem(recorded, {"index-url": "https://mirror.example/simple", "cert": "/etc/ca.crt"})
    assert problem in found and bool(found) == bool(problem)
    assert "tok" not in found.replace("token", "")


def test_builds_mount_read_only_and_take_values_as_separate_arguments(tmp_path: Path):
    hostile = "x; rm -rf / $(reboot)"
    argv = Build(tmp_path / "f", tmp_path, "t:1", {"BASE_IMAGE": hostile}, [(tmp_path, "/run/eksflow-build/0")]).argv()
    assert ["--build-arg", f"BASE_IMAGE={hostile}"] == argv[argv.index("--build-arg") : argv.index("--build-arg") + 2]
    assert f"{tmp_path}:/run/eksflow-build/0:ro" in argv
    assert "--pull=never" in argv and "--layers" in argv


def test_buildahs_own_lines_after_a_failure_are_left_out():
    said = "Traceback\nModuleNotFoundError: No module named 'x'\nsubprocess exited with status 1\nError: exit status 1"
    assert without_trailer(said).splitlines()[-1] == "ModuleNotFoundError: No module named 'x'"


def test_a_placeholder_the_check_cannot_fill_is_refused():
    assert substituted("--dir={{inputs.parameters.d}}/x", {"inputs.parameters.d": "/fsx/a"}) == "--dir=/fsx/a/x"
    with pytest.raises(ImagesError, match="no value for"):
        substituted("--dir={{inputs.parameters.other}}", {})


def test_checks_run_the_flagships_validate_data_with_its_pods_args():
    flagship = workflow_template("llama-lora")
    argv, env = pod_command(flagship, "validate-data", {"inputs.parameters.dataset_dir": f"{FSX}/check/data"})
    assert argv[:3] == ["python", "-m", "eksflow.llm.steps.validate_data"]
    assert f"--dataset-dir={FSX}/check/data" in argv and "--report-dir=/fsx/runs/check-images/reports" in argv
    assert not any("{{" in part for part in argv)
    assert env["EKSFLOW_IMAGE"] == container_of(flagship, "validate-data")["image"]


def test_checks_fill_every_value_of_the_flagships_evaluate():
    flagship = workflow_template("llama-lora")
    inputs = {"inputs.parameters.dataset_dir": f"{FSX}/check/data", **evaluate_inputs(f"{FSX}/check/tiny")}
    argv, _ = pod_command(flagship, "evaluate", inputs)
    assert argv[:3] == ["python", "-m", "eksflow.llm.steps.evaluate"]
    assert f"--adapter-dir={FSX}/check/tiny/adapter" in argv and "--champion-version=" in argv
    assert not any("{{" in part for part in argv)


def test_every_step_a_rendered_template_runs_is_among_those_checked():
    checked, run = set(step_modules()), set()
    for path in sorted((ROOT / "workflow-templates").glob("*.yaml")):
        lines = path.read_text().splitlines()
        run |= {line.split("- ", 1)[1].strip() for line in lines if line.strip().startswith("- eksflow.llm.steps.")}
    assert len(run) > 10 and run <= checked, sorted(run - checked)
