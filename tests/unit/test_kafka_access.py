"""The Kafka client security settings: what each protocol hands aiokafka, and checks."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from shared.settings import CommonSettings, SettingsError


def test_plaintext_adds_no_option() -> None:
    assert CommonSettings.from_env({}).kafka.options() == {}


def test_sasl_ssl_logs_in_with_scram_over_verified_tls(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-from-file\n")
    settings = CommonSettings.from_env(
        {
            "TW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TW_KAFKA_USERNAME": "tw-edge",
            "TW_KAFKA_PASSWORD_FILE": str(secret),
        }
    )
    opts = settings.kafka.options()
    assert opts["security_protocol"] == "SASL_SSL"
    assert opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (opts["sasl_plain_username"], opts["sasl_plain_password"]) == (
        "tw-edge",
        "s3cret-from-file",
    )
    ctx = opts["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    # The password shows in no repr: settings, access.
    assert "s3cret" not in repr(settings) and "s3cret" not in repr(settings.kafka)


def test_password_setting_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file")
    s = CommonSettings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_username="u",
        kafka_password="direct",
        kafka_password_file=str(tmp_path / "pw"),
    )
    assert s.kafka.password == "direct"
    assert s.kafka.options()["sasl_mechanism"] == "SCRAM-SHA-256"


def test_ssl_alone_has_no_sasl_login() -> None:
    opts = CommonSettings.from_env({"TW_KAFKA_SECURITY_PROTOCOL": "SSL"}).kafka.options()
    assert opts["security_protocol"] == "SSL" and "sasl_mechanism" not in opts


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "TW_KAFKA_USERNAME"),
        ({"TW_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "TW_KAFKA_SECURITY_PROTOCOL"),
        ({"TW_KAFKA_SASL_MECHANISM": "PLAIN"}, "TW_KAFKA_SASL_MECHANISM"),
        ({"TW_KAFKA_TLS_KEY_FILE": "/k.pem"}, "TW_KAFKA_TLS_CERT_FILE"),
    ],
)
def test_a_bad_combination_fails_naming_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        CommonSettings.from_env(env)


def test_the_login_in_words_names_what_is_presented_and_never_the_password() -> None:
    sasl = CommonSettings(
        kafka_security_protocol="SASL_SSL", kafka_username="tw-edge", kafka_password="pw-9x"
    )
    assert sasl.kafka.login() == "SASL_SSL as user 'tw-edge' (SCRAM-SHA-512)"
    assert "pw-9x" not in sasl.kafka.login()
    bare = CommonSettings(kafka_security_protocol="SSL").kafka.login()
    assert bare == "SSL without a client certificate (TW_KAFKA_TLS_CERT_FILE is empty)"
    mtls = CommonSettings(kafka_security_protocol="SSL", kafka_tls_cert_file="/c/w.crt")
    assert mtls.kafka.login() == "SSL with the client certificate /c/w.crt"
    assert CommonSettings().kafka.login() == "PLAINTEXT, no login"
