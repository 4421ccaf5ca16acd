"""The Data page's forms (a newcomer's findings): a refused policy renders the Data page
again, 400, with what was typed and the service's own words (the API's) beside the field
they name, nothing written; the help text of the subject fields speaks of pointers
stored under the old rule only when the policy holds one; the legal holds page places a
hold (tenant-wide, subject, runs) through the service the API uses, for the tenant's
admin only, audited, and a refusal is shown beside its field, nothing written."""

from __future__ import annotations

import html
import json
import unicodedata

import pytest

from checkpoints import services
from checkpoints.dashboard.typed import POLICY_NUMBERS
from checkpoints.jsonparse import JSON_WHITESPACE
from checkpoints.models import AuditEvent, DataPolicy, HeldRun, LegalHold, RunSubject
from tests.helpers import form_fields
from tests.lifecycle.retention_world import completed_run, set_policy

pytestmark = pytest.mark.django_db

DATA, POST = "/t/acme/data/", "/t/acme/data/policy/"
POLICY_API = "/api/v1/tenants/acme/data-policy"


def _text(answer) -> str:
    return html.unescape(answer.content.decode())


def _written(tenant) -> tuple:
    """What a refusal must leave as it was: the policy row and the audit log."""
    row = DataPolicy.objects.for_tenant(tenant).values().first()
    return row, AuditEvent.objects.for_tenant(tenant).count()


def _api_words(api_as, user, body) -> str:
    answer = api_as(user).put(POLICY_API, data=json.dumps(body),
                              content_type="application/json")
    assert answer.status_code == 400, answer.content
    return answer.json()["detail"]


@pytest.mark.parametrize("field, typed, body", [
    ("effect_retention_days", "0", {"effect_retention_days": 0}),
    ("payload_retention_days", "36501", {"payload_retention_days": 36501}),
    ("payload_flag_bytes", "0x1", {"payload_flag_bytes": "0x1"}),
    ("restart_interval_s", "", {"restart_interval_s": None}),
    ("secrets_policy", "shout", {"secrets_policy": "shout"}),
    ("subject_fields", "c = x", {"subject_fields": {"c": "x"}}),
])
def test_a_refused_policy_shows_the_page_again_with_the_services_words_beside_the_field(
        login, api_as, acme, adam, field, typed, body):
    set_policy(acme, payload_retention_days=30)
    client = login(adam)
    form = form_fields(client.get(DATA).content.decode(), "f-data-policy")
    before = _written(acme)
    words = _api_words(api_as, adam, body)  # the API's words for the same value
    sent = dict(form, **{field: typed, "tombstone_retention_days": " 90 "})
    answer = client.post(POST, sent)
    assert answer.status_code == 400
    page = _text(answer)
    assert 'id="f-data-policy"' in page and 'id="tombstones"' in page  # the Data page
    assert "Check the form" not in page
    shown = page.split(f'id="{field}-error"', 1)
    assert len(shown) == 2, page[:4000]
    assert shown[1].split("</div>", 1)[0].endswith(words)  # the service's own words
    again = form_fields(answer.content.decode(), "f-data-policy")
    assert again["tombstone_retention_days"] == " 90 "  # what was typed is kept
    if field != "secrets_policy":  # a select shows its options only
        assert again[field] == typed
    assert _written(acme) == before


#: Every character a person could type around a number that a JSON body would not take
#: there: the controls (Cc), Unicode's spaces (Zs) and line/paragraph separators, the
#: rest of ``str.isspace`` (U+001C-U+001F), a zero-width space and a byte order mark; but
#: JSON's own whitespace (space, tab, CR, LF: ``jsonparse.JSON_WHITESPACE``).
AROUND_A_NUMBER = sorted(
    ({chr(c) for c in range(0x110000)
      if unicodedata.category(chr(c)) in ("Cc", "Zs", "Zl", "Zp") or chr(c).isspace()}
     | {"\u200b", "\ufeff"}) - set(JSON_WHITESPACE))


