"""Bad input to the rollout exits 2 naming the field, before any server is asked (no fleet runs in these tests)."""

import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from eksflow.llm.steps import load_candidate, register, serve, serve_champion
from eksflow.llm.steps.common import adapters, rollout, tracking, vllm_lora
from eksflow.llm.steps.common.base_model import DEMO_MODEL, default_cache_dir, resolve_model
from eksflow.runtime.args import StepInputError

NOBODY = "http://127.0.0.1:{port}"  # a closed port: a step that asked a server would fail with exit 1, not 2


@pytest.fixture(scope="module")
def base_dir() -> Path:
    return resolve_model(DEMO_MODEL, default_cache_dir())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def adapter(base: Path | None, out: Path, rank: int) -> Path:
    """A PEFT LoRA on the demo model, or (base None) on a tiny random Llama with other shapes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if base is None:
        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=256)  # fmt: skip
        model = LlamaForCausalLM(config)
    else:
        model = AutoModelForCausalLM.from_pretrained(base)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory, base_dir):
    """Versions 1-3: a rank-32 adapter, an adapter for another base model, and one whose adapter files vanished."""
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    made = [
        adapter(base_dir, root / "rank32", 32),
        adapter(None, root / "other-base", 8),
        adapter(base_dir, root / "vanishing", 8),
    ]
    for i, folder in enumerate(made):
        args = register.Args.model_validate(
            {
                "adapter_dir": folder,
                "base_model": DEMO_MODEL,
                "metrics": {"exact_match": 0.9},
                "dataset_digest": "sha256:" + "d" * 64,
                "workflow_name": f"wf-{i}",
                "tracking_uri": uri,
                "outputs_dir": root / f"out-{i}",
            }
        )
        assert register.run(args).model_version == str(i + 1)
    run_id = tracking.client(uri).get_model_version("llama-lora", "3").run_id
    artifacts = Path(tracking.client(uri).get_run(run_id).info.artifact_uri.removeprefix("file://"))
    shutil.rmtree(artifacts / "adapter")  # registered, then the adapter folder was lost
    return uri


def load(tmp_path: Path, uri: str, version: str, **extra: str) -> list[str]:
    port = closed_port()
    values = {
        "model_name": "llama-lora",
        "model_version": version,
        "tracking_uri": uri,
        "vllm_url": NOBODY.format(port=port),
        "proxy_url": NOBODY.format(port=port),
        "serving_dir": str(tmp_path / "adapters"),
        "routes_file": str(tmp_path / "routes.json"),
        "state_file": str(tmp_path / "state.json"),
        "base_model": DEMO_MODEL,
        "base_dir": str(resolve_model(DEMO_MODEL, default_cache_dir())),
        "outputs_dir": str(tmp_path / "out"),
        **extra,
    }
    return [f"--{k.replace('_', '-')}={v}" for k, v in values.items()]


@pytest.mark.parametrize(
    ("version", "extra", "expected"),
    [
        ("1", {}, "--model-version=1: adapter rank 32 exceeds the engine's max LoRA rank 16; raise serving.engine"),
        ("2", {}, "--model-version=2: the adapter was trained on another base model: its model.layers.0.self_attn"),
        ("3", {}, "--model-version=3: llama-lora version 3 has no 'adapter' artifact"),
        ("9", {}, "--model-version=9: 'llama-lora' has no version 9"),
        ("1", {"base_model": "/models/llama-3-8b"}, "--base-model: llama-lora version 1 was trained on"),
    ],
    ids=["rank-above-max", "other-base-model", "missing-adapter-folder", "unknown-version", "base-model-tag"],
)
def test_bad_candidate_exits_2_naming_the_field_before_any_server(tmp_path, registry, capsys, version, extra, expected):
    assert load_candidate.main(load(tmp_path, registry, version, **extra)) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # no outputs
    assert not list((tmp_path / "adapters").glob("*"))  # nothing published: no engine can resolve it


def test_rank_within_a_larger_engine_limit_passes_the_checks(tmp_path, registry):
    args = load_candidate.Args.from_argv(load(tmp_path, registry, "1", max_lora_rank="32"))
    load_candidate.check_candidate(
        args, adapters.download(adapters.registered_version(registry, "llama-lora", "1"), tmp_path / "downloaded")
    )


def test_serve_refuses_a_bad_adapter_before_starting_vllm(tmp_path, registry, capsys):
    argv = [
        "--model-name=llama-lora",
        f"--tracking-uri={registry}",
        "--version=1",
        f"--serve-dir={tmp_path / 'serve'}",
        f"--model-cache-dir={default_cache_dir()}",
        f"--port={closed_port()}",
    ]
    assert serve.main(argv) == 2
    assert "adapter rank 32 exceeds the engine's max LoRA rank 16" in capsys.readouterr().err
    assert not list((tmp_path / "serve").glob("vllm-*.log"))  # the engine never started


@pytest.mark.parametrize(
    ("compared", "current", "expected"),
    [
        (None, "2", "the candidate was compared with no champion, `champion` is now v2"),
        ("1", None, "the candidate was compared with v1, `champion` is now unset"),
        ("1", "2", "the candidate was compared with v1, `champion` is now v2"),
    ],
    ids=["no-champion-then", "no-champion-now", "moved"],
)
def test_a_moved_champion_is_explained_without_a_vnone(compared, current, expected):
    message = load_candidate.champion_moved(compared, current)
    assert expected in message and "vnone" not in message and "vNone" not in message


def test_a_version_rolled_out_again_gets_a_reason_of_this_rollout():
    tags = load_candidate.progressing_tags("green", "llama-lora-x1")
    assert tags[rollout.PHASE_TAG] == "Progressing"
    assert tags[rollout.REASON_TAG] == "canary started by llama-lora-x1"  # not a previous rollout's failure


def test_an_adapter_recorded_on_another_base_model_of_the_same_shapes_is_refused(tmp_path):
    base = resolve_model(DEMO_MODEL, default_cache_dir())
    recorded = adapter(base, tmp_path / "adapter", 4)
    config = json.loads((recorded / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]).name == base.name  # what PEFT records: the folder trained on
    spec = vllm_lora.read_adapter(recorded, "--model-version")
    vllm_lora.check_adapter(spec, 16, base, "--model-version=1")  # its own base: served
    config["base_model_name_or_path"] = "/fsx/models/smollm2-135m-instruct-sibling"
    (recorded / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(StepInputError, match=r"trained on '/fsx/models/smollm2-135m-instruct-sibling'"):
        vllm_lora.check_adapter(vllm_lora.read_adapter(recorded, "--model-version"), 16, base, "--model-version=1")


def test_publishing_stamps_the_engines_base_and_renames_the_adapter_into_place_whole(tmp_path, registry):
    folder = tmp_path / "adapters"
    asked: list[str] = []

    def base(path: str):
        def served_base() -> str:
            asked.append(path)
            return path

        return served_base

    name = adapters.publish(registry, "llama-lora", "1", folder, base("/fsx/models/a"), lambda adapter: None)
    assert re.fullmatch(r"llama-lora-v1-[0-9a-f]{8}", name)
    config = json.loads((folder / name / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "/fsx/models/a"  # what vLLM's resolver compares with --model
    assert sorted(p.name for p in folder.iterdir()) == [name]  # no staging folder left behind
    assert adapters.publish(registry, "llama-lora", "1", folder, base("/fsx/models/a"), lambda adapter: None) == name
    adapters.publish(registry, "llama-lora", "1", folder, base("/fsx/models/b"), lambda adapter: None)
    assert json.loads((folder / name / "adapter_config.json").read_text())["base_model_name_or_path"] == "/fsx/models/b"
    assert asked == ["/fsx/models/a", "/fsx/models/a", "/fsx/models/b"]
    assert adapters.unpublish(folder, name) and not adapters.unpublish(folder, name)
    assert list(folder.iterdir()) == []


def test_an_adapter_failing_its_checks_is_never_published_and_no_engine_is_asked(tmp_path, registry):
    def refuse(adapter: Path) -> None:
        raise StepInputError("--model-version=1: refused")

    def no_engine() -> str:
        raise AssertionError("the engine was asked")

    with pytest.raises(StepInputError, match="refused"):
        adapters.publish(registry, "llama-lora", "1", tmp_path / "adapters", no_engine, refuse)
    assert list((tmp_path / "adapters").iterdir()) == []


@pytest.fixture
def promoted_twice(tmp_path) -> str:
    """v1 promoted, then v2: the registry as the issue's runs left it (no artifacts: nothing may be downloaded)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    client.create_registered_model("llama-lora")
    for _ in range(2):
        client.create_model_version("llama-lora", (tmp_path / "nowhere").as_uri())
    tracking.promote(uri, "llama-lora", "1")
    tracking.promote(uri, "llama-lora", "2")
    rollout.write_state(  # what serve-champion recorded: v2 serves in the blue slot
        tmp_path / "state.json",
        rollout.RolloutState(champion_version="2", champion_slot="blue", stage="serve-champion"),
    )
    return uri


