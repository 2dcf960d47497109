"""Who may connect, and as whom: the HELLO's token (or TLS client certificate) to an identity.

What always holds:
- with a tokens file (``--tokens-file``), a HELLO is served only with a valid token, or
  with no token over a TLS client certificate whose subject CN has a ``cert:`` line;
  anything else (no token, a wrong one, one that is not a string, one over
  ``MAX_TOKEN_BYTES``) is refused, and the refusal never echoes the token;
- every token is checked, whoever failed before: the check is O(1) (one SHA-256 of at
  most 256 bytes and a dict lookup), so a valid token is served at once even from an
  address or network a stranger is flooding with wrong ones;
- failures are counted per address and per network (ratelimit.py); past their
  allowance the answer to a wrong token waits, longer with every failure (refusals.py
  holds it, bounded, and logs one summary line per interval, not a line per failure);
- each served connection is remembered under the tokens file entry that admitted it (a
  token's digest, never the token, or ``cert:`` and the certificate name); a reload
  (SIGHUP) that removes that entry or changes its tenant or role closes those
  connections with UNAUTHENTICATED; a bad file keeps the old table and every connection;
- without a tokens file every connection is tenant ``default`` with admin rights, and
  rsd serves loopback only (``exposure_problem``; ``Server.admit`` checks each peer)
  unless TLS client certificates authenticate (``--tls-client-ca``) or ``--insecure``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from rsproto import ErrorCode

from .ratelimit import FailureCounts, FailureLimiter, PeerKeys, peer_keys
from .tokens import MAX_TOKEN_BYTES, Identity, TokenFileError, TokenTable

__all__ = [
    "ADDRESS_FREE_FAILURES",
    "DEFAULT_IDENTITY",
    "LIMITED_PEERS",
    "NETWORK_FREE_FAILURES",
    "REVOKED",
    "Admission",
    "Authenticator",
    "Refusal",
    "exposure_problem",
    "http_exposure_problem",
    "is_loopback",
]

log = logging.getLogger("rsd")

DEFAULT_IDENTITY = Identity("default", "admin")
# Failed HELLOs answered at once: 10 per address and 30 per network (IPv4 /24, IPv6
# /56), leaking away at one per 5 s and one per second. A legitimate client with a stale
# token fails a few times and is told at once; past that, each refusal waits twice as
# long as the one before, up to ratelimit.MAX_DELAY. At most 16384 addresses and 16384
# networks are remembered (about 3 MB each).
ADDRESS_FREE_FAILURES = 10
ADDRESS_LEAK_PER_SECOND = 0.2
NETWORK_FREE_FAILURES = 30
NETWORK_LEAK_PER_SECOND = 1.0
LIMITED_PEERS = 16384
REVOKED = "the token of this connection was revoked"
CERT_REVOKED = "the tokens file no longer maps this connection's certificate to its tenant"

Entry = bytes | str  # a tokens file entry: a token's digest, or "cert:" and a name


class Admission(NamedTuple):
    """A HELLO that authenticated: as whom, and by which entry (None: no tokens file)."""

    identity: Identity
    entry: Entry | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A HELLO whose token (or certificate) is wrong: why, and how long the answer waits."""

    message: str
    delay: float  # seconds (0: answered at once)
    peer: str
    keys: PeerKeys


class Session(Protocol):
    """A served connection, as far as revoking its entry goes."""

    def fail(self, code: ErrorCode, message: str) -> None: ...


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


def http_exposure_problem(host: str, tokens_file: str | None) -> str | None:
    """Why the HTTP listener (the dashboard, its API) must not listen on ``host``, or
    None if it may: off loopback it needs tokens (``--insecure`` does not open it)."""
    if tokens_file or _listens_on_loopback(host):
        return None
    return (
        f"refusing to serve HTTP (--http-listen) on {host or '*'}, which is not a loopback "
        "address, without a tokens file: the dashboard can cancel runs and requeue dead "
        "letters. Give --tokens-file FILE and use an admin token in the browser, or listen "
        "on 127.0.0.1"
    )


