"""Erasure is never approved blind (the recon newcomer's finding: an erasure of a subject
a legal hold covers was approved and answered ``"state": "executed"`` with 0 erased, 1
blocked, and nothing had told the approver). Before approving, the dashboard's queue
and the API's request (``preview``) say what approval would erase and what would block
it, judged by the rule the execution applies (``services.erasure_preview``: ``run_blockers``,
counted by the execution's own ``_tally``); after, ``outcome`` says when nothing was
erased. Run on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from checkpoints import services
from checkpoints.models import AuditEvent, Checkpoint, ErasureRequest
from tests.helpers import effect_body, envelope, put_checkpoint, walk_effect
from tests.lifecycle.test_erasure_holds import SECRET_CUSTOMER, completed_run, declare

pytestmark = pytest.mark.django_db
BASE = "/api/v1/tenants/acme/"
SUBJECT = {"field": "customer", "value": SECRET_CUSTOMER}
HELD = {"runs": 1, "erased": 0, "blocked": 1, "legal_hold": 1, "not_ended": 0,
        "effect_in_doubt": 0, "already_deleted": 0}


@pytest.fixture
def held_request(acme, wendy, adam, rita) -> ErasureRequest:
    """A subject's erasure requested while a legal hold covers the subject's one run."""
    declare(acme)
    completed_run(wendy, acme)
    services.legal_hold_place(actor=adam, tenant=acme, subject=SUBJECT, reason="litigation")
    return services.erasure_request(actor=rita, tenant=acme, subject=SUBJECT, reason="art. 17")


def test_the_preview_is_what_the_approval_then_does(acme, april, rita, held_request):
    events = AuditEvent.objects.for_tenant(acme).count()
    preview = services.erasure_preview(user=rita, tenant=acme, request=held_request)
    assert preview == HELD
    assert AuditEvent.objects.for_tenant(acme).count() == events  # a read writes nothing
    done = services.erasure_approve(actor=april, tenant=acme, request_id=held_request.uuid)
    assert done.counts == preview
    assert (done.state, done.outcome) == ("executed", "nothing_erased")
    assert services.erasure_preview(user=rita, tenant=acme, request=done) is None


def test_every_blocker_is_previewed_as_it_is_counted(acme, wendy, rita, april):
    live = envelope()
    put_checkpoint(wendy, acme, live)
    walk_effect(wendy, acme, effect_body(run_id=live["run_id"],
                                         operation_key=f"charge:{uuid.uuid4()}"), "submitted")
    gone, free = completed_run(wendy, acme), completed_run(wendy, acme)
    first = services.erasure_request(actor=rita, tenant=acme, runs=[gone.uuid], reason="x")
    services.erasure_approve(actor=april, tenant=acme, request_id=first.uuid)
    request = services.erasure_request(actor=rita, tenant=acme, reason="x",
                                       runs=[live["run_id"], str(gone.uuid), str(free.uuid)])
    preview = services.erasure_preview(user=rita, tenant=acme, request=request)
    assert preview == {"runs": 3, "erased": 1, "blocked": 2, "legal_hold": 0, "not_ended": 1,
                       "effect_in_doubt": 1, "already_deleted": 1}
    done = services.erasure_approve(actor=april, tenant=acme, request_id=request.uuid)
    assert (done.counts, done.outcome) == (preview, "partly_erased")
    assert not Checkpoint.objects.for_tenant(acme).filter(run=free).exists()


def test_the_api_shows_the_preview_and_says_nothing_was_erased(acme, april, rita, api_as,
                                                                held_request):
    url = BASE + f"erasure-requests/{held_request.uuid}"
    shown = api_as(rita).get(url).json()
    assert (shown["state"], shown["counts"], shown["outcome"]) == ("requested", None, None)
    assert shown["preview"] == HELD
    listed = api_as(april).get(BASE + "erasure-requests").json()["results"]
    assert [r["preview"] for r in listed] == [HELD]
    r = api_as(april).post(url + "/approve", "{}", content_type="application/json")
    assert r.status_code == 200, r.content
    done = r.json()
    assert (done["state"], done["outcome"], done["preview"]) == ("executed", "nothing_erased",
                                                                 None)
    assert done["counts"] == HELD
    assert SECRET_CUSTOMER not in json.dumps([shown, listed, done])


def test_the_queue_shows_the_approver_that_nothing_would_be_erased(april, held_request):
    client = Client()
    client.force_login(april)
    page = client.get("/t/acme/erasure-requests/").content.decode()
    cell = page[page.index(f'id="erasure-counts-{held_request.uuid}"'):]
    assert "if approved now: nothing would be erased (1 run: 1 under legal hold)" in \
        cell[:cell.index("</td>")]
    assert "Approve (erases nothing)" in page and "Nothing would be erased" in page
    r = client.post(f"/t/acme/erasure-requests/{held_request.uuid}/approve/", {}, follow=True)
    body = r.content.decode()
    assert "Erasure approved, but nothing erased: 1 run not erased (1 under legal hold)" in body
    assert "Erasure approved and executed" not in body
