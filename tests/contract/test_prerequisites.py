"""The cluster prerequisites the README points at are valid objects (core kinds strict, Kueue kinds by CRD)."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.flagship import config

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = list(yaml.safe_load_all((ROOT / "workflow-templates" / "cluster-prerequisites.yaml").read_text()))
KUEUE = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d["kind"])
def test_prerequisite_validates(document, kueue_validator):
    if document["kind"] in KUEUE:
        errors = [e.message for e in kueue_validator(document).iter_errors(document)]
        assert errors == []
    else:
        kubernetes_validate.validate(document, "1.32.0", strict=True)


def test_prerequisites_match_the_config_defaults():
    cfg = config()
    names = {(d["kind"], d["metadata"]["name"]) for d in DOCUMENTS}
    assert ("ServiceAccount", cfg.service_account) in names
    assert ("PersistentVolumeClaim", cfg.storage.fsx_claim) in names
    assert ("LocalQueue", cfg.cluster.queue) in names
