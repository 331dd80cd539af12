"""The slurmrestd client against each version's official OpenAPI document (tests/contract/schemas/slurm).

v0.0.38 is also exercised for real (tests/e2e/test_slurm.py); v0.0.44, Slinky's Slurm 25.x, only here: every
field the client sends must be declared with the right type, every field it reads must exist, and every path it
calls must be offered with its method.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from eksflow.runtime.slurm import API_VERSIONS, JobSpec, slurm_api
from tests.contract.conftest import schema_text

SPEC = JobSpec(
    name="llama-lora-x7k2-train",
    script="#!/bin/bash\nexec srun true\n",
    environment={
        "PATH": "/usr/bin:/bin",
        "EKSFLOW_STEP_ARGV": json.dumps(["python3", "-m", "eksflow.llm.steps.train"]),
    },
    working_directory="/fsx/runs/llama-lora-x7k2/slurm/train",
    standard_output="/fsx/runs/llama-lora-x7k2/slurm/train/slurm.out",
    comment="eksflow workflow 5f0c6a8e-2b1d-4c3e-9a7f-0123456789ab",
    partition="gpu",
    account="ml",
    qos="normal",
    time_limit_min=120,
    nodes=2,
    tasks_per_node=8,
    cpus_per_task=12,
    gpus_per_node=8,
)
SUBMISSION = {"v0.0.38": "v0.0.38_job_submission", "v0.0.44": "v0.0.44_job_submit_req"}
JOB = {"v0.0.38": "v0.0.38_job_response_properties", "v0.0.44": "v0.0.44_job_info"}


def document(version: str) -> dict[str, Any]:
    return json.loads(schema_text(f"slurm/openapi-{version}.json"))


def strict(schemas: dict[str, Any]) -> dict[str, Any]:
    """Every object schema with properties rejects fields it does not declare (a misspelling is an error)."""
    for schema in schemas.values():
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
    return schemas


@pytest.mark.parametrize("version", API_VERSIONS)
def test_the_submission_is_valid_for_the_version_with_no_undeclared_field(version):
    doc = document(version)
    api = slurm_api(version, "http://slurmrestd:6820", user="root", token="t")
    root = {"components": {"schemas": strict(doc["components"]["schemas"])}}
    schema = {**root, "$ref": f"#/components/schemas/{SUBMISSION[version]}"}
    jsonschema.Draft7Validator(schema).validate(api.submission(SPEC))


@pytest.mark.parametrize("version", API_VERSIONS)
def test_every_path_the_client_calls_is_offered(version):
    paths = document(version)["paths"]
    api = slurm_api(version, "", user="root", token="t")
    suffix = api.collection_suffix
    assert "post" in paths[api._url("job/submit")]
    assert {"get", "delete"} <= set(paths[api._url("job/{job_id}")])
    assert "get" in paths[api._url(f"ping{suffix}")] and "get" in paths[api._url(f"jobs{suffix}")]


@pytest.mark.parametrize("version", API_VERSIONS)
def test_every_job_field_the_client_reads_exists(version):
    fields = document(version)["components"]["schemas"][JOB[version]]["properties"]
    read = {"job_id", "name", "job_state", "exit_code", "restart_cnt", "state_reason", "user_name", "comment"}
    assert read <= set(fields)
    # what adoption compares: the user the job runs as, and the comment the submission set
    assert fields["user_name"]["type"] == fields["comment"]["type"] == "string"


@pytest.mark.parametrize("version", API_VERSIONS)
def test_the_submission_carries_the_comment_and_the_job_list_gives_it_back_with_the_user(version):
    api = slurm_api(version, "http://slurmrestd:6820", user="root", token="t")
    assert api.submission(SPEC)["job"]["comment"] == SPEC.comment
    state = "RUNNING" if version == "v0.0.38" else ["RUNNING"]
    status = api.parse({"job_id": 3, "name": "x", "job_state": state, "user_name": "root", "comment": SPEC.comment})
    assert (status.user, status.comment, status.ended) == ("root", SPEC.comment, False)


def test_v0044_job_states_and_exit_codes_parse_as_slinky_reports_them():
    api = slurm_api("v0.0.44", "http://slurmrestd:6820", user="root", token="t")
    job = {
        "job_id": 7,
        "name": "x",
        "job_state": ["FAILED"],
        "exit_code": {"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 2}},
        "restart_cnt": 1,
        "state_reason": "NonZeroExitCode",
    }
    status = api.parse(job)
    assert (status.state, status.exit_code, status.restarts, status.ended) == ("FAILED", 2, 1, True)
    states = document("v0.0.44")["components"]["schemas"]["v0.0.44_job_info"]["properties"]["job_state"]
    assert {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "COMPLETED"} <= set(states["items"]["enum"])


def test_v0038_wait_statuses_become_exit_codes():
    api = slurm_api("v0.0.38", "http://slurmrestd:6820", user="root", token="t")
    base = {"job_id": 1, "name": "x", "restart_cnt": 0}
    assert api.parse({**base, "job_state": "FAILED", "exit_code": 512}).exit_code == 2  # exit 2
    assert api.parse({**base, "job_state": "CANCELLED", "exit_code": 15}).exit_code == 128 + 15  # SIGTERM
    assert api.parse({**base, "job_state": "COMPLETED", "exit_code": 0}).exit_code == 0


def test_an_unknown_version_is_refused_naming_the_setting():
    from eksflow.runtime.slurm import SlurmError

    with pytest.raises(SlurmError, match=r"cluster.slurm.api_version: 'v0.0.41'"):
        slurm_api("v0.0.41", "http://x:6820", user="root", token="t")
