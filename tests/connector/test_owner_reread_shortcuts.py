"""The owner reread's shortcuts (issue 19, D-272) still catch every tampered owner row: the credential generations
read by the configuration's relation statement, the JSON columns canonicalized once per distinct text, and the
frozen credential proof rows read as tuples."""
from __future__ import annotations

import pytest
from django.db import connection

from connector.actors import Actor
from connector.choices import EpochState
from connector.demo import build_owners
from connector.models import ServiceConfigurationAccount
from connector.selectors import owners as owner_readers
from connector.selectors.epoch_candidate import candidate_from_owners
from connector.services import serving
from tests import dbroles

ACTOR = Actor.system("test")


@pytest.fixture
def world(db):
    return build_owners("s-", account_keys=("acme-eu", "globex-us", "initech-us"))


def _prepared(world):
    candidate = candidate_from_owners(epoch_id="s-epoch", configuration_generation_id=world.configuration.generation_id)
    return serving.epoch_prepare(candidate=candidate, actor=ACTOR)


def _behind_the_owners_back(sql: str, params: list) -> None:
    with connection.cursor() as cursor:  # corruption: triggers off, as in test_epoch_verification
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(sql, params)
        assert cursor.rowcount == 1
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)


def _last_generation_id(world) -> str:
    fact = owner_readers.service_configuration_read(generation_id=world.configuration.generation_id)
    return fact.credential_generation_ids()[-1]


def test_the_reread_checks_the_generations_the_relation_statement_read(world, monkeypatch):
    """candidate_from_owners hands the credential reader the rows the relation statement read (no second
    statement for them), and the reader still recomputes every receipt from them. Proves: CV2-02-021,
    CV2-02-036"""
    seen = []
    real = owner_readers.credential_generations_read

    def spy(*, generation_ids, rows=None):
        seen.append(rows)
        return real(generation_ids=generation_ids, rows=rows)

    monkeypatch.setattr(owner_readers, "credential_generations_read", spy)
    recomputed = []
    real_receipt = owner_readers.receipts.credential_receipt
    monkeypatch.setattr(owner_readers.receipts, "credential_receipt",
                        lambda **kw: recomputed.append(kw["generation_id"]) or real_receipt(**kw))
    candidate = candidate_from_owners(epoch_id="s-epoch", configuration_generation_id=world.configuration.generation_id)
    assert len(seen) == 1 and seen[0] is not None and len(seen[0]) == len(candidate.credentials) == 6
    assert recomputed == [p.generation_id for p in candidate.credentials]


@pytest.mark.parametrize("column,value", [
    ("secret_version_ref", "crm-api/v999"),
    ("transport_config_digest", b"\x07" * 32),
    ("receipt", b"forged receipt"),
    ("receipt_digest", b"\x08" * 32),
    ("receipt_protocol", "nexuscrm.credential-generation.receipt.v0"),
    ("provider_scope", "elsewhere"),
    ("credential_identity", "crm-other"),
])
def test_a_tampered_generation_read_by_the_relation_statement_is_rejected(world, column, value):
    """Any column of the last generation in order, changed behind its owner's back after preparation, rejects
    the epoch at verification through the rows the relation statement read. Proves: CV2-02-021, CV2-02-036,
    CV2-02-044"""
    epoch = _prepared(world)
    _behind_the_owners_back(f"UPDATE connector_credentialgeneration SET {column} = %s WHERE generation_id = %s",
                            [value, _last_generation_id(world)])
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")


@pytest.mark.parametrize("column,value", [
    ("policy_values", '{"max_batch": 101, "retry_limit": 5}'),
    ("mapping_selections", '{"extra": "selection"}'),
    ("enabled_routes", '[]'),
])
def test_one_account_of_equal_json_texts_tampered_is_rejected(world, column, value):
    """The accounts share one JSON text per column (canonicalized once per read); changing it for the last
    account alone still breaks the configuration payload. Proves: CV2-02-017, CV2-02-044"""
    rows = ServiceConfigurationAccount.objects.filter(generation=world.configuration).order_by("ordinal")
    texts = {str(getattr(row, column)) for row in rows}
    assert len(texts) == 1 and rows.count() == 3  # the shortcut's case: equal texts
    epoch = _prepared(world)
    _behind_the_owners_back(f"UPDATE connector_serviceconfigurationaccount SET {column} = %s::jsonb WHERE id = %s",
                            [value, rows.last().pk])
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")
    assert "payload, digest or receipt mismatch" in epoch.rejection_detail


def test_a_tampered_frozen_credential_proof_row_is_rejected(world):
    """The last frozen credential proof row's receipt changed behind the epoch's back: the tuple comparison
    rejects it. Proves: CV2-02-035, CV2-02-044"""
    epoch = _prepared(world)
    _behind_the_owners_back("UPDATE connector_servingepochcredentialproof SET owner_receipt = %s "
                            "WHERE epoch_id = %s AND ordinal = 5", [b"forged", epoch.pk])
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "EPOCH_OWNER_MISMATCH")
    assert "frozen credential proof rows differ" in epoch.rejection_detail
