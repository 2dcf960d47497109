"""``make test`` runs ``mypy`` with pyproject's ``[tool.mypy]``: that configuration is
strict and covers the server (``rsd``), its wire vocabulary (``rsproto``), both clients
(``rsclient``, ``rsctl``), the examples and the benchmarks, so a type error in any of them fails the
build. (The check itself runs in ``make test``, not here: this guards the list.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_strict_over_the_server_its_vocabulary_its_clients_and_the_examples() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert {"rsd", "rsproto", "rsclient", "rsctl", "examples", "bench"} <= set(config["files"])
    for package in config["files"]:
        assert (ROOT / package).is_dir(), package


def test_make_test_runs_mypy_with_that_configuration() -> None:
    """``make test`` runs the ``typecheck`` target (beside the suite's first collection),
    whose recipe is mypy with pyproject's configuration and no arguments of its own."""
    makefile = (ROOT / "Makefile").read_text()

    def recipe(target: str) -> str:
        return makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0] + "\n"

    assert re.search(r"\t\$\(MAKE\) [^\n]*\btypecheck\b", recipe("test")), recipe("test")
    assert "\t$(BIN)/mypy\n" in recipe("typecheck")
