"""Stop 37's third attack, on ca823a3..73a56c3: ``POST …/lease/revoke``'s optional
``fencing_token`` (``services.lease_revoke``'s ``expected_token``), the run page's "End the
lease" form that sends it (``LeaseRevokeForm``, ``actions.run_lease_revoke``), the forms'
helpers moved to ``dashboard/typed.py``.

A finding is ``xfail(strict=True)`` with its reason (it fails today, passes once fixed);
a probe that held is ``test_PASS_…``."""

from __future__ import annotations

import html

import pytest

from checkpoints.models import AuditEvent, Run
from tests.api.apihelpers import post
from tests.attack.test_stop37_attack2 import _form_owner, _leased, _login, _page, _revoke_url
from tests.views.test_access import _snapshot

pytestmark = pytest.mark.django_db

API_WORDS = "fencing_token: must be an integer in 0..9223372036854775807"


def _form_post(client, run_id, token, **extra):
    data = {"reason": "node gone", "confirm": "yes", "owner": "worker-1",
            "fencing_token": token, **extra}
    return client.post(_revoke_url(run_id), data, **({"HTTP_HX_REQUEST": "true"}
                                                      if extra.pop("hx", None) else {}))


def _api(api_as, user, run_id, body, query=""):
    return post(api_as(user), "acme", f"runs/{run_id}/lease/revoke{query}", body)


# ---- kind: outside data as strict as bodies / values that fit (form) ------------------

# Was a FINDING (fixed in this stop): the form reads fencing_token with Django's IntegerField, which takes '1.0', ' 1 ', '１' (fullwidth) and '1_0' as integers the API refuses (\"1\", 1.0 a…
@pytest.mark.parametrize("typed", ["1.0", " 1 ", "\uff11", "0_1"])
def test_the_form_refuses_a_token_text_the_api_refuses(acme, wendy, rita, typed):
    run_id = _leased(acme, wendy)
    assert Run.objects.get(uuid=run_id).fencing_token == 1
    response = _form_post(_login(rita), run_id, typed)
    assert response.status_code == 400, response.status_code
    assert Run.objects.get(uuid=run_id).fencing_token == 1


# ---- kind: one rule in one place (same tokens, same words) ---------------------------

# Was a FINDING (fixed in this stop): the form refuses -1 / 2**63 in Django's words ('Ensure this value is greater than or equal to 0.'), the API in intranges.FENCING_TOKEN's ('must be an …
@pytest.mark.parametrize("bad", [-1, 2**63])
def test_the_form_and_the_api_refuse_a_token_in_the_same_words(acme, wendy, rita, api_as, bad):
    run_id = _leased(acme, wendy)
    r = _api(api_as, rita, run_id, {"reason": "x", "fencing_token": bad})
    assert r.status_code == 400 and r.json()["detail"] == API_WORDS
    response = _form_post(_login(rita), run_id, str(bad))
    assert response.status_code == 400
    assert API_WORDS in html.unescape(response.content.decode())


# Was a FINDING (fixed in this stop): fencing_token posted twice to the form (fencing_token=0&fencing_token=1) is not refused 'given more than once' as typed.posted / a duplicated JSON key…
def test_the_form_refuses_a_token_given_twice(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    response = _login(rita).post(
        _revoke_url(run_id),
        "reason=gone&confirm=yes&owner=worker-1&fencing_token=0&fencing_token=1",
        content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400, response.status_code
    assert Run.objects.get(uuid=run_id).fencing_token == 1


# ---- kinds that held ---------------------------------------------------------------

@pytest.mark.parametrize("bad", [True, False, 1.0, 1.5, "1", 2**63, -1, [1], {"a": 1}])
def test_PASS_the_api_refuses_every_token_that_is_no_int_in_range(acme, wendy, rita, api_as,
                                                                  bad):
    run_id = _leased(acme, wendy)
    r = _api(api_as, rita, run_id, {"reason": "x", "fencing_token": bad})
    assert r.status_code == 400 and r.json()["detail"] == API_WORDS, (bad, r.content)
    assert Run.objects.get(uuid=run_id).fencing_token == 1


def test_PASS_the_api_takes_the_right_token(acme, wendy, rita, api_as):
    run_id = _leased(acme, wendy)
    r = _api(api_as, rita, run_id, {"reason": "x", "fencing_token": 1})
    assert r.status_code == 200 and r.json()["fencing_token"] == 2


def test_PASS_a_query_parameter_on_the_api_revoke_is_refused(acme, wendy, rita, api_as):
    run_id = _leased(acme, wendy)
    r = _api(api_as, rita, run_id, {"reason": "x"}, query="?fencing_token=0")
    assert r.status_code == 400, r.content
    assert Run.objects.get(uuid=run_id).fencing_token == 1


def test_PASS_get_on_the_revoke_writes_nothing(acme, wendy, rita, api_as):
    run_id = _leased(acme, wendy)
    page, api = _login(rita), api_as(rita)
    before = _snapshot(acme)
    assert page.get(_revoke_url(run_id) + "?fencing_token=1&reason=x&confirm=yes"
                            "&owner=worker-1").status_code == 405
    assert api.get(f"/api/v1/tenants/acme/runs/{run_id}/lease/revoke"
                            ).status_code == 405
    assert _snapshot(acme) == before


@pytest.mark.parametrize("who", ["vic", "wendy", "omar"])
def test_PASS_rights_come_from_the_tenant_grants(acme, wendy, rita, vic, omar, api_as, who):
    run_id = _leased(acme, wendy)
    user = {"vic": vic, "wendy": wendy, "omar": omar}[who]
    response = _form_post(_login(user), run_id, "1")
    assert response.status_code in (403, 404), response.status_code
    assert _api(api_as, user, run_id, {"reason": "x", "fencing_token": 1}
                ).status_code in (403, 404)
    assert Run.objects.get(uuid=run_id).fencing_token == 1


@pytest.mark.parametrize("token", ["-1", "7"])
def test_PASS_the_forms_refusals_say_vary_hx_request(acme, wendy, rita, token):
    run_id = _leased(acme, wendy)
    for hx in (False, True):
        response = _login(rita).post(
            _revoke_url(run_id), {"reason": "x", "confirm": "yes", "owner": "worker-1",
                                  "fencing_token": token},
            **({"HTTP_HX_REQUEST": "true"} if hx else {}))
        assert response.status_code in (400, 409)
        assert "HX-Request" in response.get("Vary", ""), (hx, response.get("Vary"))


def test_PASS_the_api_and_the_page_show_the_same_token(acme, wendy, rita, api_as):
    """The 409's detail names the live token; the page a reviewer sees shows it anyway."""
    run_id = _leased(acme, wendy)
    page = _login(rita).get(_page(run_id)).content.decode()
    assert _form_owner(page, "fencing_token") == "1"
    r = _api(api_as, rita, run_id, {"reason": "x", "fencing_token": 0})
    assert r.status_code == 409 and "(token 1)" in r.json()["detail"]


def test_PASS_the_form_ends_the_lease_on_the_database_clock(acme, wendy, rita):
    run_id = _leased(acme, wendy)
    response = _form_post(_login(rita), run_id, "1")
    assert response.status_code == 303
    run = Run.objects.get(uuid=run_id)
    event = AuditEvent.objects.get(action="lease.revoke")
    assert run.fencing_token == 2 and run.lease_expires_at == event.created_at
