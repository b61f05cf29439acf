"""Read-only admin pages of the restore facts (journal database)."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from config.routers import JOURNAL_DB
from cutover.models import RestoreAttempt, RestorePointRehearsal, V1RestorePoint

DIGESTS = ("v1_binary_digest", "v1_schema_digest", "v1_configuration_digest", "configuration_digest",
           "schema_digest", "content_digest", "cursors_digest", "account_gate_digest", "shutdown_certificate_digest",
           "identity_coverage_digest", "ordering_coverage_digest", "effect_evidence_digest", "dump_sha256", "digest")


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", "operator@example.com", "unused")
    client.force_login(user)
    return user


@pytest.mark.django_db(databases=["default", "journal"])
def test_restore_pages_render_read_only_with_hex_digests(client, operator):
    """Proves: CV2-12-093 (an operator sees every frozen digest of the restore point, its rehearsal and the
    restore attempt; nothing can be added, changed or deleted from the admin)."""
    point = V1RestorePoint.objects.using(JOURNAL_DB).create(
        attempt_key="adm-attempt", database_name="db", v1_release_id="v1-r", dump_path="/d", dump_bytes=10,
        payload=b"p", captured_by="op", **{f: bytes([i + 1]) * 32 for i, f in enumerate(DIGESTS)})
    rehearsal = RestorePointRehearsal.objects.using(JOURNAL_DB).create(
        restore_point=point, attempt_key="adm-attempt", scratch_database="db_rehearse", schema_digest=b"\x05" * 32,
        content_digest=b"\x06" * 32, dump_sha256=b"\x0d" * 32, boot_receipt_digest=b"\x07" * 32,
        digest=b"\x08" * 32, rehearsed_by="op")
    attempt = RestoreAttempt.objects.using(JOURNAL_DB).create(attempt_key="adm-attempt", restore_point=point,
                                                             started_by="op")
    for model, obj in ((V1RestorePoint, point), (RestorePointRehearsal, rehearsal), (RestoreAttempt, attempt)):
        opts = model._meta
        listing = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"), {"q": "adm"})
        assert listing.status_code == 200 and 'class="cv2-description"' in listing.content.decode()
        page = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
        html = page.content.decode()
        assert page.status_code == 200 and "adm-attempt" in html
        assert 'name="_save"' not in html
        assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_add")).status_code == 403
    html = client.get(reverse("admin:cutover_v1restorepoint_change", args=[point.pk])).content.decode()
    assert ("0c" * 32) in html  # dump_sha256 (13th digest) as lowercase hex
    html = client.get(reverse("admin:cutover_restoreattempt_change", args=[attempt.pk])).content.decode()
    assert "database_restored" in html  # the state machine table
