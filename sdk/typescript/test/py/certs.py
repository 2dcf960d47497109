"""Certificates for the TypeScript SDK's TLS tests (run by test/tls.test.ts).

    certs.py DIR CN...  writes DIR/ca.pem, DIR/server.pem, DIR/server.key (for 127.0.0.1
                        and localhost) and, for each CN, DIR/CN.pem and DIR/CN.key (a
                        client certificate with subject CN=CN), all from one fresh CA,
                        then prints "ok"
"""

from __future__ import annotations

import sys
from pathlib import Path

import trustme


def main(directory: str, *common_names: str) -> None:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(out / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(out / "server.key"))
    for i, pem in enumerate(server.cert_chain_pems):
        pem.write_to_path(str(out / "server.pem"), append=i > 0)
    for name in common_names:
        client = ca.issue_cert(f"{name}.clients.test", common_name=name)
        client.private_key_pem.write_to_path(str(out / f"{name}.key"))
        for i, pem in enumerate(client.cert_chain_pems):
            pem.write_to_path(str(out / f"{name}.pem"), append=i > 0)
    print("ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
