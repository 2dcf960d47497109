"""The modules pyproject.toml lists for mypyc run compiled all together or not at all,
the same in the suite and in the rsd processes it starts; ``RSD_EXPECT_COMPILED`` (1 or
0, set by ``make test``) says which. A half-compiled build (one module missing its
extension, or left from another build) fails here, not later in some rule's test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import build
from support.process import REPO, subprocess_env

EXPECTED = os.environ.get("RSD_EXPECT_COMPILED")


def _compiled_here() -> dict[str, bool]:
    return {source: build.compiled(module) for source, module in build.imported().items()}


def test_the_listed_modules_are_all_compiled_or_all_python() -> None:
    here = _compiled_here()
    assert here, "pyproject.toml lists no module for mypyc"
    assert len(set(here.values())) == 1, f"a half-compiled build: {here}"
    if EXPECTED is not None:
        assert all(here.values()) is (EXPECTED == "1"), f"RSD_EXPECT_COMPILED={EXPECTED}"


@pytest.mark.skipif(EXPECTED == "0", reason="the pure run is of in-process tests only")
def test_an_rsd_process_runs_the_build_the_suite_runs() -> None:
    probe = (
        "import sys; sys.path.insert(0, 'tests'); from support import build; "
        "print(sorted(s for s, m in build.imported().items() if build.compiled(m)))"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, check=True,
    )
    assert child.stdout.strip() == repr(sorted(s for s, c in _compiled_here().items() if c))
