"""Migrations from the dashboard (issue 19, item 2, "the same from the dashboard";
docs/migrations.md): the Kinds page's and the schema-mismatch tab's "Migrate to vN" (the
tenant's admin only), the preview page (``services.migration_preview``: writes nothing;
a bad ``to`` is a 400 naming it), its confirm form (``services.migration_job_submit``:
one job, 303 to its page; the same form again makes none) and the job's page
(``selectors.migration_job_get``: any role; per-checkpoint results; htmx polling while
open), and a declared kind version's read-only page."""

from __future__ import annotations

import html
import re
import uuid

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.jobs import migrations as job_layer
from checkpoints.models import AuditEvent, MigrationJob, MigrationJobItem
from tests.helpers import age_world, envelope, put_checkpoint
from tests.matrixhelpers import db_diff, db_state
from tests.services.test_migrations import QUIET, order, stored
from tests.twinworld import declared_kind

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def preview_url(slug="acme", kind="acme.order", **query) -> str:
    query = query or {"to": 2}
    return reverse("migration_preview", args=[slug, kind]) + "?" + "&".join(
        f"{k}={v}" for k, v in query.items())


def submit_url(slug="acme", kind="acme.order") -> str:
    return reverse("migration_submit", args=[slug, kind])


def text(response) -> str:
    """The response's text with the tags dropped and whitespace folded."""
    body = re.sub(r"<[^>]+>", " ", response.content.decode())
    return " ".join(html.unescape(body).split())


@pytest.fixture
def stranded(acme, wendy):
    """Three acme.order v1 checkpoints whose owners are gone, a fourth whose owner is live
    (written after the others aged), and a run of acme.order v9 (``schema_mismatch``)."""
    bodies = [order(wendy, acme), order(wendy, acme, "shipping"), order(wendy, acme)]
    age_world(QUIET)
    bodies.append(order(wendy, acme))
    put_checkpoint(wendy, acme, envelope(schema_version=9))
    return bodies


def _token(page: str) -> str:
    return re.search(r'name="client_token" value="([^"]+)"', page)[1]


# --- who sees "Migrate to vN" --------------------------------------------------------------


def test_the_kinds_page_offers_the_admin_a_migration_and_shows_the_paths(
        login, adam, rita, vic, stranded):
    page = login(adam).get(reverse("kind_list", args=["acme"]))
    body = page.content.decode()
    assert f'href="{preview_url()}"' in body and "Migrate to v2" in body
    # v1 leads up to v2 (the registered step), v2 is the newest, v9 is unsupported.
    words = text(page)
    assert "v1 supported migrates to v2" in words
    assert "v2 supported migrates" not in words and "v9 unsupported migrates" not in words
    for user in (rita, vic):
        other = login(user).get(reverse("kind_list", args=["acme"])).content.decode()
        assert "migrate-offer" not in other and "/migrate/" not in other
        assert "migrates to v2" in other  # the path is information for every role


def test_no_offer_when_nothing_is_older_than_the_newest(login, adam, acme, wendy):
    order(wendy, acme, version=2)
    body = login(adam).get(reverse("kind_list", args=["acme"])).content.decode()
    assert "migrate-offer" not in body


def test_the_schema_mismatch_tab_offers_the_admin_a_migration_of_the_kind(
        login, adam, rita, stranded):
    tab = reverse("run_list", args=["acme"]) + "?state=schema_mismatch"
    for extra in ({}, HX):
        body = login(adam).get(tab, **extra).content.decode()
        assert f'href="{html.escape(preview_url())}"' in body or \
            f'href="{preview_url()}"' in body, body[-3000:]
    assert "migrate-offer" not in login(rita).get(tab).content.decode()
    # Other tabs do not compute it.
    assert "migrate-offer" not in login(adam).get(
        reverse("run_list", args=["acme"]) + "?state=all").content.decode()


# --- the preview ---------------------------------------------------------------------------


def test_the_preview_shows_counts_changes_and_refusals_and_writes_nothing(
        login, adam, stranded):
    client = login(adam)
    client.get(reverse("kind_list", args=["acme"]))  # a session's own first bookkeeping
    before = db_state()
    response = client.get(preview_url())
    assert response.status_code == 200
    assert db_diff(before, db_state()) == {}
    words = text(response)
    assert "5 checkpoints of acme.order not at v2 as of now" in words
    assert "3 would be migrated" in words and "2 would be refused" in words
    # (stop 34, a newcomer's finding) No "0 already at v2" beside checkpoints at v2: the
    # preview counts those not at v2; one reaching it meanwhile is named only then.
    assert "already at v2" not in words and "by the time" not in words
    assert "owner live (1), no path (1)" in words
    # One diff per distinct change, key paths only: + amount, − amount_cents, 3 of them.
    assert "v1 → v2 3 + amount − amount_cents —" in words
    assert "2599" not in response.content.decode()  # no payload value
    # The refused checkpoints, linked to their runs, with the reasons.
    live = stranded[3]
    assert reverse("run_detail", args=["acme", live["run_id"]]) in response.content.decode()
    assert "no path acme.order v9 is not registered" in words
    assert 'name="client_token"' in response.content.decode()
    assert AuditEvent.objects.filter(action="migration.submit").count() == 0


