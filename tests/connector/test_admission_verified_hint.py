"""The REST admission verifies a request against one exact epoch and admits it only under that epoch (D-297): the
process's last hint for the account spares the gate read, and is never trusted. On real PostgreSQL."""
from __future__ import annotations

import pytest

from connector.api import views
from connector.models import AccountServingGate, Receipt
from connector.services import admission
from connector.services.admission import AdmissionHint
from connector.services.signatures import SignatureInvalid, signature_verify
from connector.demo import build_world
from tests.connector.test_api_admission import ACCOUNT, admit, body, event, signing_secret

STALE = b"\x5a" * 32  # the digest of an epoch the gate no longer serves (a superseded epoch, as the cache keeps it)


@pytest.fixture
def world(transactional_db):
    return build_world("w-")


def _current() -> AdmissionHint:
    gate = AccountServingGate.objects.get(account__account_key=ACCOUNT)
    return AdmissionHint(gate.account_id, gate.epoch_id, bytes(gate.epoch_digest))


def _only_the_superseded_credential(monkeypatch):
    """The signing credential the request carries is valid only in the superseded epoch (as after a rotation)."""
    def verify(**kwargs):
        if kwargs["epoch_digest"] != STALE:
            raise SignatureInvalid("signature does not match")
    monkeypatch.setattr(views, "signature_verify", verify)


def test_a_stale_cached_hint_is_re_read_and_the_request_admitted_under_the_serving_epoch(world, client):
    """The process caches a hint naming a superseded epoch: the request, signed for the serving epoch, fails
    verification under the cached hint, the gate is read, verification passes for the serving epoch, and the
    receipt is admitted under it; the cache now holds the serving epoch. Proves: CV2-04-009, CV2-05-001"""
    current = _current()
    admission._HINTS[ACCOUNT] = AdmissionHint(current.account_pk, current.epoch_pk, STALE)
    response = admit(client, body(event("vh-1")), "vh-1", secret=signing_secret())
    assert response.status_code == 201, response.content
    receipt = Receipt.objects.get(pk=response.json()["receipt"])
    assert bytes(receipt.epoch_digest) == current.epoch_digest
    assert admission._HINTS[ACCOUNT] == current


def test_a_request_verified_only_under_a_superseded_epoch_is_never_admitted(world, client, monkeypatch):
    """The cached hint names a superseded epoch whose credential verifies the request; the admission statement
    locks the gate, finds another epoch and writes nothing (HintStale); the view verifies again against the
    serving epoch, which refuses: 401 SIGNATURE_INVALID and no receipt.
    Proves: CV2-04-009, CV2-05-001, CV2-03-015"""
    current = _current()
    admission._HINTS[ACCOUNT] = AdmissionHint(current.account_pk, current.epoch_pk, STALE)
    _only_the_superseded_credential(monkeypatch)
    response = admit(client, body(event("vh-2")), "vh-2", secret=signing_secret())
    assert response.status_code == 401 and response.json()["code"] == "SIGNATURE_INVALID", response.content
    assert Receipt.objects.count() == 0


def test_a_duplicate_under_a_superseded_verification_is_refused_too(world, client, monkeypatch):
    """A duplicate is answered before any lock; with a hint the view verified, the gate must still name that
    epoch, else the request is verified again against the serving epoch: a request valid only under the
    superseded credential gets SIGNATURE_INVALID, not the original receipt. The same request signed for the
    serving epoch gets the duplicate answer. Proves: CV2-04-009, CV2-05-005"""
    payload = body(event("vh-3"))
    first = admit(client, payload, "vh-3", secret=signing_secret())
    assert first.status_code == 201
    current = _current()
    admission._HINTS[ACCOUNT] = AdmissionHint(current.account_pk, current.epoch_pk, STALE)
    with monkeypatch.context() as m:
        _only_the_superseded_credential(m)
        refused = admit(client, payload, "vh-3", secret=signing_secret())
    assert refused.status_code == 401 and refused.json()["code"] == "SIGNATURE_INVALID", refused.content
    again = admit(client, payload, "vh-3", secret=signing_secret())
    assert again.status_code == 200 and again.json()["admission"] == "duplicate"
    assert again.json()["receipt"] == first.json()["receipt"] and Receipt.objects.count() == 1


def test_the_real_verifier_refuses_a_digest_it_has_no_credential_for(world):
    """The stand-in above models the real verifier: the signing credential is looked up by the exact epoch
    digest, so a digest the service never served verifies nothing. Proves: CV2-04-009"""
    current = _current()
    with pytest.raises(SignatureInvalid):
        signature_verify(account_id=current.account_pk, channel="records.webhook", header="t=1,v1=00", body=b"{}",
                         now=1, epoch_pk=current.epoch_pk, epoch_digest=STALE)


def test_a_fixed_hint_is_admitted_under_exactly_that_epoch_or_not_at_all(world):
    """At the service: with `hint_fixed` (what the view passes) a hint naming another epoch than the gate's writes
    nothing and raises HintStale naming the serving epoch; without it (every other caller) the statement's retry
    admits under the serving epoch, as before D-297, which is why the view must not use that retry after it
    verified a signature. Proves: CV2-05-001, CV2-03-015"""
    from connector.actors import Actor

    current = _current()
    stale = AdmissionHint(current.account_pk, current.epoch_pk, STALE)
    actor = Actor.system("test")
    with pytest.raises(admission.HintStale) as raised:
        admission.receipt_admit(account_key=ACCOUNT, channel="records.webhook", transport_key="vh-5",
                                body=body(event("vh-5")), actor=actor, hint=stale, hint_fixed=True)
    assert raised.value.hint == current and Receipt.objects.count() == 0
    admitted = admission.receipt_admit(account_key=ACCOUNT, channel="records.webhook", transport_key="vh-5",
                                       body=body(event("vh-5")), actor=actor, hint=stale)
    assert admitted.outcome == "created" and bytes(admitted.receipt.epoch_digest) == current.epoch_digest
