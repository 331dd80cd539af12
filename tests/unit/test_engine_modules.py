"""ENGINE_MODULES (tests/conftest.py) names exactly the e2e modules that use the session's shared vLLM engine, and
those whose runs start engines of their own instead (they say so: STARTS_ITS_OWN_ENGINES).

A module that uses it but is missing from the list would run on the other pytest-xdist worker and start a second
engine beside the first; a renamed module would silently leave the list.
"""

import re
from pathlib import Path

from tests.conftest import ENGINE_MODULES

ROOT = Path(__file__).resolve().parents[2]
USES_SHARED_ENGINE = re.compile(r"\b(shared_engine|adopt_engine)\b|^STARTS_ITS_OWN_ENGINES = True", re.MULTILINE)


def test_engine_modules_are_the_modules_that_use_the_shared_engine():
    users = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests" / "e2e").glob("test_*.py")
        if USES_SHARED_ENGINE.search(path.read_text(encoding="utf-8"))
    }
    assert users == set(ENGINE_MODULES)
