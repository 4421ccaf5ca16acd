"""Issue 6, fault 3: viewers never read what the dashboard hides.

Receipts are treated like payloads (CONTRACT.md 4): stored encrypted, answered only to
runtimes (the writer role, which replays them), revealed to reviewers, approvers and
admins only with a reason and an audit event. Labels and errors never carry a payload
value; what a reconciler's service answered stays in the encrypted evidence.
"""

from __future__ import annotations

import uuid

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from checkpoints import crypto, reconcile, services
from checkpoints.exceptions import Forbidden, NotFound, ReasonRequired
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    CheckpointRevision,
    Effect,
    EffectRevision,
    Run,
)
from tests.api.apihelpers import get, post, snapshot
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, walk_effect

SECRET = "rcpt-SECRET-7731"


def _raw(model, column: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {column} FROM {model._meta.db_table}")
        return [row[0] for row in cur.fetchall()]


@pytest.fixture
def confirmed(acme, wendy):
    """An acme effect confirmed with a receipt carrying ``SECRET``."""
    run_id, fx_id = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charged"}))
    body = effect_body(fx_id, run_id)
    walk_effect(wendy, acme, body, "submitted")
    services.effect_put(
        actor=wendy, tenant=acme, expected_revision=1,
        body=services.parse_effect(dict(body, revision=2, state="confirmed",
                                        receipt={"charge_id": SECRET}), url_id=fx_id))
    return run_id, fx_id


# --- at rest --------------------------------------------------------------------------

def test_it_stores_receipts_encrypted_and_reads_them_back(confirmed):
    _, fx_id = confirmed
    stored = _raw(Effect, "receipt_ciphertext") + _raw(EffectRevision, "receipt_ciphertext")
    assert len([v for v in stored if v]) == 2  # the effect and its confirmed revision
    assert all(SECRET not in v and "charge_id" not in v for v in stored)
    effect = Effect.objects.get(uuid=fx_id)
    assert effect.receipt == {"charge_id": SECRET} and effect.has_receipt
    assert [r.receipt for r in effect.revisions.order_by("revision")] == [
        None, None, {"charge_id": SECRET}]


def test_it_rotates_receipts_with_the_payloads(confirmed, settings):
    old = settings.RECOVERY_ENCRYPTION_KEYS
    new = Fernet.generate_key().decode()
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    services.payloads_rotate_keys()
    settings.RECOVERY_ENCRYPTION_KEYS = [new]  # the old key is gone: still readable
    stored = [v for v in _raw(Effect, "receipt_ciphertext")
              + _raw(EffectRevision, "receipt_ciphertext") if v]
    assert [SECRET in crypto.decrypt_text(v) for v in stored] == [True, True]


# --- in API answers ---------------------------------------------------------------------

@pytest.mark.parametrize("who", ["vic", "rita", "april", "adam"])
def test_it_answers_receipts_to_no_role_that_may_not_have_them_unaudited(
        request, api_as, confirmed, who):
    run_id, fx_id = confirmed
    client = api_as(request.getfixturevalue(who))
    before = snapshot()
    answers = [
        get(client, "acme", f"effects/{fx_id}").json(),
        get(client, "acme", "effects", service="payments").json()["results"][0],
        get(client, "acme", f"runs/{run_id}").json()["effects"][0],
    ]
    for effect in answers:
        assert (effect["receipt"], effect["has_receipt"]) == (None, True), who
    for answer in answers:
        assert SECRET not in str(answer)
    assert snapshot() == before  # reading metadata audits nothing


def test_it_answers_receipts_to_the_runtime_that_replays_them(api_as, wendy, confirmed):
    run_id, fx_id = confirmed
    client = api_as(wendy)
    assert get(client, "acme", f"effects/{fx_id}").json()["receipt"] == {"charge_id": SECRET}
    found = get(client, "acme", "effects", service="payments",
                operation_key="charge:A-1042").json()["results"]
    assert [e["receipt"] for e in found] == [{"charge_id": SECRET}]
    assert get(client, "acme", f"runs/{run_id}").json()["effects"][0]["receipt"] == {
        "charge_id": SECRET}


def test_it_hides_the_receipt_in_the_mark_unknown_answer(api_as, rita, acme, wendy):
    fx = effect_body()
    walk_effect(wendy, acme, fx, "submitted")
    Effect.objects.filter(uuid=fx["id"]).update(
        receipt_ciphertext=crypto.encrypt_text('{"partial": "' + SECRET + '"}', tenant=acme))
    age_world(3600)  # the owner is gone: a reviewer may declare the outcome unknown
    r = post(api_as(rita), "acme", f"effects/{fx['id']}/mark-unknown", {"reason": "no lookup"})
    assert r.status_code == 200 and SECRET not in r.content.decode()
    assert r.json()["has_receipt"] is True


def test_it_reveals_a_receipt_with_a_reason_and_one_audit_event(api_as, rita, acme, confirmed):
    run_id, fx_id = confirmed
    r = post(api_as(rita), "acme", f"effects/{fx_id}/reveal-receipt", {"reason": "dispute #7"})
    assert r.status_code == 200, r.content
    assert r.json() == {"id": str(fx_id), "run_id": str(run_id), "revision": 2,
                        "receipt": {"charge_id": SECRET}}
    event = AuditEvent.objects.filter(tenant=acme).latest("seq")
    assert (event.action, event.actor_name, event.reason, event.target_ref, event.after) == (
        "receipt.reveal", "rita", "dispute #7", str(fx_id), {"revision": 2})
    assert SECRET not in str(event.after)


@pytest.mark.parametrize(("who", "body", "status"), [
    ("vic", {"reason": "x"}, 403),      # viewers may not reveal
    ("wendy", {"reason": "x"}, 403),    # runtimes read receipts in answers, not by reveal
    ("omar", {"reason": "x"}, 404),     # another tenant's reviewer: no such tenant
    ("rita", {}, 400),                  # a reason is required
    ("rita", {"reason": "  "}, 400),
])
def test_it_refuses_a_reveal_and_changes_nothing(request, api_as, confirmed, who, body, status):
    _, fx_id = confirmed
    client = api_as(request.getfixturevalue(who))
    before = snapshot()
    r = post(client, "acme", f"effects/{fx_id}/reveal-receipt", body)
    assert r.status_code == status and SECRET not in r.content.decode()
    assert snapshot() == before


def test_it_refuses_reveals_in_the_service_too(acme, vic, rita, omar, confirmed):
    _, fx_id = confirmed
    with pytest.raises(Forbidden):
        services.receipt_reveal(actor=vic, tenant=acme, effect_id=fx_id, reason="x")
    with pytest.raises(NotFound):
        services.receipt_reveal(actor=omar, tenant=acme, effect_id=fx_id, reason="x")
    with pytest.raises(NotFound):
        services.receipt_reveal(actor=rita, tenant=acme, effect_id=uuid.uuid4(), reason="x")
    with pytest.raises(ReasonRequired):
        services.receipt_reveal(actor=rita, tenant=acme, effect_id=fx_id, reason="")
    assert not AuditEvent.objects.filter(action="receipt.reveal").exists()


def test_it_audits_nothing_when_there_is_no_receipt_to_reveal(acme, rita, wendy):
    fx = effect_body()
    walk_effect(wendy, acme, fx, "submitted")
    answer = services.receipt_reveal(actor=rita, tenant=acme, effect_id=fx["id"], reason="x")
    assert answer["receipt"] is None
    assert not AuditEvent.objects.filter(action="receipt.reveal").exists()


# --- labels and errors ----------------------------------------------------------------

@pytest.mark.parametrize(("kind", "payload", "field"), [
    ("acme.order", {"phase": SECRET}, "payload.phase"),
    ("runifold.agent", {"agent": "a", "model": {"provider": "p", "name": "n"},
                        "transcript": [], "turns": 0, "tool_calls": 0, "delegations": 0,
                        "usage": {}, "phase": {"state": SECRET}}, "payload.phase.state"),
])
def test_it_names_the_field_not_the_value_of_a_schema_mismatch(acme, wendy, kind, payload,
                                                               field):
    body = envelope(kind=kind, payload=payload)
    put_checkpoint(wendy, acme, body)
    run = Run.objects.get(uuid=body["run_id"])
    assert run.recovery_state == "schema_mismatch"
    stored = [run.phase_label, run.recovery_reason,
              Checkpoint.objects.get().phase_label, CheckpointRevision.objects.get().phase_label,
              str(AuditEvent.objects.filter(action="checkpoint.write").get().after)]
    for text in stored:
        assert SECRET not in text
    assert field in run.phase_label and "must be one of" in run.phase_label


def test_it_keeps_business_data_out_of_the_demo_kinds_labels(acme, wendy):
    put_checkpoint(wendy, acme, envelope(payload={"phase": "charging", "order_id": SECRET}))
    assert Run.objects.get().phase_label == "charging"


def test_it_keeps_an_unexpected_service_status_out_of_the_clear_detail():
    answer = reconcile._classify_status_body({"status": SECRET}, "GET https://pay/…")
    assert answer.kind == reconcile.CANNOT_TELL
    assert SECRET not in answer.detail and "unexpected status" in answer.detail
    assert answer.evidence == {"status": SECRET}  # kept, encrypted, for an audited reveal
