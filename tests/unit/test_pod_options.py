"""A task's pod options follow Kubernetes' rules, checked when the pipeline is built: one line naming the field.

Labels, annotations, node selectors and Secret mounts are literal text (a value known only when the workflow runs
cannot be checked, and a label decides which NetworkPolicy admits a pod); a Secret's name also names its volume
and a folder of the local executor, so `../../victimdir` never reaches a manifest.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eksflow import Pipeline, PipelineConfig, PipelineError, task
from eksflow.config import load_config
from eksflow.errors import ConfigError
from eksflow.render import manifest
from eksflow.resources import resource
from pipelines.llama_lora import LlamaLoraConfig
from tests.unit.test_pipeline import make, template, use

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "greeter"
LONG = "a" * 64


def with_options(**options) -> dict:
    with Pipeline(PipelineConfig(name="t"), title="test", parameters={"who": "x"}) as p:
        task(use, path="p", **{k: (v(p) if callable(v) else v) for k, v in options.items()})
    return manifest(p)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"labels": lambda p: {"who": p.parameters.who}}, "labels['who']: the value workflow.parameters.who is known "
         "only when the workflow runs; labels must be literal text"),
        ({"labels": {"n": 5}}, "labels['n']: the value 5 is int; labels must be text (quote it: '5')"),
        ({"labels": {"bad key": "x"}}, "labels['bad key']: 'bad key' is not a Kubernetes key"),
        ({"labels": {"a/b/c": "x"}}, "labels['a/b/c']: 'a/b/c' is not a Kubernetes key"),
        ({"labels": {"Upper.io/x": "x"}}, "labels['Upper.io/x']: 'Upper.io/x' is not a Kubernetes key"),
        ({"labels": {LONG: "x"}}, f"labels['{LONG[:60]}'... (64 characters)]: '{LONG[:60]}'... (64 characters) is"),
        ({"labels": {"app": "-x"}}, "labels['app']: '-x' is not a label value"),
        ({"labels": {"app": "a\nb"}}, r"labels['app']: 'a\nb' is not a label value"),
        ({"labels": {"app": LONG}}, "labels['app']: 'aaaa"),
        ({"annotations": {"x y": "v"}}, "annotations['x y']: 'x y' is not a Kubernetes key"),
        ({"annotations": {"note": 1.5}}, "annotations['note']: the value 1.5 is float; annotations must be text"),
        ({"annotations": {"eksflow.dev/path-args": ""}}, "annotations['eksflow.dev/path-args'] is eksflow's own"),
        ({"annotations": {"big": "x" * 300_000}}, "annotations: 300,"),
        ({"node_selector": {"zone": "us west"}}, "node_selector['zone']: 'us west' is not a label value"),
        ({"node_selector": {"": "x"}}, "node_selector['']: '' is not a Kubernetes key"),
        ({"secrets": {"/etc/x": "../../victimdir"}}, "secrets['/etc/x']: the Secret name (it also names the pod's "
         "volume) '../../victimdir' is not a DNS-1123 label"),
        ({"secrets": {"/etc/x": "keys.v1"}}, "secrets['/etc/x']: the Secret name"),
        ({"secrets": {"/etc/x": LONG}}, "secrets['/etc/x']: the Secret name"),
        ({"secrets": {"/etc/x": "Keys"}}, "secrets['/etc/x']: the Secret name"),
        ({"secrets": lambda p: {"/etc/x": p.parameters.who}}, "secrets['/etc/x']: the value workflow.parameters.who"),
        ({"secrets": {"/etc/x": "fsx"}}, "secrets['/etc/x']: 'fsx' names another volume of the pod"),
        ({"secrets": {"etc/x": "keys"}}, "secrets['etc/x']: 'etc/x' is not a mount path"),
        ({"secrets": {"/etc/../x": "keys"}}, "secrets['/etc/../x']: '/etc/../x' is not a mount path"),
        ({"secrets": {"/etc/x:y": "keys"}}, "secrets['/etc/x:y']: '/etc/x:y' is not a mount path"),
        ({"secrets": {"/etc/x/": "keys"}}, "secrets['/etc/x/']: '/etc/x/' is not a mount path"),
        ({"secrets": {"/": "keys"}}, "secrets['/']: '/' is not a mount path"),
        ({"secrets": {"/fsx/keys": "keys"}}, "secrets['/fsx/keys']: /fsx/keys overlaps the FSx volume at /fsx"),
        ({"secrets": {"/tmp": "keys"}}, "secrets['/tmp']: /tmp overlaps the outputs folder at /tmp/outputs"),
        ({"secrets": {"/tmp/outputs": "keys"}}, "secrets['/tmp/outputs']: /tmp/outputs overlaps the outputs folder"),
        ({"secrets": {"/etc/a": "one", "/etc/a/b": "two"}}, "secrets['/etc/a/b']: /etc/a/b overlaps Secret 'one'"),
        ({"secrets": {"/etc/a": "one", "/etc/b": "one"}}, "secrets['/etc/b']: Secret 'one' is mounted at /etc/a "
         "already"),
    ],
    ids=[
        "label-ref", "label-int", "label-key-space", "label-key-two-slashes", "label-prefix-upper",
        "label-key-long", "label-value-dash", "label-value-newline", "label-value-long", "annotation-key",
        "annotation-float", "annotation-eksflow-own", "annotations-over-256KiB", "selector-value", "selector-key",
        "secret-dotdot", "secret-dotted", "secret-long", "secret-upper", "secret-ref", "secret-fsx", "path-relative",
        "path-dotdot", "path-colon", "path-trailing-slash", "path-root", "path-in-fsx", "path-above-outputs",
        "path-outputs", "path-nested", "secret-twice",
    ],
)  # fmt: skip
def test_a_bad_pod_option_is_refused_in_one_line_naming_the_field(options, message):
    with pytest.raises(PipelineError) as refused:
        with_options(**options)
    text = str(refused.value)
    assert text.startswith(f"task 'use': {message}"), text
    assert "\n" not in text and len(text) < 400


def test_pod_options_within_the_rules_render_as_given():
    rendered = template(
        with_options(
            labels={"app.kubernetes.io/name": "x", "tier": "", "A_b.c-9": "Z_9.a-b"},
            annotations={"example.com/note": "any text: \n spaces {braces} " + "x" * 10_000},
            node_selector={"topology.kubernetes.io/zone": "us-west-2a"},
            secrets={"/etc/keys": "serving-keys", "/var/run/other": "other"},
        ),
        "use",
    )
    assert template_metadata(rendered)["labels"] == {"app.kubernetes.io/name": "x", "tier": "", "A_b.c-9": "Z_9.a-b"}
    assert template_metadata(rendered)["annotations"]["example.com/note"].startswith("any text: \n spaces {braces} ")
    assert rendered["nodeSelector"] == {"topology.kubernetes.io/zone": "us-west-2a"}
    assert rendered["volumes"] == [
        {"name": "serving-keys", "secret": {"defaultMode": 0o440, "secretName": "serving-keys"}},
        {"name": "other", "secret": {"defaultMode": 0o440, "secretName": "other"}},
    ]
    mounts = {m["name"]: (m["mountPath"], m.get("readOnly")) for m in rendered["container"]["volumeMounts"]}
    assert mounts == {"fsx": ("/fsx", None), "serving-keys": ("/etc/keys", True), "other": ("/var/run/other", True)}


def template_metadata(rendered: dict) -> dict:
    return rendered["metadata"]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"labels": {"bad key": "x"}}, "resource 'obj': ConfigMap.metadata.labels['bad key']: 'bad key' is not a"),
        ({"labels": {"app": "a b"}}, "resource 'obj': ConfigMap.metadata.labels['app']: 'a b' is not a label value"),
        ({"labels": {"app": 5}}, "resource 'obj': ConfigMap.metadata.labels['app']: 5 is int; labels take text"),
        ({"annotations": {"-x": "v"}}, "resource 'obj': ConfigMap.metadata.annotations['-x']: '-x' is not a"),
    ],
    ids=["label-key", "label-value", "label-int", "annotation-key"],
)
def test_a_resource_with_bad_metadata_is_refused_naming_where(metadata, message):
    with pytest.raises(PipelineError) as refused, Pipeline(PipelineConfig(name="t"), title="test"):
        resource("obj", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", **metadata}})
    assert str(refused.value).startswith(message), refused.value


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "ConfigMap", "data": {"port": 8080}}, "ConfigMap.data['port']: 8080 is int; Kubernetes takes only"),
        ({"kind": "ConfigMap", "binaryData": {"b": None}}, "ConfigMap.binaryData['b']: None is NoneType;"),
        ({"kind": "Secret", "stringData": {"on": True}}, "Secret.stringData['on']: True is bool; Kubernetes"),
        ({"kind": "ConfigMap", "data": {"a": {"b": "c"}}}, "ConfigMap.data['a']: {'b': 'c'} is dict;"),
        ({"kind": "ConfigMap", "data": {"a/b": "c"}}, "ConfigMap.data['a/b']: not a ConfigMap key"),
        ({"kind": "ConfigMap", "data": ["a"]}, "ConfigMap.data is list; it maps keys to text"),
    ],
    ids=["int", "binary-none", "secret-bool", "nested", "key-with-slash", "list"],
)
def test_a_config_map_or_secret_whose_data_is_not_text_is_refused_when_built(obj, message):
    """Kubernetes' data is map[string]string: the API server would refuse the object only when the workflow runs."""
    with pytest.raises(PipelineError) as refused, Pipeline(PipelineConfig(name="t"), title="test"):
        resource("obj", {"apiVersion": "v1", "metadata": {"name": "x"}, **obj})
    assert str(refused.value).startswith(f"resource 'obj': {message}"), refused.value
    assert "\n" not in str(refused.value)


