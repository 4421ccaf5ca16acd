"""An ended lease says it was ended, and by whom (the newcomer's finding: after "End the
lease" the run page and the inbox said "expired", as if it had timed out; only the audit
trail said a reviewer ended it). One rule (``policy.lease_state``) gives the run page,
the inbox and the API's run the same word: ``live``, ``expired`` (timed out) or
``ended`` (``services.lease_revoke``, one run's or a bulk ``end_lease``'s), until a
runtime takes the lease again."""

from __future__ import annotations

import html
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import services
from checkpoints.models import Run
from tests.conftest import bearer_client
from tests.helpers import age_world, envelope, put_checkpoint

pytestmark = pytest.mark.django_db

REASON = "worker-1's node was drained"


def _leased(wendy, acme, owner="worker-1") -> uuid.UUID:
    """A run with one checkpoint whose runtime took a one-hour lease."""
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(uuid.uuid4(), run_id, 0, payload={"phase": "ready"}))
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=owner, ttl_s=3600)
    return run_id


def _end(rita, acme, run_id):
    return services.lease_revoke(actor=rita, tenant=acme, run_id=run_id, reason=REASON)


def _lease_card(client, run_id) -> str:
    body = html.unescape(client.get(f"/t/acme/runs/{run_id}/").content.decode())
    card = body[body.index("<h2>Lease</h2>"):]
    return card[:card.index("</dl>")]


def _inbox_owner(client, run_id) -> str:
    """The inbox's Owner cell of ``run_id``'s row (the "all" tab)."""
    body = html.unescape(client.get("/t/acme/?state=all").content.decode())
    row = body[body.index(str(run_id)[:8]):]
    row = row[:row.index("</tr>")]
    cell = row[row.index('data-label="Owner"'):]
    return cell[:cell.index("</td>")]


def _api_run(user, run_id) -> tuple[dict, dict]:
    """The run as ``GET …/runs/{id}`` and as its row of ``GET …/runs`` answer it."""
    api = bearer_client(user)
    detail = api.get(f"/api/v1/tenants/acme/runs/{run_id}")
    listing = api.get("/api/v1/tenants/acme/runs")
    assert detail.status_code == listing.status_code == 200
    [row] = [r for r in listing.json()["results"] if r["run_id"] == str(run_id)]
    return detail.json()["run"], row


def _lease_fields(run: dict) -> tuple:
    return run["lease_state"], run["lease_ended_by"], run["lease_ended_at"]


def test_a_lease_a_reviewer_ended_says_ended_by_whom_everywhere(login, acme, wendy, rita):
    run_id = _leased(wendy, acme)
    ended = _end(rita, acme, run_id)
    client = login(rita)
    card = _lease_card(client, run_id)
    assert 'id="lease-ended"' in card and "ended</span> by <strong>rita</strong>" in card
    assert REASON in card and "expired" not in card
    owner = _inbox_owner(client, run_id)
    assert "(ended)" in owner and "(expired)" not in owner and 'title="ended by rita"' in owner
    at = ended.lease_expires_at.isoformat()
    for run in _api_run(rita, run_id):
        assert _lease_fields(run) == ("ended", "rita", at)
        assert run["lease_owner"] == "worker-1" and run["lease_expires_at"] == at


def test_a_lease_that_timed_out_still_says_expired(login, acme, wendy, rita):
    run_id = _leased(wendy, acme)
    age_world(7200)
    client = login(rita)
    card = _lease_card(client, run_id)
    assert "expired</span>" in card and 'id="lease-ended"' not in card
    owner = _inbox_owner(client, run_id)
    assert "(expired)" in owner and "(ended)" not in owner
    for run in _api_run(rita, run_id):
        assert _lease_fields(run) == ("expired", None, None)


def test_an_ended_lease_that_then_ran_out_of_time_still_says_ended(login, acme, wendy, rita):
    """Ending is not undone by time passing: only a new lease clears it."""
    run_id = _leased(wendy, acme)
    _end(rita, acme, run_id)
    age_world(7200)
    assert "(ended)" in _inbox_owner(login(rita), run_id)
    for run in _api_run(rita, run_id):
        assert run["lease_state"] == "ended"


@pytest.mark.parametrize("owner", ["worker-1", "worker-2"])
def test_a_runtime_taking_the_lease_again_makes_it_live(login, acme, wendy, rita, owner):
    run_id = _leased(wendy, acme)
    _end(rita, acme, run_id)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=run_id, owner=owner, ttl_s=3600)
    stored = Run.objects.get(uuid=run_id)
    assert (stored.lease_ended_at, stored.lease_ended_by, stored.lease_ended_reason) == \
        (None, None, None)
    client = login(rita)
    card = _lease_card(client, run_id)
    assert "live</span>" in card and 'id="lease-ended"' not in card
    owner_cell = _inbox_owner(client, run_id)
    assert "(ended)" not in owner_cell and "(expired)" not in owner_cell
    for run in _api_run(rita, run_id):
        assert _lease_fields(run) == ("live", None, None)
    # ... and when that lease times out, it expired: the old ending is not remembered.
    age_world(7200)
    assert "(expired)" in _inbox_owner(client, run_id)
    for run in _api_run(rita, run_id):
        assert _lease_fields(run) == ("expired", None, None)


def test_a_run_without_a_lease_owner_has_no_lease_state(acme, wendy, rita):
    run_id = uuid.uuid4()
    put_checkpoint(wendy, acme, envelope(uuid.uuid4(), run_id, 0, payload={"phase": "ready"}))
    for run in _api_run(rita, run_id):
        assert _lease_fields(run) == (None, None, None)


def test_a_bulk_end_lease_says_ended_by_its_requester(login, acme, wendy, rita):
    runs = [_leased(wendy, acme, "worker-7") for _ in range(2)]
    services.bulk_submit(actor=rita, tenant=acme, action="end_lease", reason=REASON,
                         client_token=uuid.uuid4(), run_ids=[str(r) for r in runs],
                         lease_owner="worker-7")
    client = login(rita)
    for run_id in runs:
        assert "(ended)" in _inbox_owner(client, run_id)
        assert "by <strong>rita</strong>" in _lease_card(client, run_id)
        for run in _api_run(rita, run_id):
            assert _lease_fields(run)[:2] == ("ended", "rita")


def test_the_inbox_and_the_api_list_read_ended_leases_in_constant_queries(login, acme, wendy,
                                                                           rita):
    client = login(rita)
    api = bearer_client(rita)
    _end(rita, acme, _leased(wendy, acme))
    client.get("/t/acme/")  # the first request of a session does its own bookkeeping
    api.get("/api/v1/tenants/acme/report")  # ... and of a token (its last_used_at)

    def queries(url, fetch) -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = fetch(url)
        assert response.status_code == 200
        assert response.content.decode().count("ended") >= 1
        return len(ctx.captured_queries)

    inbox = queries("/t/acme/?state=all", client.get)
    listing = queries("/api/v1/tenants/acme/runs", api.get)
    for _ in range(6):
        _end(rita, acme, _leased(wendy, acme))
    body = client.get("/t/acme/?state=all").content.decode()
    assert body.count("(ended)") == 7
    assert queries("/t/acme/?state=all", client.get) == inbox
    assert queries("/api/v1/tenants/acme/runs", api.get) == listing
