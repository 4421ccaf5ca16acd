"""The dashboard's query strings are checked like the API's (the team's rule: "query
parameters are validated like bodies"; docs/search.md: "repeated, overlong, control
characters, unpaired surrogates: 400 naming ``q``"): on every dashboard page a GET
reaches (introspected from ``checkpoints.urls``, so a new page is covered without
editing this file), a parameter given twice, a parameter the page does not take, and
percent-encoded bytes that are not UTF-8 (``%FF``; ``%ED%A0%80``, an encoded unpaired
surrogate, which Django would turn into U+FFFD and search for) are each a 400 naming
the parameter, page or htmx fragment, while the page without them is a 200. The links
and forms the pages render themselves never send what is refused, and the bulk bar's
``filters`` and ``run`` are checked the same way."""

from __future__ import annotations

import html
import re
import uuid
from collections import deque
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.urls import URLPattern

from checkpoints import services
from checkpoints import urls as dashboard_urls
from checkpoints.dashboard import inbox as inbox_views
from checkpoints.dashboard.forms import (
    AuditFilterForm,
    BulkListForm,
    HistoryForm,
    InboxFilterForm,
    LiveRunForm,
    MigrationPreviewForm,
    NewRunsForm,
    TombstonePageForm,
)
from checkpoints.models import AuditEvent, BulkAction
from checkpoints.reports import ReportRangeForm
from tests.helpers import ambiguous_run
from tests.twinworld import declared_kind

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
ARG = re.compile(r"<(?:\w+:)?(\w+)>")

#: The parameters each page a GET reaches takes (its form's fields); every other pattern
#: of ``checkpoints.urls`` must answer a GET with 405 (``test_the_table_covers_...``).
PAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "login": ("next",),  # Django's LoginView: not ours, not walked below
    "inbox": (),
    "run_list": tuple(InboxFilterForm.base_fields),
    "run_counts": tuple(InboxFilterForm.base_fields),
    "report": tuple(ReportRangeForm.NAMES),
    "audit_log": tuple(AuditFilterForm.base_fields),
    "kind_list": (),
    "kind_version": (),
    "migration_preview": tuple(MigrationPreviewForm.base_fields),
    "migration_detail": (),
    "bulk_detail": (),
    "bulk_list": tuple(BulkListForm.base_fields),  # stop 39: the bulk actions list
    "erasure_requests": (),  # issue 20: the approval queue and the holds list
    "legal_holds": (),
    "run_detail": (),
    "run_audit": (),
    "checkpoint_history": tuple(HistoryForm.base_fields),
    "effect_history": tuple(HistoryForm.base_fields),
    "data_page": tuple(TombstonePageForm.base_fields),
    # Issue 21: the polls of the inbox and the run page, and the approver's queue.
    "run_new": tuple(NewRunsForm.base_fields),
    "run_live": tuple(LiveRunForm.base_fields),
    "approval_queue": (),
    # Issue 21, items 1 and 5: the Notifications page and an endpoint's delivery log.
    "notification_list": (),
    "notification_detail": (),
}
NOT_WALKED = {"login", "logout"}
#: The query a page needs to be a 200 (the preview's target version); the tests add theirs.
BASE_QUERY = {"migration_preview": "to=2", "run_new": "since=1",
              "run_live": "seen=000000000000"}


@pytest.fixture
def world(acme, rita, adam, wendy, unknown):
    """Every URL kwarg's value, each naming a row the admin adam may see (so each page is
    a 200: the migration preview is the admin's alone)."""
    bulk, _ = services.bulk_submit(actor=rita, tenant=acme, action="close", reason="done",
                                   client_token=uuid.uuid4(),
                                   run_ids=[ambiguous_run(wendy, acme)])
    services.kind_declare(actor=None, tenant=acme, kind="acme.ticket", version=1,
                          body=declared_kind("query strings"))
    job, _ = services.migration_job_submit(actor=adam, tenant=acme, kind="acme.order",
                                           to_version=2, client_token=uuid.uuid4())
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "query strings", "channel": "email", "email": "ops@example.com",
        "event_types": ["digest"]})
    return {"slug": "acme", "run_id": str(unknown.run_id), "retry_id": "1",
            "effect_id": str(unknown.effect_id), "checkpoint_id": str(unknown.checkpoint_id),
            "attempt_id": "1", "bulk_id": str(bulk.uuid), "kind": "acme.order",
            "version": "1", "job_id": str(job.uuid), "request_id": str(uuid.uuid4()),
            "hold_id": str(uuid.uuid4()), "endpoint_id": str(endpoint.uuid),
            "event_id": "msg_" + "0" * 32}


