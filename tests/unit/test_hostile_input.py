"""S1: hostile strings through every text setting of every pipeline: byte-identical in the step's argv, or exit 2.

Each value either reaches the step that takes it exactly as given (the rendered argv parsed back with the step's
own Args model) or is refused by the config with a line naming the key. Nothing is ever evaluated by Argo or a
shell: the local run of the same values is tests/e2e/test_user_project.py::test_hostile_values_reach_steps_intact.
"""

import importlib
import re
from pathlib import Path

import pytest
import yaml

from eksflow.config import config_type, load_config
from eksflow.config_docs import rows
from eksflow.errors import ConfigError
from eksflow.render import manifest

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if not p.stem.startswith("_"))
CORPUS = {
    "quotes": "'''\"\"\"",
    "command": "$(touch /tmp/eksflow-pwn) `touch /tmp/eksflow-pwn`; rm -rf / && echo",
    "newline": "first line\nsecond line",
    "argo": "{{workflow.name}}",
    "sprig": '{{=sprig.env("HOME")}}',
    "unicode": "naïve café ✓ 日本語",
    "flag": "--outputs-dir=/etc",
    "path-text": "Copy /fsx/data to /fsx/other",
    "nul": "a\x00b",
    "huge": "x" * (1024 * 1024),
}


def text_keys(config) -> list[str]:
    return [key for key, kind, _, _ in rows(config) if kind in ("str", "location")]


def argv_values(workflow: dict) -> list[tuple[str, dict]]:
    """(template, parsed Args as a dict) for every step template, workflow parameters resolved."""
    params = {p["name"]: p["value"] for p in workflow["spec"].get("arguments", {}).get("parameters", [])}
    parsed = []
    for template in workflow["spec"]["templates"]:
        container = template.get("container")
        if not container or container["command"][:2] != ["python", "-m"]:
            continue
        step = importlib.import_module(container["command"][2])
        args = [
            re.sub(r"\{\{workflow\.parameters\.([\w-]+)\}\}", lambda m: params[m.group(1)], a)
            for a in container["args"]
            if "{{inputs." not in a and "{{workflow.name}}" not in a
        ]
        fields = step.Args.model_fields
        values = {}
        for item in args:
            name, _, raw = item.partition("=")
            key = name.removeprefix("--").replace("-", "_")
            values[key] = raw if key in fields else None
        parsed.append((template["name"], values))
    return parsed


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_every_text_setting_reaches_its_step_or_is_refused(pipeline, case):
    module = importlib.import_module(f"pipelines.{pipeline}")
    config = config_type(module.build)
    value = CORPUS[case]
    for key in text_keys(config):
        try:
            cfg = load_config(config, None, [f"{key}={value}"])
        except ConfigError as err:
            section, _, field = key.rpartition(".")
            named = str(err).startswith(f"{key}:") or (str(err).startswith(f"{section}:") and field in str(err))
            assert named, f"{key}={case}: refused without naming the key: {err}"
            continue
        assert "{{" not in value and "\x00" not in value and len(value) < 65536, f"{key} accepted {case}"
        assert getattr_path(cfg, key) == value
        workflow = manifest(module.build(cfg))
        carried = [(t, v) for t, values in argv_values(workflow) for v in values.values() if v == value]
        used = any(key.endswith(name) for name in used_names(workflow))
        assert carried or not used, f"{pipeline} {key}={case}: no step received it byte-identical"


def getattr_path(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def used_names(workflow: dict) -> set[str]:
    """Argument names some step template renders (a setting may feed none, e.g. images)."""
    names = set()
    for template in workflow["spec"]["templates"]:
        for item in template.get("container", {}).get("args", []):
            names.add(item.partition("=")[0].removeprefix("--").replace("-", "_"))
    return names


def test_no_command_ran():
    assert not Path("/tmp/eksflow-pwn").exists()


def test_a_workflow_too_big_for_the_api_server_is_refused_before_it_runs():
    """Every setting within its own limit, together over the API server's object limit: one line, nothing runs."""
    from eksflow.cli import MAX_MANIFEST_BYTES, checked_manifest
    from eksflow.errors import PipelineError
    from pipelines.llama_lora import LlamaLoraConfig, build

    long_texts = ("x" * 60_000, "http://example.com/" + "x" * 60_000)  # free text, or a URL's long path
    overrides: list[str] = []
    for key in text_keys(load_config(LlamaLoraConfig, None, [])):
        for long_text in long_texts:
            try:
                build(load_config(LlamaLoraConfig, None, [*overrides, f"{key}={long_text}"]))
            except (ConfigError, PipelineError):
                continue  # a field whose own rules (or its step's) refuse such text
            overrides.append(f"{key}={long_text}")
            break
    pipeline = build(load_config(LlamaLoraConfig, None, overrides))
    assert len(overrides) >= 5
    with pytest.raises(ConfigError, match=r"^the workflow is [\d,]+ bytes, over the [\d,]+ the Kubernetes API server"):
        checked_manifest(pipeline)
    assert len(yaml.safe_dump(manifest(pipeline)).encode()) > MAX_MANIFEST_BYTES