def test_a_typed_number_with_a_control_or_unicode_space_around_it_is_refused_as_the_api_does(
        login, api_as, acme, adam):
    """Generated over ``AROUND_A_NUMBER``, before and after: ``"30\x0b"`` was read as 30
    (``str.strip``) where the API refuses the same text; now the form refuses it, 400,
    in the API's words beside the field, what was typed kept, nothing written."""
    set_policy(acme, payload_retention_days=30)
    client = login(adam)
    form = form_fields(client.get(DATA).content.decode(), "f-data-policy")
    before = _written(acme)
    field = "payload_retention_days"
    assert len(AROUND_A_NUMBER) > 80
    for ch in AROUND_A_NUMBER:
        for typed in (f"45{ch}", f"{ch}45"):
            # The API's JSON layer refuses U+0000 first ("body.<field>: U+0000 is not
            # allowed"); any other value reaches the service, whose words the form shows.
            words = "must be an integer in 1..36500 or null" if ch == "\x00" else \
                _api_words(api_as, adam, {field: typed})
            answer = client.post(POST, dict(form, **{field: typed}))
            assert answer.status_code == 400, (hex(ord(ch)), _text(answer)[:2000])
            page = _text(answer)
            shown = page.split(f'id="{field}-error"', 1)
            assert len(shown) == 2 and shown[1].split("</div>", 1)[0].endswith(words), hex(
                ord(ch))
            if ch not in "\x00\x0c":  # the HTML reader drops these two; a browser too
                again = form_fields(answer.content.decode(), "f-data-policy")
                assert again[field] == typed, hex(ord(ch))
    assert _written(acme) == before


@pytest.mark.parametrize("field", POLICY_NUMBERS)
def test_json_whitespace_around_a_typed_number_is_what_the_api_takes(
        login, acme, adam, field):
    """The whitespace a JSON body may hold around a number (space, tab, CR, LF) the form
    drops too; ``"\x0b"`` around it is refused on every number of the form."""
    set_policy(acme, payload_retention_days=30)
    client = login(adam)
    form = form_fields(client.get(DATA).content.decode(), "f-data-policy")
    answer = client.post(POST, dict(form, **{field: "400\x0b"}))
    assert answer.status_code == 400
    assert f'id="{field}-error"' in _text(answer)
    answer = client.post(POST, dict(form, **{field: " \t400\r\n"}))
    assert answer.status_code == 303, _text(answer)[:2000]
    assert getattr(DataPolicy.objects.for_tenant(acme).get(), field) == 400


def test_effect_retention_zero_says_what_the_api_says(login, api_as, acme, adam):
    """The newcomer's reproduction: ``effect_retention_days=0`` answered "Ensure this
    value is greater than or equal to 1" on a bare page; the API says "must be an integer
    in 1..36500 or null"."""
    client = login(adam)
    form = form_fields(client.get(DATA).content.decode(), "f-data-policy")
    answer = client.post(POST, dict(form, effect_retention_days="0"))
    assert answer.status_code == 400
    page = _text(answer)
    assert "effect_retention_days: must be an integer in 1..36500 or null" in page
    assert "greater than or equal" not in page
    assert 'id="effect_retention_days-error"' in page
    assert not DataPolicy.objects.for_tenant(acme).exists()


def test_a_saved_policy_still_redirects_and_a_field_left_out_keeps_its_value(login, acme,
                                                                            adam):
    set_policy(acme, payload_retention_days=30, payload_flag_bytes=5000)
    answer = login(adam).post(POST, {"payload_retention_days": "7",
                                     "restart_interval_s": "86400"})
    assert answer.status_code == 303
    row = DataPolicy.objects.for_tenant(acme).get()
    assert (row.payload_retention_days, row.payload_flag_bytes) == (7, 5000)


def test_the_old_pointer_sentence_shows_only_when_such_a_pointer_is_stored(login, acme,
                                                                           adam):
    set_policy(acme, subject_fields={"customer": "/customer/id"})
    page = login(adam).get(DATA).content.decode()
    assert "identify a person" in page
    assert 'id="subject_fields-old"' not in page
    assert "escaped, was stored before" not in page  # the old wording is gone
    DataPolicy.objects.for_tenant(acme).update(  # as an old release stored it
        subject_fields={"customer": "/customer/id", "x": "/a\nb"})
    page = login(adam).get(DATA).content.decode()
    assert 'id="subject_fields-old"' in page and "A pointer shown in quotes" in page


