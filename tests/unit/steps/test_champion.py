import socket

import pytest

from eksflow.llm.steps import champion
from eksflow.llm.steps.common import tracking

DIGEST = "sha256:" + "a" * 64


def champion_args(tmp_path, tracking_uri: str, retrain: str = "if-data-changed") -> champion.Args:
    return champion.Args(
        retrain=retrain, model_name="llama-lora", tracking_uri=tracking_uri, outputs_dir=tmp_path / "outputs"
    )


def registry_with_versions(tmp_path, tags: list[dict[str, str]], champion_index: int | None) -> str:
    """A sqlite registry holding one version per `tags` entry; alias champion on version champion_index + 1."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.client(uri)
    client.create_registered_model("llama-lora")
    for version_tags in tags:
        client.create_model_version("llama-lora", source=(tmp_path / "model").as_uri(), tags=version_tags)
    if champion_index is not None:
        client.set_registered_model_alias("llama-lora", tracking.CHAMPION, str(champion_index + 1))
    return uri


def test_reports_the_champions_training_data_not_the_newest_versions(tmp_path):
    uri = registry_with_versions(
        tmp_path,
        [{tracking.DATASET_DIGEST_TAG: DIGEST}, {tracking.DATASET_DIGEST_TAG: "sha256:" + "b" * 64}],
        champion_index=0,
    )
    assert champion.run(champion_args(tmp_path, uri)) == champion.Outputs(version="1", dataset_digest=DIGEST)


@pytest.mark.parametrize(
    ("tags", "champion_index"),
    [([], None), ([{tracking.DATASET_DIGEST_TAG: DIGEST}], None), ([{"workflow_name": "wf"}], 0)],
    ids=["no-model-versions", "no-champion-alias", "champion-without-digest"],
)
def test_nothing_to_compare_with_means_an_empty_digest(tmp_path, tags, champion_index):
    uri = registry_with_versions(tmp_path, tags, champion_index)
    assert champion.run(champion_args(tmp_path, uri)).dataset_digest == ""


def test_a_missing_registered_model_means_an_empty_digest(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert champion.run(champion_args(tmp_path, uri)) == champion.Outputs(version="", dataset_digest="")


def test_retrain_always_still_names_the_champion_the_run_is_judged_against(tmp_path):
    """evaluate compares with this version and has it in its memo key: a manual run too knows its champion."""
    uri = registry_with_versions(tmp_path, [{tracking.DATASET_DIGEST_TAG: DIGEST}, {}], champion_index=1)
    assert champion.run(champion_args(tmp_path, uri, retrain="always")) == champion.Outputs(
        version="2",
        dataset_digest="",  # the data is not compared: stage_data says `changed`
    )


def test_no_tracking_uri_means_no_champion(tmp_path):
    assert champion.run(champion_args(tmp_path, "", retrain="always")) == champion.Outputs(
        version="", dataset_digest=""
    )


def test_an_unreachable_registry_fails_instead_of_guessing(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(tracking.TrackingError, match="check that the tracking server is up"):
        champion.run(champion_args(tmp_path, dead))


def test_bad_retrain_value_is_refused_with_the_choices(tmp_path):
    assert (
        champion.main([f"--outputs-dir={tmp_path}", "--retrain=sometimes", "--model-name=m", "--tracking-uri=x"]) == 2
    )


def test_a_registry_not_made_yet_has_no_champion_and_is_not_made(tmp_path, capsys):
    """A first run's sqlite registry does not exist yet: no champion, and no empty database made to say so."""
    db = tmp_path / "mlflow" / "mlflow.db"
    assert champion.run(champion_args(tmp_path, f"sqlite:///{db}")) == champion.Outputs(version="", dataset_digest="")
    assert "has no champion yet (no registry at" in capsys.readouterr().err
    assert not db.parent.exists()
