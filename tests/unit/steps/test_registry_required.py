"""Steps that read what earlier runs registered refuse a sqlite registry that does not exist, creating nothing."""

import sqlite3

import pytest

from tests.commands import python


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("eksflow.llm.steps.rollback", ["--model-name=llama-lora"]),
        ("eksflow.llm.steps.fetch_champion", ["--model-name=llama-lora", "--dest-dir={tmp}/adapter"]),
        (
            "eksflow.llm.steps.serve",
            ["--model-name=llama-lora", "--serve-dir={tmp}/serve", "--model-cache-dir={tmp}/models"],
        ),
    ],
    ids=["rollback", "fetch-champion", "serve"],
)
def test_a_mistyped_sqlite_registry_is_refused_in_one_line(tmp_path, module, args):
    db = tmp_path / "typo" / "mlflow.db"
    argv = [a.format(tmp=tmp_path) for a in args]
    done = python("-m", module, *argv, f"--tracking-uri=sqlite:///{db}", f"--outputs-dir={tmp_path / 'out'}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: --tracking-uri: no MLflow database at {db} (sqlite:///{db}); check the path: this step reads what "
        "earlier runs registered there (`sqlite:////abs/path.db` is absolute, `sqlite:///rel.db` relative)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no empty registry, no folders


def test_a_locked_registry_fails_in_one_line_naming_the_database(tmp_path):
    from eksflow.llm.steps.common import tracking

    db = tmp_path / "mlflow.db"
    tracking.client(f"sqlite:///{db}").search_registered_models()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing: no reader gets in
    try:
        args = ["--model-name=llama-lora", f"--tracking-uri=sqlite:///{db}", f"--outputs-dir={tmp_path / 'out'}"]
        done = python("-m", "eksflow.llm.steps.rollback", *args)
    finally:
        holder.close()
    assert done.returncode == 1, done.stderr  # retryable: the lock goes away
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: MLflow database {db} is locked by another process"), line