def _routes(values: dict[str, str]) -> dict[str, str]:
    """Each page's path with ``values``, and its ``BASE_QUERY`` (``?to=2``) when it has one."""
    out = {}
    for p in dashboard_urls.urlpatterns:
        if isinstance(p, URLPattern) and p.name not in NOT_WALKED:
            kw = dict(values, kind="acme.ticket") if p.name == "kind_version" else values
            path = "/" + ARG.sub(lambda m, kw=kw: kw[m[1]], str(p.pattern))
            out[p.name] = path + (f"?{BASE_QUERY[p.name]}" if p.name in BASE_QUERY else "")
    return out


def _and(route: str, query: str) -> str:
    """``route`` with ``query`` added to its own (``BASE_QUERY``)."""
    return f"{route}{'&' if '?' in route else '?'}{query}"


def _pages() -> list[str]:
    return [name for name in PAGE_PARAMS if name not in NOT_WALKED]


def _cases() -> list[tuple[str, str]]:
    """(page, parameter): each parameter a page takes; ``x`` for a page taking none."""
    return [(page, name) for page in _pages() for name in (PAGE_PARAMS[page] or ("x",))]


def _refused(response, name: str, words: str) -> None:
    body = html.unescape(response.content.decode())
    assert response.status_code == 400, (response.status_code, body[:300])
    assert f"{name}: {words}" in body, body[:2000]


def test_the_table_covers_every_page_a_get_reaches(world, login, adam):
    """A pattern missing from ``PAGE_PARAMS`` must be an action (GET: 405)."""
    client = login(adam)
    for name, route in _routes(world).items():
        status = client.get(route).status_code
        assert (name in PAGE_PARAMS) == (status != 405), (name, route, status)


@pytest.mark.parametrize("page", _pages())
def test_each_page_without_parameters_is_a_200(world, login, adam, page):
    client = login(adam)
    route = _routes(world)[page]
    for extra in ({}, HX):
        response = client.get(route, **extra)
        assert response.status_code == (302 if page == "inbox" else 200), route


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
@pytest.mark.parametrize(("page", "name"), _cases())
def test_a_parameter_given_twice_is_a_400_naming_it(world, login, adam, page, name, htmx):
    """Before any field reads it: the last value never silently wins (``q=a&q=b`` used
    to search ``b``)."""
    route = _routes(world)[page]
    before = AuditEvent.objects.count()
    response = login(adam).get(_and(route, f"{name}=1&{name}=1"), **(HX if htmx else {}))
    known = bool(PAGE_PARAMS[page])
    _refused(response, name, "given more than once" if known else "")
    assert "HX-Request" in response["Vary"]
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
@pytest.mark.parametrize("page", _pages())
@pytest.mark.parametrize("name", ["x", "sort", "before"])
def test_a_parameter_the_page_does_not_take_is_a_400_naming_it(world, login, adam, page,
                                                               name, htmx):
    if name in PAGE_PARAMS[page]:
        pytest.skip(f"{page} takes {name}")
    route = _routes(world)[page]
    response = login(adam).get(_and(route, f"{name}=1"), **(HX if htmx else {}))
    _refused(response, name, "")
    assert "parameter" in html.unescape(response.content.decode())


def _utf8_cases() -> list:
    return list(_cases())


@pytest.mark.parametrize("raw", ["%FF", "%ED%A0%80"])
@pytest.mark.parametrize(("page", "name"), _utf8_cases())
def test_bytes_that_are_not_utf8_are_a_400_naming_the_parameter(world, login, adam, page,
                                                                 name, raw):
    """Django would decode them to U+FFFD, which the search would then look for."""
    route = _routes(world)[page]
    client = login(adam)
    response = client.get(_and(route, f"{name}={raw}"))
    _refused(response, name, "not UTF-8" if PAGE_PARAMS[page] else "")
    if PAGE_PARAMS[page]:  # in the name too
        _refused(client.get(_and(route, f"{raw}=1")), "\ufffd", "")


