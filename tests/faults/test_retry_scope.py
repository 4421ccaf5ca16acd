"""A consumed retry sends again only what its approver accepted (issue 5: "never execute
an operation twice without an approved retry whose preview named it").

The approval's preview (audit event ``retry.approve``, ``after.preview``) lists which
effects the retry submits again (``submit_again``, ``possible_duplicate``). An effect that
became ``unknown`` *after* the approval (a zombie owner, whose lease ran out but whose
token was still current, wrote and sent a new effect) must not be sent again by that
retry: the approver never saw it. It waits, ``unknown_outcome``, for a retry whose preview
names it. Found by the state machine's scenario; kept here as a plain test.
"""

from __future__ import annotations

import uuid

import pytest

from checkpoints import services
from checkpoints.exceptions import InvalidTransition
from checkpoints.models import AuditEvent, Effect, Run
from tests.faults.stubs import use_plugin
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect


def _approve(acme, rita, april, run_id) -> list[dict]:
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="rerun")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    return AuditEvent.objects.get(action="retry.approve", target_ref=str(retry.pk)
                                  ).after["preview"]


def _sent_then_unknown(wendy, rita, acme, run_id, key, token) -> dict:
    fx = effect_body(run_id=run_id, operation_key=key, service="crm")
    put_effect(wendy, acme, fx, token=token)
    put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0, token=token)
    age_world(3600)  # the owner is gone: a reviewer may declare it
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=uuid.UUID(fx["id"]),
                                 reason="the CRM cannot be asked")
    return fx


def test_a_retry_does_not_send_again_an_effect_its_approver_never_saw(
        acme, wendy, rita, april):
    use_plugin(acme, "crm", "none")
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    token = services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w-1",
                                   ttl_s=60).fencing_token
    seen = _sent_then_unknown(wendy, rita, acme, run_id, "note:seen", token)
    age_world(400)  # the owner went quiet
    preview = _approve(acme, rita, april, run_id)
    assert [(r["operation_key"], r["outcome"]) for r in preview] == [
        ("note:seen", "possible_duplicate")]
    # The old owner was only slow: its token is still current, so it writes and sends a
    # new effect after the approval; nobody can tell whether it happened.
    late = _sent_then_unknown(wendy, rita, acme, run_id, "note:late", token)

    claimed = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    assert claimed["action"] == "retry"
    new_token = claimed["fencing_token"]

    # What the approver accepted goes back to planned; the late effect does not.
    put_effect(wendy, acme, dict(seen, revision=3, state="planned"), expected=2,
               token=new_token)
    with pytest.raises(InvalidTransition):
        put_effect(wendy, acme, dict(late, revision=3, state="planned"), expected=2,
                   token=new_token)
    assert Effect.objects.get(uuid=late["id"]).state == "unknown"
    assert Run.objects.get(uuid=run_id).recovery_state == "unknown_outcome"

    # A new retry names it, and once approved and claimed it may be sent again.
    age_world(400)
    preview = _approve(acme, rita, april, run_id)
    assert ("note:late", "possible_duplicate") in [(r["operation_key"], r["outcome"])
                                                   for r in preview]
    token = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id,
                                  asked={})["fencing_token"]
    put_effect(wendy, acme, dict(late, revision=3, state="planned"), expected=2, token=token)
    assert Effect.objects.get(uuid=late["id"]).attempt == 2
