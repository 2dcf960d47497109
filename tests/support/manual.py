"""The README and the manual's pages (docs/*.md, built by mkdocs: mkdocs.yml), as the
tests that check what they say read them: the README first, then each page of the
manual by name (docs/protocol.md is the protocol's own file, checked by
tests/test_protocol_doc.py, and holds no code blocks)."""

from __future__ import annotations

import re

from support.process import REPO

DOCS = REPO / "docs"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def pages() -> list[str]:
    """The text of the README and of every page of the manual, the README first."""
    manual = sorted(p for p in DOCS.glob("*.md") if p.name != "protocol.md")
    return [(REPO / "README.md").read_text(encoding="utf-8"),
            *(p.read_text(encoding="utf-8") for p in manual)]


def page(name: str) -> str:
    """One page of the manual (``metrics.md``), whole."""
    return (DOCS / name).read_text(encoding="utf-8")


def python_blocks() -> list[str]:
    """Every ```python block of the README and the manual, in the order of pages()."""
    return [block for text in pages() for block in PYTHON_BLOCK.findall(text)]
