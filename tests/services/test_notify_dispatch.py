"""The notification dispatcher (issue 21, items 2-3; ``services.notify_dispatch``): typed
events from the outbox, matched to endpoints, grouped into one message per incident, the
aging event and the digest once, and never a payload value, a receipt or an operation key.

Endpoints are plain rows here (their CRUD service is another module's); every state
change goes through the real services (writes, the sweep, retry requests, closing), and
time passes by ageing the stored times (``age_world``), never by sleeping."""

from __future__ import annotations

import itertools
import json
import uuid

import pytest

from checkpoints import services
from checkpoints.models import (
    NotificationAgingMark,
    NotificationEndpoint,
    NotificationIncident,
    NotificationIncidentRun,
    NotificationMessage,
    NotificationOutbox,
    Run,
)
from checkpoints.services import notify_dispatch as nd
from checkpoints.vocab import NotificationEventType as E
from checkpoints.vocab import RecoveryState as S
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect, sweep_later

WINDOW = 120


def endpoint(tenant, owner, *, name="hook", **fields) -> NotificationEndpoint:
    """An enabled webhook endpoint taking every type, with the default window."""
    values = {"uuid": uuid.uuid4(), "name": name, "channel": "webhook",
              "url": "http://127.0.0.1:9/hook", "event_types": list(E.SUBSCRIBABLE),
              "group_window_s": WINDOW, "created_by": owner, "created_by_name": owner.username}
    values.update(fields)
    return NotificationEndpoint.objects.create(tenant=tenant, **values)


def in_flight(writer, tenant, *, kind="acme.order", service="payments", agent="",
              payload=None) -> uuid.UUID:
    """A run in flight with one submitted effect of ``service`` (in doubt once swept)."""
    body = envelope(kind=kind, payload=payload or {"phase": "charging", "order_id": "A-1"})
    put_checkpoint(writer, tenant, body)
    run_id = uuid.UUID(body["run_id"])
    if agent:  # a runifold kind's identity would name it; acme.order's names its workflow
        Run.objects.for_tenant(tenant).filter(uuid=run_id).update(agent=agent)
    fx = effect_body(run_id=run_id, operation_key=f"charge:{uuid.uuid4().hex[:8]}",
                     service=service)
    put_effect(writer, tenant, fx)
    put_effect(writer, tenant, dict(fx, revision=1, state="submitted"), expected=0)
    return run_id


def messages(ep=None, **filters) -> list[NotificationMessage]:
    rows = NotificationMessage.objects.filter(**filters).order_by("id")
    return list(rows.filter(endpoint=ep) if ep is not None else rows)


def close(actor, tenant, run_ids) -> None:
    for run_id in run_ids:
        services.run_close(actor=actor, tenant=tenant, run_id=run_id, reason="handled by hand")


# --- the classification table ---------------------------------------------------------------

ENDS = (S.HEALTHY, S.COMPLETED, S.CLOSED)


def expected(from_state: str, to_state: str):
    if to_state == S.RETRY_APPROVED:
        return (E.RETRY_DECIDED, "approved")
    if from_state == S.AWAITING_APPROVAL and to_state in S.NEEDS_REVIEW:
        return (E.RETRY_DECIDED, "rejected")
    if to_state in S.NEEDS_REVIEW:
        return (E.RUN_NEEDS_REVIEW, "")
    if to_state == S.AWAITING_APPROVAL:
        return (E.RETRY_AWAITING_APPROVAL, "")
    if from_state in S.NEEDS_PERSON and to_state in ENDS:
        return (E.RUN_RESOLVED, "")
    return None


TABLE = [(a, b) for a, b in itertools.product(("", *S.NEEDS_PERSON, *ENDS),
                                              (*S.NEEDS_PERSON, *ENDS))
         if a != b and (a in S.NEEDS_PERSON or b in S.NEEDS_PERSON)]


@pytest.mark.parametrize("from_state,to_state", TABLE)
def test_every_change_into_or_out_of_a_state_needing_a_person_is_one_typed_event(
        from_state, to_state):
    assert nd.classify(from_state, to_state) == expected(from_state, to_state)
    assert nd.classify(from_state, to_state) is not None  # the trigger writes no idle row


