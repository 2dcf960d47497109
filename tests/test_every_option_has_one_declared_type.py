"""Every option of rsd (``rsd.options.OPTIONS``) has one declared type on ``Settings``,
the one its kind gives (and ``| None`` when its default is "not set"), so mypy checks
each use of a setting; and the values ``resolve`` gives are of that type. The only
other declarations are what cli.py works out before it serves."""

from __future__ import annotations

from rsd import options
from rsd.options import OPTIONS, Settings, resolve

BY_KIND = {
    options.SECONDS: "float",
    options.INTEGER: "int",
    options.CHOICE: "str",
    options.ADDRESS: "tuple[str, int]",
    options.PATH: "str",
    options.TEXT: "str",
    options.FLAG: "bool",
}
# What each declared type admits at run time (an int is a float to mypy; a bool is no int).
RUNTIME = {"float": (int, float), "int": (int,), "str": (str,), "tuple[str, int]": (tuple,),
           "bool": (bool,)}
WORKED_OUT = {"flags", "configured", "backlog", "max_refused_lingering", "auth", "tls"}


def test_each_option_is_declared_with_the_type_of_its_kind() -> None:
    declared = Settings.__annotations__
    for option in OPTIONS:
        wanted = BY_KIND[option.kind] + (" | None" if option.default is None else "")
        assert declared.get(option.name) == wanted, option.name
    assert set(declared) - {option.name for option in OPTIONS} == WORKED_OUT


def test_resolved_defaults_have_their_declared_types() -> None:
    settings = resolve({})
    for option in OPTIONS:
        value = getattr(settings, option.name)
        if value is None:
            assert option.default is None, option.name
            continue
        base = BY_KIND[option.kind]
        assert type(value) in RUNTIME[base], option.name
        if base == "tuple[str, int]":
            host, port = value
            assert type(host) is str and type(port) is int, option.name
