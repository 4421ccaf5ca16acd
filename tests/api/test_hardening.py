"""Issue 6, fault 6 (API side): JSON answers for outages and crashes, a paged revision
list, chunked bodies refused with 411, no cacheable tenant data, and API docs that need
a login and load nothing from a CDN (``docs/security/input.md``)."""

from __future__ import annotations

import http.client
import json
import re
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.staticfiles import finders
from django.db import InterfaceError, OperationalError
from django.db.backends.utils import CursorWrapper
from django.test import Client, override_settings
from kombu.exceptions import OperationalError as BrokerError
from rest_framework.test import APIClient

from checkpoints import services
from checkpoints.models import AuditEvent, CheckpointRevision
from tests.api.apihelpers import get, new_checkpoint, put_cp, put_fx, snapshot, url
from tests.helpers import effect_body, envelope


@pytest.fixture
def w(api_as, wendy):
    return api_as(wendy)


def quiet(client: APIClient) -> APIClient:
    """The same credentials, but a server error is answered, not raised into the test."""
    other = APIClient(raise_request_exception=False)
    other.credentials(**client._credentials)
    return other


# --- outages and crashes: always JSON -----------------------------------------------------

@pytest.mark.parametrize("exc", [OperationalError("could not connect to server"),
                                 InterfaceError("connection already closed")])
def test_it_answers_503_json_while_the_database_is_down(w, acme, monkeypatch, exc):
    cp = new_checkpoint(w, "acme")
    before = snapshot()

    def down(self, *args, **kwargs):
        raise exc

    client = quiet(w)
    with monkeypatch.context() as m:
        m.setattr(CursorWrapper, "execute", down)
        answers = [client.get(url("acme", "runs")),
                   put_cp(client, "acme", dict(cp, revision=1), match=0),
                   client.get(url("acme", f"checkpoints/{cp['id']}"))]
    for r in answers:
        assert r.status_code == 503
        assert r["Content-Type"] == "application/json"
        assert r.json() == {"error": "unavailable"}
        assert r["Retry-After"] == "5"
    # Back up: nothing of the refused write was kept, and the same client carries on.
    assert snapshot() == before
    assert put_cp(w, "acme", dict(cp, revision=1), match=0).status_code == 200


def test_it_answers_503_json_when_the_broker_is_down(w, acme, monkeypatch):
    from checkpoints import selectors

    def down(**kwargs):
        raise BrokerError("[Errno 111] Connection refused")

    monkeypatch.setattr(selectors, "run_list", down)
    r = quiet(w).get(url("acme", "runs"))
    assert (r.status_code, r.json(), r["Retry-After"]) == (503, {"error": "unavailable"}, "5")


#: A crash is no answer the schema documents; these tests make one on purpose.
CRASH = pytest.mark.no_schema_check(reason="a deliberate crash: a 500 is not in the schema")


@CRASH
def test_it_answers_a_crash_with_json_500_and_no_details(w, acme, monkeypatch):
    from checkpoints import selectors

    def crash(**kwargs):
        raise RuntimeError("secret-detail-7731 from a payload")

    monkeypatch.setattr(selectors, "run_list", crash)
    r = quiet(w).get(url("acme", "runs"))
    assert r.status_code == 500
    assert r["Content-Type"] == "application/json"
    assert r.json() == {"error": "internal"}
    assert b"secret-detail-7731" not in r.content


class Explode:
    """A middleware that fails the way a dependency can, before any view runs."""

    error: Exception = RuntimeError("boom-in-middleware")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        raise Explode.error


@pytest.mark.parametrize("error,status,body", [
    (OperationalError("the database system is shutting down"), 503, {"error": "unavailable"}),
    pytest.param(RuntimeError("boom-in-middleware"), 500, {"error": "internal"}, marks=CRASH),
])
def test_it_answers_json_even_for_errors_outside_the_api_views(
        w, acme, settings, error, status, body):
    Explode.error = error
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.api.test_hardening.Explode"]
    r = quiet(w).get(url("acme", "runs"))
    assert (r.status_code, r["Content-Type"], r.json()) == (status, "application/json", body)
    assert b"boom-in-middleware" not in r.content
    # The dashboard answers a page with the same status (an outage: 503, issue 17 item 12).
    page = Client(raise_request_exception=False).get("/login/")
    assert page.status_code == status and page["Content-Type"].startswith("text/html")
    assert b"boom-in-middleware" not in page.content


