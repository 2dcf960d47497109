"""Certificates the tests make themselves (trustme): a CA, rsd's certificate, client ones.

``Certs(directory)`` writes PEM files rsd reads (``server_flags()``, ``mutual_flags()``)
and builds the client contexts a test connects with. Nothing here is trusted outside the
test: the CA is made fresh for each ``Certs``.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme


class Certs:
    """A CA, a server certificate for 127.0.0.1 and localhost, and client certificates."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert_file = directory / "server.pem"
        self.key_file = directory / "server.key"
        server.cert_chain_pems[0].write_to_path(str(self.cert_file))
        for extra in server.cert_chain_pems[1:]:
            extra.write_to_path(str(self.cert_file), append=True)
        server.private_key_pem.write_to_path(str(self.key_file))

    def server_flags(self) -> list[str]:
        return ["--tls-cert", str(self.cert_file), "--tls-key", str(self.key_file)]

    def mutual_flags(self) -> list[str]:
        """TLS that requires client certificates signed by this CA."""
        return [*self.server_flags(), "--tls-client-ca", str(self.ca_file)]

    def client_files(self, common_name: str) -> tuple[Path, Path]:
        """A client certificate with that subject CN, signed by this CA, as PEM files
        (certificate, key) for a program that takes paths (rsctl's ``--cert``/``--key``)."""
        cert = self.ca.issue_cert(f"{common_name}.clients.test", common_name=common_name)
        cert_file = self.dir / f"{common_name}.pem"
        key_file = self.dir / f"{common_name}.key"
        for n, pem in enumerate(cert.cert_chain_pems):
            pem.write_to_path(str(cert_file), append=n > 0)
        cert.private_key_pem.write_to_path(str(key_file))
        return cert_file, key_file

    def client_context(self, common_name: str | None = None) -> ssl.SSLContext:
        """A context that trusts this CA; with ``common_name``, it also presents a client
        certificate with that subject CN, signed by this CA."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if common_name is not None:
            cert = self.ca.issue_cert(f"{common_name}.clients.test", common_name=common_name)
            cert.configure_cert(context)
        return context
