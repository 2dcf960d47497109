"""rsproto: the rsd wire protocol, version 1, shared by the server and every SDK.

Everything a peer must agree on lives here and only here: frame layout and codec
(``codec``), frame kinds, op codes, push events and error codes (``vocabulary``) and
protocol limits (``limits``). ``protocol.md`` states the same in prose; a test checks
that they agree. Neither ``rsd`` nor ``rsclient`` is imported from here.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

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
from .limits import LEASE_HANDLE_BYTES, MAX_FRAME_BYTES, Limits
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

try:  # the one version source: pyproject.toml, through the installed distribution
    __version__ = _distribution_version("rsd")
except PackageNotFoundError:  # running from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ENCODE_ERRORS",
    "ERROR",
    "HEADER_BYTES",
    "LEASE_HANDLE_BYTES",
    "MAX_FRAME_BYTES",
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
