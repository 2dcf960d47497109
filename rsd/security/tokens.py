"""Access tokens: how they are made, how they are stored, and the tokens file.

What always holds:
- a token never exists in clear on the server: the tokens file holds its digest
  (``sha256:<64 hex digits>``), a tenant and a role; rsd keeps only the parsed digests;
- a token is 256 random bits (``rsd token new``: ``rsd_`` + 43 base64url characters).
  With that much entropy a plain SHA-256 is the right store: no dictionary or
  precomputed table covers 2^256 values, so a per-line salt would add nothing, and a
  deliberately slow hash (bcrypt, scrypt) would only hand every unauthenticated peer a
  way to burn server CPU per HELLO. Tokens chosen by people are not supported;
- a file is accepted whole or not at all: the first malformed line refuses it, naming
  ``file:line`` and what is wrong, so a reload never half-applies;
- lookup is by digest, then confirmed with ``hmac.compare_digest``: the time a check
  takes does not depend on how much of a guess was right.

File format, one entry per line (``#`` starts a comment, blank lines are ignored)::

    sha256:<hex digest of the token> <tenant> <role>
    cert:<certificate subject CN> <tenant> <role>

    limit <tenant> max_payload_bytes_per_tenant=<bytes>

``role`` is ``admin`` or ``client``; a tenant name is 1 to 64 of ``A-Z a-z 0-9 . _ -``.
A ``cert:`` line maps a TLS client certificate (``--tls-client-ca``) to a tenant for
clients that send no token. A ``limit`` line sets one tenant's own limit in place of the
server's (``--max-payload-bytes-per-tenant``): a whole number of bytes, or one with a
``KiB``, ``MiB``, ``GiB`` or ``TiB`` suffix, within the range the flag allows; a tenant
has at most one, and it must be a tenant some token or certificate line names (a typo
would otherwise be silently ignored).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from ..policy import Policy

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_TOKEN_BYTES",
    "ROLES",
    "Identity",
    "TokenFileError",
    "TokenTable",
    "command",
    "hash_token",
    "new_token",
    "parse_bytes",
]

ROLES = ("admin", "client")
MAX_TOKEN_BYTES = 256  # a HELLO token longer than this is refused without hashing it
MAX_FILE_BYTES = 4 << 20  # a tokens file is read in one go on the loop: keep it small
TOKEN_PREFIX = "rsd_"
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_CN_MAX = 64  # RFC 5280's upper bound for a common name
LIMITS = ("max_payload_bytes_per_tenant",)  # what a ``limit`` line may set
_SIZE = re.compile(r"^([0-9]{1,16})(KiB|MiB|GiB|TiB)?$")
_UNITS = {None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text: str) -> int | None:
    """``text`` as a byte count (``1048576``, ``512MiB``, ``2GiB``), or None if it is not one."""
    match = _SIZE.match(text)
    return None if match is None else int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a connection is: its tenant and role."""

    tenant: str
    role: str

    @property
    def admin(self) -> bool:
        return self.role == "admin"


class TokenFileError(ValueError):
    """The tokens file cannot be used; the message names ``file:line`` where it can."""


