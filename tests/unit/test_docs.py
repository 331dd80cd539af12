"""The docs stay true: examples are the code the tests run, and the configuration reference is current."""

import re
from pathlib import Path

import pytest

import eksflow.launchers  # noqa: F401  (registers the SDK's launchers)
from eksflow.config_docs import reference
from eksflow.launchers.base import LAUNCHERS
from tests.unit.test_import_rules import LAYERS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FILE_BLOCK = re.compile(r"```(?:python|dockerfile)\n# file: (\S+)\n(.*?)```", re.DOTALL)
FIXTURES = ROOT / "tests" / "fixtures"
# An excerpt of a file of this repository: its lines as they are there, runs of them separated by `# ...` lines.
EXCERPT_BLOCK = re.compile(r"```python\n# from: (\S+)\n(.*?)```", re.DOTALL)
GAP = "# ..."
ARCHITECTURE = (DOCS / "architecture.md").read_text()


@pytest.mark.parametrize(
    ("doc", "project"),
    [
        ("writing-a-step.md", "greeter"),  # tests/e2e/test_user_project.py runs it
        ("writing-a-pipeline.md", "greeter"),
        ("writing-an-llm-pipeline.md", "text2sql"),  # tests/e2e/test_own_llm_project.py runs it
        ("installing.md", "text2sql"),  # its Containerfile: `make check-images` builds and checks it
    ],
)
def test_examples_are_the_files_the_tests_run(doc, project):
    """Each `# file:` example is a file of the fixture project the tests run."""
    blocks = FILE_BLOCK.findall((DOCS / doc).read_text())
    assert blocks, f"{doc} shows no example file"
    for path, code in blocks:
        fixture = FIXTURES / project / path
        assert code == fixture.read_text(), f"docs/{doc} shows an outdated {path}: copy it from {fixture}"


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_excerpts_are_the_lines_of_the_files_they_name_in_order(doc):
    """A `# from: <path>` example shows runs of that file's lines as they are, in their order (`# ...`: a gap)."""
    for path, code in EXCERPT_BLOCK.findall((DOCS / doc).read_text()):
        lines = (ROOT / path).read_text().splitlines()
        at = 0
        for run in _runs(code.splitlines()):
            found = next((i for i in range(at, len(lines)) if lines[i : i + len(run)] == run), None)
            assert found is not None, f"docs/{doc} shows lines {path} does not have (after line {at}): {run[0]!r}"
            at = found + len(run)


def _runs(lines: list[str]) -> list[list[str]]:
    runs: list[list[str]] = [[]]
    for line in lines:
        if line.strip() == GAP:
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if run]


def test_configuration_reference_is_current():
    modules = ["pipelines.llama_lora", "pipelines.lora_sweep", "pipelines.champion_check"]
    assert (DOCS / "configuration.md").read_text() == reference(modules), "stale: run `make docs`"


def test_every_reliability_id_cited_in_code_is_in_the_catalogue():
    catalogue = set(re.findall(r"^- ([A-Z]{1,2}\d)\b", (DOCS / "reliability.md").read_text(), re.MULTILINE))
    cited = set()
    for path in [*ROOT.glob("eksflow/**/*.py"), *ROOT.glob("eksflow/llm/steps/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        cited |= set(
            re.findall(r"docs/reliability\.md[^\n]*?\b((?:CK|EV|ML|DP|DV|ST|EX|RO|SC|S)\d)\b", path.read_text())
        )
    assert cited and cited <= catalogue


def test_the_architecture_lists_the_import_layers_in_order():
    """docs/architecture.md's layer sentence is tests/unit/test_import_rules.py's LAYERS, the enforced order."""
    found = re.search(r"down these layers \(lowest first\): (.*?), the flat `eksflow` namespace", ARCHITECTURE, re.S)
    assert found is not None, "docs/architecture.md lost its sentence listing the layers"
    listed = [name.strip() for name in " ".join(found.group(1).split()).split(",")]
    assert listed == [unit.removeprefix("eksflow.") for unit in LAYERS if unit not in ("eksflow", "eksflow.llm")]


# How docs/architecture.md names each registered launcher (cluster.launcher) in its `launchers/` entry.
LAUNCHER_PHRASES = {
    "container": "a plain pod",
    "rayjob": "a KubeRay RayJob",
    "mpijob": "an MPIJob",
    "trainjob": "a Kubeflow Trainer TrainJob",
    "volcano": "a Volcano Job",
    "slurm": "a Slurm batch job",
}


def test_the_architecture_names_every_launcher():
    entry = ARCHITECTURE.split("      launchers/", 1)[1].split("\n      manifests.py", 1)[0]
    assert sorted(LAUNCHERS) == sorted(LAUNCHER_PHRASES), "a launcher was added or removed: say so in both"
    assert [name for name, phrase in LAUNCHER_PHRASES.items() if phrase not in " ".join(entry.split())] == []
