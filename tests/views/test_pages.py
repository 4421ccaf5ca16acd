"""Dashboard pages: login, home redirect, tenant switcher, inbox, run page, report, audit."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.urls import reverse

from checkpoints import services
from checkpoints.dbclock import db_now
from checkpoints.models import AuditEvent, AuditLeaf, AuditPending
from tests.security import tampering
from tests.views.conftest import make_stuck_run

pytestmark = pytest.mark.django_db


def test_it_redirects_anonymous_users_to_the_login_page(client, acme):
    response = client.get(reverse("run_list", args=["acme"]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_sends_htmx_requests_of_an_expired_session_to_login_with_a_client_redirect(client, acme):
    response = client.get(reverse("run_list", args=["acme"]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("login"))


def test_it_logs_in_with_a_password_and_lands_on_the_first_tenants_inbox(client, rita):
    page = client.get(reverse("login"))
    assert page.status_code == 200 and b"Log in" in page.content
    response = client.post(reverse("login"), {"username": "rita", "password": "pw-for-tests"},
                           follow=True)
    assert response.redirect_chain[-1][0] == reverse("run_list", args=["acme"])


def test_it_shows_a_clear_error_for_a_wrong_password(client, rita):
    response = client.post(reverse("login"), {"username": "rita", "password": "nope"})
    assert response.status_code == 200
    assert b"did not match" in response.content


def test_it_lists_only_tenants_where_the_user_has_a_role(login, rita, omar, globex):
    page = login(rita).get(reverse("run_list", args=["acme"])).content.decode()
    assert reverse("run_list", args=["acme"]) in page
    assert reverse("run_list", args=["globex"]) not in page


def test_it_tells_an_account_without_a_role_that_it_has_none(login, django_user_model, db):
    lone = django_user_model.objects.create_user("lone", password="x")
    response = login(lone).get("/")
    assert response.status_code == 200
    assert b"no role in any tenant" in response.content


def test_it_defaults_the_inbox_to_the_ambiguous_tab_with_counts(login, rita, stuck):
    response = login(rita).get(reverse("run_list", args=["acme"]))
    assert response.status_code == 200
    assert response.context["state"] == "ambiguous"
    assert [r["uuid"] for r in response.context["rows"]] == [stuck.run_id]
    tabs = {value: n for value, _, n in response.context["tabs"]}
    assert tabs["ambiguous"] == 1 and tabs["healthy"] == 0
    assert str(stuck.run_id)[:8] in response.content.decode()


def test_it_renders_the_counts_fragment(login, rita, stuck):
    # The tabs no longer poll their counts apart from the list (issue 21, item 8: they
    # disagreed with it); the fragment still answers, and the inbox polls "n new runs".
    response = login(rita).get(reverse("run_counts", args=["acme"]), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<nav id="tabs"') and "every 10s" not in body
    assert "<html" not in body


def test_it_renders_only_the_inbox_fragment_for_htmx(login, rita, stuck):
    response = login(rita).get(reverse("run_list", args=["acme"]), {"state": "all"},
                               HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="inbox-main">') and "<html" not in body


def test_it_filters_the_inbox_by_kind_subject_and_age(login, rita, stuck):
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    assert len(client.get(url, {"kind": "acme.order"}).context["rows"]) == 1
    assert client.get(url, {"kind": "runifold.agent"}).context["rows"] == []
    assert len(client.get(url, {"subject": "acme"}).context["rows"]) == 1
    assert client.get(url, {"subject": "no-such-workflow"}).context["rows"] == []
    assert client.get(url, {"age": "86400"}).context["rows"] == []


def test_it_paginates_the_inbox_by_keyset_cursor(login, rita, acme, wendy):
    for i in range(3):
        make_stuck_run(wendy, acme, order_id=f"A-{i}", key=f"charge:A-{i}")
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    seen = []
    cursor = ""
    for _ in range(3):
        response = client.get(url, {"cursor": cursor} if cursor else {})
        rows = response.context["rows"]
        seen += [r["uuid"] for r in rows]
        cursor = response.context["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == 3


def test_it_answers_400_naming_the_field_for_a_bad_filter_or_cursor(login, rita, acme):
    client = login(rita)
    url = reverse("run_list", args=["acme"])
    bad_state = client.get(url, {"state": "nope"})
    assert bad_state.status_code == 400 and b"state:" in bad_state.content
    bad_cursor = client.get(url, {"cursor": "!!!"})
    assert bad_cursor.status_code == 400 and b"cursor:" in bad_cursor.content
    bad_age = client.get(url, {"age": "7"})
    assert bad_age.status_code == 400 and b"age:" in bad_age.content


def test_it_shows_identity_lease_timeline_effects_and_audit_on_the_run_page(login, rita, stuck):
    response = login(rita).get(reverse("run_detail", args=["acme", stuck.run_id]))
    body = response.content.decode()
    assert response.status_code == 200
    assert str(stuck.run_id) in body and "acme.order" in body
    assert ">charging<" in body and ">ready<" in body  # timeline
    assert "order A-1042" not in body  # labels carry no payload value (issue 6)
    assert "charge:A-1042" in body and "unresolved" in body  # effect
    assert "effect.unresolved" in body and "run.ambiguous" in body  # audit trail
    assert "2599" not in body  # payloads stay hidden until revealed


def test_it_answers_404_for_a_malformed_or_unknown_run_id(login, rita, acme):
    client = login(rita)
    assert client.get(reverse("run_detail", args=["acme", "not-a-uuid"])).status_code == 404
    assert client.get(reverse("run_detail", args=["acme", uuid.uuid4()])).status_code == 404


def test_it_renders_the_run_audit_fragment(login, rita, stuck):
    response = login(rita).get(reverse("run_audit", args=["acme", stuck.run_id]),
                               HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert body.lstrip().startswith('<section class="card" id="audit-panel"')
    assert 'hx-trigger="audit-changed from:body"' in body


def test_it_shows_the_report_with_runs_per_state(login, vic, stuck):
    response = login(vic).get(reverse("report", args=["acme"]))
    assert response.status_code == 200
    assert response.context["data"]["runs"]["ambiguous"] == 1
    assert response.context["data"]["effects"] == {"unresolved": 1}


def test_it_filters_the_audit_log_by_actor_action_and_run(login, vic, stuck, acme, wendy):
    other = make_stuck_run(wendy, acme, order_id="B-1", key="charge:B-1")
    client = login(vic)
    url = reverse("audit_log", args=["acme"])
    by_action = client.get(url, {"action": "run.ambiguous"}).context["events"]
    assert {e.action for e in by_action} == {"run.ambiguous"} and len(by_action) == 2
    by_run = client.get(url, {"run": str(other.run_id)}).context["events"]
    assert by_run and {e.run_uuid for e in by_run} == {other.run_id}
    by_actor = client.get(url, {"actor": "wendy"}).context["events"]
    assert by_actor and {e.actor_name for e in by_actor} == {"wendy"}
    assert client.get(url, {"run": "zzz"}).status_code == 400


def test_it_pages_the_audit_log_backwards(login, vic, stuck, acme):
    total = AuditEvent.objects.filter(tenant=acme).count()
    client = login(vic)
    url = reverse("audit_log", args=["acme"])
    first = client.get(url).context
    assert len(first["events"]) == min(total, 100)
    assert first["older"] is None  # fewer than a page here
    older = client.get(url, {"before": first["events"][2].seq}).context["events"]
    assert [e.seq for e in older] == [e.seq for e in first["events"][3:]]


def test_the_audit_log_says_how_far_its_events_are_sealed(login, vic, stuck, acme):
    """Issue 22, item 1: the integration state in words, on the database clock."""
    client = login(vic)
    url = reverse("audit_log", args=["acme"])
    queued = AuditPending.objects.filter(tenant=acme).count()
    assert queued > 1
    response = client.get(url)
    sealing = response.context["sealing"]
    assert sealing["pending"] == queued and not sealing["late"]
    assert sealing["words"].startswith(f"{queued} events waiting to be sealed, oldest ")
    assert "No signed head yet." in response.content.decode()
    then = db_now() - timedelta(seconds=287)
    tampering.raw("UPDATE checkpoints_auditpending SET queued_at = %s WHERE tenant_id = %s",
                  [then, acme.pk])
    response = client.get(url)
    assert response.context["sealing"]["words"] == (
        f"{queued} events waiting to be sealed, oldest 4 min 47 s")
    assert response.context["sealing"]["late"]
    assert "The audit sequencer seems stopped" in response.content.decode()
    services.audit_integrate(acme)
    response = client.get(url)
    body = response.content.decode()
    size = AuditLeaf.objects.filter(tenant=acme).count()
    assert "All events sealed in the signed log." in body
    assert f"Newest signed head: {size} events of this tenant, signed <time" in body
    assert "its id across the whole service" in body  # why # runs ahead of the count
    assert "seems stopped" not in body
