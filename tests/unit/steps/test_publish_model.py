"""A whole-model version (train.finetune=full) published for a vLLM fleet of its own, and the rollout steps' checks
that a version goes where its kind is served: a model on its own fleet, an adapter on its base model's."""

from pathlib import Path

import pytest

from eksflow.llm.steps import load_candidate, publish_model, register
from eksflow.llm.steps.common import fleet_names, tracking
from eksflow.llm.steps.common.trained import model_digest
from tests.unit.steps.test_load_candidate import adapter, load
from tests.unit.steps.test_train_full import register_args
from tests.unit.steps.test_train_lora_family import tiny_llama


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """v1 a whole model (the tiny Llama's folder, as train.finetune=full saves it), v2 an adapter."""
    root = tmp_path_factory.mktemp("registry")
    folder = root / "model"
    tiny_llama().save_pretrained(folder)
    uri, args = register_args(folder, root)
    assert register.run(args).model_version == "1"
    lora = adapter(None, root / "adapter", 8)
    assert (
        register.run(args.model_copy(update={"adapter_dir": lora, "outputs_dir": root / "out-2"})).model_version == "2"
    )
    return uri, folder


def publish(uri: str, tmp_path: Path, **which: str) -> publish_model.Outputs:
    flags = {"model_name": "llama-lora", "tracking_uri": uri, "models_dir": tmp_path / "models",
             "pipeline": "llama-lora", "namespace": "argo", "outputs_dir": tmp_path / "out", **which}  # fmt: skip
    return publish_model.run(publish_model.Args.from_argv([f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]))


def test_a_whole_model_is_published_once_under_its_name_with_a_fleet_of_its_own(registry, tmp_path):
    uri, folder = registry
    made = publish(uri, tmp_path, model_version="1")
    run_id = tracking.client(uri).get_model_version("llama-lora", "1").run_id
    assert (made.version, made.kind, made.own_fleet) == ("1", "model", True)
    assert made.served_name == f"llama-lora-v1-{run_id[:8]}"
    assert Path(made.model_dir) == tmp_path / "models" / made.served_name
    assert model_digest(Path(made.model_dir)) == model_digest(folder)  # the registered weights, whole
    assert made.fleet.startswith("llama-lora-vllm-") and made.fleet != fleet_names.fleet_name("llama-lora", "x")
    assert made.vllm_url == f"http://{made.fleet}.argo.svc.cluster.local:8000"
    assert publish(uri, tmp_path, model_version="1") == made  # idempotent: the same folder and fleet
    assert not list((tmp_path / "models").glob(".*"))  # no staging folder left behind


def test_the_champion_alias_names_what_to_publish_and_an_adapter_or_no_champion_publishes_nothing(registry, tmp_path):
    uri, _ = registry
    client = tracking.client(uri)
    assert publish(uri, tmp_path, alias="champion") == publish_model.Outputs()  # no champion yet: nothing
    client.set_registered_model_alias("llama-lora", "champion", "2")
    try:
        adapter_champion = publish(uri, tmp_path, alias="champion")
        assert (adapter_champion.version, adapter_champion.kind, adapter_champion.own_fleet) == ("2", "adapter", False)
        assert adapter_champion.vllm_url == "" and not (tmp_path / "models").exists()
        client.set_registered_model_alias("llama-lora", "champion", "1")
        assert publish(uri, tmp_path, alias="champion") == publish(uri, tmp_path, model_version="1")
    finally:
        client.delete_registered_model_alias("llama-lora", "champion")


def test_publishing_needs_one_version_named_by_number_or_alias(registry, tmp_path, capsys):
    uri, _ = registry
    flags = [f"--tracking-uri={uri}", "--model-name=llama-lora", f"--models-dir={tmp_path}", "--pipeline=p",
             "--namespace=argo", f"--outputs-dir={tmp_path / 'out'}"]  # fmt: skip
    for which in ([], ["--model-version=1", "--alias=champion"]):
        assert publish_model.main([*flags, *which]) == 2
        assert "give either --model-version or --alias" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "served_name", "expected"),
    [
        (
            "1",
            "",
            "is a whole model (tag kind=model: train.finetune=full), not an adapter: it is served by a vLLM fleet",
        ),
        ("2", "llama-lora-v2-0123abcd", "is an adapter, and this rollout serves its candidate on a fleet of its own"),
    ],
    ids=["model-as-adapter", "adapter-as-model"],
)
def test_load_candidate_refuses_a_version_where_its_kind_is_not_served_in_one_line(
    registry, tmp_path, capsys, version, served_name, expected
):
    uri, _ = registry
    assert load_candidate.main(load(tmp_path, uri, version, served_name=served_name)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert expected in line and line.startswith(f"error: --model-version={version}: llama-lora")
    assert not (tmp_path / "routes.json").exists()  # no slot was routed
