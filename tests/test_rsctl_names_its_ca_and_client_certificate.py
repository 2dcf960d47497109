"""rsctl reaches an rsd whose certificate is signed by the operator's own CA (``--ca``)
and that admits only certified clients (``--cert``, ``--key``), the SDK's ``tls=``: no
undocumented ``SSL_CERT_FILE`` needed. Any of the three means TLS; a file that cannot
be loaded, or a key without its certificate, is a usage error (exit 2) naming it.

One real rsd with mutual TLS (support/certs.py: a CA made for the test) and a tokens
file whose ``cert:`` line makes the client certificate an admin.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support.certs import Certs
from support.process import Rsd

from rsclient import AsyncRunstate
from rsctl.main import run


async def rsctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = await run(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


async def test_rsctl_trusts_the_named_ca_and_presents_the_named_client_certificate(
    rsds: Callable[..., Rsd], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # nothing trusted but --ca
    monkeypatch.delenv("RUNSTATE_TOKEN", raising=False)  # the certificate is the credential
    certs = Certs(tmp_path / "certs")
    cert, key = certs.client_files("ops-cli")
    ca = str(certs.ca_file)
    server = rsds()
    tokens = server.write_tokens("cert:ops-cli ops admin")
    await server.start(*certs.mutual_flags(), "--tokens-file", str(tokens))
    async with AsyncRunstate("ops", server.address, tls=certs.client_context("ops-cli")) as rs:
        made = (await rs.scopes.create()).id

    tls = f"tls://{server.address}"
    status, out, err = await rsctl(
        capsys, "--address", tls, "--ca", ca, "--cert", str(cert), "--key", str(key),
        "scopes", "--json",
    )
    assert status == 0, err
    assert [scope["scope"] for scope in json.loads(out)["scopes"]] == [made]

    # After the command's name too; a plain HOST:PORT with --ca is TLS all the same.
    status, out, err = await rsctl(
        capsys, "stats", "--interval", "0", "--address", server.address, "--ca", ca,
        "--cert", str(cert), "--key", str(key), "--json",
    )
    assert status == 0, err
    assert json.loads(out)["tls"] is True

    # Without a client certificate mutual TLS lets nobody in; without --ca nothing
    # vouches for rsd's certificate: both are refusals (exit 1), said on stderr.
    status, _, err = await rsctl(
        capsys, "--address", tls, "--ca", ca, "--connect-timeout", "1", "scopes"
    )
    assert status == 1 and err.startswith("rsctl: "), err
    status, _, err = await rsctl(
        capsys, "--address", tls, "--cert", str(cert), "--key", str(key), "scopes"
    )
    assert status == 1 and "cannot be trusted" in err, err
    assert await server.stop() == 0


async def test_a_ca_or_certificate_rsctl_cannot_load_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    certs = Certs(tmp_path / "certs")
    cert, key = certs.client_files("ops-cli")
    missing = str(tmp_path / "nowhere.pem")
    for argv, named in (
        (["--ca", missing], f"--ca {missing}"),
        (["--cert", str(cert), "--key", missing], f"--key {missing}"),
        (["--cert", str(key), "--key", str(key)], f"--cert {key}"),  # a key is no cert
    ):
        status, _, err = await rsctl(capsys, "--address", "127.0.0.1:9", *argv, "scopes")
        assert status == 2 and "cannot load" in err and named in err, (argv, err)
    status, _, err = await rsctl(capsys, "--key", str(key), "scopes")
    assert status == 2 and "--key needs --cert" in err, err
