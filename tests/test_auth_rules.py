"""The rules of authentication, without a server: the tokens file, the failure limiter,
where rsd may listen, which peers it admits, and what the core keeps of a HELLO.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import types
from pathlib import Path

import pytest

from rsd.core import Core
from rsd.security.auth import (
    ADDRESS_FREE_FAILURES,
    DEFAULT_IDENTITY,
    NETWORK_FREE_FAILURES,
    Admission,
    Authenticator,
    Refusal,
    exposure_problem,
    is_loopback,
)
from rsd.security.ratelimit import MAX_DELAY, FailureCounts, peer_keys
from rsd.security.tokens import (
    MAX_TOKEN_BYTES,
    Identity,
    TokenFileError,
    TokenTable,
    hash_token,
    new_token,
)
from rsd.server import Server
from rsproto import ErrorCode

# ---- the tokens file ---------------------------------------------------------------------


def test_a_token_is_stored_as_its_sha256_and_found_by_it() -> None:
    token = new_token()
    assert token.startswith("rsd_") and len(token) == 4 + 43  # 256 bits, base64url
    assert hash_token(token) == "sha256:" + hashlib.sha256(token.encode()).hexdigest()
    table = TokenTable.parse(
        f"# ops\n\n{hash_token(token)} acme client   # the acme fleet\ncert:w-1 ops admin\n"
    )
    assert table.identify(token) == Identity("acme", "client")
    assert table.identify(token + "x") is None
    assert table.identify(new_token()) is None
    assert table.for_certificate("w-1") == Identity("ops", "admin")
    assert table.for_certificate("w-2") is None and table.for_certificate(None) is None
    assert len(table) == 2


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("sha256:abc acme client", "64 lowercase hex digits"),
        ("rsd_abcdefgh acme client", "looks like a token in clear"),
        (f"{hash_token('x')} acme", "got 2 fields"),
        (f"{hash_token('x')} acme superuser", "role must be admin or client"),
        (f"{hash_token('x')} ac/me client", "tenant 'ac/me'"),
        ("cert: acme client", "certificate name must be 1 to 64"),
        (f"cert:{'n' * 65} acme client", "certificate name"),
    ],
)
def test_a_malformed_line_refuses_the_file_naming_file_and_line(
    line: str, complaint: str
) -> None:
    with pytest.raises(TokenFileError) as caught:
        TokenTable.parse(f"# header\n{hash_token('ok')} good admin\n{line}\n", "tokens.txt")
    assert str(caught.value).startswith("tokens.txt:3: ") and complaint in str(caught.value)


def test_a_token_or_certificate_listed_twice_refuses_the_file() -> None:
    with pytest.raises(TokenFileError, match=r":2: the same token digest is listed twice"):
        TokenTable.parse(f"{hash_token('a')} t1 admin\n{hash_token('a')} t2 client\n")
    with pytest.raises(TokenFileError, match=r":2: certificate name 'c' is listed twice"):
        TokenTable.parse("cert:c t1 admin\ncert:c t2 client\n")


def test_an_unreadable_or_oversized_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot read tokens file"):
        TokenTable.load(tmp_path / "missing")
    big = tmp_path / "big"
    big.write_bytes(b"#" * (5 << 20))
    with pytest.raises(TokenFileError, match="is over"):
        TokenTable.load(big)


# ---- authenticating a HELLO ----------------------------------------------------------------


def _auth(tmp_path: Path, *lines: str) -> Authenticator:
    path = tmp_path / "tokens"
    path.write_text("".join(f"{line}\n" for line in lines))
    return Authenticator(str(path))


def _who(verdict: Admission | Refusal) -> Identity | str:
    """The identity a HELLO is served as, or its refusal's message."""
    return verdict.message if isinstance(verdict, Refusal) else verdict.identity


def _delay(verdict: Admission | Refusal) -> float:
    """How long a refusal's answer waits (a refusal it must be)."""
    assert isinstance(verdict, Refusal), verdict
    return verdict.delay


def test_without_a_tokens_file_everyone_is_the_default_admin() -> None:
    auth = Authenticator(None)
    assert not auth.required
    assert auth.authenticate(12, None, "p", "127.0.0.1", 0.0) == (DEFAULT_IDENTITY, None)
    assert DEFAULT_IDENTITY.admin and DEFAULT_IDENTITY.tenant == "default"


