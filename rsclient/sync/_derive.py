"""The sync client's methods, derived from the async client's: each signature and each
docstring is written once, on the async method, and the sync one is made from it.

    class Lease(Handle[aleases.Lease]):
        renew = blocking(aleases.Lease.renew)  # run on the client's loop, waited for
        token = direct(aleases.Lease.token)    # a plain call, in the caller's thread
        is_lost: Attribute[bool] = attribute(aleases.Lease.is_lost)  # a property

    class Scope(Handle[aclient.Scope]):
        mailbox = direct(aclient.Scope.mailbox, Mailbox)  # a sync Mailbox over the async one

What always holds:
- a sync handle is a ``Handle``: the async object it stands for (``_async``) and the
  portal of its client (``_portal``); a derived method looks its async method up on
  ``_async`` by name at each call (so a subclass's override, a pool's ``inspect``, is the
  one run) and, for ``blocking``, runs it on the client's loop with ``Portal.call``;
- with ``wrap``, what the async method returns is handed to ``wrap(portal, result)``: a
  sync handle over the async one (a ``Ticket`` for an ``atasks.Ticket``), never the async
  object itself;
- a derived method is a plain function: ``help()``, ``inspect.signature`` and IPython
  show the async method's parameters, defaults and docstring, with the sync return
  type; type checkers see them too (``Method`` binds the ParamSpec), so mypy --strict
  checks every sync call against the async signature; an async method with overloads
  (``Ticket.result`` and ``Mailbox.submit_and_wait``, whose answer follows
  ``outcome_only``) has them restated for type checkers beside its derivation, since a
  ParamSpec carries only the first;
- an ``attribute`` states its type (``Attribute[bool]``): pyright reads a property on
  its class as a ``property``, not as its getter; mypy checks the stated type against
  the async property's, so the two cannot drift apart;
- ``blocking`` refuses a plain function and ``direct`` a coroutine function, at import.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from ._portal import Portal

__all__ = ["Attribute", "Handle", "Method", "attribute", "blocking", "construct", "direct"]

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")
A = TypeVar("A")
S = TypeVar("S")
R_co = TypeVar("R_co", covariant=True)


class Handle(Generic[A]):
    """A sync handle: the async object it stands for and the portal that runs its calls."""

    def __init__(self, portal: Portal, inner: A) -> None:
        self._portal = portal
        self._async = inner


class Method(Protocol[P, R_co]):
    """What a derived method is to a type checker: bound on an instance, the async
    method's parameters returning the sync result."""

    @overload
    def __get__(self, obj: None, owner: type[Any], /) -> Method[P, R_co]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None, /) -> Callable[P, R_co]: ...
    def __call__(self, obj: Any, /, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


class Attribute(Protocol[R_co]):
    """What a derived property is to a type checker: the async property's type."""

    @overload
    def __get__(self, obj: None, owner: type[Any], /) -> Attribute[R_co]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None, /) -> R_co: ...


@overload
def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]], *, note: str | None = None
) -> Method[P, R]: ...
@overload
def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    wrap: Callable[[Portal, R], W],
    *,
    note: str | None = None,
) -> Method[P, W]: ...
def blocking(
    method: Callable[..., Any],
    wrap: Callable[[Portal, Any], Any] | None = None,
    *,
    note: str | None = None,
) -> Any:
    """The blocking form of the coroutine method ``method``: runs it on the client's
    loop, waits, returns its result (through ``wrap`` if given). ``note``: what the
    sync form adds to the async docstring."""
    if not inspect.iscoroutinefunction(method):
        raise TypeError(f"blocking() derives from a coroutine function, not {method!r}")
    name = method.__name__
    if wrap is None:
        def call(self: Handle[Any], /, *args: Any, **kwargs: Any) -> Any:
            return self._portal.call(getattr(self._async, name)(*args, **kwargs))
    else:
        def call(self: Handle[Any], /, *args: Any, **kwargs: Any) -> Any:
            portal = self._portal
            return wrap(portal, portal.call(getattr(self._async, name)(*args, **kwargs)))
    return _dress(call, method, wrap, note)


@overload
def direct(
    method: Callable[Concatenate[Any, P], R], *, note: str | None = None
) -> Method[P, R]: ...
@overload
def direct(
    method: Callable[Concatenate[Any, P], R],
    wrap: Callable[[Portal, R], W],
    *,
    note: str | None = None,
) -> Method[P, W]: ...
def direct(
    method: Callable[..., Any],
    wrap: Callable[[Portal, Any], Any] | None = None,
    *,
    note: str | None = None,
) -> Any:
    """The plain method ``method`` called on the async object in the caller's thread (it
    does no I/O: a handle made, a token read), its result through ``wrap`` if given."""
    if inspect.iscoroutinefunction(method):
        raise TypeError(f"direct() derives from a plain function, not {method!r}")
    name = method.__name__
    if wrap is None:
        def call(self: Handle[Any], /, *args: Any, **kwargs: Any) -> Any:
            return getattr(self._async, name)(*args, **kwargs)
    else:
        def call(self: Handle[Any], /, *args: Any, **kwargs: Any) -> Any:
            return wrap(self._portal, getattr(self._async, name)(*args, **kwargs))
    return _dress(call, method, wrap, note)


def attribute(prop: Callable[[Any], R]) -> Attribute[R]:
    """A read-only property that reads the async property ``prop`` (a type checker sees
    a property read on the class as its getter), with its docstring."""
    if not isinstance(prop, property) or prop.fget is None:
        raise TypeError(f"attribute() derives from a property, not {prop!r}")
    name = prop.fget.__name__

    def read(self: Handle[Any]) -> Any:
        return getattr(self._async, name)

    functools.update_wrapper(read, prop.fget)
    return property(read)


def construct(
    cls: Callable[P, A],
) -> Callable[[Callable[[S, A], None]], Callable[Concatenate[S, P], None]]:
    """A decorator for a sync class's ``__init__(self, inner)``: the class takes the async
    class's arguments, builds the async object with them and hands it to ``__init__``."""
    init = cls.__init__

    def decorate(setup: Callable[[S, A], None]) -> Callable[Concatenate[S, P], None]:
        def __init__(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
            setup(self, cls(*args, **kwargs))

        __init__.__signature__ = inspect.signature(init)  # type: ignore[attr-defined]
        __init__.__doc__ = init.__doc__
        return __init__

    return decorate


def _dress(
    call: Callable[..., Any],
    method: Callable[..., Any],
    wrap: Callable[[Portal, Any], Any] | None,
    note: str | None,
) -> Callable[..., Any]:
    """``call`` given ``method``'s name, docstring and signature, returning what the sync
    form returns."""
    functools.update_wrapper(call, method)
    call.__code__ = call.__code__.replace(co_name=method.__name__)  # tracebacks name it
    signature = inspect.signature(method)
    returns = signature.return_annotation if wrap is None else _returns(wrap)
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=returns
    )
    call.__annotations__ = {**method.__annotations__, "return": returns}
    if note is not None:
        call.__doc__ = f"{inspect.cleandoc(method.__doc__ or '')}\n\n{inspect.cleandoc(note)}"
    return call


def _returns(wrap: Callable[[Portal, Any], Any]) -> Any:
    """What a sync method returns when ``wrap`` makes it: the handle class, or the
    wrapping function's return annotation."""
    if isinstance(wrap, type):
        return wrap.__name__
    return inspect.signature(wrap).return_annotation
