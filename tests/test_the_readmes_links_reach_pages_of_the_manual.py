"""Every link of the README to a file of this repository (the manual's pages, protocol.md)
names a file that is there. The manual's own links are checked by its strict build
(`make docs`, in `make test`); the README stands outside the manual (mkdocs.yml's
docs_dir), so a page renamed or removed under it would break its links unnoticed."""

from __future__ import annotations

import re

from support.process import REPO

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_every_link_of_the_readme_to_a_file_names_a_file_that_is_there() -> None:
    links = [link for link in LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
             if "://" not in link]
    assert "docs/getting-started.md" in links, "the README links into the manual"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"the README links to files that are not there: {missing}"
