"""Every public name of rsclient has a docstring: each module, each class and function
it exports (``__all__``), and each public method and property of those classes, so
``help()`` and an editor tell a user what each one does. (``mypy --strict`` over the
package and the examples is run by ``make test``, from pyproject's ``[tool.mypy]``.)"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import rsclient


def _modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(rsclient.__path__, "rsclient.")]
    return [rsclient, *(importlib.import_module(name) for name in names)]


def _undocumented() -> list[str]:
    missing: list[str] = []
    for module in _modules():
        if not module.__doc__:
            missing.append(module.__name__)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__doc__:
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(obj):
                continue
            for attr, member in vars(obj).items():
                fn = member.fget if isinstance(member, property) else member
                if attr.startswith("_") or not (inspect.isfunction(fn) or
                                                isinstance(member, property)):
                    continue
                if not getattr(fn, "__doc__", None):
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return sorted(set(missing))


def test_every_public_name_of_rsclient_has_a_docstring() -> None:
    assert _undocumented() == []


def test_views_are_typed_dicts_that_read_as_dicts() -> None:
    from rsclient import views

    for name in ("TaskView", "ClaimView", "QueueCounts", "SentMessage", "Busy", "Acquired"):
        cls = getattr(views, name)
        assert cls.__annotations__, name
        assert isinstance(cls(), dict), name  # a TypedDict is a plain dict at run time
