"""``GET …/audit-events/{id}/proof`` (issue 22, item 1; CONTRACT.md 8): an audit event's
inclusion proof that an outsider checks with ``checkpoints.merkle`` and the tree head's
public key alone, under the newest signed head and under an earlier one; a queued event
is 409 ``not_integrated`` with ``Retry-After`` and the GET integrates nothing; another
tenant's event is 404; ``tree_size`` is checked like a body."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import transaction

from checkpoints import merkle, services
from checkpoints.models import AuditEvent, AuditLeaf, AuditPending, AuditTreeHead
from tests.api.apihelpers import snapshot, url


def note(tenant, n: int = 1) -> list[AuditEvent]:
    """``n`` audit events of ``tenant``, committed (queued, not integrated)."""
    out = []
    for i in range(n):
        with transaction.atomic():
            out.append(services.audit_record(tenant=tenant, actor=None, action="test.note",
                                             target_type="tenant", target_id=f"n{i}"))
    return out


def proof_of(client, event_id, **query):
    return client.get(url("acme", f"audit-events/{event_id}/proof"), query)


def outsider_checks(proof: dict, public_key_b64: str) -> None:
    """What a client holding only the public key does (docs/security/audit.md): the leaf
    hash from the leaf input, the root from the audit path, the head's signature over its
    checkpoint text, and that text naming that root and size."""
    head = proof["tree_head"]
    leaf = merkle.leaf_hash(proof["leaf_input"].encode("utf-8"))
    assert leaf.hex() == proof["leaf_hash"]
    path = [bytes.fromhex(h) for h in proof["audit_path"]]
    root = bytes.fromhex(head["root_hash"])
    assert merkle.verify_inclusion(proof["leaf_index"], head["tree_size"], leaf, path, root)
    text = merkle.checkpoint_text(head["origin"], head["tree_size"], root)
    assert text == head["checkpoint"]
    Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64)).verify(
        base64.b64decode(head["signature"]), text.encode("utf-8"))  # raises if forged
    # A wrong leaf or a path for another leaf does not verify: the checks can fail.
    assert not merkle.verify_inclusion(proof["leaf_index"], head["tree_size"],
                                       merkle.leaf_hash(b"other"), path, root)


def test_a_proof_verifies_with_the_public_key_alone_now_and_after_more_events(
        api_as, vic, acme):
    events = note(acme, 12)
    services.audit_integrate(acme)
    target = events[4]
    first = proof_of(api_as(vic), target.pk)
    assert first.status_code == 200, first.content
    body = first.json()
    size = AuditLeaf.objects.filter(tenant=acme).count()
    assert body["tree_head"]["tree_size"] == size and size > 12
    assert len(body["audit_path"]) >= 4  # a non-trivial path: several levels
    assert body["event"]["id"] == target.pk and body["event"]["action"] == "test.note"
    listed = api_as(vic).get(url("acme", "audit-events"), {"action": "test.note"}).json()
    assert body["event"] in listed["results"]  # the event as the list shows it
    public_key = body["tree_head"]["public_key"]
    outsider_checks(body, public_key)

    note(acme, 9)
    services.audit_integrate(acme)
    later = proof_of(api_as(vic), target.pk).json()
    assert later["tree_head"]["tree_size"] == size + 9
    assert later["leaf_index"] == body["leaf_index"] and later["audit_path"] != body["audit_path"]
    outsider_checks(later, public_key)  # the same key checks the later head
    # The earlier head is still provable by its size, and gives the same answer.
    again = proof_of(api_as(vic), target.pk, tree_size=str(size)).json()
    assert again == body


def test_a_queued_event_is_409_not_integrated_and_the_get_integrates_nothing(
        api_as, vic, acme):
    services.audit_integrate(acme)
    [queued] = note(acme)
    before = snapshot()
    heads = AuditTreeHead.objects.filter(tenant=acme).count()
    r = proof_of(api_as(vic), queued.pk)
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "not_integrated"
    assert r["Retry-After"] == "1"
    assert AuditPending.objects.filter(event_id=queued.pk).exists()
    assert AuditTreeHead.objects.filter(tenant=acme).count() == heads
    assert snapshot() == before
    services.audit_integrate(acme)
    assert proof_of(api_as(vic), queued.pk).status_code == 200


def test_another_tenants_event_and_a_malformed_id_are_404(api_as, vic, acme, globex):
    services.audit_integrate(globex)
    theirs = AuditEvent.objects.filter(tenant=globex).first()
    for event_id in (theirs.pk, 0, -1, "x", "1.0", "01", 2**63, 10**30):
        r = proof_of(api_as(vic), event_id)
        assert r.status_code == 404, (event_id, r.content)
        assert r.json()["error"] == "not_found"


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.0", " 3", "", str(2**63)])
def test_tree_size_is_checked_like_a_body(api_as, vic, acme, value):
    services.audit_integrate(acme)
    event = AuditEvent.objects.filter(tenant=acme).first()
    r = proof_of(api_as(vic), event.pk, tree_size=value)
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_payload"
    assert r.json()["detail"].startswith("tree_size: ")


def test_tree_size_must_cover_the_event_and_name_a_signed_head(api_as, vic, acme):
    services.audit_integrate(acme)
    first = AuditLeaf.objects.filter(tenant=acme).count()
    events = note(acme, 3)
    services.audit_integrate(acme, limit=2)
    services.audit_integrate(acme)
    sizes = sorted(AuditTreeHead.objects.filter(tenant=acme).values_list("tree_size", flat=True))
    assert sizes == [first, first + 2, first + 3]
    leaf = AuditLeaf.objects.get(event=events[1]).index
    assert leaf == first + 1
    client = api_as(vic)
    for bad, says in ((first, f"must be in {first + 2}..{first + 3}"),
                      (first + 4, f"must be in {first + 2}..{first + 3}")):
        r = proof_of(client, events[1].pk, tree_size=str(bad))
        assert r.status_code == 400 and r.json()["detail"].startswith(f"tree_size: {says}")
    for good in (first + 2, first + 3):
        r = proof_of(client, events[1].pk, tree_size=str(good))
        assert r.status_code == 200 and r.json()["tree_head"]["tree_size"] == good
        outsider_checks(r.json(), r.json()["tree_head"]["public_key"])
    note(acme, 2)
    services.audit_integrate(acme, limit=1)
    services.audit_integrate(acme)
    # first + 4 has a head now, first + 3 still has; a size between heads has none.
    assert proof_of(client, events[1].pk, tree_size=str(first + 4)).status_code == 200
    r = proof_of(client, events[0].pk, tree_size=str(first + 5))
    assert r.status_code == 200
    sizes = set(AuditTreeHead.objects.filter(tenant=acme).values_list("tree_size", flat=True))
    missing = next(n for n in range(first + 1, first + 6) if n not in sizes)
    r = proof_of(client, events[0].pk, tree_size=str(missing))
    assert r.status_code == 400
    assert r.json()["detail"] == (f"tree_size: no signed tree head has {missing} leaves (a "
                                  "head is signed per sequencer batch)")


@pytest.mark.django_db(transaction=True)
def test_a_proof_the_damaged_tree_cannot_build_is_409_not_a_500(api_as, vic, acme):
    """A leaf on the proof's path deleted past the triggers (tests/security/tampering.py):
    409 ``audit_tree_incomplete`` naming what is missing, and nothing written (an
    attack's finding: it was a 500)."""
    from tests.security import tampering

    events = note(acme, 6)
    services.audit_integrate(acme)
    target = events[2]
    assert proof_of(api_as(vic), target.pk).status_code == 200
    sibling = AuditLeaf.objects.get(tenant=acme, event=events[3])
    tampering.raw(f'DELETE FROM {tampering.LEAVES} WHERE id = %s', [sibling.pk])
    before = snapshot()
    r = proof_of(api_as(vic), target.pk)
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "audit_tree_incomplete"
    assert "not all stored" in r.json()["detail"]
    assert snapshot() == before
