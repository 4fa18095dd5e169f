"""TLS certificates made at test time with openssl: a CA and a server certificate for
127.0.0.1 signed by it, and client certificates signed by the same CA."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_certs(folder: Path, cn: str = "127.0.0.1") -> dict[str, Path]:
    """A CA and a certificate with subject ``CN=cn`` for 127.0.0.1 and localhost, signed
    by it (no key usage restriction: a server's, or a client's for mTLS)."""
    folder.mkdir(parents=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    crt, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        f"req -x509 -newkey rsa:2048 -nodes -days 1 -keyout {ca_key} -out {ca}",
        f"req -newkey rsa:2048 -nodes -keyout {key} -out {csr} -subj /CN={cn}",
        f"x509 -req -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -out {crt} -days 1 "
        f"-extfile {ext}",
    ):
        extra = ["-subj", "/CN=tokenwire test CA"] if "-x509" in cmd else []
        subprocess.run(["openssl", *cmd.split(), *extra], check=True, capture_output=True)
    return {"ca": ca, "cert": crt, "key": key}


def client_cert(folder: Path, cn: str) -> dict[str, Path]:
    """A certificate with subject ``CN=cn`` signed by the CA that ``make_certs`` made in
    ``folder`` (a client's, for mTLS): its files are ``<cn>.crt`` and ``<cn>.key``."""
    crt, key, csr = folder / f"{cn}.crt", folder / f"{cn}.key", folder / f"{cn}.csr"
    for cmd in (
        f"req -newkey rsa:2048 -nodes -keyout {key} -out {csr} -subj /CN={cn}",
        f"x509 -req -in {csr} -CA {folder / 'ca.crt'} -CAkey {folder / 'ca.key'} "
        f"-CAcreateserial -out {crt} -days 1",
    ):
        subprocess.run(["openssl", *cmd.split()], check=True, capture_output=True)
    return {"cert": crt, "key": key}