def test_the_table_spells_out_the_rule():
    assert nd.classify(S.HEALTHY, S.AMBIGUOUS) == (E.RUN_NEEDS_REVIEW, "")
    assert nd.classify(S.AMBIGUOUS, S.AWAITING_APPROVAL) == (E.RETRY_AWAITING_APPROVAL, "")
    assert nd.classify(S.AWAITING_APPROVAL, S.RETRY_APPROVED) == (E.RETRY_DECIDED, "approved")
    assert nd.classify(S.AWAITING_APPROVAL, S.AMBIGUOUS) == (E.RETRY_DECIDED, "rejected")
    assert nd.classify(S.RETRY_APPROVED, S.COMPLETED) == (E.RUN_RESOLVED, "")
    assert nd.classify(S.HEALTHY, S.COMPLETED) is None


# --- grouping -------------------------------------------------------------------------------

@pytest.mark.django_db
def test_fifty_runs_crashing_in_one_outage_page_once_and_one_resolve_closes_it(
        acme, wendy, rita, adam):
    endpoint(acme, adam)
    run_ids = [in_flight(wendy, acme) for _ in range(50)]
    sweep_later()  # the owner is gone: all fifty turn ambiguous in one pass
    assert Run.objects.filter(recovery_state=S.AMBIGUOUS).count() == 50

    counts = nd.dispatch_round()
    assert counts["dispatched"] == 50 and messages() == []  # the window is still open
    incident = NotificationIncident.objects.get()
    assert (incident.run_count, incident.state, incident.event_type) == (
        50, S.AMBIGUOUS, E.RUN_NEEDS_REVIEW)
    assert NotificationOutbox.objects.count() == 0

    age_world(WINDOW - 5)
    nd.dispatch_round()
    assert messages() == []
    age_world(10)
    nd.dispatch_round()
    (page,) = messages()
    assert page.event_type == E.RUN_NEEDS_REVIEW and page.incident_id == incident.pk
    data = page.payload["data"]
    assert page.payload["type"] == E.RUN_NEEDS_REVIEW
    assert page.payload["timestamp"].endswith("Z")
    assert data["run_count"] == 50 and data["runs_listed"] == 50
    assert {r["id"] for r in data["runs"]} == {str(r) for r in run_ids}
    assert data["cause"] == {"kind": "acme.order", "service": "payments",
                             "agent": "acme.order"}  # the workflow: no agent named
    assert data["incident"]["id"] == str(incident.uuid)
    assert data["inbox_url"] == ("http://127.0.0.1:8000/t/acme/?state=ambiguous&kind=acme.order")
    assert data["runs"][0]["url"].startswith("http://127.0.0.1:8000/t/acme/runs/")
    assert data["runs"][0]["api_url"].startswith("http://127.0.0.1:8000/api/v1/tenants/acme/runs/")
    assert page.subject == "[acme] 50 runs need review (ambiguous): acme.order, payments"
    assert "http://127.0.0.1:8000/t/acme/?state=ambiguous" in page.text
    assert page.event_id.startswith("evt_") and len(page.event_id) == 36

    nd.dispatch_round()
    assert len(messages()) == 1  # once

    close(rita, acme, run_ids[:49])
    nd.dispatch_round()
    assert len(messages()) == 1  # one run still open: the incident stays
    assert NotificationIncidentRun.objects.filter(resolved_at__isnull=False).count() == 49
    close(rita, acme, run_ids[49:])
    nd.dispatch_round()
    page, closed = messages()
    assert closed.event_type == E.RUN_RESOLVED and closed.incident_id == incident.pk
    assert closed.payload["data"]["incident"] == {"id": str(incident.uuid), "run_count": 50}
    assert "All 50 runs of incident" in closed.text
    incident.refresh_from_db()
    assert incident.closed_at is not None
    nd.dispatch_round()
    assert len(messages()) == 2


