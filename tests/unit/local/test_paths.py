"""Container paths are mapped to host folders only where a path is meant, and only as whole values."""

import os
from pathlib import Path

import pytest

from eksflow.local.model import PathRules
from eksflow.local.paths import PATH_ARGS, PATH_ENV, PathMap, map_argv, map_env, map_shell_words, path_rules
from tests.unit.local.manifests import container, outputs, run, task, workflow

PATHS = PathMap([("/fsx", "/host/fsx"), ("/tmp/outputs", "/host/out"), ("/tmp/outputs/sub", "/host/sub")])
ANNOTATED = PathRules(frozenset({"--dataset-dir", "--tracking-uri", "--report-dir"}), frozenset({"DATA"}))
UNANNOTATED = PathRules(None, None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/fsx", "/host/fsx"),
        ("/fsx/a/b", "/host/fsx/a/b"),
        ("sqlite:////fsx/db", "sqlite:////host/fsx/db"),
        ("file:///fsx/data.jsonl", "file:///host/fsx/data.jsonl"),
        ("/tmp/outputs/score", "/host/out/score"),
        ("/tmp/outputs/sub/x", "/host/sub/x"),
        ("/data/fsx/x", "/data/fsx/x"),
        ("/fsx-old/x", "/fsx-old/x"),
        ("/fsx.bak", "/fsx.bak"),
        ("s3://bucket/fsx/x", "s3://bucket/fsx/x"),
        ("s3:///fsx", "s3:///host/fsx"),
        ("--dir=/fsx/a", "--dir=/fsx/a"),
        ("Copy /fsx/data", "Copy /fsx/data"),
        ("a=/fsx,b=/fsx/c", "a=/fsx,b=/fsx/c"),
    ],
    ids=[
        "bare",
        "nested",
        "sqlite-url",
        "file-url",
        "outputs",
        "longest",
        "inner",
        "sibling",
        "dotted",
        "authority",
        "no-authority",
        "flag-is-not-a-path",
        "text",
        "list",
    ],
)
def test_whole_values_only(value: str, expected: str) -> None:
    assert PATHS.to_host(value) == expected
    assert PATHS.to_container(expected) == value


def test_annotated_flags_and_env_are_the_only_values_mapped() -> None:
    argv = [
        "/fsx/bin/tool",
        "--dataset-dir=/fsx/data",
        "--report-dir",
        "/fsx/reports",
        "--tracking-uri=sqlite:////fsx/mlflow/mlflow.db",
        "--smoke-prompt=/fsx/data is where the data lives",
        "--other",
        "/fsx/x",
        "Copy /fsx/data",
    ]
    assert map_argv(argv, PATHS, ANNOTATED) == [
        "/host/fsx/bin/tool",  # the program itself is a path
        "--dataset-dir=/host/fsx/data",
        "--report-dir",
        "/host/fsx/reports",
        "--tracking-uri=sqlite:////host/fsx/mlflow/mlflow.db",
        "--smoke-prompt=/fsx/data is where the data lives",
        "--other",
        "/fsx/x",
        "Copy /fsx/data",
    ]
    env = [("DATA", "/fsx/data"), ("PROMPT", "/fsx/data")]
    assert map_env(env, PATHS, ANNOTATED) == {"DATA": "/host/fsx/data", "PROMPT": "/fsx/data"}


def test_without_annotations_whole_items_and_flag_values_are_mapped() -> None:
    argv = ["python", "/fsx/x", "--dir=/fsx/a", "Copy /fsx/data", "--prompt= /fsx/data"]
    assert map_argv(argv, PATHS, UNANNOTATED) == ["python", "/host/fsx/x", "--dir=/host/fsx/a", *argv[3:]]
    assert map_env([("A", "/fsx/a"), ("B", "x /fsx")], PATHS, UNANNOTATED) == {"A": "/host/fsx/a", "B": "x /fsx"}


def test_annotations_are_read_from_template_metadata() -> None:
    rules = path_rules({PATH_ARGS: "--a, --b,", PATH_ENV: "X"})
    assert rules == PathRules(frozenset({"--a", "--b"}), frozenset({"X"}))
    assert path_rules({}) == UNANNOTATED


@pytest.mark.parametrize(
    ("command", "rules", "expected"),
    [
        ("python -m x /fsx/out > /fsx/log; wait", UNANNOTATED, "python -m x /host/fsx/out > /host/fsx/log; wait"),
        (
            'python -c \'print("/fsx/x")\' "$OUT" /fsx/y',
            UNANNOTATED,
            'python -c \'print("/fsx/x")\' "$OUT" /host/fsx/y',
        ),
        (
            "train --dataset-dir=/fsx/d --note=/fsx/n /fsx/z",
            ANNOTATED,
            "train --dataset-dir=/host/fsx/d --note=/fsx/n /fsx/z",
        ),
        ("train --report-dir /fsx/r", ANNOTATED, "train --report-dir /host/fsx/r"),
        # shlex.quote's quoting of a value with `{{workflow.name}}` in it: the text is literal, so it is mapped
        (
            "train '--dataset-dir=/fsx/runs/wf-1/d' '--note=/fsx/n' '/fsx/z'",
            ANNOTATED,
            "train --dataset-dir=/host/fsx/runs/wf-1/d '--note=/fsx/n' '/fsx/z'",
        ),
        ("train '--out=/fsx/o' 'it''s' /fsx", UNANNOTATED, "train --out=/host/fsx/o 'it''s' /host/fsx"),
    ],
    ids=[
        "plain-words-and-redirect",
        "quoted-text-untouched",
        "annotated",
        "annotated-two-words",
        "single-quoted",
        "single-quoted-unannotated",
    ],
)
def test_shell_entrypoints_map_plain_words_in_place(command: str, rules: PathRules, expected: str) -> None:
    assert map_shell_words(command, PATHS, rules) == (expected, "")


def test_a_host_folder_the_shell_cannot_carry_is_reported() -> None:
    paths = PathMap([("/fsx", "/my runs/fsx")])
    assert map_shell_words("cat /fsx/x", paths, UNANNOTATED) == ("cat /my runs/fsx/x", "/my runs/fsx/x")
    # a single-quoted word is quoted again: any folder fits in it
    assert map_shell_words("cat '/fsx/x'", paths, UNANNOTATED) == ("cat '/my runs/fsx/x'", "")


RECORD = """
import os, pathlib, sys
out = pathlib.Path(os.environ["RECORD_TO"])
for i, value in enumerate(sys.argv[1:]):
    (out / f"arg{i}").write_bytes(os.fsencode(value))
(out / "env").write_bytes(os.fsencode(os.environ["PROMPT"]))
(out / "data").write_bytes(os.fsencode(os.environ["DATA_DIR"]))
os.makedirs(os.environ["OUT_DIR"], exist_ok=True)
open(os.path.join(os.environ["OUT_DIR"], "where"), "w").write(sys.argv[1].split("=", 1)[1])
open(os.path.join(os.environ["OUT_DIR"], "said"), "w").write("saved to " + sys.argv[1].split("=", 1)[1])
"""


def test_a_run_maps_declared_paths_and_leaves_free_text_byte_identical(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    prompts = ["Copy /fsx/data to the bucket", "/fsx/data is where it lives"]
    template = container(
        "step",
        RECORD,
        "--dataset-dir=/fsx/data",
        f"--smoke-prompt={prompts[0]}",
        "--smoke-expect",
        prompts[1],
        outputs=outputs("where", "said"),
    )
    template["container"]["env"] = [
        {"name": "RECORD_TO", "value": str(seen)},
        {"name": "PROMPT", "value": prompts[1]},
        {"name": "DATA_DIR", "value": "/fsx/data"},
        {"name": "OUT_DIR", "value": "/tmp/outputs"},
    ]
    template["container"]["volumeMounts"] = [{"name": "fsx", "mountPath": "/fsx"}]
    template["metadata"] = {"annotations": {PATH_ARGS: "--dataset-dir", PATH_ENV: "DATA_DIR,OUT_DIR"}}
    manifest = workflow([task("step", "step")], [template])
    manifest["spec"]["volumes"] = [{"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}}]
    result = run(manifest, tmp_path)
    assert result.phase == "Succeeded", result.message
    host_data = tmp_path / "state" / "volumes" / "fsx-claim" / "data"
    assert (seen / "arg0").read_bytes() == f"--dataset-dir={host_data}".encode()
    assert (seen / "arg1").read_bytes() == f"--smoke-prompt={prompts[0]}".encode()
    assert (seen / "arg3").read_bytes() == prompts[1].encode()
    assert (seen / "env").read_bytes() == prompts[1].encode()
    assert (seen / "data").read_bytes() == os.fsencode(str(host_data))
    # An output that is a host path as a whole shows as the container path; text that contains one stays as is.
    assert result.nodes["step"].outputs == {"where": "/fsx/data", "said": f"saved to {host_data}"}
