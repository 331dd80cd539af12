"""SE1: a hostile value in any parameter that reaches a resource manifest leaves the object's shape unchanged.

Argo substitutes a resource template's manifest as text and then parses it as YAML, so a value with a quote and a
newline could add `hostPID: true` or an initContainer to a RayJob's head pod. eksflow writes every reference there
as a JSON-encoding expression tag (eksflow/manifests.py). For every resource template of every pipeline, profile
kind, registered launcher and scheduler (derived from the config and the launcher registry, so a new one is covered
without editing this file), each parameter the template reads gets each value of a hostile corpus; the manifest is
substituted as Argo's controller does it (tests/argo_substitution.py) and as the local executor does it, and both
parse to an object of the same shape as with a benign value, holding the hostile value intact.
"""

import importlib
import itertools
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from eksflow import Pipeline, PipelineConfig, PipelineError, task
from eksflow.cluster import LAUNCHERS as REGISTERED_LAUNCHERS
from eksflow.cluster import ClusterSettings
from eksflow.config import config_type, load_config
from eksflow.llm.serving.rollout import rollout_pipeline
from eksflow.local.substitution import Scope
from eksflow.manifests import REFERENCE, SAFE_REFERENCES, manifest_text
from eksflow.profiles import VARIANT_DEFAULTS
from eksflow.render import manifest
from eksflow.resources import resource
from pipelines.llama_lora import LlamaLoraConfig
from tests.argo_substitution import substitute, unresolved
from tests.commands import python
from tests.unit.test_pipeline import make

GENERATED = {"workflow.name": "llama-lora-abc12", "workflow.uid": "0-1", "workflow.namespace": "argo", "retries": "0"}
ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if not p.stem.startswith("_"))
LAUNCHERS = sorted(REGISTERED_LAUNCHERS)  # eksflow's own, registered by importing the pipelines above
SCHEDULERS = get_args(ClusterSettings.model_fields["scheduler"].annotation)
INIT_CONTAINER = (
    "x'\n    initContainers:\n    - name: pwn\n      image: alpine\n"
    '      command: ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "sh"]\n    hostPID: true\n  z: \''
)
CORPUS = {
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "newline": "a\nb",
    "crlf-tab": "a\r\n\tb",
    "colon-space": "key: value",
    "dash-space": "- item",
    "brace": "{",
    "braces-brackets": "}]{[",
    "hostpid": "x'\nhostPID: true\n",
    "init-container": INIT_CONTAINER,
    "yaml-specials": "&anchor *alias !!python/object/apply:os.system ['id'] | > % @ ` #comment",
    "json-escapes": '\\"\\n\\u0041 </script> & <',
    "unicode": "é \u2028 \u2029 \U0001f600",
    "expr-syntax": '" + workflow.name + "',
    "trailing-backslash": "end\\",
    "64KiB": "A" * 65536,
}


def renders() -> dict[str, dict[str, Any]]:
    """Every workflow a pipeline renders: each pipeline x profile kind x launcher x scheduler, and the rollout."""
    found: dict[str, dict[str, Any]] = {}
    for name, kind, launcher, scheduler in itertools.product(PIPELINES, VARIANT_DEFAULTS, LAUNCHERS, SCHEDULERS):
        build = importlib.import_module(f"pipelines.{name}").build
        if "cluster" not in config_type(build).model_fields:  # no distributed step: one render is all it has
            found.setdefault(name, manifest(build(load_config(config_type(build)))))
            continue
        overrides = [
            f"cluster.instance_type={VARIANT_DEFAULTS[kind]}",
            f"cluster.launcher={launcher}",
            f"cluster.scheduler={scheduler}",
        ]
        found[f"{name}-{kind}-{launcher}-{scheduler}"] = manifest(
            build(load_config(config_type(build), None, overrides))
        )
    found["rollout"] = manifest(rollout_pipeline(load_config(LlamaLoraConfig)))
    return found


RENDERS = renders()
CASES: dict[tuple[str, str], dict[str, Any]] = {}  # one case per distinct template, named by its first render
for _render, _workflow in RENDERS.items():
    for _template in _workflow["spec"]["templates"]:
        if "resource" in _template and _template not in CASES.values():
            CASES[_render, _template["name"]] = _template
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the corpus parses 64 KiB values many times


def parameters_read(template: dict[str, Any]) -> list[str]:
    """The dotted names of the parameters a resource template's manifest reads."""
    text = template["resource"]["manifest"]
    names = set(re.findall(r"\b((?:workflow|inputs)\.parameters\.\w+)", text))
    return sorted(names)