def test_a_version_registered_before_the_champion_is_refused_in_one_line(tmp_path, promoted_twice, capsys):
    """A rerun that trained v1's weights again (train memoized) registers v1 again: it never replaces champion v2."""
    argv = load(tmp_path, promoted_twice, "1", evaluated_champion="2")
    assert load_candidate.main(argv) == 2
    err = capsys.readouterr().err
    assert "llama-lora v1 was registered before the champion v2" in err, err
    assert "an older version is never rolled out over a newer champion" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "adapters").exists()  # nothing published
    assert str(tracking.alias_version(promoted_twice, "llama-lora", tracking.CHAMPION).version) == "2"


def test_an_evaluation_that_had_no_champion_never_replaces_one(tmp_path, promoted_twice, capsys):
    """A memoized evaluate from before any champion says champion_version ''; the champion is v2 now: stop (RO4)."""
    version = tracking.client(promoted_twice).create_model_version("llama-lora", (tmp_path / "v3").as_uri()).version
    assert load_candidate.main(load(tmp_path, promoted_twice, str(version), evaluated_champion="")) == 1
    err = capsys.readouterr().err
    assert "the candidate was compared with no champion, `champion` is now v2" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "adapters").exists()


def test_a_champion_this_fleet_cannot_serve_is_still_the_one_the_candidate_replaces(tmp_path, registry, capsys):
    """v2 (trained on another base model) is champion: serve-champion serves none, and load-candidate must not read
    that as a moved champion (it did: `compared with v2, champion is now v2` failed every such rollout)."""
    shutil.copy(registry.removeprefix("sqlite:///"), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.promote(uri, "llama-lora", "2")
    fleet_args = {k: v for k, v in (a[2:].split("=", 1) for a in load(tmp_path, uri, "3")) if k != "model-version"}
    serve_args = serve_champion.Args.from_argv([f"--{k}={v}" for k, v in fleet_args.items() if k != "base-model"])
    assert serve_champion.run(serve_args) == serve_champion.Outputs(champion_version="", champion_slot="")
    state = rollout.read_state(tmp_path / "state.json")
    assert (state.champion_version, state.champion_slot) == ("2", None)  # compared with and replaced, not served
    capsys.readouterr()
    assert load_candidate.main(load(tmp_path, uri, "3", evaluated_champion="2")) == 2
    err = capsys.readouterr().err
    assert "--model-version=3: llama-lora version 3 has no 'adapter' artifact" in err, err  # past the champion check
