"""A user pipeline's own section default survives an override of another key of the section, in every command.

tests/fixtures/greeter/pipelines/formal.py declares `greeting: GreetSettings = GreetSettings(punctuation=".")`
(the step's own default is "!"); `--set greeting.pause_s=...` once rebuilt the section from GreetSettings' class
defaults, so `config`, `render` and `run` silently greeted with "!".
"""

import yaml

from tests.e2e.test_user_project import cli

FORMAL = ("-m", "pipelines.formal")
OTHER_KEY = ("--set", "greeting.pause_s=0.1")


def test_config_prints_the_declared_default_and_reads_back_the_same(tmp_path):
    done = cli(*FORMAL, "config", *OTHER_KEY)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["greeting"] == {"punctuation": ".", "pause_s": 0.1}
    printed = tmp_path / "printed.yaml"
    printed.write_text(done.stdout)
    again = cli(*FORMAL, "config", "--config", str(printed))
    assert again.returncode == 0 and again.stdout == done.stdout
    keys = cli(*FORMAL, "config", "--keys").stdout.splitlines()
    assert "| greeting.punctuation | str | '.' | appended to every greeting |" in keys


def test_render_passes_the_declared_default_to_the_step():
    done = cli(*FORMAL, "render", *OTHER_KEY)
    assert done.returncode == 0, done.stderr
    (greet,) = [t for t in yaml.safe_load(done.stdout)["spec"]["templates"] if t["name"] == "greet"]
    assert {"--punctuation=.", "--pause-s=0.1"} <= set(greet["container"]["args"])


def test_run_greets_with_the_declared_default_under_set_and_a_partial_config_file(tmp_path):
    partial = tmp_path / "partial.yaml"
    partial.write_text("greeting:\n  pause_s: 0.1\n")
    for given in (OTHER_KEY, ("--config", str(partial))):
        state = tmp_path / given[0].lstrip("-")
        done = cli(*FORMAL, "run", "--state-dir", str(state), *given)
        assert done.returncode == 0, done.stderr
        assert "message = Hallo, Ada Lovelace." in done.stderr


def test_a_resume_given_a_default_value_again_matches_the_run_it_resumes(tmp_path):
    state = tmp_path / "state"
    assert cli(*FORMAL, "run", "--state-dir", str(state)).returncode == 0
    (name,) = [run.name for run in (state / "runs").iterdir()]
    again = cli(*FORMAL, "run", "--state-dir", str(state), "--resume", name, "--set", "greeting.pause_s=0")
    assert again.returncode == 2  # the same settings: only the finished run stops it
    assert f"run {name!r} already Succeeded; there is nothing to resume" in again.stderr, again.stderr
