"""Ending a dead owner's lease from the run page ("End the lease", reviewers only, with a
reason and a confirmation; ``services.lease_revoke``): the form shows where the lease
and the owner_live sentence are, a plain POST and htmx both work, and a refusal
re-shows the page with the service's words beside the form."""

from __future__ import annotations

import html
import json
import re
import time
import uuid

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.models import AuditEvent, Run
from tests.helpers import envelope, put_checkpoint
from tests.views.conftest import make_stuck_run
from tests.views.test_access import _snapshot

pytestmark = pytest.mark.django_db

WORDS = ("Only if you know the owner is gone: its writes are refused from now on (fenced); "
         "a call it already made to an outside service may still land, so reconcile it.")


@pytest.fixture
def leased(acme, wendy):
    """The stuck run (an unresolved charge), then its runtime came back, took a one-hour
    lease as ``worker-1`` and died again: reconcile waits for it."""
    stuck = make_stuck_run(wendy, acme)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=stuck.run_id, owner="worker-1",
                           ttl_s=3600)
    return stuck.run_id


def _url(run_id):
    return reverse("run_lease_revoke", args=["acme", run_id])


def _page(run_id):
    return reverse("run_detail", args=["acme", run_id])


def _ok(owner="worker-1"):
    return {"reason": "worker-1's node was drained", "confirm": "yes", "owner": owner}


def test_a_reviewer_sees_the_form_beside_the_lease_and_the_wait(login, rita, leased):
    body = html.unescape(login(rita).get(_page(leased)).content.decode())
    assert 'id="f-lease-revoke"' in body and WORDS in body
    form = body[body.index('id="f-lease-revoke"'):]
    form = form[:form.index("</form>")]
    assert 'name="owner" value="worker-1"' in form and 'name="confirm"' in form
    blocked = body[body.index('id="reconcile-blocked"'):]
    blocked = blocked[:blocked.index("</p>")]
    assert "worker-1 is live until" in blocked and 'href="#lease-revoke"' in blocked


@pytest.mark.parametrize("who", ["vic", "april", "adam_without_lease"])
def test_the_form_shows_only_to_a_reviewer_with_a_live_lease(login, acme, wendy, vic, april,
                                                             adam, who):
    if who == "adam_without_lease":  # an admin may review, but there is nothing to end
        run_id, user = make_stuck_run(wendy, acme).run_id, adam
    else:
        services.lease_acquire(actor=wendy, tenant=acme,
                               run_id=(run_id := make_stuck_run(wendy, acme).run_id),
                               owner="worker-1", ttl_s=3600)
        user = {"vic": vic, "april": april}[who]
    body = login(user).get(_page(run_id)).content.decode()
    assert 'id="f-lease-revoke"' not in body and 'href="#lease-revoke"' not in body


def test_a_plain_post_ends_the_lease_and_the_page_says_so(login, rita, leased, acme):
    client = login(rita)
    response = client.post(_url(leased), _ok())
    assert response.status_code == 303 and response["Location"] == _page(leased)
    run = Run.objects.get(uuid=leased)
    assert (run.lease_owner, run.fencing_token) == ("worker-1", 2)
    [event] = AuditEvent.objects.filter(tenant=acme, action="lease.revoke")
    assert (event.actor_name, event.reason) == ("rita", _ok()["reason"])
    body = html.unescape(client.get(_page(leased)).content.decode())
    assert "Lease of worker-1 ended" in body
    assert 'id="f-lease-revoke"' not in body  # nothing left to end
    assert 'id="f-reconcile"' in body  # and reconcile is offered again
    assert "ended worker-1's lease on the run (fencing token 1 → 2)" in body


def test_htmx_gets_the_refreshed_run_body(login, rita, leased):
    response = login(rita).post(_url(leased), _ok(), HTTP_HX_REQUEST="true",
                                HTTP_HX_TRIGGER="f-lease-revoke")
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<div id="run-body">')
    assert "audit-changed" in json.loads(response["HX-Trigger"])
    assert 'id="f-reconcile"' in body and 'id="f-lease-revoke"' not in body
    assert "HX-Request" in response["Vary"]