def shape(value: Any) -> Any:
    """The structure of a parsed object: keys, list lengths and leaf types, without the leaf values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}[{i}]").items()}
    return {path: value}


def locally(template: dict[str, Any], values: dict[str, str]) -> Any:
    """The object the local executor builds: its Scope substitutes the manifest text, then YAML parses it."""
    workflow = {k.removeprefix("workflow."): v for k, v in values.items() if k.startswith("workflow.")}
    inputs = {k.removeprefix("inputs.parameters."): v for k, v in values.items() if k.startswith("inputs.parameters.")}
    generated = {k.removeprefix("workflow."): v for k, v in GENERATED.items() if k.startswith("workflow.")}
    scope = Scope({**generated, **workflow}, inputs, retries=int(GENERATED["retries"]))
    return yaml.load(scope.substitute(template["resource"]["manifest"]), Loader=LOADER)


def both_ways(template: dict[str, Any], values: dict[str, str]) -> Any:
    """The object after Argo's substitution, checked equal to the local executor's."""

    def value(name: str) -> str:
        return values[name] if name in values else GENERATED.get(name, unresolved(name))

    argo = yaml.load(substitute(template, value)["resource"]["manifest"], Loader=LOADER)
    assert locally(template, {n: value(n) for n in parameters_read(template)}) == argo
    return argo


def test_every_kind_of_resource_template_is_among_the_cases():
    assert any("RayJob" in t["resource"]["manifest"] for t in CASES.values())
    assert any("MPIJob" in t["resource"]["manifest"] for t in CASES.values())
    assert any("kind: TrainJob" in t["resource"]["manifest"] for t in CASES.values())
    assert any("batch.volcano.sh" in t["resource"]["manifest"] for t in CASES.values())
    assert any("PodGroup" in t["resource"]["manifest"] for t in CASES.values())
    assert any("kind: Deployment" in t["resource"]["manifest"] for t in CASES.values())


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]}:{c[1]}")
def test_no_parameter_is_written_into_manifest_text(case):
    text = CASES[case]["resource"]["manifest"]
    plain = sorted({ref for ref in REFERENCE.findall(text) if not ref.startswith("=")} - SAFE_REFERENCES)
    assert plain == [], f"{case}: plain tags in the manifest text; write the object through manifest_text()"


@pytest.mark.parametrize("case", sorted(c for c in CASES if parameters_read(CASES[c])), ids=lambda c: f"{c[0]}:{c[1]}")
def test_a_hostile_parameter_leaves_the_object_unchanged(case):
    template = CASES[case]
    benign = both_ways(template, {})
    benign_shape, benign_leaves = shape(benign), leaves(benign)
    for parameter, (label, hostile) in itertools.product(parameters_read(template), CORPUS.items()):
        attacked = both_ways(template, {parameter: hostile})
        assert shape(attacked) == benign_shape, f"{case}: {parameter}={label} changed the object's shape"
        changed = {path: value for path, value in leaves(attacked).items() if benign_leaves[path] != value}
        assert changed, f"{case}: {parameter} does not reach the object"
        assert all(isinstance(v, str) and hostile in v for v in changed.values()), (
            f"{case}: {parameter}={label} changed fields other than the ones it fills: {sorted(changed)}"
        )


def test_every_committed_resource_template_is_covered():
    covered = {(t["name"], t["resource"]["manifest"]) for t in CASES.values()}
    committed = [
        template
        for path in sorted((ROOT / "workflow-templates").glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document and "templates" in document.get("spec", {})
        for template in document["spec"]["templates"]
        if "resource" in template
    ]
    assert committed, "workflow-templates/ holds no resource template: has `make templates` changed?"
    missing = sorted(t["name"] for t in committed if (t["name"], t["resource"]["manifest"]) not in covered)
    assert missing == [], f"resource templates in workflow-templates/ that no render here produces: {missing}"


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "X", "metadata": {"{{inputs.parameters.k}}": "v"}},
        {"kind": "X", "spec": {"a": "{{=sprig.env('HOME')}}"}},
    ],
    ids=["reference-in-key", "expression-given"],
)
def test_what_cannot_travel_as_data_is_refused_when_the_pipeline_is_built(obj):
    with pytest.raises(ValueError, match=r"key cannot hold a reference|already holds an expression"):
        manifest_text(obj)


def test_a_run_with_a_newline_in_the_base_model_folder_is_refused_naming_the_field(tmp_path):
    folder = tmp_path / "model\n--api-key=attacker-chosen --trust-remote-code"
    folder.mkdir()
    config = tmp_path / "hostile.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(folder)}))
    state = tmp_path / "state"
    done = python(str(ROOT / "pipelines" / "llama_lora.py"), "run", "--config", str(config), "--state-dir", str(state))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("config error: base_model: "), done.stderr
    assert "control characters" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not state.exists()  # refused before anything ran


def test_a_step_refuses_a_newline_in_a_location_argument(tmp_path):
    args = ["--base-model=x\n--api-key=y", "--pipeline=p", "--namespace=n", f"--model-cache-dir={tmp_path}"]
    done = python("-m", "eksflow.llm.steps.prepare_fleet", *args, f"--outputs-dir={tmp_path / 'out'}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --base-model: ") and "control characters" in done.stderr
    assert not (tmp_path / "out").exists()


def resource_template(obj: dict[str, Any]) -> dict[str, Any]:
    """The resource template `resource()` renders for `obj`, a task's output wired in where a string names it.

    A custom resource's: its fields take any JSON value (a ConfigMap's data takes only text).
    """
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        made = task(make, out_dir="/x")
        resource("obj", {"apiVersion": "example.com/v1", "kind": "Widget", **json_loads_with(obj, str(made.path))})
    return next(t for t in manifest(p)["spec"]["templates"] if t["name"] == "obj")


def json_loads_with(obj: Any, output: str) -> Any:
    """`obj` with every "OUTPUT" in its strings replaced by the task output's reference."""
    if isinstance(obj, dict):
        return {k: json_loads_with(v, output) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_loads_with(v, output) for v in obj]
    return obj.replace("OUTPUT", output) if isinstance(obj, str) else obj


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"a": {1, 2}}, "Widget.data.a: a value of type set is no JSON value; give text, a number, a bool, null"),
        ({"a": b"\x00\xff"}, "Widget.data.a: a value of type bytes is no JSON value"),
        ({"a": [1, frozenset()]}, "Widget.data.a[1]: a value of type frozenset is no JSON value"),
        ({"a": {"b": object()}}, "Widget.data.a.b: a value of type object is no JSON value"),
        ({"a": float("nan")}, "Widget.data.a: nan is no JSON number"),
        ({1: "x"}, "Widget.data: the key 1 is int; a manifest's keys are text"),
        ({"a": '{{=toJson({"b": sprig.env("HOME")})}}'}, "Widget.data.a: '{{=toJson"),
    ],
    ids=["set", "bytes", "frozenset", "object", "nan", "int-key", "expression-with-braces"],
)
def test_data_that_is_no_json_value_is_refused_in_one_line_naming_where(data, message):
    with pytest.raises(PipelineError) as refused:
        resource_template({"data": data})
    assert str(refused.value).startswith(f"resource 'obj': {message}"), refused.value
    assert "\n" not in str(refused.value)


