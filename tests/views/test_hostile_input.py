"""Issue 6, faults 4 and 6 on the dashboard: every filter and form field is checked
against its column before any query (400 naming it, nothing written), and revealed
payloads and evidence are never cacheable."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent
from tests.api.apihelpers import snapshot

BIG = str(2**63)  # one more than any revision or sequence number the store can hold


@pytest.mark.parametrize("query,field", [
    ("kind=%00", "kind"),
    ("kind=" + "k" * 201, "kind"),
    ("subject=a%00", "subject"),
    ("cursor=%00", "cursor"),
    ("state=nope", "state"),
])
def test_it_refuses_bad_inbox_filters_naming_them(login, rita, acme, query, field):
    before = snapshot()
    r = login(rita).get(f"/t/acme/?{query}")
    assert r.status_code == 400
    assert field.encode() + b":" in r.content
    assert snapshot() == before


@pytest.mark.parametrize("query,field", [
    ("actor=a%00", "actor"),
    ("action=" + "a" * 65, "action"),
    ("before=" + BIG, "before"),
    ("run=%00", "run"),
])
def test_it_refuses_bad_audit_filters_naming_them(login, rita, acme, query, field):
    before = snapshot()
    r = login(rita).get(f"/t/acme/audit/?{query}")
    assert r.status_code == 400
    assert field.encode() + b":" in r.content
    assert snapshot() == before


@pytest.mark.parametrize("path,data,field", [
    ("reveal", {"reason": "look", "revision": BIG}, "revision"),
    ("diff", {"reason": "look", "from_rev": BIG, "to_rev": "0"}, "from_rev"),
    ("diff", {"reason": "look", "from_rev": "0", "to_rev": BIG}, "to_rev"),
    ("reveal", {"reason": "a\x00b"}, "reason"),
])
def test_it_refuses_out_of_range_reveal_fields_naming_them(login, rita, stuck, path, data,
                                                           field):
    before = snapshot()
    r = login(rita).post(f"/t/acme/checkpoints/{stuck.checkpoint_id}/{path}/", data)
    assert r.status_code == 400
    assert field.encode() + b":" in r.content
    assert snapshot() == before


def test_it_never_lets_a_cache_keep_a_revealed_payload(login, rita, stuck):
    events = AuditEvent.objects.count()
    client = login(rita)
    base = f"/t/acme/checkpoints/{stuck.checkpoint_id}"
    for r in (client.post(f"{base}/reveal/", {"reason": "look"}),
              client.post(f"{base}/reveal/", {"reason": "look"}, HTTP_HX_REQUEST="true"),
              client.post(f"{base}/diff/", {"reason": "look", "from_rev": "0", "to_rev": "1"})):
        assert r.status_code == 200
        assert "no-store" in r["Cache-Control"]
    assert AuditEvent.objects.count() == events + 4  # two reveals, and the diff's two