@pytest.mark.django_db
def test_different_causes_are_different_incidents_and_a_late_run_opens_a_new_one(
        acme, wendy, adam):
    endpoint(acme, adam)
    in_flight(wendy, acme)
    in_flight(wendy, acme, service="shipping")
    in_flight(wendy, acme, agent="billing-bot")
    in_flight(wendy, acme)
    sweep_later()
    nd.dispatch_round()
    assert sorted(NotificationIncident.objects.values_list("run_count", flat=True)) == [1, 1, 2]
    age_world(WINDOW + 1)
    nd.dispatch_round()
    assert sorted(m.payload["data"]["run_count"] for m in messages()) == [1, 1, 2]
    assert sorted(m.subject for m in messages()) == [
        "[acme] 1 run needs review (ambiguous): acme.order, payments, billing-bot",
        "[acme] 1 run needs review (ambiguous): acme.order, shipping",
        "[acme] 2 runs need review (ambiguous): acme.order, payments",
    ]

    in_flight(wendy, acme, kind="acme.order")  # after the first incident's message
    sweep_later()
    nd.dispatch_round()
    assert NotificationIncident.objects.filter(message_at__isnull=True).count() == 1


@pytest.mark.django_db
def test_the_quiet_period_holds_back_the_next_page(acme, wendy, adam):
    ep = endpoint(acme, adam, quiet_period_s=600)
    in_flight(wendy, acme, kind="acme.order")
    sweep_later()
    nd.dispatch_round()
    age_world(WINDOW + 1)
    nd.dispatch_round()
    assert len(messages(ep)) == 1

    in_flight(wendy, acme, kind="acme.refund")  # another cause, soon after
    sweep_later(0.05)  # three minutes later
    nd.dispatch_round()
    age_world(WINDOW + 1)
    nd.dispatch_round()
    assert len(messages(ep)) == 1  # quiet: 600 s since the last page have not passed
    age_world(600)
    nd.dispatch_round()
    assert [m.payload["data"]["cause"]["kind"] for m in messages(ep)] == [
        "acme.order", "acme.refund"]


@pytest.mark.django_db
def test_a_zero_window_sends_each_event_at_once(acme, wendy, adam):
    ep = endpoint(acme, adam, group_window_s=0)
    run_ids = [in_flight(wendy, acme) for _ in range(3)]
    sweep_later()
    nd.dispatch_round()
    sent = messages(ep)
    assert [m.payload["data"]["runs"][0]["id"] for m in sent] == [str(r) for r in run_ids]
    assert len({m.event_id for m in sent}) == 3 and not NotificationIncident.objects.exists()
    assert sent[0].subject.startswith(f"[acme] run {str(run_ids[0])[:8]} needs review")


@pytest.mark.django_db
def test_a_resolve_of_a_run_in_no_incident_is_a_plain_message(acme, wendy, rita, adam):
    ep = endpoint(acme, adam, group_window_s=0)
    run_id = in_flight(wendy, acme)
    sweep_later()
    close(rita, acme, [run_id])
    nd.dispatch_round()
    review, resolved = messages(ep)
    assert (resolved.event_type, resolved.incident_id) == (E.RUN_RESOLVED, None)
    data = resolved.payload["data"]
    assert (data["state"], data["previous_state"], data["incident"]) == (
        S.CLOSED, S.AMBIGUOUS, None)
    assert resolved.subject.startswith(f"[acme] run {str(run_id)[:8]} resolved (closed)")
    assert review.event_id != resolved.event_id


@pytest.mark.django_db
def test_filters_choose_the_runs_an_endpoint_hears_of(acme, wendy, adam):
    by_kind = endpoint(acme, adam, name="k", kinds=["acme.refund"], group_window_s=0)
    by_service = endpoint(acme, adam, name="s", services=["shipping"], group_window_s=0)
    by_agent = endpoint(acme, adam, name="a", agents=["billing-bot"], group_window_s=0)
    by_type = endpoint(acme, adam, name="t", event_types=[E.RUN_RESOLVED], group_window_s=0)
    off = endpoint(acme, adam, name="o", enabled=False, group_window_s=0)
    in_flight(wendy, acme, kind="acme.order")
    refund = in_flight(wendy, acme, kind="acme.refund")
    shipping = in_flight(wendy, acme, service="shipping")
    billing = in_flight(wendy, acme, agent="billing-bot")
    sweep_later()
    nd.dispatch_round()

    def heard(ep):
        return [m.payload["data"]["runs"][0]["id"] for m in messages(ep)]

    assert heard(by_kind) == [str(refund)]
    assert heard(by_service) == [str(shipping)]
    assert heard(by_agent) == [str(billing)]
    assert heard(by_type) == [] and heard(off) == []


