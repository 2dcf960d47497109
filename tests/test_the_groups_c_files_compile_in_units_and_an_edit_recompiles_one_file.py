"""The group's module C files compile in units when all of a unit is to be compiled (a
fresh build, the group's header changed), and an edit recompiles the files edited, not a
unit (setup.py's Units): what is compiled and what is linked, at each step of a
developer's builds.

Each unit is a C file that includes its files; each of them alone parsed the group's
headers first, about 0.3 s of gcc a file. What must hold besides: every file is linked
exactly once (in its unit's object or in its own), no object older than what it is
made from is linked, and a file's unit follows from its name, never from its size.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.build import setup_module_of_the_checkout

FILES = [f"__native_m{n}.c" for n in range(40)]
RUNTIME = "init.c"  # a lib-rt file mypyc copies beside its own: compiled alone


class Builds:
    """A checkout's build/mypyc of FILES, a header and a lib-rt file, and the plans of
    successive builds, with the objects each plan compiles made (dated later)."""

    def __init__(self, setup: ModuleType, compiler: Any) -> None:
        self.setup = setup
        self.compiler = compiler
        self.clock = time.time()  # ahead of the real one: what plan() writes is older
        self.sources = [f"{setup.BUILD}/{name}" for name in [*FILES, RUNTIME]]
        for source in [*self.sources, f"{setup.BUILD}/__native_internal_x.h"]:
            Path(source).parent.mkdir(parents=True, exist_ok=True)
            Path(source).write_text("/* C */\n")
            self.date(source)

    def date(self, path: str) -> None:
        """Made or changed now (a second after the last change)."""
        self.clock += 1
        os.utime(path, (self.clock, self.clock))

    def objects(self) -> list[str]:
        return list(self.compiler.object_filenames(self.sources, output_dir="objects"))

    def build(self) -> tuple[list[str], list[str]]:
        """The plan of a build (compiled, linked), its objects then made."""
        objects = self.objects()
        todo = [s for s, o in zip(self.sources, objects, strict=True)
                if self.setup._stale(s, o)]
        compiled, linked = self.setup.Units(self.compiler, "objects").plan(
            self.sources, objects, todo)
        for source in compiled:
            (made,) = self.compiler.object_filenames([source], output_dir="objects")
            Path(made).parent.mkdir(parents=True, exist_ok=True)
            Path(made).write_bytes(b"")
            self.date(made)
        for made in linked:
            assert not self.setup._stale(*self.made_from(made)), f"{made} linked stale"
        return compiled, linked

    def made_from(self, made: str) -> tuple[str, str, list[str]]:
        """(source, object, other inputs) of a linked object."""
        for source, own in zip(self.sources, self.objects(), strict=True):
            if own == made:
                return source, made, [str(p) for p in Path(self.setup.BUILD).glob("*.h")]
        unit = f"{self.setup.BUILD}/units/{Path(made).stem}.c"
        files = [f"{self.setup.BUILD}/{line.split('/')[-1].rstrip(chr(34))}"
                 for line in Path(unit).read_text().splitlines()]
        return unit, made, [*files, *(str(p) for p in Path(self.setup.BUILD).glob("*.h"))]

    def members(self, linked: list[str]) -> list[str]:
        """The files the linked objects hold, each as often as it is linked."""
        held = []
        for made in linked:
            source, _, inputs = self.made_from(made)
            held += [i for i in inputs if i.endswith(".c")] if "/units/" in source else [source]
        return sorted(held)

    def units(self) -> list[str]:
        return sorted(str(p) for p in Path(self.setup.BUILD, "units").glob("*.c"))

    def unit_of(self, source: str) -> list[str]:
        """The files of the unit ``source`` is in."""
        for unit in self.units():
            files = self.made_from(f"objects/{unit[:-2]}.o")[2]
            if source in files:
                return sorted(f for f in files if f.endswith(".c"))
        raise AssertionError(f"{source} is in no unit")


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Builds:
    # (setuptools' compiler, imported here as the build imports it: not as this module is
    # collected, which would cost each pytest-xdist worker its import)
    from setuptools._distutils.ccompiler import new_compiler

    monkeypatch.chdir(tmp_path)
    return Builds(setup_module_of_the_checkout(), new_compiler())


def test_a_fresh_build_compiles_units_and_each_file_is_linked_once(builds: Builds) -> None:
    compiled, linked = builds.build()
    assert sorted(compiled) == sorted([*builds.units(), f"{builds.setup.BUILD}/{RUNTIME}"])
    assert 1 < len(builds.units()) <= builds.setup.UNITS
    assert builds.members(linked) == sorted(builds.sources)
    assert builds.build() == ([], linked)  # nothing changed: nothing compiled, same link


def test_an_edit_recompiles_its_units_files_once_then_only_the_file_edited(
    builds: Builds,
) -> None:
    builds.build()
    edited = f"{builds.setup.BUILD}/{FILES[7]}"
    builds.date(edited)
    compiled, linked = builds.build()
    assert sorted(compiled) == builds.unit_of(edited)  # on their own objects from now on
    assert builds.members(linked) == sorted(builds.sources)
    builds.date(edited)
    compiled, linked = builds.build()
    assert compiled == [edited]
    assert builds.members(linked) == sorted(builds.sources)


def test_a_change_of_the_groups_header_compiles_every_unit_again(builds: Builds) -> None:
    builds.build()
    builds.date(f"{builds.setup.BUILD}/{FILES[3]}")
    builds.build()  # one unit's files on their own objects
    builds.date(f"{builds.setup.BUILD}/__native_internal_x.h")
    compiled, linked = builds.build()
    assert sorted(compiled) == sorted([*builds.units(), f"{builds.setup.BUILD}/{RUNTIME}"])
    assert builds.members(linked) == sorted(builds.sources)


def test_a_files_unit_follows_from_its_name_not_its_size(builds: Builds) -> None:
    builds.build()
    units = {unit: Path(unit).read_text() for unit in builds.units()}
    for name in FILES[::5]:
        Path(builds.setup.BUILD, name).write_text("/* C, grown */\n" * 1000)
        builds.date(f"{builds.setup.BUILD}/{name}")
    builds.build()
    assert {unit: Path(unit).read_text() for unit in builds.units()} == units


def test_a_checkout_built_file_by_file_links_its_objects_and_compiles_only_what_changed(
    builds: Builds,
) -> None:
    for made in builds.objects():  # a build from before units: every file's own object
        Path(made).parent.mkdir(parents=True, exist_ok=True)
        Path(made).write_bytes(b"")
        builds.date(made)
    compiled, linked = builds.build()
    assert compiled == [] and sorted(linked) == sorted(builds.objects())
    edited = f"{builds.setup.BUILD}/{FILES[11]}"
    builds.date(edited)
    compiled, linked = builds.build()
    assert compiled == [edited]
    assert builds.members(linked) == sorted(builds.sources)
