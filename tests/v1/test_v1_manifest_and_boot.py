"""The V1 egress manifest and the V1 boot check a restore rehearsal runs."""
from __future__ import annotations

import dataclasses

import pytest
from django.db import connections

from tests.crash.conftest import _url
from v1 import manifest
from v1.errors import V1BootCheckFailed
from v1.owner import V1Owner


def test_the_current_tree_manifest_tracks_every_provider_call_site():
    """The scan of the V1 package finds exactly the declared call site, whose pre-I/O marker is `dispatching`.
    Proves: CV2-12-020"""
    current = V1Owner().egress_manifest()
    assert manifest.scan() == ["v1.egress:send"]
    assert current.supported and current.untracked == ()
    assert [e.pre_io_marker for e in current.entries] == ["dispatching"]


def test_an_untracked_call_site_or_a_missing_marker_makes_the_upgrade_unsupported(tmp_path):
    """A provider call added anywhere in the tree without a manifest entry is `untracked`; an entry without a
    durable pre-I/O marker is unsupported; either changes the manifest digest. Proves: CV2-12-021"""
    package = tmp_path / "v1x"
    package.mkdir()
    (package / "egress.py").write_text("import httpx\n\ndef send():\n    return httpx.post('http://x')\n")
    (package / "sneaky.py").write_text("from urllib import request\n\ndef ping():\n    request.urlopen('http://x')\n")
    (package / "plain.py").write_text("import json\n\ndef f():\n    return json.dumps({})\n")
    entries = (dataclasses.replace(manifest.MANIFEST[0], call_site="v1x.egress:send"),)
    found = manifest.current(package, "v1x", entries)
    assert found.untracked == ("v1x.sneaky:ping",) and not found.supported
    unmarked = manifest.current(package, "v1x", (dataclasses.replace(entries[0], pre_io_marker=""),
                                                 dataclasses.replace(entries[0], call_site="v1x.sneaky:ping")))
    assert unmarked.untracked == () and not unmarked.supported
    assert found.digest != unmarked.digest


@pytest.mark.django_db(transaction=True)
def test_boot_check_runs_the_release_against_another_database():
    """`v1_boot_check` in a separate process boots the V1 release against the named database: the exact release
    passes; another release or schema digest fails with the mismatch named. Proves: CV2-12-052"""
    owner = V1Owner()
    release = owner.release()
    default = connections["default"].settings_dict
    url = _url(default, default["NAME"])
    receipt = owner.boot_check(url, release, "att-1")
    assert receipt.kind == "restore.boot_checked" and b'"ok": true' in receipt.payload
    with pytest.raises(V1BootCheckFailed, match="schema digest"):
        owner.boot_check(url, dataclasses.replace(release, schema_digest=b"\1" * 32), "att-1")
    with pytest.raises(V1BootCheckFailed, match="release"):
        owner.boot_check(url, dataclasses.replace(release, release_id="v1-other"), "att-1")
