"""Who may connect, and as whom: the HELLO's token (or TLS client certificate) to an identity.

What always holds:
- with a tokens file (``--tokens-file``), a HELLO is served only with a valid token, or
  with no token over a TLS client certificate whose subject CN has a ``cert:`` line;
  anything else (no token, a wrong one, one that is not a string, one over
  ``MAX_TOKEN_BYTES``) is refused, and the refusal never echoes the token;
- failures are counted per peer address (ratelimit.py); a peer over its budget is
  refused before its token is even hashed, so guessing costs the server O(1) per try;
- each failure is logged with the peer's address, never the token; a peer that runs out
  of its budget is logged once per refill, not once per attempt;
- without a tokens file every connection is tenant ``default`` with admin rights, and
  rsd serves loopback only (``exposure_problem``; ``Server.admit`` checks each peer)
  unless TLS client certificates authenticate (``--tls-client-ca``) or ``--insecure``;
- a reload (SIGHUP) swaps the whole table or nothing: a bad file keeps the old table;
  connections already authenticated keep their tenant.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from .ratelimit import FailureLimiter, peer_key
from .tokens import MAX_TOKEN_BYTES, Identity, TokenFileError, TokenTable

__all__ = [
    "DEFAULT_IDENTITY",
    "FAILURE_BURST",
    "FAILURE_REFILL_PER_SECOND",
    "LIMITED_PEERS",
    "Authenticator",
    "exposure_problem",
    "is_loopback",
]

log = logging.getLogger("rsd")

DEFAULT_IDENTITY = Identity("default", "admin")
# Failed HELLOs per peer address: a burst of 10, then one more every 5 s. A legitimate
# client with a stale token fails at most a few times; a guesser gets 12 tries a minute
# (against 2^256 tokens). At most 16384 peers are remembered (about 3 MB).
FAILURE_BURST = 10
FAILURE_REFILL_PER_SECOND = 0.2
LIMITED_PEERS = 16384


def is_loopback(host: str) -> bool:
    """Whether an IP address literal is a loopback address (IPv4-mapped ones included)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _listens_on_loopback(host: str) -> bool:
    """Whether every address ``host`` names is loopback (a name is resolved; the empty
    host, 0.0.0.0 and :: mean every interface)."""
    if not host:
        return False
    if is_loopback(host):
        return True
    try:
        ipaddress.ip_address(host)
        return False  # an address literal, and not loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)


def exposure_problem(
    host: str, tokens_file: str | None, client_ca: str | None, insecure: bool
) -> str | None:
    """Why rsd must not listen on ``host`` as configured, or None if it may."""
    if tokens_file or client_ca or insecure or _listens_on_loopback(host):
        return None
    return (
        f"refusing to listen on {host or '*'}, which is not a loopback address, without "
        "authentication: anyone who can reach it could use and read everything. Give "
        "--tokens-file FILE (create tokens with `rsd token new TENANT ROLE`), or "
        "--tls-client-ca to require client certificates, or --insecure to accept any "
        "client on a network you trust"
    )


class Authenticator:
    """The tokens table (reloadable) and the per-peer failure limiter."""

    def __init__(self, tokens_file: str | None) -> None:
        """Loads ``tokens_file`` if given; TokenFileError (naming file:line) if bad."""
        self.path = tokens_file
        self.table: TokenTable | None = TokenTable.load(tokens_file) if tokens_file else None
        self.limiter = FailureLimiter(FAILURE_BURST, FAILURE_REFILL_PER_SECOND, LIMITED_PEERS)
        self.failures = 0  # HELLOs refused for their token or certificate
        self.rate_limited = 0  # HELLOs refused unchecked: their peer was over its budget
        self.reloads = 0
        self.reload_failures = 0

    @property
    def required(self) -> bool:
        return self.table is not None

    def reload(self) -> bool:
        """Read the tokens file again; on any problem keep the old table and log why."""
        if self.path is None:
            return False
        try:
            table = TokenTable.load(self.path)
        except TokenFileError as exc:
            self.reload_failures += 1
            log.error("tokens file not reloaded, keeping the %d entries in use: %s",
                      len(self.table or ()), exc)
            return False
        self.table = table
        self.reloads += 1
        log.info("tokens file %s reloaded: %d entries", self.path, len(table))
        return True

    def authenticate(
        self, token: object, common_name: str | None, peer: str, peer_host: str, now: float
    ) -> Identity | str:
        """The identity a HELLO authenticates as, or the refusal's message."""
        table = self.table
        if table is None:
            return DEFAULT_IDENTITY
        key = peer_key(peer_host)
        limiter = self.limiter
        wait = limiter.retry_after(key, now)
        if wait > 0:
            self.rate_limited += 1
            return (
                f"too many failed authentication attempts from {key}: HELLOs from it are "
                f"refused for {wait:.0f} s more (at most {FAILURE_BURST} failures, then one "
                f"every {1 / FAILURE_REFILL_PER_SECOND:g} s)"
            )
        identity: Identity | None = None
        if token is None:
            identity = table.for_certificate(common_name)
            reason = "this server requires a token (HELLO field `token`)"
            if common_name is not None and identity is None:
                reason += f"; client certificate {common_name[:64]!r} is not mapped to a tenant"
        elif type(token) is not str:
            reason = f"token must be a string, got {type(token).__name__}"
        elif not token or len(token) > MAX_TOKEN_BYTES or len(token.encode()) > MAX_TOKEN_BYTES:
            reason = f"token must be 1 to {MAX_TOKEN_BYTES} bytes"
        else:
            identity = table.identify(token)
            reason = "the token is not valid"
        if identity is not None:
            return identity
        self.failures += 1
        if limiter.failed(key, now):
            log.warning(
                "authentication failed from %s: %s; its failures are over the limit, its "
                "HELLOs are refused unchecked for a while", peer, reason,
            )
        else:
            log.warning("authentication failed from %s: %s", peer, reason)
        return reason

    def stats(self) -> dict[str, int | bool]:
        return {
            "required": self.required,
            "entries": len(self.table or ()),
            "failures": self.failures,
            "rate_limited": self.rate_limited,
            "limited_peers": len(self.limiter.buckets),
            "reloads": self.reloads,
            "reload_failures": self.reload_failures,
        }