class Authenticator:
    """The tokens table (reloadable), the failure counts, and who each entry admitted."""

    def __init__(self, tokens_file: str | None) -> None:
        """Loads ``tokens_file`` if given; TokenFileError (naming file:line) if bad."""
        self.path = tokens_file
        self.table: TokenTable | None = TokenTable.load(tokens_file) if tokens_file else None
        self.limiter = FailureLimiter(
            FailureCounts(ADDRESS_FREE_FAILURES, ADDRESS_LEAK_PER_SECOND, LIMITED_PEERS),
            FailureCounts(NETWORK_FREE_FAILURES, NETWORK_LEAK_PER_SECOND, LIMITED_PEERS),
        )
        self.sessions: dict[Entry, set[Session]] = {}  # entry -> connections it admitted
        self.failures = 0  # HELLOs refused for their token or certificate
        self.revoked = 0  # connections closed because a reload removed their entry
        self.reloads = 0
        self.reload_failures = 0

    @property
    def required(self) -> bool:
        return self.table is not None

    def reload(self) -> bool:
        """Read the tokens file again; on any problem keep the old table and log why.
        Connections whose entry is gone or now names another tenant or role are closed."""
        if self.path is None:
            return False
        try:
            table = TokenTable.load(self.path)
        except TokenFileError as exc:
            self.reload_failures += 1
            log.error("tokens file not reloaded, keeping the %d entries in use: %s",
                      len(self.table or ()), exc)
            return False
        old, self.table = self.table, table
        self.reloads += 1
        closed = self._revoke(old, table) if old is not None else 0
        log.info("tokens file %s reloaded: %d entries%s", self.path, len(table),
                 f"; {closed} connections closed, their token was removed or changed"
                 if closed else "")
        return True

    def _revoke(self, old: TokenTable, new: TokenTable) -> int:
        """Close the connections of every entry ``new`` drops or changes: one look at
        each entry in use, then one call per connection closed."""
        gone: list[tuple[Entry, str]] = []
        for entry in self.sessions:
            if isinstance(entry, bytes):
                before, after = old.by_digest.get(entry), new.by_digest.get(entry)
                if after is None or before is None or after[1] != before[1]:
                    gone.append((entry, REVOKED))
            else:
                cn = entry[5:]
                now_is = new.by_cn.get(cn)
                if now_is is None or now_is != old.by_cn.get(cn):
                    gone.append((entry, CERT_REVOKED))
        closed = 0
        for entry, message in gone:
            for conn in self.sessions.pop(entry):
                conn.fail(ErrorCode.UNAUTHENTICATED, message)
                closed += 1
        self.revoked += closed
        return closed

    def admitted(self, entry: Entry, conn: Session) -> None:
        """``conn`` is served by ``entry`` until it ends (``forget``) or is revoked."""
        self.sessions.setdefault(entry, set()).add(conn)

    def forget(self, entry: Entry, conn: Session) -> None:
        """``conn`` has ended."""
        conns = self.sessions.get(entry)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self.sessions[entry]

    def authenticate(
        self, token: object, common_name: str | None, peer: str, peer_host: str, now: float
    ) -> Admission | Refusal:
        """Who a HELLO authenticates as; or why not, and how long the answer waits."""
        table = self.table
        if table is None:
            return Admission(DEFAULT_IDENTITY, None)
        entry: Entry | None = None
        identity: Identity | None = None
        if token is None:
            identity = table.for_certificate(common_name)
            entry = f"cert:{common_name}"
            reason = "this server requires a token (HELLO field `token`)"
            if common_name is not None and identity is None:
                reason += f"; client certificate {common_name[:64]!r} is not mapped to a tenant"
        elif type(token) is not str:
            reason = f"token must be a string, got {type(token).__name__}"
        elif not token or len(token) > MAX_TOKEN_BYTES or len(token.encode()) > MAX_TOKEN_BYTES:
            reason = f"token must be 1 to {MAX_TOKEN_BYTES} bytes"
        else:
            found = table.entry(token)
            if found is not None:
                entry, identity = found
            reason = "the token is not valid"
        if identity is not None and entry is not None:
            return Admission(identity, entry)
        self.failures += 1
        keys = peer_keys(peer_host)
        return Refusal(reason, self.limiter.failed(keys, now), peer, keys)

    def stats(self) -> dict[str, int | bool]:
        return {
            "required": self.required,
            "entries": len(self.table or ()),
            "failures": self.failures,
            "revoked": self.revoked,
            "limited_peers": len(self.limiter),
            "reloads": self.reloads,
            "reload_failures": self.reload_failures,
        }
