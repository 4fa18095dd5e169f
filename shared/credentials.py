"""Credentials given in settings, read the same way for every dependency (Redis, Kafka):
secrets inline or in a file (the way orchestrators mount them), and client TLS contexts."""

from __future__ import annotations

import ssl
from pathlib import Path


def secret(value: str, file: str) -> str:
    """``value`` when set, else the stripped content of ``file`` when named, else empty."""
    if value or not file:
        return value
    return Path(file).read_text().strip()


def client_tls(ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    """A client TLS context: the server's certificate and host name verified against
    ``ca_file`` (empty: the system's CAs), ``cert_file`` presented when set (mTLS)."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx
