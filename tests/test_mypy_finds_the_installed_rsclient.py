"""A user's code type-checks against the rsclient installed in the venv, from any folder.

The venv ``make`` builds holds rsclient as an editable install; the Makefile makes it
strict (``editable_mode=strict``: a link tree under build/ on a plain path entry), which
mypy follows, not setuptools' default import hook, which it cannot (mypy then says
"Cannot find implementation or library stub for module named 'rsclient'"). So mypy is
run here, with this venv's Python, from a folder outside the checkout, with no
PYTHONPATH or MYPYPATH to help it: a correct use passes, and a wrong one is reported,
which shows rsclient's own types were read (py.typed).

(A venv whose install predates the Makefile's setting fails here: ``make`` remakes it,
as the stamp follows the Makefile.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CORRECT = '''
from rsclient import AsyncRunstate, ConflictError


async def main() -> str:
    async with AsyncRunstate(holder="typed-1") as rs:
        run = await rs.scopes.create(id="nightly")
        try:
            lease = await run.claim("company:acme").acquire()
        except ConflictError as exc:
            return exc.code
        generation: int = lease.generation
        return f"{lease.token()} {generation}"
'''

WRONG = '''
from rsclient import AsyncRunstate


async def main() -> None:
    async with AsyncRunstate(holder="typed-1") as rs:
        run = await rs.scopes.create(id="nightly")
        name: int = run.id
'''


def mypy(folder: Path, source: str) -> subprocess.CompletedProcess[str]:
    (folder / "app.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(folder / ".cache"),
         "--no-error-summary", "app.py"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )


def test_mypy_run_from_another_folder_finds_rsclient_and_its_types(tmp_path: Path) -> None:
    checkout = Path(__file__).resolve().parent.parent
    if tmp_path.resolve().is_relative_to(checkout):
        pytest.skip("the temporary folder is inside the checkout")
    good = mypy(tmp_path, CORRECT)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy(tmp_path, WRONG)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Incompatible types in assignment (expression has type "str"' in bad.stdout, (
        bad.stdout + bad.stderr
    )


@pytest.mark.parametrize("where", ["elsewhere", "in the checkout"])
def test_the_version_is_the_installed_distributions_read_without_importlib_metadata(
    where: str,
) -> None:
    """``__version__`` is the one importlib.metadata gives for the installed distribution,
    yet neither rsd's start nor rsclient nor rsctl imports importlib.metadata for it (37 ms
    of CPU at every start of each: rsproto reads the dist-info's METADATA itself), also
    when started in the checkout, where the install left an egg-info first on the path
    (every test's rsd starts there: 45 ms more each, about 20 s of a suite's CPU)."""
    from importlib.metadata import version

    import rsclient
    import rsproto

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    shown = subprocess.run(
        [sys.executable, "-c", "import sys, rsd.cli, rsclient, rsctl.main, rsproto; "
         "print(rsproto.__version__, 'importlib.metadata' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
        cwd="/" if where == "elsewhere" else Path(__file__).resolve().parent.parent,
    ).stdout.split()
    assert rsproto.__version__ == rsclient.__version__ == version("rsd")
    assert shown == [version("rsd"), "False"]
