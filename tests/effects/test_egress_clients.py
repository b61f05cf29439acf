"""The egress keeps one HTTP client per process and per TLS configuration (CA bundle, mTLS identity), so an
exchange never pays for a new SSL context and reuses keep-alive connections (issue 20, decision D-221)."""
from __future__ import annotations

import shutil

import certifi

from effects import egress


def test_one_client_per_tls_configuration_and_a_bounded_pool(monkeypatch, tmp_path):
    monkeypatch.setattr(egress, "_TLS_CLIENTS", {})
    monkeypatch.setattr(egress, "TLS_CLIENTS_MAX", 2)
    first = egress._tls_client(certifi.where(), None)
    assert egress._tls_client(certifi.where(), None) is first
    system = egress._tls_client(None, None)
    assert system is not first and len(egress._TLS_CLIENTS) == 2
    # A third configuration closes the oldest kept client instead of growing without bound.
    other_bundle = tmp_path / "other-ca.pem"
    shutil.copy(certifi.where(), other_bundle)
    third = egress._tls_client(str(other_bundle), None)
    assert third not in (first, system) and len(egress._TLS_CLIENTS) == 2
    assert first.is_closed and not system.is_closed
    assert egress._tls_client(None, None) is system