@pytest.mark.parametrize("query,name,words", [
    ("q=a&q=b", "q", "given more than once"),
    ("sort=created&sort=-created", "sort", "given more than once"),
    ("state=all&state=ambiguous", "state", "given more than once"),
    ("cursor=a&cursor=a", "cursor", "given more than once"),
    ("kind=a&kind=a", "kind", "given more than once"),
    ("subject=a&subject=b", "subject", "given more than once"),
    ("age=300&age=3600", "age", "given more than once"),
    ("q=%ED%A0%80", "q", "not UTF-8"),
    ("q=%FF", "q", "not UTF-8"),
    ("q=a%C3", "q", "not UTF-8"),
    ("q=%C0%AF", "q", "not UTF-8"),  # an overlong encoding of "/"
    ("q=a%01", "q", ""),
    ("q=" + "a" * 513, "q", ""),
    ("limit=5", "limit", "unknown parameter"),
])
@pytest.mark.parametrize("path", ["/t/acme/", "/t/acme/counts/"])
def test_the_attacks_on_the_inbox(login, rita, acme, path, query, name, words):
    _refused(login(rita).get(f"{path}?{query}"), name, words)


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
@pytest.mark.parametrize("path", ["/t/acme/", "/t/acme/counts/", "/t/acme/new-runs/?since=1"])
def test_the_inbox_and_its_polls_check_the_cursor_alike(login, rita, wendy, acme, path, htmx,
                                                        monkeypatch):
    """The tab counts and the "n new runs" poll take the inbox's query string, ``cursor``
    included, and check it as the inbox does (``inbox.check_cursor``), though they page
    nothing: a cursor that is not the inbox's, or one made for other filters, is a 400
    naming ``cursor``; the page's own next-page cursor is a 200."""
    for _ in range(3):
        ambiguous_run(wendy, acme)
    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 1)
    client = login(rita)
    cursor = client.get("/t/acme/?state=ambiguous").context["next_cursor"]
    assert cursor
    extra = HX if htmx else {}
    ok = client.get(_and(path, f"state=ambiguous&cursor={cursor}"), **extra)
    assert ok.status_code == 200, ok.content.decode()[:500]
    _refused(client.get(_and(path, "state=ambiguous&cursor=!!!"), **extra),
             "cursor", "not a cursor returned by this API")
    _refused(client.get(_and(path, f"state=all&cursor={cursor}"), **extra),
             "cursor", "made for another sort or other filters")


@pytest.mark.parametrize("query,name,words", [
    ("actor=a&actor=b", "actor", "given more than once"),
    ("action=a&action=a", "action", "given more than once"),
    ("run=7f1c0d2e-1a2b-4c3d-8e9f-0a1b2c3d4e5f&run=7f1c0d2e-1a2b-4c3d-8e9f-0a1b2c3d4e5f",
     "run", "given more than once"),
    ("before=5&before=6", "before", "given more than once"),
    ("q=a&q=b", "q", "given more than once"),
    ("q=%FF", "q", "not UTF-8"),
    ("sort=a", "sort", "unknown parameter"),
    ("cursor=!!!!", "cursor", "unknown parameter"),
    ("before=%D9%A1", "before", "must be a number"),  # an Arabic-Indic digit one
    ("before=+5", "before", "must be a number"),
    ("actor=a%01", "actor", "a control character"),
    ("action=run.close%0A", "action", "a control character"),
    ("q=a%7F", "q", "a control character"),
])
def test_the_attacks_on_the_audit_log(login, rita, acme, query, name, words):
    _refused(login(rita).get(f"/t/acme/audit/?{query}"), name, words)


def test_the_search_still_searches(login, rita, stuck):
    """Harmless: one ``q``, empty filters as the filter form sends them, a non-ASCII q."""
    client = login(rita)
    body = client.get("/t/acme/", {"q": "A-1042", "state": "all", "kind": "", "subject": "",
                                   "age": ""}).content.decode()
    assert str(stuck.run_id) in body
    assert client.get("/t/acme/?q=caf%C3%A9").status_code == 200
    assert client.get("/t/acme/audit/?q=A-1042&actor=&action=&run=").status_code == 200


# --------------------------------------------------------------------------------------
# The pages' own links and forms send nothing the pages refuse
# --------------------------------------------------------------------------------------

LINK = re.compile(r'(?:href|hx-get)="(/t/acme/[^"]*)"')
FORM = re.compile(r'<form method="get" action="([^"]+)"(.*?)</form>', re.S)
INPUT = re.compile(r'<(?:input|select)[^>]*\bname="([^"]+)"')


def _links_and_forms(body: str) -> tuple[set[str], list[tuple[str, list[str]]]]:
    links = {html.unescape(m) for m in LINK.findall(body)}
    forms = [(action, INPUT.findall(inner)) for action, inner in FORM.findall(body)]
    return links, forms


