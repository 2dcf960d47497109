"""The build's one dynamic part: the hot modules compiled by mypyc (pyproject.toml holds
the rest, and the list: ``[tool.rsd.mypyc] compile``).

What always holds: the build succeeds with or without a C compiler. The modules listed
are compiled to C extension modules by the mypyc that ``[build-system] requires`` pins
(as black and mypy ship); each ``.so`` sits beside its ``.py`` and wins at import time.
Without them the same ``.py`` files run as they are: ``RSD_COMPILE=0`` asks for that,
and any failure to compile (no mypyc, no C compiler, a mypyc error) falls back to it with
a warning, never fails the build. The C objects are kept in ``build/mypyc/`` and one is
rebuilt only when its C file or a header of its group is newer, one per core at a time (at
most 4; RSD_COMPILE_JOBS): an edit inside a function recompiles one C file, an edit of a
signature or a class (the shared header) all of them.
"""

from __future__ import annotations

import os
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
PACKAGES = ("rsproto", "rsd", "rsclient", "rsctl")
BUILD = "build/mypyc"  # C sources, headers and objects, kept between builds
JOBS = int(os.environ.get("RSD_COMPILE_JOBS") or min(4, os.cpu_count() or 1))


def _warn(message: str) -> None:
    print(f"rsd build: {message}; installing the pure-Python modules", file=sys.stderr)


def _compiled_sources() -> list[str]:
    """``[tool.rsd.mypyc]``: the files its ``compile`` globs match, less its ``python``."""
    with open(HERE / "pyproject.toml", "rb") as file:
        config = tomllib.load(file)["tool"]["rsd"]["mypyc"]
    kept = set(config["python"])
    return sorted(
        path.relative_to(HERE).as_posix()
        for pattern in config["compile"]
        for path in HERE.glob(pattern)
        if path.relative_to(HERE).as_posix() not in kept
    )


def _remove_stale(compiled: list[str]) -> None:
    """Compiled modules beside a source this build does not compile, left by an earlier
    build (with another list, or compiled when this one is pure): they would win at
    import time. A pure build also removes the library they share, at the top."""
    kept = {(HERE / source).with_suffix("") for source in compiled}
    for package in PACKAGES:
        for built in (HERE / package).glob("**/*.so"):
            if built.parent / built.name.split(".")[0] not in kept:
                built.unlink()
    if not compiled:
        for shared in HERE.glob("*__mypyc.*.so"):
            shared.unlink()


def _extensions() -> list[Any]:
    sources = _compiled_sources()
    if os.environ.get("RSD_COMPILE", "1") == "0":
        _remove_stale([])
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        _remove_stale([])
        return []
    _remove_stale(sources)
    try:
        return list(mypycify(
            [f"--cache-dir={BUILD}/mypy-cache", *sources],  # not the cache of `make test`'s mypy
            opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
            multi_file=True,  # one C file per module: compiled in parallel, and only when changed
            target_dir=BUILD,
        ))
    except (Exception, SystemExit) as exc:  # mypyc reports its errors and exits
        _warn(f"mypyc failed ({exc!r})")
        _remove_stale([])
        return []


class OptionalBuildExt(build_ext):
    """build_ext that keeps its objects, compiles them in parallel and, if anything fails,
    removes what it built and leaves the pure-Python modules."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # Not the editable install's temporary directory; named after what made the
        # objects (another mypyc or level: other objects).
        try:
            from mypy.version import __version__ as mypy_version
        except ImportError:  # no mypyc: nothing to compile
            mypy_version = "none"
        level = os.environ.get("MYPYC_OPT_LEVEL", "3")
        self.build_temp = os.path.join(BUILD, f"objects-mypy{mypy_version}-O{level}")

    def build_extensions(self) -> None:
        self.compiler.compile = _parallel_incremental(self.compiler)
        try:
            super().build_extensions()
            self.check_importable()
        except (Exception, SystemExit) as exc:
            _warn(f"compiling failed ({exc!r})")
            built = [path for path in self.get_outputs() if os.path.exists(path)]
            for path in built:
                os.unlink(path)
            if self.inplace:  # the copies beside the sources
                _remove_stale([])
            self.extensions = []

    def check_importable(self) -> None:
        """Every extension was written (a compiler error raises before this)."""
        missing = [path for path in self.get_outputs() if not os.path.exists(path)]
        if missing:
            raise RuntimeError(f"not built: {missing}")


def _parallel_incremental(compiler: Any) -> Any:
    """The compiler's ``compile``, each object rebuilt only when out of date, JOBS at once
    (gcc runs in its own process: threads are enough)."""
    compile = compiler.compile

    def compile_all(sources: list[str], output_dir: str | None = None, **kwargs: Any) -> list[str]:
        def one(source: str) -> list[str]:
            return list(compile([source], output_dir=output_dir, **kwargs))

        objects = compiler.object_filenames(sources, output_dir=output_dir)
        todo = [s for s, o in zip(sources, objects, strict=True) if _stale(s, o)]
        for obj in objects:  # made here, not by threads racing
            os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
        with ThreadPoolExecutor(JOBS) as pool:
            list(pool.map(one, todo))
        return list(objects)

    return compile_all


def _stale(source: str, obj: str) -> bool:
    """The object is missing or older than its C file or a header of its group (mypyc
    rewrites a file only when its text changes)."""
    if not os.path.exists(obj):
        return True
    built = os.path.getmtime(obj)
    headers = [str(path) for path in Path(os.path.dirname(source)).glob("*.h")]
    return any(os.path.getmtime(path) > built for path in [source, *headers])


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