@pytest.mark.django_db
def test_a_retry_asked_and_decided_is_told_with_who_and_why(acme, wendy, rita, april, adam):
    ep = endpoint(acme, adam, group_window_s=0)
    run_id = in_flight(wendy, acme)
    sweep_later()
    run = Run.objects.get(uuid=run_id)
    for fx in run.effects.all():
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx.uuid,
                                     reason="the provider has no record")
    request = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="try again")
    services.retry_reject(actor=april, tenant=acme, retry_id=request.pk,
                          reason="customer called: do not charge")
    nd.dispatch_round()
    types = [m.event_type for m in messages(ep)]
    assert E.RETRY_AWAITING_APPROVAL in types and types[-1] == E.RETRY_DECIDED
    decided = messages(ep)[-1]
    assert decided.payload["data"]["decision"] == {
        "decision": "rejected", "decided_by": "april",
        "decision_reason": "customer called: do not charge"}
    assert decided.subject.startswith(f"[acme] retry of run {str(run_id)[:8]} rejected by april")


@pytest.mark.django_db
def test_a_run_that_moves_on_before_the_page_is_not_paged_for_its_old_state(
        acme, wendy, rita, april, adam):
    ep = endpoint(acme, adam, event_types=[E.RETRY_AWAITING_APPROVAL, E.RETRY_DECIDED])
    run_id = in_flight(wendy, acme)
    sweep_later()
    for fx in Run.objects.get(uuid=run_id).effects.all():
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx.uuid,
                                     reason="the provider has no record")
    request = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="again")
    nd.dispatch_round()
    services.retry_approve(actor=april, tenant=acme, retry_id=request.pk, reason="safe")
    nd.dispatch_round()
    age_world(WINDOW + 1)
    nd.dispatch_round()
    # The approval came within the window: no "awaiting approval" page, one decision.
    assert [m.event_type for m in messages(ep)] == [E.RETRY_DECIDED]
    assert NotificationIncident.objects.get().closed_at is not None


# --- aging and the digest -------------------------------------------------------------------

@pytest.mark.django_db
def test_a_run_unknown_too_long_is_told_once_per_stay(acme, wendy, rita, adam, settings):
    settings.RECOVERY_NOTIFY_UNKNOWN_AGING_S = 3600
    ep = endpoint(acme, adam, event_types=[E.OUTCOME_UNKNOWN_AGING])
    run_id = in_flight(wendy, acme)
    sweep_later()
    run = Run.objects.get(uuid=run_id)
    for fx in run.effects.all():
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx.uuid,
                                     reason="the provider has no record")
    assert Run.objects.get(uuid=run_id).recovery_state == S.UNKNOWN_OUTCOME
    assert nd.dispatch_round()["aging"] == 0
    age_world(3601)
    assert nd.dispatch_round()["aging"] == 1
    assert nd.dispatch_round()["aging"] == 0
    age_world(WINDOW + 1)
    nd.dispatch_round()
    age_world(86400)
    nd.dispatch_round()
    (told,) = messages(ep)
    assert told.event_type == E.OUTCOME_UNKNOWN_AGING
    assert told.payload["data"]["runs"][0]["id"] == str(run_id)
    assert NotificationAgingMark.objects.count() == 1


@pytest.mark.django_db
def test_the_digest_goes_once_a_day_per_endpoint(acme, wendy, adam, settings):
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = 0
    ep = endpoint(acme, adam, event_types=[E.DIGEST])
    other = endpoint(acme, adam, name="other", event_types=[E.DIGEST], kinds=["acme.refund"])
    in_flight(wendy, acme)
    in_flight(wendy, acme)
    sweep_later()
    assert nd.dispatch_round()["digests"] == 2
    assert nd.dispatch_round()["digests"] == 0
    (digest,) = messages(ep)
    data = digest.payload["data"]
    assert data["counts"][S.AMBIGUOUS] == 2 and data["run_count"] == 2
    assert data["oldest"]["state"] == S.AMBIGUOUS
    assert digest.subject.startswith("[acme] daily digest ")
    assert messages(other)[0].payload["data"]["run_count"] == 0


