"""The dashboard's bulk actions page (``/t/<slug>/bulk-actions/``): the rows of
``GET …/bulk-actions`` (``selectors.bulk_list``), its filters as a query string checked
like the API's, each row linking to its result page, any role reading, another tenant's
never listed, and where it is linked from."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.models import AuditEvent
from tests.api.test_bulk_list import submit
from tests.helpers import ambiguous_run
from tests.views.test_bulk import logged_in

pytestmark = pytest.mark.django_db
PAGE = "/t/acme/bulk-actions/"


def test_the_page_lists_the_tenants_bulk_actions_newest_first(acme, globex, wendy, wes,
                                                             rita, vic, omar):
    first = submit(rita, [ambiguous_run(wendy, acme)], action="mark_unknown")
    second = submit(rita, [ambiguous_run(wendy, acme), uuid.uuid4()])
    theirs = submit(omar, [ambiguous_run(wes, globex)],
                    url="/api/v1/tenants/globex/bulk-actions")
    events = AuditEvent.objects.count()
    page = logged_in(vic).get(PAGE)  # any role
    assert page.status_code == 200 and page["Vary"].count("HX-Request") == 1
    html = page.content.decode()
    assert html.index(second["id"]) < html.index(first["id"])
    assert f'href="/t/acme/bulk/{second["id"]}/"' in html
    assert "2: 1 done, 1 refused" in html and "incident 42" in html
    assert theirs["id"] not in html
    assert AuditEvent.objects.count() == events  # a read writes nothing
    assert logged_in(omar).get(PAGE).status_code == 404


def test_filters_and_pages(acme, wendy, rita, adam):
    closes = [submit(rita, [ambiguous_run(wendy, acme)])["id"] for _ in range(3)]
    unknown = submit(adam, [ambiguous_run(wendy, acme)], action="mark_unknown")["id"]
    client = logged_in(rita)
    html = client.get(PAGE + "?action=mark_unknown").content.decode()
    assert unknown in html and not any(c in html for c in closes)
    html = client.get(PAGE + "?requested_by=rita&state=finished").content.decode()
    assert unknown not in html and all(c in html for c in closes)
    assert "No bulk action matches" in client.get(PAGE + "?state=aborted").content.decode()


@pytest.mark.parametrize(("query", "words"), [
    ("action=delete", "action: Select a valid choice. delete is not one of the available "
                      "choices. One of: reconcile, mark_unknown"),
    ("state=done", "state: "),
    ("cursor=1.0", "cursor: "),
    ("requested_by=" + "r" * 151, "requested_by: "),
    ("page=2", "page: unknown parameter"),
    ("state=finished&state=running", "state: given more than once"),
])
def test_a_bad_filter_is_400_naming_it(acme, rita, query, words):
    response = logged_in(rita).get(f"{PAGE}?{query}")
    assert response.status_code == 400
    assert words in response.content.decode()


def test_a_fixed_number_of_queries_whatever_the_rows(acme, wendy, rita):
    client = logged_in(rita)
    submit(rita, [ambiguous_run(wendy, acme)])
    client.get(PAGE)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(PAGE).status_code == 200
        return len(ctx.captured_queries)

    one = queries()
    for _ in range(4):
        submit(rita, [ambiguous_run(wendy, acme), uuid.uuid4()])
    assert queries() == one


def test_linked_from_the_result_page_and_the_inbox(acme, wendy, rita, vic):
    bulk = submit(rita, [ambiguous_run(wendy, acme)])
    link = f'href="{PAGE}"'
    assert link in logged_in(rita).get(f"/t/acme/bulk/{bulk['id']}/").content.decode()
    assert link in logged_in(rita).get("/t/acme/").content.decode()  # the bulk bar
    assert link in logged_in(vic).get("/t/acme/").content.decode()  # no bar: the inbox