@pytest.mark.parametrize(("data", "words", "status"), [
    ({"reason": "drained", "owner": "worker-1"}, "confirm: tick the box", 400),
    ({"confirm": "yes", "owner": "worker-1"}, "reason: a reason is required", 400),
    (_ok(owner="worker-0"), "owner: the live lease is worker-1's, not worker-0's", 409),
])
@pytest.mark.parametrize("htmx", [False, True])
def test_a_refusal_reshows_the_page_with_the_error_beside_the_form(login, rita, leased, acme,
                                                                   data, words, status, htmx):
    before = _snapshot(acme)
    extra = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "f-lease-revoke"} if htmx else {}
    response = login(rita).post(_url(leased), data, **extra)
    assert response.status_code == status
    body = html.unescape(response.content.decode())
    assert body.lstrip().startswith('<div id="run-body">') == htmx
    form = body[body.index('id="f-lease-revoke"'):]
    form = form[:form.index("</form>")]
    error = form[form.index('id="f-lease-revoke-error"'):]
    assert words in error
    if "reason" in data:
        assert f'value="{data["reason"]}"' in form  # what was typed stays
    assert _snapshot(acme) == before
    assert Run.objects.get(uuid=leased).fencing_token == 1


def test_a_lease_that_ended_meanwhile_says_so_where_the_form_was(login, rita, leased, acme):
    services.lease_revoke(actor=rita, tenant=acme, run_id=leased, reason="first")
    response = login(rita).post(_url(leased), _ok())
    assert response.status_code == 409
    body = html.unescape(response.content.decode())
    note = body[body.index('id="lease-revoke-refused"'):]
    assert "it holds no live lease" in note[:note.index("</p>")]
    assert AuditEvent.objects.filter(tenant=acme, action="lease.revoke").count() == 1


def test_other_roles_and_tenants_are_refused(login, vic, omar, leased):
    assert login(vic).post(_url(leased), _ok()).status_code == 403
    assert login(omar).post(_url(leased), _ok()).status_code == 404
    assert login(omar).post(reverse("run_lease_revoke", args=["acme", uuid.uuid4()]),
                            _ok()).status_code == 404
    assert Run.objects.get(uuid=leased).fencing_token == 1


def test_the_state_it_entered_in_this_request_is_never_in_the_future(login, rita, acme, wendy,
                                                                      monkeypatch):
    """The action's page read its run (and held the page clock) before the write stamped
    ``state_changed_at``; the refreshed body then called it "in 0 s" (the recon
    newcomer's finding). The page clock follows the latest database time the request
    read (``dbclock.seed_page_now``). The pause makes the write surely later than the
    first read, at the millisecond the page writes."""
    revoke = services.lease_revoke

    def later(**kwargs):
        time.sleep(0.05)
        return revoke(**kwargs)

    monkeypatch.setattr(services, "lease_revoke", later)
    # A live owner's checkpoint in flight: healthy until its lease ends, ambiguous after.
    leased, cp_id = uuid.uuid4(), uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(cp_id, leased, 0, payload={"phase": "ready"}))
    put_checkpoint(wendy, acme, envelope(cp_id, leased, 1, payload={"phase": "charging"}),
                   expected=0)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=leased, owner="worker-1",
                           ttl_s=3600)
    before = Run.objects.get(uuid=leased).recovery_state
    response = login(rita).post(_url(leased), _ok(), HTTP_HX_REQUEST="true",
                                HTTP_HX_TRIGGER="f-lease-revoke")
    assert response.status_code == 200
    assert Run.objects.get(uuid=leased).recovery_state != before  # the state moved now
    body = html.unescape(response.content.decode())
    since = body[body.index('id="state-since"'):]
    since = since[:since.index("</span>")]
    stamp = re.search(r'datetime="([^"]+)" title="[^"]+" data-now="([^"]+)">([^<]+)<', since)
    written, now, words = stamp.groups()
    assert written <= now and words.endswith(" ago"), since