def test_a_reverse_preview_of_v2_checkpoints(login, adam, acme, wendy):
    put_checkpoint(wendy, acme, envelope(schema_version=2, payload={
        "phase": "charged", "order_id": "A-1", "amount": {"cents": 5, "currency": "USD"}}))
    age_world(QUIET)
    response = login(adam).get(preview_url(to=1, reverse=1))
    assert response.status_code == 200
    assert "1 would be migrated" in text(response)
    assert 'name="reverse" value="1"' in response.content.decode()


@pytest.mark.parametrize(("query", "words"), [
    ("to=7", "to: acme.order has versions 1, 2"),
    ("to=x", "to: must be a number"),
    ("to=%2B2", "to: must be a number"),
    ("to=99999999999", "to: Ensure this value is less than or equal to"),
    ("", "to: required"),
    ("to=", "to: required"),
    ("to=2&to=2", "to: given more than once"),
    ("to=2&reverse=yes", "reverse: Select a valid choice"),
    ("to=2&runs=1", "runs: unknown parameter"),
])
def test_a_bad_query_is_a_400_naming_the_field(login, adam, stranded, query, words):
    client = login(adam)
    before = db_state()
    for extra in ({}, HX):
        response = client.get(reverse("migration_preview", args=["acme", "acme.order"])
                                   + ("?" + query if query else ""), **extra)
        assert response.status_code == 400, (query, response.status_code)
        assert words in html.unescape(response.content.decode()), query
        assert "HX-Request" in response["Vary"]
    assert db_diff(before, db_state()) == {}


def test_an_unknown_kind_is_a_404_as_on_the_api(login, adam, acme, api_as):
    response = login(adam).get(preview_url(kind="no.such"))
    assert response.status_code == 404
    api = api_as(adam).post("/api/v1/tenants/acme/kinds/no.such/migrations",
                            data={"to_version": 2, "dry_run": True}, format="json")
    assert api.status_code == 404


def test_the_preview_and_the_confirm_are_the_admins_only(login, rita, april, vic, omar,
                                                         stranded):
    clients = [login(user) for user in (rita, april, vic)]
    foreign = login(omar)  # another tenant's account: nothing of acme exists for it
    before = db_state()
    for client in clients:
        assert client.get(preview_url()).status_code == 403
        response = client.post(submit_url(), {"to": 2, "client_token": str(uuid.uuid4())})
        assert response.status_code == 403 and b"does not allow" in response.content
    assert foreign.get(preview_url()).status_code == 404
    assert foreign.post(submit_url(), {"to": 2, "client_token": str(uuid.uuid4())}
                       ).status_code == 404
    assert db_diff(before, db_state()) == {}


# --- the confirm and the job -----------------------------------------------------------------


def test_the_confirm_makes_one_job_and_the_same_form_again_makes_none(login, adam, stranded):
    client = login(adam)
    page = client.get(preview_url()).content.decode()
    form = {"to": "2", "reverse": "0", "client_token": _token(page)}
    response = client.post(submit_url(), form)
    assert response.status_code == 303
    job = MigrationJob.objects.get()
    assert response["Location"] == reverse("migration_detail",
                                           args=["acme", "acme.order", job.uuid])
    assert (job.kind, job.to_version, job.reverse, job.selection, job.state) == (
        "acme.order", 2, False, {}, "queued")
    assert AuditEvent.objects.filter(action="migration.submit").count() == 1
    again = client.post(submit_url(), form, follow=True)
    assert again.redirect_chain == [(response["Location"], 303)]
    assert "already submitted" in text(again)
    assert MigrationJob.objects.count() == 1
    assert AuditEvent.objects.filter(action="migration.submit").count() == 1
    # The same token for another request is refused, naming it, with nothing written.
    before = db_state()
    other = client.post(submit_url(), {**form, "to": "1", "reverse": "1"})
    assert other.status_code == 400 and "client_token:" in html.unescape(text(other))
    assert db_diff(before, db_state()) == {}


@pytest.mark.parametrize(("form", "words"), [
    ({"to": "7"}, "to: acme.order has versions 1, 2"),
    ({"to": ""}, "to: required"),
    ({"to": "2", "reverse": "true"}, "reverse: Select a valid choice"),
    ({"to": "2", "client_token": "nope"}, "client_token: not a UUID"),
    ({"to": "2", "client_token": ""}, "client_token: missing"),
])
def test_a_bad_confirm_is_a_400_naming_the_field_with_nothing_written(login, adam, stranded,
                                                                      form, words):
    data = {"client_token": str(uuid.uuid4()), **form}
    client = login(adam)
    before = db_state()
    response = client.post(submit_url(), data)
    assert response.status_code == 400
    assert words in html.unescape(response.content.decode())
    assert db_diff(before, db_state()) == {}


