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
signature or a class (the shared header) all of them, in a few units of several files
each (Units); each module's small shim compiles on ``Python.h`` precompiled once per build
(PythonHeader). mypyc runs only when extensions are
built (not for the metadata pip asks for first), and the compiling says how far it is
every few seconds (`make` runs it in sight, before pip, which hides a build's output).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import sys
import sysconfig
import threading
import time
import tomllib
import zlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
PACKAGES = ("rsproto", "rsd", "rsclient", "rsctl")
BUILD = "build/mypyc"  # C sources, headers and objects, kept between builds
EXTENSIONS = f"{BUILD}/extensions.pickle"  # what mypyc made last, and from what
JOBS = int(os.environ.get("RSD_COMPILE_JOBS") or min(4, os.cpu_count() or 1))
UNITS = 12  # the group's module C files are compiled, when all are to be, as this many (Units)
PROGRESS_SECONDS = 5.0  # at most this long without a word while compiling
# What setup() is given: the distribution has extensions (a platform wheel, build_ext
# runs); build_ext puts mypyc's in its place when it runs (OptionalBuildExt).
PLACEHOLDER = Extension("rsd.core.__mypyc_placeholder__", sources=[])
# The commands that only write metadata (what pip asks for before it builds): no mypyc.
METADATA = {"egg_info", "dist_info"}


def _warn(message: str) -> None:
    print(f"rsd build: {message}; installing the pure-Python modules", file=sys.stderr)


def _say(message: str) -> None:
    print(f"rsd build: {message}", file=sys.stderr, flush=True)


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


def _remove_stale_groups(extensions: list[Any]) -> None:
    """The group libraries at the top that earlier builds left (mypyc names a group's
    library after its modules, so another list made another name): only this build's is
    loaded, but a wheel made from the checkout carries every one (the image's test, built
    from a checkout compiled a dozen times: 131 MB, against 89 MB from a fresh one)."""
    names = {extension.name for extension in extensions}
    for shared in HERE.glob("*__mypyc.*.so"):
        if shared.name.split(".")[0] not in names:
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
    level = os.environ.get("MYPYC_OPT_LEVEL", "3")
    cached = _cached_extensions(level)
    if cached is not None:
        _say("mypyc: the C of the core is up to date (made by the last build, same sources)")
        _remove_stale_groups(cached)
        return cached
    _say(f"mypyc: type-checking {len(sources)} modules of the core and writing their C")
    try:
        extensions = list(mypycify(
            [f"--cache-dir={BUILD}/mypy-cache", *sources],  # not the cache of `make test`'s mypy
            opt_level=level,
            multi_file=True,  # one C file per module: compiled in parallel, and only when changed
            target_dir=BUILD,
        ))
    except (Exception, SystemExit) as exc:  # mypyc reports its errors and exits
        _warn(f"mypyc failed ({exc!r})")
        _remove_stale([])
        return []
    with open(EXTENSIONS, "wb") as file:
        pickle.dump((_fingerprint(level), extensions), file)
    _remove_stale_groups(extensions)
    return extensions


def _fingerprint(level: str) -> str:
    """What mypyc's C is made from: every Python file of rsd and rsproto (a superset of
    what the compiled modules import), the list in pyproject, this file, mypyc's version
    and level, and Python's."""
    from mypy.version import __version__ as mypy_version

    digest = hashlib.sha256(f"{mypy_version} O{level} {sys.version}".encode())
    files = [HERE / "pyproject.toml", HERE / "setup.py"]
    files += sorted(path for package in ("rsd", "rsproto")
                    for path in (HERE / package).rglob("*.py"))
    for path in files:
        digest.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _cached_extensions(level: str) -> list[Any] | None:
    """The extensions mypyc made for these very sources, when its C files are all still
    there: pip's build, a moment after ``make``'s, need not type-check the core again
    (mypyc writes the same C from the same sources)."""
    try:
        with open(EXTENSIONS, "rb") as file:
            fingerprint, extensions = pickle.load(file)
    except Exception:  # none yet, or from another setuptools: mypyc runs
        return None
    if fingerprint != _fingerprint(level):
        return None
    if not all(os.path.exists(source) for ext in extensions for source in ext.sources):
        return None
    return list(extensions)


class OptionalBuildExt(build_ext):
    """build_ext that keeps its objects, compiles them in parallel and, if anything fails,
    removes what it built and leaves the pure-Python modules."""

    def finalize_options(self) -> None:
        if self.distribution.ext_modules == [PLACEHOLDER]:  # once, and only to build
            building = not set(self.distribution.commands) <= METADATA
            self.distribution.ext_modules = _extensions() if building else []
        super().finalize_options()
        # Not the editable install's temporary directory; named after what made the
        # objects (another mypyc or level: other objects).
        try:
            from mypy.version import __version__ as mypy_version
        except ImportError:  # no mypyc: nothing to compile
            mypy_version = "none"
        level = os.environ.get("MYPYC_OPT_LEVEL", "3")
        self.build_temp = os.path.join(BUILD, f"objects-mypy{mypy_version}-O{level}")
        # Extensions built side by side: the group's library (its C files JOBS at a time)
        # beside the small per-module ones, which would otherwise wait for it, one by one.
        self.parallel = JOBS
        self._built = 0
        self._said = time.monotonic()

    def build_extension(self, ext: Any) -> None:
        super().build_extension(ext)
        self._built += 1  # for the progress lines only
        if time.monotonic() - self._said >= PROGRESS_SECONDS:
            self._said = time.monotonic()
            _say(f"{self._built} of {len(self.extensions)} extension modules built")

    def build_extensions(self) -> None:
        self.compiler.compile = _parallel_incremental(self.compiler)
        self.compiler.link_shared_object = _kept_links(self.compiler, self.build_lib,
                                                       self.build_temp)
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
    (gcc runs in its own process: threads are enough); a module's shim on a precompiled
    ``Python.h`` (PythonHeader)."""
    compile = compiler.compile
    python_header = PythonHeader(compiler)

    def compile_all(sources: list[str], output_dir: str | None = None, **kwargs: Any) -> list[str]:
        def one(source: str) -> list[str]:
            return list(compile([source], output_dir=output_dir, **kwargs))

        objects = compiler.object_filenames(sources, output_dir=output_dir)
        todo = [s for s, o in zip(sources, objects, strict=True) if _stale(s, o)]
        if len(sources) > 1:  # the group's library: its module files in units where they can be
            todo, objects = Units(compiler, output_dir).plan(sources, objects, todo)
            todo.sort(key=os.path.getsize, reverse=True)  # the longest first: an even end
        if todo and len(sources) == 1 and not os.path.basename(sources[0]).startswith("__native"):
            precompiled = python_header.directory(output_dir, kwargs)
            if precompiled is not None:  # searched first: gcc finds Python.h.gch there
                kwargs["include_dirs"] = [precompiled, *(kwargs.get("include_dirs") or [])]
        for obj in objects:  # made here, not by threads racing
            os.makedirs(os.path.dirname(obj) or ".", exist_ok=True)
        if len(todo) > 1:
            _say(f"compiling {len(todo)} C files, {JOBS} at a time")
        start = said = time.monotonic()
        with ThreadPoolExecutor(JOBS) as pool:
            pending = {pool.submit(one, source) for source in todo}
            while pending:  # a word every PROGRESS_SECONDS, however long one file takes
                finished, pending = wait(pending, PROGRESS_SECONDS, FIRST_COMPLETED)
                for future in finished:
                    future.result()
                if time.monotonic() - said >= PROGRESS_SECONDS and pending:
                    said = time.monotonic()
                    _say(f"{len(todo) - len(pending)} of {len(todo)} C files compiled "
                         f"({said - start:.0f} s)")
        if len(todo) > 1:
            _say(f"{len(todo)} C files compiled in {time.monotonic() - start:.0f} s")
        return list(objects)

    return compile_all


class Units:
    """The group's module C files compiled a few at a time, as one translation unit each
    (a unit: a C file that includes them), when all of a unit's files are to be compiled:
    a fresh build, or an edit of a signature or a class (the group's header). Each file
    alone parses the group's 400 KB of headers and ``Python.h`` first, about 0.3 s of gcc
    of its 0.3 to 7 s, for each of the 86 files; 12 units parse them 12 times. A fresh
    ``setup.py build_ext`` (mypyc and the compile, 2 jobs, alternated): 176 and 188 s of
    CPU file by file, 161 and 156 s in units; 99 and 105 s of wall, 91 and 89 s. The code
    is the same: a task and a renewal frame run as many instructions (``bench.server_path``
    under callgrind). Which unit a file is in follows from its name alone (a CRC of it), so
    an edit, which changes a file's size, never moves files between units.

    A unit's object is used while it is newer than the unit's files and the group's
    headers. An edit inside a function changes one file: its unit's files are then
    compiled one by one (each once, the first time; then only the one edited), as before
    units, so the next edit recompiles one file, not a unit. A unit whose files all have
    objects of their own up to date (a checkout built before units) links those. The
    lib-rt files mypyc copies beside its own are compiled alone, as mypyc's build does."""

    def __init__(self, compiler: Any, output_dir: str | None) -> None:
        self.compiler = compiler
        self.output_dir = output_dir

    def plan(self, sources: list[str], objects: list[str],
             todo: list[str]) -> tuple[list[str], list[str]]:
        """What to compile and what to link: ``todo`` and ``objects`` with the whole units
        in place of their files (their files' objects left out of the link)."""
        members: dict[str, list[str]] = {}
        for source in sources:
            name = os.path.basename(source)
            if name.startswith("__native_") and os.path.dirname(source) == BUILD:
                unit = f"{BUILD}/units/unit{zlib.crc32(name.encode()) % UNITS:02d}.c"
                members.setdefault(unit, []).append(source)
        united = {source for files in members.values() for source in files}
        own = dict(zip(sources, objects, strict=True))
        linked = [own[source] for source in sources if source not in united]
        compiled = [source for source in todo if source not in united]
        headers = _headers(BUILD)
        for unit, files in sorted(members.items()):
            self._write(unit, files)
            (made,) = self.compiler.object_filenames([unit], output_dir=self.output_dir)
            if not _stale(unit, made, [*files, *headers]):
                linked.append(made)
            elif all(source in todo for source in files) and (
                    _stale(unit, made, headers) or all(_stale(f, made, []) for f in files)):
                compiled.append(unit)  # none yet, the group's header changed, or every file
                linked.append(made)
            else:  # an edit in some of them (or a build from before units): their own
                compiled += [source for source in files if source in todo]
                linked += [own[source] for source in files]
        return compiled, linked

    @staticmethod
    def _write(unit: str, files: list[str]) -> None:
        """The unit's text, written only when it changes (its date is part of what makes
        its object stale)."""
        text = "".join(f'#include "../{os.path.basename(source)}"\n' for source in files)
        os.makedirs(os.path.dirname(unit), exist_ok=True)
        try:
            with open(unit) as file:
                if file.read() == text:
                    return
        except FileNotFoundError:
            pass
        with open(unit, "w") as file:
            file.write(text)


class PythonHeader:
    """``Python.h`` precompiled once per build for mypyc's module shims (each module's own
    small extension, which only imports its part of the group's library): each of the 85
    parsed the header itself first, 0.16 s of gcc a shim, 0.05 s on the precompiled one
    (about 9 s of a fresh build's CPU). The group's own C files gain nothing from one (its
    700 KB headers make an 18 MB one, slower to load than to parse). Made by the very
    command that compiles a shim, with Python.h as its source: gcc uses a precompiled
    header only when it was made with the same options, and otherwise reads Python.h as
    before, without a word, so it can cost time, never a wrong build; and a failure to
    make it only leaves the shims as they were."""

    def __init__(self, compiler: Any) -> None:
        self.compiler = compiler
        self.lock = threading.Lock()  # build_ext builds extensions JOBS at a time
        self.tried = False
        self.made: str | None = None

    def directory(self, output_dir: str | None, kwargs: dict[str, Any]) -> str | None:
        """The directory holding ``Python.h.gch`` for compiles given ``kwargs``, or None."""
        with self.lock:
            if not self.tried:
                self.tried = True
                try:
                    self.made = self._make(output_dir or ".", kwargs)
                except Exception as exc:  # (a CompileError, an OSError, distutils changed)
                    _say(f"Python.h not precompiled ({exc!r}); the shims parse it themselves")
            return self.made

    def _make(self, output_dir: str, kwargs: dict[str, Any]) -> str:
        header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
        directory = os.path.join(output_dir, "python-header")
        made = os.path.join(directory, "Python.h.gch")
        if os.path.exists(made) and os.path.getmtime(made) >= os.path.getmtime(header):
            return directory
        compiler = self.compiler
        _, _, extra, pp_opts, _ = compiler._setup_compile(
            output_dir, kwargs.get("macros"), kwargs.get("include_dirs"), [],
            kwargs.get("depends"), kwargs.get("extra_postargs"),
        )
        cc_args = compiler._get_cc_args(pp_opts, kwargs.get("debug"), kwargs.get("extra_preargs"))
        os.makedirs(directory, exist_ok=True)
        compiler._compile(made + ".part", header, ".h", cc_args, extra, pp_opts)
        os.replace(made + ".part", made)
        return directory


def _kept_links(compiler: Any, build_lib: str, build_temp: str) -> Any:
    """The compiler's ``link_shared_object``, linking into ``build_temp`` (kept between
    builds, as the objects are), which distutils skips while no object is newer, then
    copying to where it was asked: pip's editable build asks for a new temporary
    directory each time, a moment after ``make`` built the same modules in place."""
    link = compiler.link_shared_object

    def link_kept(objects: list[str], output: str, *args: Any, **kwargs: Any) -> None:
        where = os.path.relpath(output, build_lib)
        kept = os.path.join(build_temp, "linked",
                            os.path.basename(output) if where.startswith("..") else where)
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        link(objects, kept, *args, **kwargs)
        os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
        shutil.copy(kept, output)  # dated now: the tests check it is newer than its .py

    return link_kept


def _headers(directory: str) -> list[str]:
    return [str(path) for path in Path(directory).glob("*.h")]


def _stale(source: str, obj: str, inputs: list[str] | None = None) -> bool:
    """The object is missing or older than its C file or a header of its group (mypyc
    rewrites a file only when its text changes), or than ``inputs`` when given (a unit's
    files and the group's headers)."""
    if not os.path.exists(obj):
        return True
    built = os.path.getmtime(obj)
    if inputs is None:
        inputs = _headers(os.path.dirname(source))
    return any(os.path.getmtime(path) > built for path in [source, *inputs])


if __name__ == "__main__":  # as `python setup.py` and the build backend run it; a test imports it
    setup(ext_modules=[PLACEHOLDER], cmdclass={"build_ext": OptionalBuildExt})