def test_junk_tokens_are_refused_with_a_message_that_never_echoes_them(tmp_path: Path) -> None:
    token = new_token()
    auth = _auth(tmp_path, f"{hash_token(token)} acme client")
    assert _who(auth.authenticate(token, None, "p", "10.0.0.1", 0.0)) == Identity("acme", "client")
    junk = "J" * 100_000
    cases = {
        None: "requires a token",
        12345: "must be a string, got int",
        b"bytes": "must be a string, got bytes",
        "": f"1 to {MAX_TOKEN_BYTES} bytes",
        junk: f"1 to {MAX_TOKEN_BYTES} bytes",
        "rsd_wrong": "not valid",
    }
    for index, (bad, complaint) in enumerate(cases.items()):
        reason = _who(auth.authenticate(bad, None, "p", f"10.0.1.{index}", 0.0))
        assert isinstance(reason, str) and complaint in reason
        assert "JJJJ" not in reason and "rsd_wrong" not in reason
    assert auth.failures == len(cases)


def test_a_certificate_name_stands_in_for_a_missing_token_only(tmp_path: Path) -> None:
    auth = _auth(tmp_path, "cert:worker-a acme client")
    assert auth.authenticate(None, "worker-a", "p", "10.0.0.1", 0.0) == (
        Identity("acme", "client"), "cert:worker-a"
    )
    refused = _who(auth.authenticate(None, "worker-b", "p", "10.0.0.1", 0.0))
    assert isinstance(refused, str) and "'worker-b' is not mapped" in refused
    wrong = _who(auth.authenticate("rsd_wrong", "worker-a", "p", "10.0.0.1", 0.0))
    assert wrong == "the token is not valid"  # a token that is sent must be valid


def test_no_failures_of_anyone_refuse_a_valid_token_theirs_only_wait_longer(
    tmp_path: Path,
) -> None:
    token = new_token()
    auth = _auth(tmp_path, f"{hash_token(token)} acme admin")
    delays = []
    for _ in range(ADDRESS_FREE_FAILURES + 8):
        refusal = auth.authenticate("rsd_guess", None, "p", "10.9.9.9", 0.0)
        assert isinstance(refusal, Refusal) and refusal.message == "the token is not valid"
        delays.append(refusal.delay)
    assert delays[:ADDRESS_FREE_FAILURES] == [0.0] * ADDRESS_FREE_FAILURES  # told at once
    waits = delays[ADDRESS_FREE_FAILURES:]
    assert waits[0] > 0 and all(b == min(2 * a, MAX_DELAY) for a, b in itertools.pairwise(waits))
    assert waits[-1] == MAX_DELAY
    assert _who(auth.authenticate(token, None, "p", "10.9.9.9", 0.0)) == Identity("acme", "admin")
    # the counts leak away: after a long quiet spell a failure is told at once again
    assert _delay(auth.authenticate("rsd_guess", None, "p", "10.9.9.9", 3600.0)) == 0.0


def test_rotating_addresses_of_one_network_shares_its_allowance(tmp_path: Path) -> None:
    auth = _auth(tmp_path, f"{hash_token(new_token())} acme admin")
    delays = [
        _delay(auth.authenticate("rsd_guess", None, "p", f"10.7.7.{n}", 0.0))
        for n in range(NETWORK_FREE_FAILURES + 3)
    ]  # one failure per address: every address within its own allowance
    assert delays[:NETWORK_FREE_FAILURES] == [0.0] * NETWORK_FREE_FAILURES
    assert all(delay > 0 for delay in delays[NETWORK_FREE_FAILURES:])
    assert _delay(auth.authenticate("rsd_guess", None, "p", "10.7.8.1", 0.0)) == 0.0  # another /24


def test_a_bad_reload_keeps_the_table_in_use(tmp_path: Path) -> None:
    old, new = new_token(), new_token()
    auth = _auth(tmp_path, f"{hash_token(old)} acme client")
    (tmp_path / "tokens").write_text(f"{hash_token(new)} acme client\nnot a line\n")
    assert not auth.reload() and auth.reload_failures == 1
    assert _who(auth.authenticate(old, None, "p", "10.0.0.1", 0.0)) == Identity("acme", "client")
    (tmp_path / "tokens").write_text(f"{hash_token(new)} acme admin\n")
    assert auth.reload()
    assert _who(auth.authenticate(new, None, "p", "10.0.0.1", 0.0)) == Identity("acme", "admin")
    assert _who(auth.authenticate(old, None, "p", "10.0.0.1", 0.0)) == "the token is not valid"