def test_the_confirm_needs_csrf(login, adam, stranded):
    response = login(adam, csrf=True).post(submit_url(), {"to": 2,
                                                          "client_token": str(uuid.uuid4())})
    assert response.status_code == 403
    assert not MigrationJob.objects.exists()


def test_the_job_page_shows_its_state_and_each_checkpoints_result(login, adam, vic, rita,
                                                                  stranded):
    job, _ = services.migration_job_submit(actor=adam, tenant=stranded_tenant(stranded),
                                           kind="acme.order", to_version=2,
                                           client_token=uuid.uuid4())
    url = reverse("migration_detail", args=["acme", "acme.order", job.uuid])
    queued = login(vic).get(url)
    assert queued.status_code == 200
    body = queued.content.decode()
    assert 'data-state="queued"' in body
    assert 'hx-trigger="every 2s"' in body and f'hx-get="{url}"' in body
    assert "next sweep round" in text(queued)  # no broker in the tests
    fragment = login(vic).get(url, **HX)
    assert fragment.status_code == 200 and "HX-Request" in fragment["Vary"]
    assert fragment.content.decode().lstrip().startswith('<section id="migration-job"')
    assert "<html" not in fragment.content.decode()

    job_layer.execute(job.pk)
    for user in (vic, rita, adam):
        done = login(user).get(url)
        body = done.content.decode()
        assert 'data-state="done"' in body and "every 2s" not in body
        words = text(done)
        assert "5 checkpoints looked at: 3 migrated 0 skipped 2 refused 0 conflict" in words
        for b in stranded:
            assert reverse("run_detail", args=["acme", b["run_id"]]) in body
        assert "refused owner live" in words and "refused no path" in words
    assert MigrationJobItem.objects.count() == 5
    assert [stored(b).schema_version for b in stranded] == [2, 2, 2, 1]


def test_a_failed_job_shows_its_last_error(login, vic, adam, stranded):
    job, _ = services.migration_job_submit(actor=adam, tenant=stranded_tenant(stranded),
                                           kind="acme.order", to_version=2,
                                           client_token=uuid.uuid4())
    MigrationJob.objects.filter(pk=job.pk).update(state="failed",
                                                  last_error="the requester is no admin")
    body = login(vic).get(reverse("migration_detail", args=["acme", "acme.order", job.uuid]))
    assert "Failed: the requester is no admin" in text(body)
    assert "every 2s" not in body.content.decode()


def test_the_job_page_is_404_elsewhere(login, adam, omar, vic, stranded):
    job, _ = services.migration_job_submit(actor=adam, tenant=stranded_tenant(stranded),
                                           kind="acme.order", to_version=2,
                                           client_token=uuid.uuid4())
    assert login(omar).get(reverse("migration_detail", args=["acme", "acme.order", job.uuid])
                           ).status_code == 404
    assert login(omar).get(reverse("migration_detail",
                                   args=["globex", "acme.order", job.uuid])).status_code == 404
    for kind, jid in (("runifold.agent", job.uuid), ("acme.order", uuid.uuid4()),
                      ("acme.order", "nope")):
        assert login(vic).get(reverse("migration_detail", args=["acme", kind, jid])
                              ).status_code == 404, (kind, jid)
    assert login(vic).get(reverse("migration_detail", args=["acme", "acme.order", job.uuid])
                          + "?x=1").status_code == 400


def stranded_tenant(bodies):
    return stored(bodies[0]).tenant


# --- a declared kind's declaration ------------------------------------------------------------


def test_a_declared_kinds_versions_link_their_read_only_declaration(login, vic, omar, acme):
    services.kind_declare(actor=None, tenant=acme, kind="acme.ticket", version=1,
                          body=declared_kind("pages"))
    page = login(vic).get(reverse("kind_list", args=["acme"])).content.decode()
    url = reverse("kind_version", args=["acme", "acme.ticket", 1])
    assert f'href="{url}"' in page and "declared" in page
    response = login(vic).get(url)
    assert response.status_code == 200
    body = html.unescape(response.content.decode())
    assert '"pointer": "/step"' in body and '"description": "pages"' in body
    assert 'method="post" action="/t/' not in body  # read only
    assert login(omar).get(url).status_code == 404
    # "01": the API's reading of a version (no leading zero; attack finding: the page
    # answered 200 where GET …/kinds/{kind}/versions/01 answers 404).
    for version in ("2", "x", "99999999999", "-1", "01", "0001"):
        assert login(vic).get(reverse("kind_version", args=["acme", "acme.ticket", version])
                              ).status_code == 404, version
    assert login(vic).get(reverse("kind_version", args=["acme", "acme.order", "1"])
                          ).status_code == 404  # a kind in code has no declaration
