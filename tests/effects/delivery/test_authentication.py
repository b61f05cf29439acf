"""Every supported authentication mode reaches the receiver through the sole egress path, with the secret taken
from the binding's current secret version and never stored: bearer, api_key_header, http_basic,
oauth2_client_credentials, mtls (a real TLS handshake with a client certificate), and api_key_query only with its
recorded exception."""
from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from connector.actors import Actor
from effects import egress
from tests.effects.delivery.receiver import DeliveryReceiver
from effects.services.delivery import runner, setup

EXCEPTION = {"immutable_profile_exception": "PX-1", "security_approval": "SEC-9", "end_to_end_url_redaction": "on",
             "log_trace_exception_waf_receiver_review": "REV-3"}


def _binding(world, receiver, mode: str, secret: bytes, *, semantics: str | None = None, exception=None,
             tls_policy: str = "tls-default"):
    actor = Actor.for_user(world.admin)
    binding = setup.binding_create(
        actor=actor, name=f"auth-{mode}", base_url=receiver.url, authentication_mode=mode, secret=secret,
        api_key_query_exception=exception, authority_origin=receiver.url, remote_principal_id=f"svc-{mode}",
        remote_account_id="acct-42", remote_resource_namespace="warehouse",
        authentication_semantics=semantics or mode, tls_policy_identity=tls_policy,
        network_policy_identity="egress-loopback")
    setup.certification_request(actor=actor, binding=binding, assurance_mode="receiver_attested",
                                handshake={"principal_id": f"svc-{mode}", "account_id": "acct-42"},
                                evidence_ref=f"handshake:{mode}", valid_until=datetime.now(UTC) + timedelta(days=1))
    return binding


def _deliver(world, binding, key: str):
    parent = world.plan(binding=binding, parent_key=key, group=key)
    return runner.drive_parent(parent.pk)


@pytest.mark.parametrize("mode,secret,semantics,check", [
    ("api_key_header", b"k-123", "api_key_header:X-Receiver-Key", lambda r: r["headers"]["X-Receiver-Key"] == "k-123"),
    ("http_basic", b"alice:pw", None, lambda r: r["headers"]["Authorization"].startswith("Basic ")),
    ("oauth2_client_credentials", b"client:secret", "oauth2_client_credentials:/oauth/token",
     lambda r: r["headers"]["Authorization"].startswith("Bearer token-")),
])
def test_header_modes_reach_the_receiver(world, sync_receiver, mode, secret, semantics, check):
    binding = _binding(world, sync_receiver, mode, secret, semantics=semantics)
    assert _deliver(world, binding, mode) == ["final_full_promoted", "final_full_promoted"]
    mutations = sync_receiver.mutations()
    assert mutations and all(check(r) for r in mutations)


def test_api_key_query_only_with_its_exception_and_never_stored(world, sync_receiver):
    binding = _binding(world, sync_receiver, "api_key_query", b"q-secret", semantics="api_key_query:key",
                       exception=EXCEPTION)
    assert _deliver(world, binding, "q") == ["final_full_promoted", "final_full_promoted"]
    assert all("key=q-secret" in r["path"] for r in sync_receiver.mutations())
    with connection.cursor() as cursor:  # the secret is in no row of the database
        cursor.execute("SELECT count(*) FROM effects_receiverbinding b WHERE b::text LIKE '%q-secret%'")
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT count(*) FROM effects_deliveryattempt a WHERE a::text LIKE '%q-secret%'")
        assert cursor.fetchone()[0] == 0


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl binary."""
    d = str(tmp_path)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=test-ca", cwd=d)
    for name, extra in (("server", ["-addext", "subjectAltName=IP:127.0.0.1"]), ("client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN={name}-cn", *extra, cwd=d)
        ext = tmp_path / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\n" if name == "server" else "extendedKeyUsage=clientAuth\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.pem", "-days",
             "2", "-subj", "/CN=rogue", cwd=d)
    return tmp_path


def test_mtls_presents_the_client_certificate_from_the_secret_version(world, pki, settings):
    """The client certificate and key are the binding's secret version; the egress writes them to a private file
    for the exchange only; the receiver requires and verifies them. A wrong certificate fails the handshake,
    and nothing is applied. Under TLS 1.3 the server refuses a client certificate only after the client has
    written its request, so the client cannot prove the request never started: the outcome is
    final_unknown_not_accepted (an operator reconciles; the receiver shows zero applied), never a retry."""
    receiver = DeliveryReceiver(tls=(str(pki / "server.pem"), str(pki / "server.key"), str(pki / "ca.pem"))).start()
    try:
        settings.CONNECTOR = {**settings.CONNECTOR,
                              "DELIVERY_TLS_POLICIES": {"tls-test-ca": {"ca_file": str(pki / "ca.pem")}}}
        client_pem = (pki / "client.pem").read_bytes() + (pki / "client.key").read_bytes()
        binding = _binding(world, receiver, "mtls", client_pem, tls_policy="tls-test-ca")
        clients_before = set(egress._TLS_CLIENTS)
        assert _deliver(world, binding, "m") == ["final_full_promoted", "final_full_promoted"]
        assert {r["client_cn"] for r in receiver.mutations()} == {"client-cn"}
        # Both exchanges ran on one pooled client for this TLS configuration (issue 20, D-221), not one each.
        assert len(set(egress._TLS_CLIENTS) - clients_before) == 1
        setup.secret_rotate(actor=Actor.for_user(world.admin), binding=binding,
                            secret=(pki / "rogue.pem").read_bytes() + (pki / "rogue.key").read_bytes())
        before = len(receiver.mutations())
        states = _deliver(world, binding, "m2")
        assert set(states) <= {"final_unknown_not_accepted", "retry_wait", "final_not_started"}
        assert len(receiver.mutations()) == before
        assert receiver.applied and all(v == 1 for v in receiver.applied.values())
    finally:
        receiver.stop()