def new_token() -> str:
    """A fresh token: 256 bits from the OS's CSPRNG."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of ``token`` (the left column of a tokens file line)."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """A parsed tokens file: digests and certificate names to identities."""

    __slots__ = ("by_cn", "by_digest", "limits", "path")

    def __init__(
        self,
        path: str,
        by_digest: dict[bytes, tuple[bytes, Identity]],
        by_cn: dict[str, Identity],
        limits: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self.path = path
        self.by_digest = by_digest
        self.by_cn = by_cn
        self.limits = limits or {}  # tenant -> {limit name: value}, from ``limit`` lines

    def __len__(self) -> int:
        return len(self.by_digest) + len(self.by_cn)

    @classmethod
    def load(cls, path: str | Path) -> TokenTable:
        """Read and check the whole file; TokenFileError naming what is wrong."""
        name = str(path)
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise TokenFileError(f"cannot read tokens file {name}: {exc.strerror}") from None
        if len(data) > MAX_FILE_BYTES:
            raise TokenFileError(f"tokens file {name} is over {MAX_FILE_BYTES} bytes")
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise TokenFileError(f"tokens file {name} is not UTF-8: {exc}") from None
        return cls.parse(text, name)

    @classmethod
    def parse(cls, text: str, name: str = "<tokens>") -> TokenTable:
        by_digest: dict[bytes, tuple[bytes, Identity]] = {}
        by_cn: dict[str, Identity] = {}
        limits: dict[str, dict[str, int]] = {}
        limit_lines: dict[str, str] = {}  # tenant -> where its first limit line is
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{name}:{number}"
            fields = line.split()
            if len(fields) != 3:
                raise TokenFileError(
                    f"{where}: expected '<sha256:digest | cert:CN> <tenant> <role>', "
                    f"got {len(fields)} fields"
                )
            key, tenant, role = fields
            if not _TENANT.match(tenant):
                raise TokenFileError(
                    f"{where}: tenant {tenant[:80]!r} must be 1 to 64 of A-Z a-z 0-9 . _ -"
                )
            if key == "limit":
                name, value = _limit(where, role)
                if name in limits.setdefault(tenant, {}):
                    raise TokenFileError(f"{where}: {name} of tenant {tenant!r} is set twice")
                limits[tenant][name] = value
                limit_lines.setdefault(tenant, where)
                continue
            if role not in ROLES:
                raise TokenFileError(f"{where}: role must be admin or client, got {role[:80]!r}")
            identity = Identity(tenant, role)
            if key.startswith("cert:"):
                cn = key[5:]
                if not cn or len(cn) > _CN_MAX:
                    raise TokenFileError(f"{where}: a certificate name must be 1 to 64 characters")
                if cn in by_cn:
                    raise TokenFileError(f"{where}: certificate name {cn!r} is listed twice")
                by_cn[cn] = identity
                continue
            match = _DIGEST.match(key)
            if match is None:
                hint = " (it looks like a token in clear)" if key.startswith(TOKEN_PREFIX) else ""
                raise TokenFileError(
                    f"{where}: expected 'sha256:' and 64 lowercase hex digits{hint}; "
                    "`rsd token new TENANT ROLE` prints a line to add"
                )
            digest = bytes.fromhex(match.group(1))
            if digest in by_digest:
                raise TokenFileError(f"{where}: the same token digest is listed twice")
            by_digest[digest] = (digest, identity)
        named = {identity.tenant for _, identity in by_digest.values()}
        named.update(identity.tenant for identity in by_cn.values())
        for tenant, where in limit_lines.items():
            if tenant not in named:
                raise TokenFileError(
                    f"{where}: tenant {tenant!r} has a limit but no token or certificate line"
                )
        return cls(name, by_digest, by_cn, limits)

    def identify(self, token: str) -> Identity | None:
        """The identity of ``token``, or None. Tokens over MAX_TOKEN_BYTES are the
        caller's to refuse (they are never hashed)."""
        found = self.entry(token)
        return None if found is None else found[1]

    def entry(self, token: str) -> tuple[bytes, Identity] | None:
        """The entry of ``token``: its digest (what a connection is remembered by, never
        the token) and its identity; or None."""
        digest = _digest(token)
        entry = self.by_digest.get(digest)
        # The lookup compares digests, which a guesser cannot steer; the decision itself
        # rests on a constant-time comparison all the same.
        if entry is None or not hmac.compare_digest(entry[0], digest):
            return None
        return entry

    def for_certificate(self, common_name: str | None) -> Identity | None:
        if common_name is None:
            return None
        return self.by_cn.get(common_name)


def _limit(where: str, setting: str) -> tuple[str, int]:
    """The (name, value) of a ``limit`` line's ``name=value``; TokenFileError if bad."""
    name, sep, text = setting.partition("=")
    if not sep or name not in LIMITS:
        raise TokenFileError(
            f"{where}: a limit line reads 'limit <tenant> <name>=<value>' with a name among "
            f"{', '.join(LIMITS)}; got {setting[:80]!r}"
        )
    value = parse_bytes(text)
    low, high = Policy.MIN_PAYLOAD_BYTES_PER_TENANT, Policy.MAX_PAYLOAD_BYTES_PER_TENANT_CAP
    if value is None or not low <= value <= high:
        raise TokenFileError(
            f"{where}: {name} must be a number of bytes (optionally with KiB, MiB, GiB or "
            f"TiB) from {low} to {high}, got {text[:80]!r}"
        )
    return name, value


_USAGE = """usage: rsd token new TENANT ROLE
       rsd token hash < TOKEN

new   print a new token (256 random bits) and the line to add to the tokens file
hash  read a token from stdin and print its line's left column (sha256:...)
ROLE  admin (every op) or client"""


def command(argv: list[str]) -> int:
    """``rsd token ...``. Exit 0 on success, 2 on a usage error."""
    if argv[:1] == ["new"] and len(argv) == 3:
        tenant, role = argv[1], argv[2]
        if not _TENANT.match(tenant):
            print(f"rsd token: tenant must be 1 to 64 of A-Z a-z 0-9 . _ -, got {tenant!r}",
                  file=sys.stderr)
            return 2
        if role not in ROLES:
            print(f"rsd token: role must be admin or client, got {role!r}", file=sys.stderr)
            return 2
        token = new_token()
        print(f"token: {token}")
        print("add this line to the tokens file, then send rsd SIGHUP:")
        print(f"{hash_token(token)} {tenant} {role}")
        return 0
    if argv == ["hash"]:
        token = sys.stdin.readline().strip()
        if not token or len(token.encode()) > MAX_TOKEN_BYTES:
            print(f"rsd token: expected a token of 1 to {MAX_TOKEN_BYTES} bytes on stdin",
                  file=sys.stderr)
            return 2
        print(hash_token(token))
        return 0
    print(_USAGE, file=sys.stderr)
    return 2