def test_config_map_data_from_a_task_output_or_formatted_text_is_taken():
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        made = task(make, out_dir="/x")
        data = {"path": made.path, "port": "8080", "config.yaml": f"dir: {made.path}\n"}
        resource("obj", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": data})
    assert "inputs.parameters.path" in template(manifest(p), "obj")["resource"]["manifest"]


def test_a_label_value_from_a_task_output_stays_a_reference_in_a_resource():
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        made = task(make, out_dir="/x")
        labels = {"fleet": made.path, "app": "x"}
        resource("obj", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": labels}})
    assert "inputs.parameters.path" in template(manifest(p), "obj")["resource"]["manifest"]


def test_the_slurm_token_secret_names_a_volume_so_it_is_a_dns_label():
    with pytest.raises(ConfigError, match=r"^cluster.slurm.token_secret: String should have at most 63 characters"):
        load_config(LlamaLoraConfig, None, [f"cluster.slurm.token_secret={LONG}"])


def test_a_secret_name_from_config_cannot_reach_a_manifest_nor_the_machine(tmp_path):
    """The tester's case: `secrets={"/etc/x": cfg.secret_name}` with a `..` name; render and run refuse it."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURE, project)
    (project / "pipelines" / "keyed.py").write_text(KEYED)
    victim = tmp_path / "victimdir"
    victim.mkdir()
    (victim / "kept").write_text("untouched")
    hostile = f"secret_name={'../' * 12}{victim.relative_to('/')}"
    for verb in (["render"], ["run", "--state-dir", str(tmp_path / "state")]):
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.keyed", *verb, "--set", hostile],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("pipeline error: task 'greet': secrets['/etc/x']: the Secret name"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""
    assert sorted(p.name for p in victim.iterdir()) == ["kept"]
    assert (victim / "kept").read_text() == "untouched"
    assert not (tmp_path / "state").exists()


KEYED = """
from pydantic import Field

from eksflow import Pipeline, PipelineConfig, main, name_field, task
from steps import greet


class KeyedConfig(PipelineConfig):
    name: str = name_field("keyed")
    secret_name: str = Field("greeter-keys", description="the Secret the greeting reads")


def build(cfg: KeyedConfig) -> Pipeline:
    with Pipeline(cfg, title="keyed") as p:
        task(greet, name="Ada", secrets={"/etc/x": cfg.secret_name})
    return p


if __name__ == "__main__":
    main(build)
"""
