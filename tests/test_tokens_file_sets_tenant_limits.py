"""A tokens file's ``limit`` lines: one tenant's own payload byte limit, checked whole.

``limit <tenant> max_payload_bytes_per_tenant=<bytes>`` (a whole number, or with KiB,
MiB, GiB or TiB), within the range the flag allows, at most once per tenant, and only
for a tenant a token or certificate line names; anything else refuses the file naming
``file:line``. The core applies them over the server-wide default.
"""

from __future__ import annotations

import pytest

from rsd.core.ground.tenants import TenantLimits, Tenants
from rsd.policy import Policy
from rsd.security.tokens import TokenFileError, TokenTable, hash_token, parse_bytes

HEAD = f"{hash_token('a')} acme client\ncert:w-1 ops admin\n"


def test_limit_lines_give_tenants_their_own_payload_byte_limit() -> None:
    table = TokenTable.parse(
        HEAD + "limit acme max_payload_bytes_per_tenant=2GiB  # big jobs\n"
        "limit ops max_payload_bytes_per_tenant=300000\n"
    )
    assert table.limits == {"acme": {"max_payload_bytes_per_tenant": 2 << 30},
                            "ops": {"max_payload_bytes_per_tenant": 300_000}}
    assert len(table) == 2  # limits are no tokens
    assert TokenTable.parse(HEAD).limits == {}
    assert [parse_bytes(t) for t in ("1", "3KiB", "5MiB", "1TiB", "1GB", "-1", "", "1.5GiB")] \
        == [1, 3 << 10, 5 << 20, 1 << 40, None, None, None, None]


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("limit acme max_items_per_tenant=5", "a limit line reads"),
        ("limit acme max_payload_bytes_per_tenant", "a limit line reads"),
        ("limit acme max_payload_bytes_per_tenant=lots", "must be a number of bytes"),
        ("limit acme max_payload_bytes_per_tenant=1KiB", "from 262144 to"),
        ("limit acme max_payload_bytes_per_tenant=2TiB", "to 1099511627776"),
        ("limit acme max_payload_bytes_per_tenant=1GiB extra", "got 4 fields"),
        ("limit acmee max_payload_bytes_per_tenant=1GiB", "'acmee' has a limit but no token"),
        ("limit a/b max_payload_bytes_per_tenant=1GiB", "tenant 'a/b'"),
    ],
)
def test_a_bad_limit_line_refuses_the_file_naming_file_and_line(line: str, complaint: str) -> None:
    with pytest.raises(TokenFileError) as caught:
        TokenTable.parse(HEAD + line + "\n", "tokens.txt")
    assert str(caught.value).startswith("tokens.txt:3: ") and complaint in str(caught.value)


def test_a_tenant_limit_set_twice_refuses_the_file() -> None:
    twice = "limit acme max_payload_bytes_per_tenant=1GiB\n"
    with pytest.raises(TokenFileError, match=r":4: max_payload_bytes_per_tenant of tenant "
                       "'acme' is set twice"):
        TokenTable.parse(HEAD + twice + twice)


def test_the_core_takes_each_tenants_own_limit_over_the_default() -> None:
    tenants = Tenants(TenantLimits())
    assert tenants.byte_limit("acme") == Policy.MAX_PAYLOAD_BYTES_PER_TENANT == 1 << 30
    assert tenants.set_byte_limits(5 << 20, {"acme": 9 << 20}) == [
        "max_payload_bytes_per_tenant 5242880",
        "max_payload_bytes_per_tenant of 1 tenants from the tokens file",
    ]
    assert tenants.byte_limit("acme") == 9 << 20 and tenants.byte_limit("ops") == 5 << 20
    assert tenants.set_byte_limits(5 << 20, {"acme": 9 << 20}) == []  # nothing changed
    tenants.set_byte_limits(5 << 20, {})
    assert tenants.byte_limit("acme") == 5 << 20