HOLDS, PLACE = "/t/acme/legal-holds/", "/t/acme/legal-holds/place/"


def _holds_written(tenant) -> tuple:
    return (LegalHold.objects.for_tenant(tenant).count(),
            HeldRun.objects.for_tenant(tenant).count(),
            AuditEvent.objects.for_tenant(tenant).count())


def test_the_data_pages_place_link_leads_to_a_form_that_places_a_hold(login, acme, adam,
                                                                      wendy):
    """The Data page says "every hold, place or release" to the admin: the page it links
    to places one, on runs, on a subject or on the whole tenant, through the service the
    API uses (one ``legal_hold.place`` audit event each)."""
    set_policy(acme, subject_fields={"customer": "/customer/id"})
    run = completed_run(wendy, acme)
    client = login(adam)
    assert 'href="/t/acme/legal-holds/">every hold, place or release' in (
        client.get(DATA).content.decode())
    page = client.get(HOLDS).content.decode()
    assert 'id="f-hold-place"' in page and 'action="/t/acme/legal-holds/place/"' in page
    for body in ({"scope": "runs", "runs": f"\r\n{run.uuid}\r\n", "reason": "case 7"},
                 {"scope": "subject", "subject_field": "customer", "subject_value": "C-42",
                  "reason": "case 8"},
                 {"scope": "tenant", "reason": "case 9"}):
        answer = client.post(PLACE, body)
        assert answer.status_code == 303 and answer["Location"] == HOLDS, _text(answer)[:2000]
    holds = {h.reason: h for h in LegalHold.objects.for_tenant(acme)}
    assert holds["case 7"].scope == "runs" and holds["case 7"].run_uuids == [str(run.uuid)]
    assert HeldRun.objects.for_tenant(acme).get().run_uuid == run.uuid
    assert (holds["case 8"].scope, holds["case 8"].subject_field) == ("subject", "customer")
    assert "C-42" not in json.dumps([h.subject_digest for h in holds.values()])
    assert holds["case 9"].scope == "tenant"
    events = AuditEvent.objects.for_tenant(acme).filter(action="legal_hold.place")
    assert sorted(e.reason for e in events) == ["case 7", "case 8", "case 9"]
    assert all(e.actor_id == adam.pk for e in events)
    listed = client.get(HOLDS).content.decode()
    assert "C-42" not in listed and "every run of the tenant" in listed


@pytest.mark.parametrize("length", [256, 257, 4096])
def test_the_hold_form_takes_a_subject_value_as_typed_at_any_length_the_index_takes(
        login, acme, adam, length):
    """The subject index takes a string of any length, unstripped
    (``services.subject_value``): so does the form, sent as typed to the service, and
    its input sets no ``maxlength`` of its own (it was 256, the old limit)."""
    set_policy(acme, subject_fields={"customer": "/customer/id"})
    value = (" C-42\u00e9 " * length)[:length]
    client = login(adam)
    page = client.get(HOLDS).content.decode()
    field = page[page.index('id="hold-subject_value"'):]
    assert "maxlength" not in field[:field.index(">")]
    answer = client.post(PLACE, {"scope": "subject", "subject_field": "customer",
                                 "subject_value": value, "reason": "case 8"})
    assert answer.status_code == 303, _text(answer)[:2000]
    assert LegalHold.objects.for_tenant(acme).get().subject_digest \
        == services.subject_digest(acme, "customer", value)