def test_a_reload_closes_the_connections_of_entries_it_drops_or_changes_only(
    tmp_path: Path,
) -> None:
    gone, changed, kept = new_token(), new_token(), new_token()
    auth = _auth(tmp_path, f"{hash_token(gone)} a client", f"{hash_token(changed)} b client",
                 f"{hash_token(kept)} c client", "cert:w-1 d client", "cert:w-2 e client")
    closed: dict[str, tuple[ErrorCode, str]] = {}

    class Conn:
        def __init__(self, name: str) -> None:
            self.name = name

        def fail(self, code: ErrorCode, message: str) -> None:
            closed[self.name] = (code, message)

    for name, token, cn in [("gone", gone, None), ("changed", changed, None),
                            ("kept", kept, None), ("w-1", None, "w-1"), ("w-2", None, "w-2")]:
        admission = auth.authenticate(token, cn, "p", "10.0.0.1", 0.0)
        assert isinstance(admission, Admission) and admission.entry is not None
        auth.admitted(admission.entry, Conn(name))
    ended = Conn("ended")
    auth.admitted(hash_token(kept).encode(), ended)
    auth.forget(hash_token(kept).encode(), ended)
    (tmp_path / "tokens").write_text(
        f"{hash_token(changed)} b admin\n{hash_token(kept)} c client\ncert:w-2 e client\n"
    )
    assert auth.reload()
    assert set(closed) == {"gone", "changed", "w-1"} and auth.revoked == 3
    assert closed["gone"] == (ErrorCode.UNAUTHENTICATED, "the token of this connection was revoked")
    assert "no longer maps this connection's certificate" in closed["w-1"][1]
    assert len(auth.sessions) == 2  # kept and w-2: what is left is what still runs


# ---- the failure limiter -------------------------------------------------------------------


def test_the_failure_counts_leak_and_stay_within_their_table_size() -> None:
    counts = FailureCounts(free=3, per_second=1.0, max_keys=100)
    assert [counts.failed("a", 0.0) for _ in range(4)] == [-2.0, -1.0, 0.0, 1.0]
    assert counts.over("a", 2.0) == pytest.approx(-1.0)  # two leaked away
    for index in range(10_000):
        counts.failed(f"peer-{index}", 2.0)
    assert len(counts.counts) == 100 and counts.evicted == 10_000 - 100 + 1
    assert counts.over("peer-0", 2.0) == -3.0  # forgotten: the oldest go first


def test_failures_count_per_address_and_per_network() -> None:
    assert peer_keys("192.0.2.7") == ("192.0.2.7", "192.0.2.0/24")
    assert peer_keys("::ffff:192.0.2.7") == ("192.0.2.7", "192.0.2.0/24")
    one, other = peer_keys("2001:db8:1:2:aaaa::1"), peer_keys("2001:db8:1:2:bbbb::2")
    assert one == other and one.address == "2001:db8:1:2::/64"
    assert peer_keys("2001:db8:1:3::1").address != one.address
    assert peer_keys("2001:db8:1:3::1").network == one.network == "2001:db8:1::/56"


# ---- where rsd listens, whom it admits -----------------------------------------------------


def test_only_loopback_is_served_without_authentication() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "localhost"):
        assert exposure_problem(host, None, None, False) is None, host
    for host in ("0.0.0.0", "::", "", "192.0.2.1"):
        problem = exposure_problem(host, None, None, False)
        assert problem is not None and "--tokens-file" in problem and "--insecure" in problem
        assert exposure_problem(host, "tokens", None, False) is None
        assert exposure_problem(host, None, "ca.pem", False) is None
        assert exposure_problem(host, None, None, True) is None
    assert is_loopback("::ffff:127.0.0.1") and not is_loopback("::ffff:10.0.0.1")


def test_a_loopback_only_server_refuses_other_peers_at_accept() -> None:
    loop = asyncio.new_event_loop()
    try:
        server = Server(Core(lambda: "s"), loop, loopback_only=True)
        stranger = types.SimpleNamespace(peer="192.0.2.5:4000", peer_host="192.0.2.5")
        refusal = server.admit(stranger)  # type: ignore[arg-type]
        assert refusal is not None and refusal[0] == ErrorCode.UNAUTHENTICATED
        assert "loopback clients only" in refusal[1] and "--tokens-file" in refusal[1]
        assert server.refused_total == 1 and not server.conns
        local = types.SimpleNamespace(peer="127.0.0.1:4000", peer_host="127.0.0.1", id=7)
        assert server.admit(local) is None  # type: ignore[arg-type]
    finally:
        loop.close()


# ---- what the core keeps -------------------------------------------------------------------


def test_the_core_keeps_each_connections_tenant_and_rights_until_it_ends() -> None:
    core = Core(lambda: "s")
    core.connected(1, "alice", tenant="acme", admin=False)
    core.connected(2, "bob")
    assert (core.tables.tenant_of(1), core.tables.tenant_of(2)) == ("acme", "default")
    assert (core.is_admin(1), core.is_admin(2)) == (False, True)
    core.disconnected(1)
    core.disconnected(2)
    assert core.tables.tenants.by_conn == {} and core.tables.tenants.admins == set()
