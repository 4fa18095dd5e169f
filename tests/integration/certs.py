"""TLS certificates made at test time with openssl: a CA and a server certificate for
127.0.0.1 signed by it."""

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