@pytest.mark.parametrize("debug", [False, True])
def test_it_answers_json_404_for_an_unknown_api_path(w, settings, debug):
    """With ``DEBUG`` on too (``make demo``), where Django answers its HTML debug page
    for a path no pattern matched (stop 35, the newcomer's finding)."""
    settings.DEBUG = debug
    for path in ("/api/v1/nope", "/api/v1/tenants/acme/nope", "/api/v1/tenants/acme/runs/x/y/z"):
        r = w.get(path)
        assert (r.status_code, r["Content-Type"]) == (404, "application/json"), path
        assert r.json() == {"error": "not_found"}
    assert Client().get("/no-such-page/")["Content-Type"].startswith("text/html")


# --- chunked bodies -----------------------------------------------------------------------

def test_it_refuses_a_chunked_body_with_411_instead_of_reading_it_as_empty(w, acme):
    """What a WSGI server hands Django for ``Transfer-Encoding: chunked``: no
    Content-Length. Django would read an empty body; the API refuses it."""
    body = envelope()
    before = snapshot()
    for path, extra in ((f"checkpoints/{body['id']}", {"HTTP_IF_NONE_MATCH": "*"}),
                        (f"effects/{uuid.uuid4()}", {"HTTP_IF_NONE_MATCH": "*"})):
        r = w.put(url("acme", path), data=b"", content_type="application/json",
                  HTTP_TRANSFER_ENCODING="chunked", **extra)
        assert r.status_code == 411
        assert r.json()["error"] == "length_required"
        assert r.json()["detail"].startswith("Content-Length")
    assert snapshot() == before
    rid = new_checkpoint(w, "acme")["run_id"]
    before = snapshot()
    for action in ("lease", "resume"):
        r = w.post(url("acme", f"runs/{rid}/{action}"), data=b"",
                   content_type="application/json", HTTP_TRANSFER_ENCODING="chunked")
        assert r.status_code == 411, r.content
    assert snapshot() == before


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_chunked_body_under_a_real_wsgi_server(live_server, wendy, acme):
    token = services.token_issue(user=wendy)
    body = envelope()
    before = snapshot()
    host, port = urlsplit(live_server.url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    raw = json.dumps(body).encode()
    conn.request("PUT", f"/api/v1/tenants/acme/checkpoints/{body['id']}",
                 body=iter([raw[:40], raw[40:]]), encode_chunked=True,
                 headers={"Authorization": f"Bearer {token}", "If-None-Match": "*",
                          "Content-Type": "application/json"})
    r = conn.getresponse()
    answer = json.loads(r.read())
    conn.close()
    assert r.status == 411 and answer["error"] == "length_required"
    assert r.getheader("Transfer-Encoding") is None
    assert snapshot() == before
    # The same body with a Content-Length is stored.
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("PUT", f"/api/v1/tenants/acme/checkpoints/{body['id']}", body=raw,
                 headers={"Authorization": f"Bearer {token}", "If-None-Match": "*",
                          "Content-Type": "application/json"})
    assert conn.getresponse().status == 201
    conn.close()


# --- the revision list, paged -------------------------------------------------------------

def _revisions(w, acme, n: int, pad: int = 0) -> dict:
    body = new_checkpoint(w, "acme", payload={"phase": "ready", "pad": "x" * pad})
    for rev in range(1, n):
        r = put_cp(w, "acme", dict(body, revision=rev, payload={"phase": "charging", "n": rev,
                                                               "pad": "x" * pad}),
                   match=rev - 1)
        assert r.status_code == 200
    return body


def _follow(client, first: str) -> list[dict]:
    pages, nxt = [], first
    while nxt:
        r = client.get(nxt)
        assert r.status_code == 200, r.content
        pages.append(r.json())
        nxt = r.json()["next"]
    return pages


def test_it_pages_the_revision_list_oldest_first_with_one_export_event_per_page(w, acme):
    body = _revisions(w, acme, 5)
    exports = AuditEvent.objects.filter(action="payload.export").count()
    pages = _follow(w, url("acme", f"checkpoints/{body['id']}/revisions") + "?limit=2")
    assert [[x["revision"] for x in page["results"]] for page in pages] == [[0, 1], [2, 3], [4]]
    assert parse_qs(urlsplit(pages[0]["next"]).query) == {"limit": ["2"], "cursor": ["1"]}
    assert pages[-1]["next"] is None
    assert AuditEvent.objects.filter(action="payload.export").count() == exports + 3
    last = AuditEvent.objects.filter(action="payload.export").order_by("-seq").first()
    assert last.after == {"revisions": 1, "from": 4, "to": 4}


def test_it_defaults_to_a_bounded_page(w, acme):
    body = _revisions(w, acme, 23)
    pages = _follow(w, url("acme", f"checkpoints/{body['id']}/revisions"))
    assert [len(p["results"]) for p in pages] == [20, 3]


def test_it_bounds_a_revision_page_by_payload_bytes(w, acme, settings):
    body = _revisions(w, acme, 5, pad=1500)
    settings.RECOVERY_MAX_BODY_BYTES = 1024  # a page then holds at most 4096 payload bytes
    pages = _follow(w, url("acme", f"checkpoints/{body['id']}/revisions") + "?limit=100")
    assert [[x["revision"] for x in p["results"]] for p in pages] == [[0, 1], [2, 3], [4]]
    settings.RECOVERY_MAX_BODY_BYTES = 1000 // 4  # smaller than one payload: one per page
    pages = _follow(w, url("acme", f"checkpoints/{body['id']}/revisions"))
    assert [len(p["results"]) for p in pages] == [1] * 5


@pytest.mark.parametrize("query,field", [("limit=0", "limit"), ("limit=101", "limit"),
                                         ("cursor=-1", "cursor"), ("cursor=x", "cursor"),
                                         (f"cursor={2**63}", "cursor")])
def test_it_refuses_bad_revision_page_parameters(w, acme, query, field):
    body = _revisions(w, acme, 2)
    before = snapshot()
    r = w.get(url("acme", f"checkpoints/{body['id']}/revisions") + "?" + query)
    assert r.status_code == 400 and r.json()["detail"].startswith(f"{field}: ")
    assert snapshot() == before


def test_it_answers_an_empty_last_page_past_the_end(w, acme):
    body = _revisions(w, acme, 2)
    r = w.get(url("acme", f"checkpoints/{body['id']}/revisions") + "?cursor=7")
    assert r.status_code == 200 and r.json() == {"results": [], "next": None}


def test_it_still_refuses_viewers_the_revision_list(api_as, w, vic, acme):
    body = _revisions(w, acme, 2)
    before = snapshot()
    r = api_as(vic).get(url("acme", f"checkpoints/{body['id']}/revisions"))
    assert r.status_code == 403 and snapshot() == before
    assert CheckpointRevision.objects.count() == 2


# --- no caching of tenant data ------------------------------------------------------------

def test_it_marks_every_api_answer_no_store(w, api_as, rita, acme):
    cp = new_checkpoint(w, "acme")
    fx = effect_body(run_id=cp["run_id"])
    created = put_fx(w, "acme", fx, create=True)
    answers = {
        "checkpoint": get(api_as(rita), "acme", f"checkpoints/{cp['id']}"),
        "revisions": get(w, "acme", f"checkpoints/{cp['id']}/revisions"),
        "effect put": created,
        "effect": get(w, "acme", f"effects/{fx['id']}"),
        "effects": get(w, "acme", "effects", service="payments"),
        "run": get(w, "acme", f"runs/{cp['run_id']}"),
        "runs": get(w, "acme", "runs"),
        "error": get(w, "acme", f"effects/{uuid.uuid4()}"),
        "unauthenticated": APIClient().get(url("acme", "runs")),
    }
    for name, r in answers.items():
        assert r.status_code < 500, name
        assert "no-store" in r["Cache-Control"], name


# --- the schema and the docs page ---------------------------------------------------------

def test_it_serves_the_schema_only_to_accounts(w, db, rita):
    r = APIClient().get("/api/schema/")
    assert (r.status_code, r["Content-Type"]) == (401, "application/json")
    assert r.json()["error"] == "not_authenticated"
    assert w.get("/api/schema/?format=json").status_code == 200
    session = Client()
    session.force_login(rita)
    r = session.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200 and "/api/v1/tenants/{tenant}/runs" in r.json()["paths"]


def test_it_sends_anonymous_browsers_from_the_docs_to_the_login_page(db):
    r = Client().get("/api/docs/")
    assert r.status_code == 302 and r["Location"] == "/login/?next=/api/docs/"


@override_settings(DEBUG=False)
def test_it_serves_the_docs_page_from_vendored_files_only(rita):
    session = Client()
    session.force_login(rita)
    r = session.get("/api/docs/")
    assert r.status_code == 200
    html = r.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html
    for source in sources:
        assert source.startswith("/"), f"{source} is not served by us"
        assert "//" not in source
    assert any("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in s
               for s in sources)
    assert "<script>" not in html  # the init script is a separate file (CSP-friendly)
    for source in sources:
        path = urlsplit(source).path
        if path.startswith("/static/"):
            assert finders.find(path[len("/static/"):]), path
    script = next(s for s in sources if "script" in urlsplit(s).query)
    r = session.get(script.replace("&amp;", "&"))
    assert r.status_code == 200 and r["Content-Type"].startswith("application/javascript")
    assert b"/api/schema/" in r.content
