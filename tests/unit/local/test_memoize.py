"""Argo's template memoization, locally: hit, miss, maxAge, switched off, and the field checked against its schema."""

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from eksflow.local import LocalExecutorError
from tests.unit.local.manifests import container, dag, inputs, lines, outputs, params, run, task, workflow

# Appends a line to argv[1] (one per real run) and writes argv[2] to the output file.
COUNT = """
import os, sys
open(sys.argv[1], "a").write("ran\\n")
os.makedirs(os.path.dirname(sys.argv[3]), exist_ok=True)
open(sys.argv[3], "w").write(sys.argv[2])
"""
MEMOIZE = {"key": "count-{{inputs.parameters.x}}", "maxAge": "1h", "cache": {"configMap": {"name": "eksflow-memo"}}}


def counted(tmp_path: Path, memoize: dict[str, Any] | None = None) -> dict[str, Any]:
    template = container(
        "count",
        COUNT,
        str(tmp_path / "runs"),
        "value-{{inputs.parameters.x}}",
        "/tmp/outputs/value",
        inputs=inputs("x"),
        outputs=outputs("value"),
        memoize=memoize or MEMOIZE,
    )
    manifest = workflow([task("count", "count", arguments=params(x="{{workflow.parameters.x}}"))], [template])
    manifest["spec"]["arguments"] = params(x="1")
    return manifest


def entry(tmp_path: Path, key: str) -> Path:
    return tmp_path / "state" / "memoize" / "eksflow-memo" / f"{key}.json"


def test_a_second_run_with_the_same_key_reuses_the_outputs_without_running(tmp_path: Path) -> None:
    first = run(counted(tmp_path), tmp_path)
    assert first.phase == "Succeeded", first.message
    assert first.nodes["count"].memoization is not None and not first.nodes["count"].cached
    saved = json.loads(entry(tmp_path, "count-1").read_text())
    assert saved["nodeID"] == f"{first.name}.count"
    assert saved["outputs"] == {"parameters": [{"name": "value", "value": "value-1"}]}

    second = run(counted(tmp_path), tmp_path)
    node = second.nodes["count"]
    assert second.phase == "Succeeded" and node.cached
    assert node.outputs == {"value": "value-1"}
    assert lines(tmp_path / "runs") == ["ran"]  # nothing ran the second time
    status = json.loads((second.run_dir / "status.json").read_text())["status"]["nodes"]["count"]
    assert status["memoizationStatus"] == {"hit": True, "key": "count-1", "cacheName": "eksflow-memo"}
    assert "count              Succeeded  (0s)  cached" in second.output

    third = run(counted(tmp_path), tmp_path, parameters={"x": "2"})  # another key: a miss
    assert not third.nodes["count"].cached
    assert lines(tmp_path / "runs") == ["ran", "ran"]


def test_an_entry_older_than_max_age_is_a_miss(tmp_path: Path) -> None:
    run(counted(tmp_path), tmp_path)
    path = entry(tmp_path, "count-1")
    saved = json.loads(path.read_text())
    two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    saved["creationTimestamp"] = two_hours_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps(saved))
    again = run(counted(tmp_path), tmp_path)
    assert not again.nodes["count"].cached
    assert lines(tmp_path / "runs") == ["ran", "ran"]
    assert json.loads(path.read_text())["creationTimestamp"] != saved["creationTimestamp"]  # refreshed


def test_memoize_off_runs_every_task_and_refreshes_the_cache(tmp_path: Path) -> None:
    run(counted(tmp_path), tmp_path)
    created = json.loads(entry(tmp_path, "count-1").read_text())["nodeID"]
    again = run(counted(tmp_path), tmp_path, memoize=False)
    assert not again.nodes["count"].cached
    assert lines(tmp_path / "runs") == ["ran", "ran"]
    assert json.loads(entry(tmp_path, "count-1").read_text())["nodeID"] == f"{again.name}.count" != created


def test_a_failed_task_is_not_cached_and_a_bad_rendered_key_errors(tmp_path: Path) -> None:
    failing = counted(tmp_path)
    failing["spec"]["templates"][0]["container"]["args"][0] = str(tmp_path / "no-such-dir" / "runs")
    assert run(failing, tmp_path).nodes["count"].phase == "Failed"
    assert not entry(tmp_path, "count-1").exists()

    result = run(counted(tmp_path), tmp_path, parameters={"x": "not a key"})
    assert result.nodes["count"].phase == "Error"
    assert result.nodes["count"].message.startswith("template 'count': memoize.key rendered to 'count-not a key'")


def test_a_memoized_dag_is_reused_whole(tmp_path: Path) -> None:
    inner = counted(tmp_path)["spec"]["templates"][0]
    del inner["memoize"]
    group = dag(
        "group",
        [task("count", "count", arguments=params(x="{{inputs.parameters.x}}"))],
        inputs=inputs("x"),
        outputs={
            "parameters": [{"name": "value", "valueFrom": {"parameter": "{{tasks.count.outputs.parameters.value}}"}}]
        },
        memoize={**MEMOIZE, "key": "group-{{inputs.parameters.x}}"},
    )
    manifest = workflow([task("group", "group", arguments=params(x="7"))], [inner, group])
    first = run(manifest, tmp_path)
    second = run(manifest, tmp_path)
    assert first.nodes["group"].outputs == second.nodes["group"].outputs == {"value": "value-7"}
    assert second.nodes["group"].cached and "group.count" not in second.nodes
    assert lines(tmp_path / "runs") == ["ran"]


@pytest.mark.parametrize(
    ("memoize", "message"),
    [
        ({"key": "k", "cache": {"configMap": {"name": "c"}}}, r"memoize.maxAge is required"),
        ({"key": "k", "maxAge": "1h"}, r"memoize.cache is required"),
        ({"key": "k", "maxAge": "1h", "cache": {"configMap": {}}}, r"memoize.cache.configMap.name must be a string"),
        ({"key": "k", "maxAge": "1h", "cache": {"redis": {}}}, r"memoize.cache.redis is not supported locally"),
        ({"key": "k", "maxAge": "10 minutes", "cache": {"configMap": {"name": "c"}}}, r"maxAge must be a Go duration"),
        ({"key": "has space", "maxAge": "1h", "cache": {"configMap": {"name": "c"}}}, r"not a cache key Argo accepts"),
        ({"key": "k", "maxAge": "1h", "cache": {"configMap": {"name": "C_x"}}}, r"is not a Kubernetes object name"),
        (
            {"key": "k", "maxAge": "1h", "cache": {"configMap": {"name": "c"}}, "ttl": 1},
            r"memoize.ttl is not supported",
        ),
    ],
    ids=["no-max-age", "no-cache", "no-name", "other-cache", "bad-max-age", "bad-key", "bad-name", "unknown-key"],
)
def test_memoize_is_checked_against_argo_schema_before_the_run(
    tmp_path: Path, memoize: dict[str, Any], message: str
) -> None:
    with pytest.raises(LocalExecutorError, match=message):
        run(counted(tmp_path, memoize), tmp_path)
    assert not (tmp_path / "state").exists()
