"""A module's shim (mypyc's small per-module extension) compiles on ``Python.h``
precompiled once per build (setup.py's PythonHeader: 0.16 s of gcc a shim without it,
0.05 s with it), and a precompiled header gcc cannot use (made with other options, or
damaged) is passed over without a word: it can cost time, never a build.
"""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.build import setup_module_of_the_checkout

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")

SHIM = (
    "#include <Python.h>\n"
    'PyMODINIT_FUNC PyInit_shim(void) { return PyImport_ImportModule("sys"); }\n'
)
PLAIN = ("-O2", "-Werror")  # options as the build gives them (its own are mypyc's)


def _compiler() -> Any:
    # (imported here, not as the module is collected: setuptools costs each pytest-xdist
    # worker 0.1 s of CPU to import, and only these tests and the build use it)
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    compiler.include_dirs.append(sysconfig.get_paths()["include"])
    return compiler


def _compile_shim(
    compiler: Any, where: Path, include_dirs: list[str], flags: Sequence[str] = PLAIN
) -> Path:
    source = where / "shim.c"
    source.write_text(SHIM)
    (made,) = compiler.compile([str(source)], output_dir=str(where / "objects"),
                               include_dirs=include_dirs, extra_postargs=list(flags))
    return Path(made)


def test_the_header_is_made_once_and_a_shim_compiles_on_it(tmp_path: Path) -> None:
    setup = setup_module_of_the_checkout()
    compiler = _compiler()
    header = setup.PythonHeader(compiler)
    # -Winvalid-pch with -Werror: a shim's compile fails if gcc finds the header unusable
    flags = [*PLAIN, "-Winvalid-pch"]
    kwargs = {"include_dirs": [], "extra_postargs": flags}
    directory = header.directory(str(tmp_path), kwargs)
    assert directory is not None
    made = Path(directory) / "Python.h.gch"
    assert made.stat().st_size > 1_000_000  # a precompiled header, not a stub
    assert header.directory(str(tmp_path), kwargs) == directory  # once per build
    assert _compile_shim(compiler, tmp_path, [directory], flags).stat().st_size > 0


@pytest.mark.parametrize("damage", ["other options", "garbage"])
def test_a_precompiled_header_gcc_cannot_use_is_passed_over(tmp_path: Path, damage: str) -> None:
    compiler = _compiler()
    directory = tmp_path / "python-header"
    directory.mkdir()
    gch = directory / "Python.h.gch"
    if damage == "garbage":
        gch.write_bytes(b"\x00garbage" * 10_000)
    else:
        python_h = Path(sysconfig.get_paths()["include"]) / "Python.h"
        compiler.call([*compiler.compiler_so, "-DNOT_THE_SAME=1", "-O0", "-c", str(python_h),
                        "-o", str(gch)])
    assert _compile_shim(compiler, tmp_path, [str(directory)]).stat().st_size > 0