@pytest.mark.django_db
def test_the_digest_waits_for_its_hour(acme, adam, settings):
    from checkpoints.dbclock import db_now

    hour = db_now().hour
    if hour == 23:
        pytest.skip("no later hour today")
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = hour + 1
    endpoint(acme, adam, event_types=[E.DIGEST])
    assert nd.dispatch_round()["digests"] == 0


# --- what a message never says --------------------------------------------------------------

@pytest.mark.django_db
def test_no_payload_value_receipt_or_operation_key_reaches_a_message(
        acme, wendy, rita, adam, settings):
    settings.RECOVERY_NOTIFY_DIGEST_HOUR = 0
    endpoint(acme, adam)
    endpoint(acme, adam, name="each", group_window_s=0)
    secret = "S3CRET-" + uuid.uuid4().hex
    body = envelope(payload={"phase": "charging", "card": secret})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    paid = effect_body(run_id=run_id, operation_key=f"charge:{secret}-a", service="payments")
    put_effect(wendy, acme, paid)
    put_effect(wendy, acme, dict(paid, revision=1, state="submitted"), expected=0)
    put_effect(wendy, acme, dict(paid, revision=2, state="confirmed",
                                 receipt={"charge_id": secret}), expected=1)
    doubt = effect_body(run_id=run_id, operation_key=f"charge:{secret}-b", service="payments")
    put_effect(wendy, acme, doubt)
    put_effect(wendy, acme, dict(doubt, revision=1, state="submitted"), expected=0)
    sweep_later()
    nd.dispatch_round()
    age_world(WINDOW + 1)
    nd.dispatch_round()
    close(rita, acme, [run_id])
    nd.dispatch_round()
    sent = messages()
    assert {m.event_type for m in sent} >= {E.RUN_NEEDS_REVIEW, E.RUN_RESOLVED, E.DIGEST}
    for m in sent:
        for text in (json.dumps(m.payload), m.subject, m.text):
            assert secret not in text and "charge:" not in text


def test_notify_emit_refuses_what_a_message_must_not_carry():
    with pytest.raises(ValueError):
        nd.notify_emit(tenant=None, event_type=E.RUN_NEEDS_REVIEW)
    with pytest.raises(ValueError):
        nd.notify_emit(tenant=None, event_type=E.RECONCILE_GAVE_UP,
                       detail={"receipt": "x"})
    with pytest.raises(ValueError):
        nd.notify_emit(tenant=None, event_type=E.RECONCILE_GAVE_UP,
                       detail={"service": "x" * 201})


@pytest.mark.django_db
def test_a_long_operation_key_cut_by_the_reason_never_reaches_a_message(acme, wendy, adam):
    """Attack (issue 21): an operation key may be 512 characters, the run's reason only
    256 (``services.runs`` cuts it); a reason cut inside a key held a prefix the
    dispatcher's whole-key replacement missed, and the message carried it."""
    endpoint(acme, adam, group_window_s=0)
    secret = "S3CRET" + uuid.uuid4().hex
    key = "charge:" + secret * 12  # ~450 characters, the reason's cut falls inside it
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    for n in range(3):  # three labels of ~90 characters: the third is cut at 256
        fx = effect_body(run_id=run_id, operation_key=f"{key}-{n}", service="payments")
        put_effect(wendy, acme, fx)
        put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0)
    sweep_later()
    nd.dispatch_round()
    run = Run.objects.for_tenant(acme).get(uuid=run_id)
    assert secret[:20] in run.recovery_reason and key not in run.recovery_reason
    assert len(run.recovery_reason) == 256 and not run.recovery_reason.endswith("…")
    sent = messages()
    assert sent
    for m in sent:
        for text in (json.dumps(m.payload), m.subject, m.text):
            assert "S3CRET" not in text and "charge:" not in text, text