def test_the_hold_form_holds_a_subject_value_over_several_lines_as_the_payload_holds_it(
        login, acme, adam, wendy):
    """A subject value with a line break (a payload's ``"A-1\\nB-2"``) was refused by
    the page's one-line input (a browser drops its line breaks): only the API could hold
    it. The field is a textarea; a browser sends its line breaks as CR LF, which the form
    reads as the payload's LF (``forms.textarea_value``), so the hold covers the run whose
    payload holds that value; a lone CR or LF from a client that is no browser is kept."""
    set_policy(acme, subject_fields={"order": "/order_id"})
    run = completed_run(wendy, acme, order_id="A-1\nB-2")
    indexed = RunSubject.objects.for_tenant(acme).get(run=run, field="order").digest
    assert indexed == services.subject_digest(acme, "order", "A-1\nB-2")
    client = login(adam)
    form = form_fields(client.get(HOLDS).content.decode(), "f-hold-place")
    assert form["subject_value"] == ""
    page = client.get(HOLDS).content.decode()
    assert '<textarea id="hold-subject_value" name="subject_value"' in page
    for typed, held in (("A-1\r\nB-2", "A-1\nB-2"), ("x\ry", "x\ry"), ("x\ny", "x\ny"),
                        (" C-42 ", " C-42 ")):
        answer = client.post(PLACE, {**form, "scope": "subject", "subject_field": "order",
                                     "subject_value": typed, "reason": repr(typed)})
        assert answer.status_code == 303, _text(answer)[:2000]
        hold = LegalHold.objects.for_tenant(acme).get(reason=repr(typed))
        assert hold.subject_digest == services.subject_digest(acme, "order", held)
    assert LegalHold.objects.for_tenant(acme).get(
        reason=repr("A-1\r\nB-2")).subject_digest == indexed
    # A line break before or after the value (an Enter typed after it) is refused, not
    # held as a subject no payload holds (the stop-37 attack).
    for typed in ("C-42\r\n", "\r\nC-42", "C-42\n", "\rC-42"):
        answer = client.post(PLACE, {**form, "scope": "subject", "subject_field": "order",
                                     "subject_value": typed, "reason": "enter"})
        assert answer.status_code == 400 and "subject.value: a line break" in _text(answer)
    assert not LegalHold.objects.for_tenant(acme).filter(reason="enter").exists()


@pytest.mark.parametrize("body, field, words", [
    ({"scope": "runs", "runs": "not-a-run"}, "runs", "runs: "),
    ({"scope": "runs", "runs": ""}, "runs", "runs: name at least one run"),
    ({"scope": "subject", "subject_field": "nobody", "subject_value": "C-42"},
     "subject_field", "subject.field: 'nobody' is not a subject field"),
    ({"scope": "subject", "subject_field": "customer", "subject_value": ""},
     "subject_value", "subject.value: must be a non-empty string or an integer"),
    ({"scope": "tenant", "reason": "  "}, "reason", "reason: a reason is required"),
    ({"scope": "sky"}, "runs", "runs: give exactly one of runs, subject or tenant"),
    # A field posted twice is refused, not the last value taken (forms.posted; stop 35).
    ({"scope": ["runs", "tenant"]}, "scope", "scope: given more than once"),
])
def test_a_refused_hold_is_shown_beside_its_field_and_nothing_is_written(
        login, acme, adam, body, field, words):
    set_policy(acme, subject_fields={"customer": "/customer/id"})
    before = _holds_written(acme)
    answer = login(adam).post(PLACE, {"reason": "case 7", **body})
    assert answer.status_code == 400
    page = _text(answer)
    assert f'id="hold-{field}-error"' in page and words in page, page[:4000]
    assert 'id="f-hold-place"' in page and "Check the form" not in page
    assert "C-42" not in page  # the subject value is not echoed
    typed = form_fields(answer.content.decode(), "f-hold-place")
    assert typed["reason"] == body.get("reason", "case 7")
    assert _holds_written(acme) == before


@pytest.mark.parametrize("who, status", [("vic", 403), ("rita", 403), ("april", 403),
                                         ("wendy", 403), ("omar", 404)])
def test_only_the_tenants_admin_places_a_hold_and_sees_the_form(request, login, acme, who,
                                                                status):
    user = request.getfixturevalue(who)
    before = _holds_written(acme)
    answer = login(user).post(PLACE, {"scope": "tenant", "reason": "x"})
    assert answer.status_code == status
    assert _holds_written(acme) == before
    if status == 403:
        assert 'id="f-hold-place"' not in login(user).get(HOLDS).content.decode()