def test_every_link_and_form_of_the_pages_is_accepted(login, rita, wendy, acme, stuck,
                                                      monkeypatch):
    """The inbox filtered, searched, sorted and paged (tabs, its 10 s poll of
    ``run_new``, pager, sort and "clear" links; the search form and the filter form
    with its hidden ``state``/``q``/``sort``), the audit log paged, the run page and a
    history page: every link answers 200 and has each parameter once; no GET form holds
    a name twice (a search form plus a filter form each send their own)."""
    for _ in range(3):
        ambiguous_run(wendy, acme)
    client = login(rita)
    start = ["/t/acme/?q=acme&kind=acme.order&subject=a&age=300&sort=created&state=all",
             "/t/acme/?state=ambiguous", "/t/acme/audit/?q=A&actor=rita",
             f"/t/acme/runs/{stuck.run_id}/"]
    seen: set[str] = set()
    monkeypatch.setattr(inbox_views, "INBOX_PAGE", 1)  # pager links on a small world
    # Breadth first, in a fixed order: the links of the start pages (tabs, counts poll,
    # pager, sort) come before the links of the pages they lead to (the nav's Kinds page
    # alone links every kind), so the budget below always reaches them.
    queue = deque(start)
    while queue:
        url = queue.popleft()
        if url in seen or len(seen) > 60:
            continue
        seen.add(url)
        response = client.get(url)
        assert response.status_code == 200, (url, response.content.decode()[:500])
        names = [k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)]
        assert len(names) == len(set(names)), url
        links, forms = _links_and_forms(response.content.decode())
        for action, fields in forms:
            assert len(fields) == len(set(fields)), (url, action, fields)
        queue.extend(sorted(link for link in links if "/runs/" not in link or link in start))
    assert any("cursor=" in u for u in seen) and any("/new-runs/" in u for u in seen)


# --------------------------------------------------------------------------------------
# The bulk bar: ``filters`` is a query string, ``run`` a run id never cut
# --------------------------------------------------------------------------------------

def _bulk(**change) -> dict:
    data = {"action": "close", "reason": "incident 42", "client_token": str(uuid.uuid4()),
            "scope": "matching", "filters": "state=ambiguous", "confirm": "yes"}
    return data | change


@pytest.mark.parametrize("filters,words", [
    ("state=ambiguous&state=all", "filters: state: given more than once"),
    ("q=a&q=b&state=all", "filters: q: given more than once"),
    ("q=%FF&state=all", "filters: q: not UTF-8"),
    ("state=all&limit=5", "filters: limit: unknown parameter"),
    ("state=all&cursor=x", "filters: cursor: "),  # every matching run, never one page
])
def test_bulk_filters_are_checked_like_the_inbox_query(login, rita, wendy, acme, filters,
                                                       words):
    ambiguous_run(wendy, acme)
    events = AuditEvent.objects.count()
    response = login(rita).post("/t/acme/bulk/", _bulk(filters=filters))
    assert response.status_code == 400
    assert words in html.unescape(response.content.decode())
    assert not BulkAction.objects.exists() and AuditEvent.objects.count() == events


def test_the_inbox_bulk_filters_are_accepted(login, rita, wendy, acme):
    """The ``filters`` the inbox renders (its query with ``state``) act."""
    ambiguous_run(wendy, acme)
    client = login(rita)
    bar = client.get("/t/acme/?q=acme&sort=created&kind=acme.order").context["bulk"]
    response = client.post("/t/acme/bulk/", _bulk(filters=bar["filters"]))
    assert response.status_code == 303, response.content.decode()[:500]
    assert BulkAction.objects.get().done == 1


@pytest.mark.parametrize("value", [
    "12345678123456781234567812345678" + "-" * 40,  # was cut to 64 and read as a run id
    "12345678-1234-5678-1234-567812345678-",
    "{12345678-1234-5678-1234-567812345678}",
    "x" * 10_000,
])
def test_an_overlong_run_is_refused_never_cut(login, rita, wendy, acme, value):
    ambiguous_run(wendy, acme)
    response = login(rita).post("/t/acme/bulk/",
                                _bulk(scope="selected", run=[value], filters=""))
    assert response.status_code == 400
    body = html.unescape(response.content.decode())
    assert "run: " in body and "at most 36 characters" in body
    assert len(body) < 20_000  # the value is not echoed whole
    assert not BulkAction.objects.exists()
