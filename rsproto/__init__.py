"""rsproto: the rsd wire protocol, version 1, shared by the server and every SDK.

Everything a peer must agree on lives here and only here: frame layout and codec
(``codec``), frame kinds, op codes, push events and error codes (``vocabulary``) and
protocol limits (``limits``). ``protocol.md`` states the same in prose; a test checks
that they agree. Neither ``rsd`` nor ``rsclient`` is imported from here.
"""

import os
import sys

from .codec import (
    ENCODE_ERRORS,
    HEADER_BYTES,
    Decoder,
    Ext,
    FrameError,
    encode,
    error_frame,
    pack_body,
    pack_from_rsd,
    pack_header,
    push_frame,
    reply_frame,
    request_frame,
    unpack_checked,
    unpack_from_rsd,
)
from .limits import (
    LEASE_HANDLE_BYTES,
    MAX_FRAME_BYTES,
    MAX_TRACEPARENT_BYTES,
    MAX_TRACESTATE_BYTES,
    Limits,
)
from .vocabulary import (
    ERROR,
    PROTOCOL_VERSION,
    PUSH,
    REPLY,
    REQUEST,
    ErrorCode,
    Kind,
    Op,
    Push,
)


def _installed_version(name: str = "rsd") -> str:
    """The installed distribution's version, as ``importlib.metadata.version`` gives it:
    the ``Version`` field of the ``METADATA`` in the first ``<name>-<version>.dist-info``
    folder on ``sys.path``. Read here directly, because importing importlib.metadata (it
    pulls in email, zipfile, csv) cost every process that imports rsproto 37 ms of CPU,
    a fifth of an rsd start's; it is still asked where neither header file has a version,
    and "0+unknown" is the version of a tree that was never installed."""
    prefix = name + "-"
    for entry in sys.path:
        try:
            found = sorted(os.listdir(entry or "."))
        except OSError:  # not a folder (a zip of the standard library), or gone
            continue
        for folder in found:
            if folder.startswith(prefix) and folder.endswith(".dist-info"):
                return _metadata_version(os.path.join(entry or ".", folder, "METADATA")) or (
                    _version_from_importlib(name))
            if folder.startswith((prefix, name + ".")) and folder.endswith(".egg-info"):
                return _metadata_version(os.path.join(entry or ".", folder, "PKG-INFO")) or (
                    _version_from_importlib(name))
    return _version_from_importlib(name)


def _metadata_version(headers: str) -> str | None:
    """The ``Version`` header of a dist-info's METADATA or an egg-info's PKG-INFO (the
    same format), if it has one. (An egg-info is what a setuptools build leaves in the
    checkout, first on ``sys.path`` for ``python -m rsd`` run there, as every test does.)"""
    try:
        with open(headers, "rb") as metadata:
            for line in metadata:
                if line.startswith(b"Version:"):
                    return line[len(b"Version:"):].strip().decode()
                if not line.strip():  # the headers end at the first empty line
                    break
    except OSError:
        pass
    return None


def _version_from_importlib(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:  # running from a tree that was never installed
        return "0+unknown"


__version__ = _installed_version()  # the one version source: pyproject.toml, as installed

__all__ = [
    "ENCODE_ERRORS",
    "ERROR",
    "HEADER_BYTES",
    "LEASE_HANDLE_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_TRACEPARENT_BYTES",
    "MAX_TRACESTATE_BYTES",
    "PROTOCOL_VERSION",
    "PUSH",
    "REPLY",
    "REQUEST",
    "Decoder",
    "ErrorCode",
    "Ext",
    "FrameError",
    "Kind",
    "Limits",
    "Op",
    "Push",
    "encode",
    "error_frame",
    "pack_body",
    "pack_from_rsd",
    "pack_header",
    "push_frame",
    "reply_frame",
    "request_frame",
    "unpack_checked",
    "unpack_from_rsd",
]
