"""TLS for the same protocol: the server's context, its reload, and the peer's certificate name.

What always holds:
- with ``--tls-cert``/``--tls-key`` every connection speaks TLS (1.2 or later) before
  any frame; there is no plaintext port beside it;
- with ``--tls-client-ca`` a client must present a certificate that CA signed, or the
  TLS handshake fails and nothing of it is read; its subject CN may map it to a tenant
  (a ``cert:`` line in the tokens file, tokens.py);
- the handshake happens after the connection was admitted under the connection limits
  (connection.py), so connections still shaking hands count against them and are
  bounded by the handshake timeout;
- a reload (SIGHUP) loads the certificate and key again into the same context: new
  connections get the new certificate, a bad pair keeps the old one;
- a peer whose first bytes are no TLS handshake record (a plain client at this port) is
  sent a TLS alert and closed, so that it can tell it reached a TLS port (the SDKs say
  so) rather than a node that closed without a word, as the loop's TLS layer would
  (it drops the alert it makes); its handshake fails as any other.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from typing import Any

__all__ = [
    "TlsFiles", "behind_first_bytes", "peer_common_name", "server_context", "tls_layer",
    "tls_option_problem",
]

log = logging.getLogger("rsd")

_HANDSHAKE_RECORD = 0x16  # the first byte of every TLS client's first record
# A TLS record: a fatal alert, protocol_version (record version 3.1, as TLS stacks send
# before a version is agreed).
_ALERT_PROTOCOL_VERSION = bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46])


def tls_option_problem(cert: str | None, key: str | None, client_ca: str | None) -> str | None:
    """What is wrong with the TLS options taken together, or None."""
    if bool(cert) != bool(key):
        return "--tls-cert and --tls-key go together: give both, or neither"
    if client_ca and not cert:
        return "--tls-client-ca needs TLS: give --tls-cert and --tls-key too"
    return None


class TlsFiles:
    """The certificate, key and client CA files of a server context, for reloads."""

    __slots__ = ("cert", "client_ca", "context", "key")

    def __init__(self, cert: str, key: str, client_ca: str | None) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.context = server_context(cert, key, client_ca)

    def reload(self) -> bool:
        """Load the certificate chain again; on failure keep the one in use and log why."""
        try:
            self.context.load_cert_chain(self.cert, self.key)
            if self.client_ca:
                self.context.load_verify_locations(self.client_ca)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS certificate not reloaded, keeping the one in use: %s", exc)
            return False
        log.info("TLS certificate %s reloaded", self.cert)
        return True


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """A server context for ``cert``/``key``; requiring client certificates signed by
    ``client_ca`` if given. OSError or ssl.SSLError if a file is missing or bad."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def tls_layer(
    loop: asyncio.AbstractEventLoop,
    app: asyncio.Protocol,
    context: ssl.SSLContext,
    waiter: asyncio.Future[None],
    handshake_timeout: float,
) -> Any:
    """The server side of TLS as a protocol to put on an accepted socket in place of
    ``app``: the loop's own implementation (uvloop's, else asyncio's), the one
    ``create_server(ssl=...)`` would use. It calls ``app.connection_made`` with the TLS
    transport once the handshake is done; ``waiter`` fails if the handshake does."""
    layer_class = sslproto.SSLProtocol
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        pass
    else:
        if isinstance(loop, uvloop.Loop):
            # uvloop's stubs leave its SSL layer out; it takes asyncio's arguments
            layer_class = uvloop.loop.SSLProtocol  # type: ignore[attr-defined]
    return layer_class(
        loop, app, context, waiter, server_side=True, call_connection_made=True,
        # typeshed's stub of SSLProtocol has it an int; it is seconds, a float in both
        # layers (asyncio's own default is 60.0, loop.create_server's stub a float)
        ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]
    )


class _FirstBytes(asyncio.Protocol):
    """Stands before the TLS layer on a socket until its first bytes come (see the module
    docstring): a TLS handshake record hands the socket and those bytes to the layer;
    anything else is answered with a TLS alert and the socket closed, the layer told
    that its handshake failed."""

    def __init__(self, raw: asyncio.Transport, layer: Any) -> None:
        self.raw = raw
        self.layer = layer
        self.plain = False

    def data_received(self, data: bytes) -> None:
        if self.plain:
            return
        if data[0] != _HANDSHAKE_RECORD:
            self.plain = True
            self.raw.write(_ALERT_PROTOCOL_VERSION)
            self.raw.close()  # connection_lost tells the layer
            return
        self.raw.set_protocol(self.layer)
        view = memoryview(data)
        while view:  # both loops' layers are buffered protocols
            buffer = self.layer.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            self.layer.buffer_updated(n)
            view = view[n:]

    def eof_received(self) -> bool | None:
        return None if self.plain else self.layer.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.plain and exc is None:
            exc = ConnectionError("the peer does not speak TLS")
        self.layer.connection_lost(exc)

    def pause_writing(self) -> None:
        self.layer.pause_writing()

    def resume_writing(self) -> None:
        self.layer.resume_writing()


def behind_first_bytes(raw: asyncio.Transport, layer: Any) -> asyncio.Protocol:
    """The protocol to set on ``raw`` in place of the TLS ``layer`` (tls_layer) until the
    peer's first bytes came: see ``_FirstBytes``."""
    return _FirstBytes(raw, layer)


def peer_common_name(transport: Any) -> str | None:
    """The subject CN of the verified client certificate on ``transport``, if any."""
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None
