"""An image's history records every build argument: a package index and its token never become one.

Built with this machine's pip configuration plus an index URL holding a user and a token, on the layers
`make images` cached: the index reaches the build in the mounted pip.conf only, so the build arguments (and with
them every cached layer) are those of a normal build, and `buildah inspect` finds the token nowhere.
"""

import json
import secrets

import pytest

from images import buildah
from images.build import ROOT, Image, build_all
from images.check import history_problem

pytestmark = pytest.mark.images

TAG = "localhost/eksflow-check/history-steps:test"


def test_an_index_credential_reaches_no_build_argument_and_no_history(monkeypatch: pytest.MonkeyPatch):
    token = secrets.token_hex(12)
    index = f"http://eksflow-check:{token}@127.0.0.1:9/simple"  # discard port: no request may need it
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_RETRIES", "0")
    try:
        build_all([Image("steps", ROOT / "images" / "steps.Dockerfile", TAG)])
        found = buildah.inspect(TAG)
    finally:
        buildah.buildah("rmi", "--force", TAG)
    assert token not in json.dumps(found)
    recorded = [str(entry.get("created_by", "")) for entry in found.get("History") or []]
    assert recorded and history_problem(recorded, {"index-url": index}) == ""
