"""The Notifications page (issue 21, items 1 and 5; docs/notifications.md): every role
of the tenant sees the endpoints, a non-admin exactly what the API shows it (no URL path,
no address's local part, no secret hint); the admin's forms go through the services
(``services.notify_endpoints``): the webhook secret is shown once, a refusal names its
field beside the form and writes nothing, a non-admin's post is 403 and writes nothing;
the endpoint page's delivery log shows every attempt, resend keeps the event id, a
disabled endpoint says why; the queries a page costs are pinned."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import services
from checkpoints.jobs import notify
from checkpoints.jsonparse import name_problem
from checkpoints.models import (
    AuditEvent,
    NotificationAttempt,
    NotificationEndpoint,
    NotificationMessage,
)
from checkpoints.vocab import DeliveryState
from tests.conftest import bearer_client
from tests.helpers import age_world, form_fields
from tests.notifications.receiver import Receiver

pytestmark = pytest.mark.django_db

#: A recognisable path (a Slack URL's path is its secret) and an address's local part.
SECRET_PATH = "/services/T0SECRETPATH/B0XYZ/hushhush42"
LOCAL_PART = "oncall-hidden-person"
ROLES = ["vic", "rita", "april", "wendy", "adam"]
BASE = "/t/acme/notifications/"


@pytest.fixture
def endpoints(acme, adam):
    """A webhook (with a secret), a Slack URL whose path is secret, an email address."""
    hook, secret = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "pager", "channel": "webhook", "url": "https://hooks.example.com/in/abc",
        "event_types": ["run.needs_review"], "kinds": ["acme.order"]})
    slack, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "chat", "channel": "slack", "url": "https://hooks.slack.com" + SECRET_PATH,
        "event_types": ["retry.awaiting_approval"]})
    mail, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        "name": "mail", "channel": "email", "email": f"{LOCAL_PART}@example.com",
        "event_types": ["digest"], "quiet_period_s": 600})
    return {"hook": hook, "secret": secret, "slack": slack, "mail": mail}


def _text(response) -> str:
    return html.unescape(response.content.decode())


def _state(acme) -> tuple:
    return (list(NotificationEndpoint.objects.for_tenant(acme)
                 .values_list("name", "url", "email", "enabled", "secret")),
            NotificationMessage.objects.for_tenant(acme).count(),
            AuditEvent.objects.for_tenant(acme).count())


@pytest.mark.parametrize("who", ROLES)
def test_every_role_sees_the_endpoints(request, login, acme, endpoints, who):
    page = login(request.getfixturevalue(who)).get(BASE)
    assert page.status_code == 200
    body = _text(page)
    for name in ("pager", "chat", "mail"):
        assert name in body
    assert "https://hooks.example.com" in body and "@example.com" in body
    assert "acme.order" in body and "10 min" in body  # a filter; the quiet period
    assert 'aria-current="page">Notifications</a>' in body
    assert ('id="f-endpoint-create"' in body) == (who == "adam")


@pytest.mark.parametrize("who", ["vic", "rita", "april"])
def test_a_non_admin_sees_what_the_api_shows_it_and_no_more(request, login, acme,
                                                            endpoints, who):
    user = request.getfixturevalue(who)
    client = login(user)
    pages = [_text(client.get(BASE))] + [
        _text(client.get(f"{BASE}{endpoints[k].uuid}/")) for k in ("hook", "slack", "mail")]
    hint = endpoints["secret"][-4:]
    for body in pages:
        assert SECRET_PATH not in body and "T0SECRETPATH" not in body and "hushhush42" not in body
        assert LOCAL_PART not in body and "/in/abc" not in body
        assert "whsec_" not in body and hint not in body
        assert 'id="f-endpoint-edit"' not in body and "Rotate secret" not in body
    # The same endpoints through the API, as the same user: no url, email or hint either.
    api = bearer_client(user).get("/api/v1/tenants/acme/notification-endpoints").json()
    for row in api["results"]:
        assert row["url"] is None and row["email"] is None and row["secret_hint"] is None
        assert row["destination"] in pages[0]


def test_the_admin_sees_url_address_and_hint(login, adam, endpoints):
    client = login(adam)
    body = _text(client.get(f"{BASE}{endpoints['slack'].uuid}/"))
    assert SECRET_PATH in body
    body = _text(client.get(f"{BASE}{endpoints['mail'].uuid}/"))
    assert f"{LOCAL_PART}@example.com" in body
    body = _text(client.get(f"{BASE}{endpoints['hook'].uuid}/"))
    assert "whsec_…" + endpoints["secret"][-4:] in body
    assert endpoints["secret"] not in body


FORM = {"name": "ops hook", "channel": "webhook", "url": "https://hooks.example.com/x/1",
        "event_types_sent": "1", "event_types": ["run.needs_review", "reconcile.gave_up"],
        "kinds": "acme.order\r\nacme.refund\nacme.ticket\r\n", "agents": "",
        "services": "payments",
        "group_window_s": "60", "quiet_period_s": ""}


def test_the_admin_creates_a_webhook_and_sees_its_secret_once(login, acme, adam):
    client = login(adam)
    answer = client.post(BASE + "new/", FORM)
    assert answer.status_code == 200
    body = _text(answer)
    [secret] = set(re.findall(r"whsec_[A-Za-z0-9+/=]{20,}", body))  # text and copy button
    assert f'id="secret-value">{secret}<' in body and "never shown again" in body
    endpoint = NotificationEndpoint.objects.for_tenant(acme).get(name="ops hook")
    assert endpoint.kinds == ["acme.order", "acme.refund", "acme.ticket"]
    assert endpoint.services == ["payments"] and endpoint.group_window_s == 60
    assert endpoint.event_types == ["run.needs_review", "reconcile.gave_up"]
    assert secret not in endpoint.secret  # stored encrypted
    assert secret not in str(dict(client.session))
    assert secret not in answer.get("Location", "")
    # A reload (a GET of the page, the list) shows its hint, never the secret.
    again = _text(client.get(f"{BASE}{endpoint.uuid}/"))
    assert secret not in again and "whsec_…" + secret[-4:] in again
    assert secret not in _text(client.get(BASE))
    # Rotating shows the new one once, then only its hint.
    rotated = _text(client.post(f"{BASE}{endpoint.uuid}/rotate/"))
    [new] = set(re.findall(r"whsec_[A-Za-z0-9+/=]{20,}", rotated))
    assert new != secret and "keeps signing until" in rotated
    assert new not in _text(client.get(f"{BASE}{endpoint.uuid}/"))


def test_a_reloaded_create_or_rotate_form_does_nothing_again(login, acme, adam):
    """The page that shows a secret answers a POST: a reload sends the form again. Its
    one-time token makes the second post a 303 to the endpoint, with nothing created or
    rotated again (newcomer: a reload added a second endpoint with another secret)."""
    client = login(adam)
    page = _text(client.get(BASE))
    [token] = re.findall(r'name="form_token" value="([0-9a-f-]{36})"', page)
    first = client.post(BASE + "new/", dict(FORM, form_token=token))
    assert first.status_code == 200 and "whsec_" in _text(first)
    endpoint = NotificationEndpoint.objects.for_tenant(acme).get()
    again = client.post(BASE + "new/", dict(FORM, form_token=token))
    assert again.status_code == 303 and again["Location"] == f"{BASE}{endpoint.uuid}/"
    assert NotificationEndpoint.objects.for_tenant(acme).count() == 1
    assert "whsec_" not in again.content.decode()
    page = _text(client.get(f"{BASE}{endpoint.uuid}/"))
    assert "already sent" in page
    [token] = re.findall(r'name="form_token" value="([0-9a-f-]{36})"', page)
    secret = NotificationEndpoint.objects.for_tenant(acme).get().secret
    assert client.post(f"{BASE}{endpoint.uuid}/rotate/", {"form_token": token}).status_code == 200
    rotated = NotificationEndpoint.objects.for_tenant(acme).get().secret
    assert rotated != secret
    assert client.post(f"{BASE}{endpoint.uuid}/rotate/", {"form_token": token}).status_code == 303
    assert NotificationEndpoint.objects.for_tenant(acme).get().secret == rotated
    bad = client.post(BASE + "new/", dict(FORM, form_token="not-a-uuid"))
    assert bad.status_code == 400 and "form_token" in bad.content.decode()
    assert NotificationEndpoint.objects.for_tenant(acme).count() == 1


def test_an_email_endpoint_redirects_to_its_page(login, acme, adam):
    form = dict(FORM, channel="email", email="ops@example.com", url="")
    answer = login(adam).post(BASE + "new/", form)
    endpoint = NotificationEndpoint.objects.for_tenant(acme).get()
    assert answer.status_code == 303 and answer["Location"] == f"{BASE}{endpoint.uuid}/"
    assert endpoint.email == "ops@example.com" and endpoint.url == ""


@pytest.mark.parametrize("change, field, words", [
    ({"url": "ftp://hooks.example.com/x"}, "url", "url: "),
    ({"url": "http://127.0.0.1/hook"}, "url", "url: "),
    ({"url": ""}, "url", "url: "),
    ({"channel": "email", "email": "not-an-address"}, "email", "email: not a valid email"),
    ({"group_window_s": "3601"}, "group_window_s", "group_window_s: must be an integer"),
    ({"group_window_s": "soon"}, "group_window_s", "group_window_s: must be an integer"),
    # Read as the API reads a JSON number (forms.typed_number): int() took all four.
    ({"group_window_s": "60\x0b"}, "group_window_s", "group_window_s: must be an integer"),
    ({"quiet_period_s": "\u00a060"}, "quiet_period_s", "quiet_period_s: must be an integer"),
    ({"group_window_s": "\uff16\uff10"}, "group_window_s", "group_window_s: must be an "
                                                          "integer"),
    ({"group_window_s": "6_0"}, "group_window_s", "group_window_s: must be an integer"),
    ({"quiet_period_s": "-1"}, "quiet_period_s", "quiet_period_s: must be an integer"),
    ({"event_types": []}, "event_types", "event_types: must be a non-empty list"),
    ({"name": " "}, "name", "name: must be a non-empty string"),
    # Blank too: joiners and a Hangul filler between spaces show nothing (jsonparse.blank).
    ({"name": "\u200d \u200c"}, "name", "name: must be a non-empty string"),
    # A filter value is a name as a run's agent is (a lone joiner hides; spaces do not).
    ({"agents": "refund\r\n\u200d\u2800"}, "agents",
     "agents: an invisible character is not allowed"),
    ({"kinds": "x" * 201}, "kinds", "kinds: each value at most 200"),
    ({"channel": "pigeon"}, "channel", "channel: must be one of"),
])
def test_a_bad_value_is_shown_beside_its_field_and_nothing_is_written(login, acme, adam,
                                                                      change, field, words):
    before = _state(acme)
    answer = login(adam).post(BASE + "new/", dict(FORM, **change))
    assert answer.status_code == 400
    body = _text(answer)
    assert f'id="new-{field}-error"' in body and words in body, body[:3000]
    assert 'id="f-endpoint-create"' in body and ">payments<" in body  # kept as typed
    assert _state(acme) == before


def test_an_edit_is_a_patch_and_a_refusal_names_the_field(login, acme, adam, endpoints):
    client = login(adam)
    hook = endpoints["hook"]
    edit = f"{BASE}{hook.uuid}/edit/"
    before = _state(acme)
    answer = client.post(edit, {"name": "pager", "url": "https://10.0.0.1/x",
                                "event_types_sent": "1", "event_types": ["run.needs_review"]})
    assert answer.status_code == 400 and 'id="edit-url-error"' in _text(answer)
    assert _state(acme) == before
    answer = client.post(edit, {"name": "pager 2", "event_types_sent": "1",
                                "event_types": ["digest"], "kinds": ""})
    assert answer.status_code == 303
    hook.refresh_from_db()
    assert (hook.name, hook.event_types, hook.kinds) == ("pager 2", ["digest"], [])
    assert hook.url == "https://hooks.example.com/in/abc"  # not sent: unchanged


def test_an_edit_of_the_name_keeps_every_filter_value_the_api_stored(login, acme, adam):
    """The edit form shows the filters one a line and sends each line back as it is: a
    value holding a comma or a space the API stored survives a save that changes only
    the name (stop 34's attack: ``refund, assistant`` came back as two agents, ``refund`` and
    ``assistant``, and `` padded `` lost its spaces)."""
    api = bearer_client(adam)
    agents = ["refund, assistant", "a,b", " padded "]
    made = api.post("/api/v1/tenants/acme/notification-endpoints", {
        "name": "comma", "channel": "email", "email": "ops@example.com",
        "event_types": ["run.needs_review"], "agents": agents[:2], "kinds": ["acme.order"],
        "services": ["pay, ments"]}, format="json")
    assert made.status_code == 201, made.content
    eid = made.json()["endpoint"]["id"]
    # " padded " is a value as sent (an agent may be one), kept by the form's save too.
    assert api.patch(f"/api/v1/tenants/acme/notification-endpoints/{eid}",
                     {"agents": agents}, format="json").status_code == 200
    client = login(adam)
    form = form_fields(_text(client.get(f"{BASE}{eid}/")), "f-endpoint-edit")
    assert form["agents"] == "refund, assistant\r\na,b\r\n padded "  # one a line
    answer = client.post(f"{BASE}{eid}/edit/", dict(form, name="renamed"))
    assert answer.status_code == 303, _text(answer)[:2000]
    read = api.get(f"/api/v1/tenants/acme/notification-endpoints/{eid}").json()
    assert read["name"] == "renamed" and read["agents"] == agents
    assert read["kinds"] == ["acme.order"] and read["services"] == ["pay, ments"]
    # The create form takes the same values the same way: a line is one value.
    client.post(BASE + "new/", dict(FORM, name="typed", agents="refund, assistant\r\n\r\nb"))
    typed = NotificationEndpoint.objects.for_tenant(acme).get(name="typed")
    assert typed.agents == ["refund, assistant", "b"]


#: The whitespace a name may start or end with (``name_problem`` refuses tab and line
#: breaks as controls): the space and Unicode's other spaces (Zs).
PADDING = [ch for ch in map(chr, range(0x110000)) if ch.isspace() and not name_problem(ch)]
API_ENDPOINTS = "/api/v1/tenants/acme/notification-endpoints"


@pytest.mark.parametrize("field", ["kinds", "agents", "services"])
def test_a_filter_value_with_surrounding_whitespace_is_kept_by_the_api_and_the_form(
        login, acme, adam, field):
    """Generated over ``PADDING``, before and after the value: a run's agent may be
    ``"refund "`` (a name, ``jsonparse.name_problem``), so a filter takes it as sent, the
    API's body and the form's line alike, and gives it back unchanged (issue 22's stop,
    item 3: both refused it, 400 ``leading or trailing whitespace``, so no rule could hear
    such a run; tests/views/test_padded_filters.py matches one end to end)."""
    assert len(PADDING) >= 17 and " " in PADDING and "\u00a0" in PADDING
    api, client = bearer_client(adam), login(adam)
    for n, ch in enumerate(PADDING):
        values = [f"acme.order{ch}", f"{ch}acme.order", "acme.order"]
        body = {"name": f"api {n}", "channel": "email", "email": "ops@example.com",
                "event_types": ["run.needs_review"], field: values}
        answer = api.post(API_ENDPOINTS, body, format="json")
        assert answer.status_code == 201, (hex(ord(ch)), answer.content)
        assert answer.json()["endpoint"][field] == values, hex(ord(ch))
        typed = "\r\n".join(values) + "\r\n"
        answer = client.post(BASE + "new/", dict(FORM, name=f"form {n}", **{field: typed}))
        assert answer.status_code in (200, 303), hex(ord(ch))
        stored = NotificationEndpoint.objects.for_tenant(acme).get(name=f"form {n}")
        assert getattr(stored, field) == values, hex(ord(ch))


@pytest.mark.parametrize("stored", [{"agents": ["re\u00adfund"]}, {"name": "on\u200bcall"},
                                    {"url": "https://hooks.example.com:0/x"},
                                    {"name": "on\u2062call"}, {"name": "\u200d"},
                                    {"agents": ["re\U000e0041fund", "\u3164"]}])
def test_an_edit_keeps_a_value_stored_before_a_rule(login, acme, adam, stored):
    """(stop 34's second attack) An endpoint holding a value a later rule refuses (an
    invisible character, a URL's port 0) saved no change from its edit form, which sends
    every field back, while the API's PATCH of another field worked. A field sent as
    stored is kept, not judged again, by both; changing it is judged."""
    api = bearer_client(adam)
    made = api.post("/api/v1/tenants/acme/notification-endpoints", {
        "name": "hook", "channel": "webhook", "url": "https://hooks.example.com/x",
        "event_types": ["run.needs_review"], "agents": ["refund"]}, format="json")
    eid = made.json()["endpoint"]["id"]
    NotificationEndpoint.objects.for_tenant(acme).filter(uuid=eid).update(**stored)
    client = login(adam)
    form = form_fields(_text(client.get(f"{BASE}{eid}/")), "f-endpoint-edit")
    answer = client.post(f"{BASE}{eid}/edit/", dict(form, group_window_s="30"))
    assert answer.status_code == 303, _text(answer)[:2000]
    row = NotificationEndpoint.objects.for_tenant(acme).get(uuid=eid)
    assert row.group_window_s == 30
    assert all(getattr(row, k) == v for k, v in stored.items())
    patched = api.patch(f"/api/v1/tenants/acme/notification-endpoints/{eid}",
                        {**{k: v for k, v in stored.items()}, "quiet_period_s": 60},
                        format="json")
    assert patched.status_code == 200, patched.content
    [(field, value)] = stored.items()
    changed = value + ["x\u200by"] if isinstance(value, list) else value + "\u200b"
    refused = api.patch(f"/api/v1/tenants/acme/notification-endpoints/{eid}",
                        {field: changed}, format="json")
    assert refused.status_code == 400 and refused.json()["detail"].startswith(field)


def test_disable_shows_the_reason_and_enable_clears_it(login, acme, adam, vic, endpoints):
    client = login(adam)
    hook = endpoints["hook"]
    page = f"{BASE}{hook.uuid}/"
    assert client.post(page + "edit/", {"enabled": "false"}).status_code == 303
    body = _text(login(vic).get(BASE))
    assert "disabled" in body and "by an admin (the audit log says who)" in body
    # The system disables an endpoint failing for days, with its reason.
    NotificationEndpoint.objects.for_tenant(acme).filter(pk=hook.pk).update(
        disabled_reason="disabled by the system: every delivery failed for more than 5 day(s)")
    for who in (vic, adam):
        body = _text(login(who).get(page))
        assert "every delivery failed for more than 5 day(s)" in body
    assert client.post(page + "test/").status_code == 422  # disabled: no test event
    assert client.post(page + "edit/", {"enabled": "true"}).status_code == 303
    hook.refresh_from_db()
    assert hook.enabled and hook.disabled_reason == ""


@pytest.mark.parametrize("who", ["vic", "rita", "april", "wendy"])
def test_a_non_admin_post_is_403_and_writes_nothing(request, login, acme, endpoints, who):
    client = login(request.getfixturevalue(who))
    uid = endpoints["hook"].uuid
    before = _state(acme)
    for path, data in ((BASE + "new/", FORM),
                       (f"{BASE}{uid}/edit/", {"enabled": "false"}),
                       (f"{BASE}{uid}/rotate/", {}),
                       (f"{BASE}{uid}/delete/", {"confirm": "on"}),
                       (f"{BASE}{uid}/test/", {}),
                       (f"{BASE}{uid}/deliveries/msg_x/resend/", {})):
        assert client.post(path, data).status_code == 403, path
    assert _state(acme) == before


def test_another_tenants_reader_gets_404(login, acme, omar, endpoints):
    client = login(omar)
    assert client.get(BASE).status_code == 404
    assert client.get(f"{BASE}{endpoints['hook'].uuid}/").status_code == 404


def test_delete_needs_the_box_ticked(login, acme, adam, endpoints):
    client = login(adam)
    uid = endpoints["mail"].uuid
    answer = client.post(f"{BASE}{uid}/delete/", {})
    assert answer.status_code == 400 and "confirm: tick the box" in _text(answer)
    assert NotificationEndpoint.objects.for_tenant(acme).filter(uuid=uid).exists()
    answer = client.post(f"{BASE}{uid}/delete/", {"confirm": "on"})
    assert answer.status_code == 303 and answer["Location"] == BASE
    assert not NotificationEndpoint.objects.for_tenant(acme).filter(uuid=uid).exists()


def test_the_delivery_log_shows_each_attempt_and_resend_keeps_the_event_id(
        login, acme, adam, vic, settings):
    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = True
    settings.RECOVERY_NOTIFY_ALLOW_HTTP = True
    settings.RECOVERY_NOTIFY_TIMEOUT_S = 2
    receiver = Receiver()
    try:
        endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body={
            "name": "local", "channel": "webhook", "url": receiver.url,
            "event_types": ["run.needs_review"]})
        client = login(adam)
        page = f"{BASE}{endpoint.uuid}/"
        assert client.post(page + "test/").status_code == 303
        message = NotificationMessage.objects.for_tenant(acme).get()
        receiver.statuses = [500]
        notify.send_due()
        body = _text(client.get(page))
        assert message.event_id in body and "pending" in body and "<strong>500</strong>" in body
        age_world(3600)
        notify.send_due()
        body = _text(login(vic).get(page))
        assert "<strong>200</strong>" in body and "thanks!" in body and "delivered" in body
        assert "Resend" not in body  # the viewer's page has no admin button
        assert client.post(f"{page}deliveries/{message.event_id}/resend/").status_code == 303
        message.refresh_from_db()
        assert message.state == DeliveryState.PENDING
        notify.send_due()
        ids = [h["webhook-id"] for h, _ in receiver.seen]
        assert ids == [message.event_id] * 3  # every try and the resend: the same id
        assert NotificationMessage.objects.for_tenant(acme).count() == 1
    finally:
        receiver.close()


def test_a_response_head_is_escaped(login, acme, adam, endpoints):
    message = services.notification_test(actor=adam, tenant=acme,
                                         endpoint_id=endpoints["hook"].uuid)
    NotificationAttempt.objects.create(tenant=acme, message=message, number=1,
                                       started_at=message.created_at, status_code=500,
                                       latency_ms=12,
                                       response_head="<script>alert(1)</script>" + "z" * 400)
    raw = login(adam).get(f"{BASE}{endpoints['hook'].uuid}/").content.decode()
    assert "<script>alert(1)" not in raw and "&lt;script&gt;alert(1)" in raw
    assert "z" * 200 not in raw.split('title="')[0]  # truncated in the cell


def test_a_grouped_message_shows_its_run_count_and_links_its_runs(login, acme, adam,
                                                                  endpoints):
    runs = [{"id": f"0193a4f2-0000-7000-8000-{i:012d}"} for i in range(12)]
    NotificationMessage.objects.create(
        tenant=acme, endpoint=endpoints["hook"], event_id="msg_grouped",
        event_type="run.needs_review", state=DeliveryState.DELIVERED,
        payload={"type": "run.needs_review", "data": {"run_count": 50, "runs": runs}})
    body = _text(login(adam).get(f"{BASE}{endpoints['hook'].uuid}/"))
    assert "50 runs" in body and "and 40 more" in body
    assert f"/t/acme/runs/{runs[0]['id']}/" in body and runs[11]["id"] not in body
    # (stop 34, an attack's finding) The API's delivery log says the same: the page had
    # the count and the runs, the API neither.
    answer = login(adam).get(f"/api/v1/tenants/acme/notification-endpoints/"
                             f"{endpoints['hook'].uuid}/deliveries").json()["results"]
    [grouped] = [m for m in answer if m["event_id"] == "msg_grouped"]
    assert (grouped["run_count"], grouped["incident"]) == (50, False)
    assert grouped["runs"] == [r["id"] for r in runs[:10]]


@pytest.mark.parametrize("who", ["vic", "adam"])
def test_the_queries_of_a_page_are_bounded(login, acme, adam, endpoints, request, who):
    """The list and the endpoint page cost the same with 1 or 30 messages of 3 attempts."""
    client = login(request.getfixturevalue(who))
    hook = endpoints["hook"]
    page = f"{BASE}{hook.uuid}/"

    def count(path) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path).status_code == 200
        return len(captured)

    def add(n):
        for _ in range(n):
            m = services.notification_test(actor=adam, tenant=acme, endpoint_id=hook.uuid)
            for k in (1, 2, 3):
                NotificationAttempt.objects.create(tenant=acme, message=m, number=k,
                                                   started_at=m.created_at, status_code=500)
    add(1)
    list_small, page_small = count(BASE), count(page)
    add(29)
    assert (count(BASE), count(page)) == (list_small, page_small)
    assert (list_small, page_small) == PINNED[who]


#: Queries per page (list, endpoint page), pinned: the session, the user, the tenant with
#: the caller's rights, the endpoint(s) (the page: its messages, their attempts), the
#: tenant switcher's tenants, the caller's role names; the endpoint page also the database
#: time its relative times are measured against (``dbclock.page_now``). Whatever the
#: number of rows.
PINNED = {"vic": (6, 9), "adam": (6, 9)}
