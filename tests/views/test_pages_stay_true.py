"""Issue 9, item 4 ("pages that stay true"), server side:

- every dashboard answer that depends on ``HX-Request`` says so (``Vary: HX-Request``) and
  no htmx answer may be stored (``no-store``): walked over every URL pattern of
  ``checkpoints.urls`` (introspected, so a new page is covered without editing this file)
  with and without ``HX-Request``, on the paths that end in 200/302, 400, 403, 404, 405,
  a CSRF failure and the login redirect;
- an htmx history restore (``HX-History-Restore-Request``) gets the whole page, and the
  answers say they vary on that header;
- a CSRF failure or an ended session inside an htmx action is a short message in place,
  never Django's error page or the login page swapped into the run page;
- an action refused because someone acted first refreshes the run and says who and when;
- the requester's "Withdraw request" button.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.test import Client
from django.urls import URLPattern, reverse

from checkpoints import services
from checkpoints import urls as dashboard_urls
from checkpoints.models import RetryRequest, Run

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
ARG = re.compile(r"<(?:\w+:)?(\w+)>")
#: Django's auth views: their answers do not depend on HX-Request (a CSRF failure on
#: them does, and is checked below).
AUTH_VIEWS = {"login", "logout"}


def _vary(response) -> set[str]:
    return {v.strip().lower() for v in response.get("Vary", "").split(",") if v.strip()}


def _assert_true_to_htmx(response, htmx: bool, where: str) -> None:
    assert "hx-request" in _vary(response), f"{where}: Vary {response.get('Vary')!r}"
    if htmx:
        assert "no-store" in response.get("Cache-Control", ""), \
            f"{where}: htmx answer cacheable: {response.get('Cache-Control')!r}"


@pytest.fixture
def world(acme, rita, april, unknown):
    """The unknown-outcome run with rita's open retry request: every URL kwarg's value."""
    retry = services.retry_request(actor=rita, tenant=acme, run_id=unknown.run_id,
                                   reason="stuck")
    return {"slug": "acme", "run_id": str(unknown.run_id), "retry_id": str(retry.pk),
            "effect_id": str(unknown.effect_id), "checkpoint_id": str(unknown.checkpoint_id),
            "attempt_id": "999999", "bulk_id": str(uuid.uuid4()), "kind": "acme.order",
            "version": "1", "job_id": str(uuid.uuid4()),
            # Issue 20's pages: a request and a hold no tenant has (404, still true to htmx).
            "request_id": str(uuid.uuid4()), "hold_id": str(uuid.uuid4()),
            # Issue 21's Notifications pages: an endpoint and a message no tenant has.
            "endpoint_id": str(uuid.uuid4()), "event_id": "msg_" + "0" * 32}


def _dashboard_urls(values: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    for p in dashboard_urls.urlpatterns:
        if isinstance(p, URLPattern) and p.name not in AUTH_VIEWS:
            route = "/" + ARG.sub(lambda m: values[m[1]], str(p.pattern))
            out.append((p.name, route))
    return out


def test_the_walk_covers_every_dashboard_page(world):
    names = {name for name, _ in _dashboard_urls(world)}
    views = {p.name for p in dashboard_urls.urlpatterns if isinstance(p, URLPattern)}
    assert names == views - AUTH_VIEWS and len(names) > 20


@pytest.mark.parametrize("who", ["rita", "april", "vic", "anonymous", "foreign"])
def test_every_dashboard_answer_varies_on_hx_request(world, login, who, rita, april, vic,
                                                      omar):
    """Each page and action, GET and POST (one of which is 405), empty POST bodies (400
    reason required), a viewer's actions (403), an account of another tenant (404), and
    an anonymous visitor (login redirect, or the htmx in-place message), an approver (its
    queue, issue 21): each answer carries ``Vary: HX-Request``, and every htmx answer
    ``no-store``; each that the view's ``@dashboard`` stack answered (all but the 405s)
    ``Vary: HX-History-Restore-Request`` too (``whole_page_for_history``)."""
    client = {"rita": lambda: login(rita), "april": lambda: login(april),
              "vic": lambda: login(vic),
              "anonymous": Client, "foreign": lambda: login(omar)}[who]()
    statuses = set()
    for name, url in _dashboard_urls(world):
        for method in ("get", "post"):
            for htmx in (False, True):
                extra = {**HX, "HTTP_HX_TRIGGER": "f-x",
                         "HTTP_HX_CURRENT_URL": "http://testserver" + url} if htmx else {}
                response = getattr(client, method)(url, **extra)
                statuses.add(response.status_code)
                where = f"{who} {method} {name} htmx={htmx} ({response.status_code})"
                _assert_true_to_htmx(response, htmx, where)
                if response.status_code != 405:  # past require_safe/POST: @dashboard's
                    assert "hx-history-restore-request" in _vary(response), where
    expected = {"rita": {200, 400, 405}, "april": {200, 400, 405}, "vic": {200, 403, 405},
                "anonymous": {302, 403, 405},
                "foreign": {404, 405}}[who]
    assert expected <= statuses, statuses


def test_a_csrf_failure_varies_and_is_a_message_in_place(world, login, rita):
    """A POST whose token is stale: htmx gets the short message retargeted into the
    form's error slot (never Django's 403 page in the run body); a plain post a readable
    page; both 403 with ``Vary: HX-Request`` and ``no-store``."""
    client = login(rita, csrf=True)
    url = reverse("run_close", args=["acme", world["run_id"]])
    page = f"http://testserver/t/acme/runs/{world['run_id']}/"
    before = list(Run.objects.values_list("closed_at", flat=True))
    response = client.post(url, {"reason": "x", "confirm": "on",
                                 "csrfmiddlewaretoken": "stale" * 8},
                           **HX, HTTP_HX_TRIGGER="f-close", HTTP_HX_CURRENT_URL=page)
    body = response.content.decode()
    assert response.status_code == 403
    assert response["HX-Retarget"] == "#f-close-error" and response["HX-Reswap"] == "innerHTML"
    assert "Your session changed" in body and "<html" not in body and "CSRF" not in body
    assert f'href="/t/acme/runs/{world["run_id"]}/"' in body  # "Reload the page"
    _assert_true_to_htmx(response, True, "csrf htmx")
    plain = client.post(url, {"reason": "x", "confirm": "on"}, HTTP_REFERER=page)
    assert plain.status_code == 403 and "<html" in plain.content.decode()
    assert "Your session changed" in plain.content.decode()
    _assert_true_to_htmx(plain, False, "csrf plain")
    # Django's auth views too (their CSRF failure is ours).
    for auth in ("login", "logout"):
        r = Client(enforce_csrf_checks=True).post(reverse(auth), **HX, HTTP_HX_TRIGGER="f-x")
        assert r.status_code == 403 and "hx-request" in _vary(r)
    assert list(Run.objects.values_list("closed_at", flat=True)) == before


@pytest.mark.parametrize("referer", ["https://evil.example/x", "javascript:alert(1)",
                                     "//evil.example/x"])
def test_an_error_page_links_back_only_to_this_site(world, login, rita, referer):
    """A forged cross-site post carries the attacker's page as its Referer: the CSRF
    page and the error pages never link to it."""
    client = login(rita, csrf=True)
    url = reverse("run_close", args=["acme", world["run_id"]])
    forged = client.post(url, {"reason": "x", "confirm": "on"}, HTTP_REFERER=referer)
    assert forged.status_code == 403 and "Your session changed" in forged.content.decode()
    refused = login(rita).post(url, {"reason": ""}, HTTP_REFERER=referer)  # 400 page
    assert refused.status_code == 400
    for response in (forged, refused):
        body = response.content.decode()
        assert "evil.example" not in body and "javascript:" not in body


def test_an_api_csrf_failure_keeps_its_json_error(world, rita):
    """The API's session callers keep DRF's JSON error (its views check CSRF themselves)."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(rita)
    r = client.post(f"/api/v1/tenants/acme/runs/{world['run_id']}/close",
                    data='{"reason": "x"}', content_type="application/json")
    assert r.status_code == 403 and r.json()["error"] in ("forbidden", "permission_denied")