BRACES = {
    "brace-before-tag": ("x{{{workflow.name}}", "x{llama-lora-abc12"),
    "brace-before-output": ("x{OUTPUT", "x{P"),
    "unclosed": ("a {{ b", "a {{ b"),
    "closing-first": ("}}{{", "}}{{"),
    "tag-then-braces": ("{{workflow.uid}}{{{", "0-1{{{"),
    "end-brace": ("x{", "x{"),
    "start-brace": ("{workflow.name}}", "{workflow.name}}"),
}


def test_braces_in_data_reach_the_object_as_text_and_the_text_holds_no_other_tag():
    """A `{{` that is no whole reference, or a brace before one, is data: the manifest holds only eksflow's tags."""
    data = {name: value for name, (value, _) in BRACES.items()}
    data["split"] = ["{", "{workflow.name}}"]  # next to each other in the object, never in the text
    template = resource_template({"data": data})
    text = template["resource"]["manifest"]
    assert "{{{" not in text
    tags = REFERENCE.findall(text)
    assert all(tag.startswith("=") or tag in SAFE_REFERENCES for tag in tags), tags
    assert "{{" not in REFERENCE.sub("", text)
    made = both_ways(template, {"inputs.parameters.path": "P"})
    assert made["data"] == {**{name: value for name, (_, value) in BRACES.items()}, "split": ["{", "{workflow.name}}"]}


def test_a_value_that_looks_like_eksflow_s_marker_is_data():
    data = {"a": "eksflow-expression-0", "b": "OUTPUT", "c": "eksflow-expression1-0", "d": "- eksflow-expression-1"}
    made = both_ways(resource_template({"data": data}), {"inputs.parameters.path": "P"})
    assert made["data"] == {**data, "b": "P"}
    # a setting that reaches a manifest may hold it too (a pipeline's name is on every object it creates)
    cfg = load_config(LlamaLoraConfig, None, ["name=eksflow-expression-0"])
    deployment = next(t for t in manifest(rollout_pipeline(cfg))["spec"]["templates"] if t["name"] == "vllm")
    assert both_ways(deployment, {})["metadata"]["labels"]["eksflow.dev/pipeline"] == "eksflow-expression-0"


def test_a_task_output_given_whole_reaches_the_object_as_data_whatever_its_value():
    """A Ref given as a manifest value (not formatted into a string) travels as the same JSON-encoding expression."""
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        made = task(make, out_dir="/x")
        data = {"whole": made.path, "below": made.path / "b"}
        resource("obj", {"apiVersion": "v1", "kind": "ConfigMap", "data": data})
    template = next(t for t in manifest(p)["spec"]["templates"] if t["name"] == "obj")
    assert parameters_read(template) == ["inputs.parameters.path"]
    tags = REFERENCE.findall(template["resource"]["manifest"])
    assert all(tag.startswith("=") or tag in SAFE_REFERENCES for tag in tags), tags
    for label, hostile in CORPUS.items():
        made_object = both_ways(template, {"inputs.parameters.path": hostile})
        assert made_object["data"] == {"whole": hostile, "below": f"{hostile}/b"}, label
