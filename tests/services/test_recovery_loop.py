"""Issue 5, service level: reconciler plugins per service per tenant (HTTP status look-up,
replay with the same key), the effect's optional request, closing and reopening a run,
the retry preview, and a resume preview that changes nothing while the claim consumes.

The stub provider is a real HTTP server on 127.0.0.1 that honours idempotency keys and
counts executions per key, so "never twice" is counted, not assumed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from checkpoints import services
from checkpoints.exceptions import Forbidden, InvalidPayload, InvalidTransition
from checkpoints.models import (
    AuditEvent,
    Effect,
    ReconcilerConfig,
    ReconcileRequest,
    RetryRequest,
    Run,
)
from recovery_client.client import fingerprint
from tests.helpers import (
    age_world,
    effect_body,
    envelope,
    put_checkpoint,
    put_effect,
    sweep_later,
    walk_effect,
)

REQUEST = {"amount_cents": 2599, "currency": "eur", "order_id": "A-9"}


class Provider(BaseHTTPRequestHandler):
    """``POST /charges`` with ``Idempotency-Key``: executes once per key (counted), answers
    the same receipt for the same key. ``GET /operations/<key>``: 200 receipt or 404."""

    executions: dict[str, int] = {}
    receipts: dict[str, dict] = {}

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self):  # noqa: N802
        key = self.headers["Idempotency-Key"]
        self.rfile.read(int(self.headers["Content-Length"]))
        if key not in self.receipts:
            self.executions[key] = self.executions.get(key, 0) + 1
            self.receipts[key] = {"status": "succeeded", "charge_id": f"ch_{len(self.receipts)}"}
        self._send(200, self.receipts[key])

    def do_GET(self):  # noqa: N802
        key = unquote(self.path.rsplit("/", 1)[-1])
        if key in self.receipts:
            return self._send(200, self.receipts[key])
        return self._send(404, {"error": "not_found"})


@pytest.fixture
def provider():
    Provider.executions, Provider.receipts = {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Provider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _in_doubt(wendy, acme, *, effect_class="idempotent", request=REQUEST, key="charge:A-9"):
    """A run whose worker died after submitting an effect that carried its request."""
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging"}))
    body = effect_body(run_id=run_id, operation_key=key, effect_class=effect_class,
                       fingerprint=fingerprint(request))
    put_effect(wendy, acme, dict(body, request=request))
    put_effect(wendy, acme, dict(body, revision=1, state="submitted"), expected=0)
    return run_id, uuid.UUID(body["id"])


# --- the effect's optional request ------------------------------------------------------

def test_it_stores_the_request_encrypted_only_when_it_matches_the_fingerprint(acme, wendy):
    body = effect_body(fingerprint=fingerprint(REQUEST))
    with pytest.raises(InvalidPayload, match="request: its SHA-256"):
        put_effect(wendy, acme, dict(body, request=dict(REQUEST, amount_cents=1)))
    with pytest.raises(InvalidPayload, match="request: must be an object"):
        put_effect(wendy, acme, dict(body, request=[1]))
    assert not Effect.objects.exists()
    put_effect(wendy, acme, dict(body, request=REQUEST))
    stored = Effect.objects.get().request_ciphertext
    assert stored and "A-9" not in stored and "2599" not in stored


# --- plugins per service per tenant ---------------------------------------------------

def test_it_replays_an_idempotent_effect_with_its_key_and_confirms_once(
        acme, wendy, rita, provider, django_capture_on_commit_callbacks):
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="replay", url=f"{provider}/charges")
    run_id, effect_id = _in_doubt(wendy, acme)
    sweep_later()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="replay it")
    effect = Effect.objects.get(uuid=effect_id)
    assert effect.state == "confirmed" and effect.receipt["charge_id"] == "ch_0"
    assert Provider.executions == {"charge:A-9": 1}
    # The runtime had in fact charged before dying? The same key replays the same answer.
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(InvalidTransition):  # nothing in doubt any more
            services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="again")
    assert Provider.executions == {"charge:A-9": 1}


def test_it_never_replays_a_non_idempotent_effect(acme, wendy, rita, provider,
                                                  django_capture_on_commit_callbacks):
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="replay", url=f"{provider}/charges")
    run_id, effect_id = _in_doubt(wendy, acme, effect_class="non_idempotent")
    sweep_later()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="replay it")
    assert Effect.objects.get(uuid=effect_id).state == "unresolved"
    request = ReconcileRequest.objects.get()
    assert (request.state, request.failures) == ("queued", 1)
    assert "only idempotent effects replay" in request.last_error
    assert Provider.executions == {}


def test_it_uses_the_tenants_plugin_and_not_another_tenants(acme, globex, wendy, rita,
                                                            provider,
                                                            django_capture_on_commit_callbacks):
    services.reconciler_configure(actor=None, tenant=globex, service="payments",
                                  plugin="http_status", url=f"{provider}/operations")
    Provider.receipts["charge:A-9"] = {"status": "succeeded", "charge_id": "ch_globex"}
    run_id, effect_id = _in_doubt(wendy, acme)
    sweep_later()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="look")
    # acme has no look-up for payments: the outcome is unknown, a human decides.
    assert Effect.objects.get(uuid=effect_id).state == "unknown"
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="http_status", url=f"{provider}/operations")
    assert ReconcilerConfig.objects.filter(tenant=acme).get().plugin == "http_status"


def test_it_settles_with_the_status_look_up_and_keeps_the_evidence(
        acme, wendy, rita, provider, django_capture_on_commit_callbacks):
    services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                  plugin="http_status", url=f"{provider}/operations")
    Provider.receipts["charge:A-9"] = {"status": "succeeded", "charge_id": "ch_9"}
    run_id, effect_id = _in_doubt(wendy, acme)
    sweep_later()
    with django_capture_on_commit_callbacks(execute=True):
        services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="look")
    assert Effect.objects.get(uuid=effect_id).state == "confirmed"
    attempt = ReconcileRequest.objects.get().attempt_log.get()
    assert (attempt.answer, attempt.applied) == ("found", "confirmed")
    assert "ch_9" not in attempt.evidence_ciphertext  # encrypted like a receipt

    events = AuditEvent.objects.count()
    assert services.evidence_reveal(actor=rita, tenant=acme, attempt_id=attempt.pk,
                                          reason="audit")["charge_id"] == "ch_9"
    assert AuditEvent.objects.count() == events + 1
    assert AuditEvent.objects.latest("seq").action == "evidence.reveal"


def test_it_refuses_bad_reconciler_settings_naming_the_field(acme):
    for kwargs, field in [({"plugin": "nope"}, "plugin"),
                          ({"plugin": "no.such.Module"}, "plugin"),
                          ({"plugin": "http_status"}, "url"),
                          ({"plugin": "http_status", "url": "ftp://x"}, "url"),
                          ({"plugin": "none", "timeout_s": 0}, "timeout_s"),
                          ({"plugin": "none", "settle_delay_s": -1}, "settle_delay_s")]:
        with pytest.raises(InvalidPayload, match=f"^{field}:"):
            services.reconciler_configure(actor=None, tenant=acme, service="payments",
                                          **kwargs)
    assert not ReconcilerConfig.objects.exists()
    assert not AuditEvent.objects.filter(action="reconciler.configure").exists()


def test_it_lets_only_a_tenant_admin_configure_and_the_command_audits(acme, adam, rita):
    with pytest.raises(Forbidden):
        services.reconciler_configure(actor=rita, tenant=acme, service="crm", plugin="none")
    services.reconciler_configure(actor=adam, tenant=acme, service="crm", plugin="none")
    call_command("set_reconciler", "acme", "crm", "default")
    assert not ReconcilerConfig.objects.exists()
    assert AuditEvent.objects.filter(action="reconciler.configure").count() == 2
    with pytest.raises(CommandError, match="plugin"):
        call_command("set_reconciler", "acme", "crm", "wizard")


# --- close and reopen ------------------------------------------------------------------

def test_it_closes_a_run_and_reopens_it_on_the_next_write(acme, wendy, rita, april):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    sweep_later()
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="refunded by hand")
    run = Run.objects.get()
    assert (run.recovery_state, run.closed_by, run.closed_reason) == (
        "closed", rita, "refunded by hand")
    retry.refresh_from_db()
    assert retry.state == "expired"  # nothing acts on a closed run
    assert services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={}) [
        "reason"] == "closed"
    with pytest.raises(InvalidTransition):
        services.run_close(actor=rita, tenant=acme, run_id=run_id, reason="again")
    with pytest.raises(InvalidTransition):
        services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="x")
    sweep_later()  # the sweep leaves a closed run alone
    assert Run.objects.get().recovery_state == "closed"
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "completed"}),
                   expected=0)
    run.refresh_from_db()
    assert (run.recovery_state, run.closed_at) == ("completed", None)
    event = AuditEvent.objects.filter(action="checkpoint.write").latest("seq")
    assert event.after["reopened"] is True


def test_it_refuses_close_without_the_reviewer_role_and_changes_nothing(acme, wendy, vic,
                                                                        april):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    events = AuditEvent.objects.count()
    for who in (vic, april, wendy):
        with pytest.raises(Forbidden):
            services.run_close(actor=who, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="x")
    assert Run.objects.get().closed_at is None
    assert AuditEvent.objects.count() == events


# --- retry preview, resume preview vs claim -------------------------------------------

def test_it_previews_what_a_retry_does_and_stores_it_with_the_approval(acme, wendy, rita,
                                                                      april):
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging"}))
    walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="k-confirmed"),
                "submitted", "confirmed")
    unknown = walk_effect(wendy, acme, effect_body(run_id=run_id, operation_key="k-unknown"),
                          "submitted")
    age_world(3600)  # the owner is gone: a reviewer may declare it
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=unknown.uuid,
                                 reason="no look-up")
    preview = services.retry_preview(Run.objects.get())
    assert [(p["operation_key"], p["outcome"]) for p in preview] == [
        ("k-confirmed", "replay_receipt"), ("k-unknown", "possible_duplicate")]
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="retry")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="accept")
    approval = AuditEvent.objects.get(action="retry.approve")
    assert approval.after["preview"] == preview
    assert AuditEvent.objects.get(action="retry.request").after["preview"] == preview


def test_it_previews_a_resume_without_consuming_and_claims_once(acme, wendy, rita, april):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    run_id = uuid.UUID(body["run_id"])
    sweep_later()
    retry = services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="stuck")
    services.retry_approve(actor=april, tenant=acme, retry_id=retry.pk, reason="ok")
    events = AuditEvent.objects.count()
    for _ in range(3):
        answer = services.resume_preview(actor=wendy, tenant=acme, run_id=run_id, asked={})
        assert (answer["action"], answer["fencing_token"]) == ("retry", 0)
    assert RetryRequest.objects.get().state == "approved"
    assert Run.objects.get().fencing_token == 0
    assert AuditEvent.objects.count() == events
    claimed = services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})
    assert (claimed["action"], claimed["fencing_token"]) == ("retry", 1)
    assert services.resume_claim(actor=wendy, tenant=acme, run_id=run_id, asked={})[
        "action"] == "reject"
    assert RetryRequest.objects.get().state == "consumed"


def test_it_accepts_a_retry_request_for_a_quiet_run_that_no_sweep_has_seen(acme, wendy,
                                                                            rita):
    body = envelope(payload={"phase": "charging"})
    put_checkpoint(wendy, acme, body)
    age_world(301)  # the owner went quiet; no sweeper ran (the embedded default, no cron)
    assert Run.objects.get().recovery_state == "healthy"
    services.retry_request(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                           reason="stuck")
    assert Run.objects.get().recovery_state == "awaiting_approval"


def test_the_fingerprint_is_the_servers_canonical_json():
    assert fingerprint(REQUEST) == hashlib.sha256(
        json.dumps(REQUEST, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_it_refuses_unknown_and_retry_over_a_live_owner_and_close_of_a_completed_run(
        acme, wendy, rita):
    from checkpoints.exceptions import OwnerLive

    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(run_id=run_id, payload={"phase": "charging"}))
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner="w-1", ttl_s=3600)
    effect = walk_effect(wendy, acme, effect_body(run_id=run_id), "submitted", token=1)
    events = AuditEvent.objects.count()
    with pytest.raises(OwnerLive) as err:
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=effect.uuid,
                                     reason="cannot tell")
    assert err.value.body()["lease_expires_at"]
    assert Effect.objects.get().state == "submitted"
    assert AuditEvent.objects.count() == events
    done = envelope(payload={"phase": "completed"})
    put_checkpoint(wendy, acme, done)
    with pytest.raises(InvalidTransition, match="completed"):
        services.run_close(actor=rita, tenant=acme, run_id=uuid.UUID(done["run_id"]),
                           reason="x")
    assert Run.objects.get(uuid=done["run_id"]).closed_at is None
