"""Every subject value a write indexes can be held and erased by value, and a value a
hold or an erasure request refuses is one no write ever indexed: one rule,
``services.subject_value`` (docs/security/erasure.md, "What a subject value is").

Until it, the subject index took a string of any length (and any integer) while a hold
and an erasure request took 1..256 characters (and integers under 10^18): a data subject
whose identifier was longer could be neither held nor erased by value. Run on SQLite and
on PostgreSQL (``DATABASE_URL``)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from checkpoints import services
from checkpoints.exceptions import InvalidPayload
from checkpoints.models import DataPolicy, ErasureRequest, LegalHold, Run, RunSubject
from checkpoints.services.lifecycle import Blocker, subject_rows
from tests.helpers import envelope
from tests.lifecycle.test_erasure_holds import completed_run, declare

pytestmark = pytest.mark.django_db
BASE = "/api/v1/tenants/acme/"
FIELDS = {"customer": "/customer/id"}


def post(client, path, body):
    return client.post(BASE + path, json.dumps(body), content_type="application/json")


def value_of(length: int) -> str:
    """A subject value of ``length`` characters that no normalisation leaves alone: a
    leading and a trailing space, upper case, a decomposed "é", a 4-byte character."""
    pattern = " Ann.E\u0301-\U0001f600 "
    return (pattern * (length // len(pattern) + 1))[:length]


def indexed(tenant, run: Run) -> set[str]:
    return set(RunSubject.objects.for_tenant(tenant).filter(run=run)
               .values_list("digest", flat=True))


def held(run: Run) -> bool:
    return Blocker.HELD in services.run_blockers(run)


#: The lengths around the old limit (256) and well past it; the longest a checkpoint
#: body carries is ``test_the_longest_value_a_body_carries_…``'s.
LENGTHS = [1, 2, 255, 256, 257, 512, 1024, 4096, 65_536]


@pytest.mark.parametrize("value", [value_of(n) for n in LENGTHS]
                         + [10**18, -(10**30), 2**63, 0],
                         ids=[f"len{n}" for n in LENGTHS] + ["1e18", "-1e30", "2^63", "zero"])
def test_every_value_a_write_indexes_is_held_and_erased_by_value(
        acme, wendy, adam, rita, april, api_as, value):
    declare(acme, FIELDS)
    run = completed_run(wendy, acme, customer=value)
    mine = services.subject_digest(acme, "customer", str(value))
    assert indexed(acme, run) == {mine}
    other = completed_run(wendy, acme, customer=f"{value}x")  # one character more
    subject = {"field": "customer", "value": value}
    r = post(api_as(adam), "legal-holds", {"subject": subject, "reason": "case 9"})
    assert r.status_code == 201, r.content
    assert LegalHold.objects.for_tenant(acme).get().subject_digest == mine
    assert held(run) and not held(other)
    r = post(api_as(rita), "erasure-requests", {"subject": subject, "reason": "art. 17"})
    assert r.status_code == 201, r.content
    r = post(api_as(april), f"erasure-requests/{r.json()['id']}/approve", {})
    assert r.status_code == 200, r.content
    # The index found exactly the subject's run; the hold kept it.
    assert r.json()["counts"] == {"runs": 1, "erased": 0, "blocked": 1, "legal_hold": 1,
                                  "not_ended": 0, "effect_in_doubt": 0, "already_deleted": 0}
    if isinstance(value, int):  # its digits are the same subject
        assert services.legal_hold_place(actor=adam, tenant=acme, reason="digits", subject={
            "field": "customer", "value": str(value)}).subject_digest == mine


def test_the_longest_value_a_body_carries_is_held_and_erased_by_value(
        acme, wendy, adam, rita, api_as):
    """The only bound on a subject value is the body's (``RECOVERY_MAX_BODY_BYTES``): the
    longest value a checkpoint PUT can carry is indexed, and a hold and an erasure
    request carry it too (their bodies hold less around it)."""
    declare(acme, FIELDS)
    limit = settings.RECOVERY_MAX_BODY_BYTES
    body = envelope(payload={"phase": "ready", "customer": {"id": ""}})

    def raw(value: str) -> bytes:
        return json.dumps({**body, "payload": {"phase": "ready", "customer": {"id": value}}},
                          separators=(",", ":")).encode()

    longest = "v" * (limit - len(raw("")))
    writer = api_as(wendy)

    def put(value):
        return writer.put(BASE + f"checkpoints/{body['id']}", raw(value),
                          content_type="application/json", HTTP_IF_NONE_MATCH="*")

    assert put(longest + "v").status_code == 413
    assert put(longest).status_code == 201
    run = Run.objects.for_tenant(acme).get(uuid=body["run_id"])
    assert indexed(acme, run) == {services.subject_digest(acme, "customer", longest)}
    subject = {"field": "customer", "value": longest}
    r = post(api_as(adam), "legal-holds", {"subject": subject, "reason": "case 9"})
    assert r.status_code == 201, r.content
    assert held(run)
    r = post(api_as(rita), "erasure-requests", {"subject": subject, "reason": "art. 17"})
    assert r.status_code == 201, r.content
    assert ErasureRequest.objects.for_tenant(acme).get().subject_digest \
        == services.subject_digest(acme, "customer", longest)


#: What no write indexes (the payload's value at the declared pointer).
NEVER_INDEXED = ["", None, True, False, 1.5, -0.0, {"id": "c-1"}, ["c-1"]]


@pytest.mark.parametrize("value", NEVER_INDEXED, ids=repr)
def test_a_value_no_write_indexes_is_refused_naming_subject_value(
        acme, wendy, adam, rita, api_as, value):
    declare(acme, FIELDS)
    run = completed_run(wendy, acme, customer=value)
    assert indexed(acme, run) == set()
    subject = {"field": "customer", "value": value}
    for who, path in ((adam, "legal-holds"), (rita, "erasure-requests")):
        r = post(api_as(who), path, {"subject": subject, "reason": "x"})
        assert r.status_code == 400, r.content
        assert r.json()["detail"].startswith("subject.value: "), r.json()
    assert not LegalHold.objects.for_tenant(acme).exists()
    assert not ErasureRequest.objects.for_tenant(acme).exists()


@pytest.mark.parametrize("raw", ['"a\\u0000b"', '"\\ud800"'], ids=["nul", "surrogate"])
def test_text_no_payload_can_hold_is_refused_naming_subject_value(acme, adam, api_as, raw):
    """A payload never holds such text (the body's JSON is refused, ``jsonparse``), and
    neither does a hold: the API's body names ``body.subject.value``, the service (the
    dashboard's way in) ``subject.value``."""
    declare(acme, FIELDS)
    body = '{"subject": {"field": "customer", "value": ' + raw + '}, "reason": "x"}'
    r = api_as(adam).post(BASE + "legal-holds", body, content_type="application/json")
    assert r.status_code == 400 and r.json()["detail"].startswith("body.subject.value: ")
    with pytest.raises(InvalidPayload) as caught:
        services.legal_hold_place(actor=adam, tenant=acme, reason="x", subject={
            "field": "customer", "value": json.loads(raw)})
    assert caught.value.detail.startswith("subject.value: ")


_ANY_VALUE = st.one_of(st.text(max_size=400), st.integers(), st.floats(allow_nan=False),
                       st.booleans(), st.none(), st.lists(st.text(max_size=3), max_size=2))


@hsettings(max_examples=60, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_ANY_VALUE)
def test_a_hold_takes_exactly_the_values_a_write_indexes_under_their_digest(acme, adam, value):
    """Generated: for any JSON value at a subject's pointer, the write path's rows
    (``subject_rows``) and a hold by that value agree: indexed -> the hold is placed
    with the indexed digest; not indexed -> 400 naming ``subject.value``."""
    DataPolicy.objects.update_or_create(tenant=acme, defaults={"subject_fields": FIELDS})
    rows = subject_rows(tenant=acme, run_pk=1, payload={"customer": {"id": value}},
                                 fields=FIELDS)
    subject = {"field": "customer", "value": value}
    if rows:
        hold = services.legal_hold_place(actor=adam, tenant=acme, subject=subject, reason="x")
        assert hold.subject_digest == rows[0].digest
    else:
        with pytest.raises(InvalidPayload) as caught:
            services.legal_hold_place(actor=adam, tenant=acme, subject=subject, reason="x")
        assert caught.value.detail.startswith("subject.value: ")
