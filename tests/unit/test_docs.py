"""The docs stay true: examples are the code the tests run, and the configuration reference is current."""

import re
from pathlib import Path

import pytest

from eksflow.config_docs import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FILE_BLOCK = re.compile(r"```(?:python|dockerfile)\n# file: (\S+)\n(.*?)```", re.DOTALL)
FIXTURES = ROOT / "tests" / "fixtures"


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
