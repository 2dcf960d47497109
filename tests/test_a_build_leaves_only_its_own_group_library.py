"""A build removes the group libraries earlier builds left at the top of the checkout.

mypyc names the library a group of compiled modules shares after the group's modules
(``<hash>__mypyc.<abi>.so``): a build with another list of modules makes another name,
and the old library stays beside the new one. Only the new one is loaded, but a wheel
made from the checkout packs every one: the image's test, built from a checkout compiled
a dozen times, was 131 MB against 89 MB from a fresh clone. setup.py keeps this build's
group library and removes the others, whether mypyc ran or its last output was reused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.build import setup_module_of_the_checkout

ABI = ".cpython-311-x86_64-linux-gnu.so"


def test_the_group_libraries_of_earlier_builds_are_removed_and_this_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = setup_module_of_the_checkout()
    monkeypatch.setattr(setup, "HERE", tmp_path)
    for name in ("aaaa__mypyc", "bbbb__mypyc", "cccc__mypyc"):
        (tmp_path / f"{name}{ABI}").write_bytes(b"")
    (tmp_path / f"other{ABI}").write_bytes(b"")  # not a group library: not the build's
    # (setuptools' Extension, as setup.py has it: imported with it, not as this module is
    # collected, which cost each pytest-xdist worker 0.7 s of CPU)
    extension = setup.Extension
    this_build = [extension("bbbb__mypyc", sources=[]), extension("rsd.core.x", sources=[])]
    setup._remove_stale_groups(this_build)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        f"bbbb__mypyc{ABI}", f"other{ABI}"]