def test_an_ended_session_inside_an_htmx_action_is_a_message_in_place(world):
    """Logged out (or expired): an htmx POST gets a short message in place with a link to
    log in and come back (403, nothing written); an htmx GET (tabs polling) a client
    redirect to the login page; a plain request the usual 302."""
    anonymous = Client()
    page = f"/t/acme/runs/{world['run_id']}/"
    url = reverse("run_close", args=["acme", world["run_id"]])
    response = anonymous.post(url, {"reason": "x", "confirm": "on"}, **HX,
                              HTTP_HX_TRIGGER="f-close",
                              HTTP_HX_CURRENT_URL="http://testserver" + page)
    body = response.content.decode()
    assert response.status_code == 403 and response["HX-Retarget"] == "#f-close-error"
    assert "Your session has ended" in body and "<html" not in body
    assert 'href="/login/?next=/t/acme/runs/' in body
    assert "HX-Redirect" not in response
    poll = anonymous.get(reverse("run_counts", args=["acme"]), **HX,
                         HTTP_HX_CURRENT_URL="http://testserver/t/acme/")
    assert poll["HX-Redirect"].startswith("/login/?next=/t/acme/")
    assert anonymous.get(page).status_code == 302
    assert Run.objects.get().closed_at is None


def test_a_history_restore_gets_the_whole_page(world, login, rita):
    """htmx 2 on a history cache miss asks again with ``HX-History-Restore-Request`` and
    puts the answer in place of <body>: it must be the whole page, not the fragment."""
    client = login(rita)
    url = reverse("run_list", args=["acme"]) + "?state=all&kind=acme"
    swap = client.get(url, **HX)
    fragment = swap.content.decode()
    assert 'id="inbox-main"' in fragment and 'class="topbar"' not in fragment
    whole = client.get(url, **HX, HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert whole.status_code == 200
    body = whole.content.decode()
    assert "<html" in body and 'class="topbar"' in body and 'id="inbox-main"' in body
    _assert_true_to_htmx(whole, True, "history restore")
    # Same URL, same HX-Request, two answers: a cache must tell them apart by this header.
    for response in (swap, whole):
        assert "hx-history-restore-request" in _vary(response), response.get("Vary")


def test_base_turns_htmx_history_snapshots_off(login, rita, acme):
    """No localStorage snapshot to restore a stale page from; a miss reloads the URL."""
    body = login(rita).get(reverse("run_list", args=["acme"])).content.decode()
    config = re.search(r"""<meta name="htmx-config" content='([^']+)'>""", body)[1]
    parsed = json.loads(config)
    assert parsed["historyCacheSize"] == 0 and parsed["refreshOnHistoryMiss"] is True


# --------------------------------------------------------------------------------------
# Someone acted first
# --------------------------------------------------------------------------------------

def _decide_url(world, verb="approve"):
    return reverse(f"retry_{verb}", args=["acme", world["retry_id"]])


def test_a_stale_approval_refreshes_the_run_and_names_who_approved(world, login, april, adam,
                                                                   acme):
    services.retry_approve(actor=april, tenant=acme, retry_id=int(world["retry_id"]),
                           reason="ok")
    client = login(adam)
    response = client.post(_decide_url(world), {"reason": "me too"}, **HX,
                           HTTP_HX_TRIGGER=f"f-decide-{world['retry_id']}")
    body = response.content.decode()
    assert response.status_code == 422
    assert "HX-Retarget" not in response  # the action's own target: #run-body
    assert '<div id="run-body">' in body and "<html" not in body
    assert re.search(r'id="refusal">Not done: already approved by april \d+ s ago\.', body)
    assert 'id="run-state">retry approved<' in body
    assert f'id="f-decide-{world["retry_id"]}"' not in body  # the stale buttons are gone
    assert "audit-changed" in response["HX-Trigger"]
    _assert_true_to_htmx(response, True, "stale approval")
    plain = client.post(_decide_url(world, "reject"), {"reason": "no"})
    assert plain.status_code == 422 and "<html" in plain.content.decode()
    assert "already approved by april" in plain.content.decode()
    assert RetryRequest.objects.get().decided_by == april


def test_acknowledging_conflicts_someone_acknowledged_says_so(login, rita, adam, wendy, acme):
    from tests.helpers import envelope, put_checkpoint

    body = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(services.StaleRevision):
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    url = reverse("conflicts_acknowledge", args=["acme", body["run_id"]])
    assert login(rita).post(url, {"reason": "seen"}, **HX).status_code == 200
    again = login(adam).post(url, {"reason": "seen"}, **HX, HTTP_HX_TRIGGER="f-ack")
    assert again.status_code == 422
    assert 'id="refusal">Not done: already acknowledged by rita' in again.content.decode()


def test_the_requester_withdraws_from_the_run_page(world, login, rita, adam):
    page = reverse("run_detail", args=["acme", world["run_id"]])
    form = f'id="f-withdraw-{world["retry_id"]}"'
    assert form in login(rita).get(page).content.decode()
    assert form not in login(adam).get(page).content.decode()  # not adam's request
    url = reverse("retry_withdraw", args=["acme", world["retry_id"]])
    assert login(adam).post(url, {"reason": "x"}).status_code == 403
    response = login(rita).post(url, {"reason": "handled by phone"}, **HX,
                                HTTP_HX_TRIGGER=f"f-withdraw-{world['retry_id']}")
    body = response.content.decode()
    assert response.status_code == 200 and "withdrawn" in body
    assert 'id="run-state">unknown outcome<' in body and form not in body
    assert RetryRequest.objects.get().state == "withdrawn"
    again = login(rita).post(url, {"reason": "x"}, **HX)
    assert again.status_code == 422
    assert 'id="refusal">Not done: already withdrawn by rita' in again.content.decode()


@pytest.mark.parametrize("action", ["close", "mark unknown", "request retry"])
def test_every_refused_review_action_refreshes_the_run_and_says_who(action, login, acme, rita,
                                                                    adam, stuck):
    """Each action someone else did first: 422, the refreshed run body with the sentence
    naming rita, never an error fragment; nothing written."""
    if action == "close":
        services.run_close(actor=rita, tenant=acme, run_id=stuck.run_id, reason="by phone")
        url, data, words = (reverse("run_close", args=["acme", stuck.run_id]),
                            {"reason": "x", "confirm": "on"}, "already closed by rita")
    elif action == "mark unknown":
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                     reason="?")
        url, data, words = (reverse("effect_mark_unknown", args=["acme", stuck.effect_id]),
                            {"reason": "x", "confirm": "on"}, "already marked unknown by rita")
    else:
        services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=stuck.effect_id,
                                     reason="?")
        services.retry_request(actor=rita, tenant=acme, run_id=stuck.run_id, reason="stuck")
        url, data, words = (reverse("run_retry_request", args=["acme", stuck.run_id]),
                            {"reason": "x"}, "already requested by rita")
    before = (list(RetryRequest.objects.values_list("pk", "state")),
              list(Run.objects.values_list("recovery_state", "closed_at")))
    response = login(adam).post(url, data, **HX, HTTP_HX_TRIGGER="f-x")
    body = response.content.decode()
    assert response.status_code == 422 and "HX-Retarget" not in response
    assert '<div id="run-body">' in body and f'id="refusal">Not done: {words}' in body
    assert before == (list(RetryRequest.objects.values_list("pk", "state")),
                      list(Run.objects.values_list("recovery_state", "closed_at")))
