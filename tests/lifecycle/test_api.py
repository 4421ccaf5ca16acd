"""The HTTP side of legal holds and erasure requests (CONTRACT.md 8; issue 20, items 2
and 4): shapes, status codes, the four-eyes refusal, 409 on a second decision, 400
naming the field, and no subject value in any answer."""

from __future__ import annotations

import json
import uuid

import pytest

from checkpoints.models import DataPolicy
from tests.lifecycle.test_erasure_holds import FIELDS, SECRET_CUSTOMER, completed_run

pytestmark = pytest.mark.django_db
BASE = "/api/v1/tenants/acme/"


def post(client, path, body):
    return client.post(BASE + path, json.dumps(body), content_type="application/json")


def test_a_hold_through_the_api(acme, wendy, adam, vic, api_as):
    run = completed_run(wendy, acme)
    admin = api_as(adam)
    r = post(admin, "legal-holds", {"runs": [str(run.uuid)], "reason": "case 9"})
    assert r.status_code == 201, r.content
    hold = r.json()
    assert (hold["scope"], hold["runs"], hold["active"]) == ("runs", [str(run.uuid)], True)
    assert hold["released_at"] is None and hold["placed_by"] == "adam"
    viewer = api_as(vic)
    listed = viewer.get(BASE + "legal-holds").json()["results"]
    assert [h["id"] for h in listed] == [hold["id"]]
    assert viewer.get(BASE + f"legal-holds/{hold['id']}").json() == hold
    assert post(viewer, f"legal-holds/{hold['id']}/release", {"reason": "x"}).status_code == 403
    r = post(admin, f"legal-holds/{hold['id']}/release", {"reason": "settled"})
    assert r.status_code == 200 and r.json()["active"] is False
    assert r.json()["release_reason"] == "settled"
    r = post(admin, f"legal-holds/{hold['id']}/release", {"reason": "again"})
    assert (r.status_code, r.json()["error"]) == (409, "already_decided")
    assert viewer.get(BASE + f"legal-holds/{uuid.uuid4()}").status_code == 404
    assert viewer.get(BASE + "legal-holds/nope").status_code == 404


def test_an_erasure_through_the_api_four_eyes_and_no_subject_value(acme, wendy, rita, april,
                                                                   api_as):
    DataPolicy.objects.create(tenant=acme, subject_fields=FIELDS)
    completed_run(wendy, acme)
    reviewer, approver = api_as(rita), api_as(april)
    r = post(reviewer, "erasure-requests",
             {"subject": {"field": "customer", "value": SECRET_CUSTOMER}, "reason": "art. 17"})
    assert r.status_code == 201, r.content
    made = r.json()
    assert (made["state"], made["subject_field"], made["counts"]) == ("requested", "customer",
                                                                      None)
    r = post(reviewer, f"erasure-requests/{made['id']}/approve", {})
    assert r.status_code == 403  # a reviewer has no approval right
    r = post(approver, f"erasure-requests/{made['id']}/approve", {"reason": "verified"})
    assert r.status_code == 200, r.content
    done = r.json()
    assert done["state"] == "executed" and done["counts"]["erased"] == 1
    assert done["decided_by"] == "april" and done["decision_reason"] == "verified"
    r = post(approver, f"erasure-requests/{made['id']}/reject", {"reason": "late"})
    assert (r.status_code, r.json()["error"]) == (409, "already_decided")
    listed = reviewer.get(BASE + "erasure-requests")
    assert [x["id"] for x in listed.json()["results"]] == [made["id"]]
    for answer in (made, done, listed.json()):
        assert SECRET_CUSTOMER not in json.dumps(answer)


def test_the_requester_is_refused_with_a_clear_error(acme, wendy, adam, api_as):
    run = completed_run(wendy, acme)
    admin = api_as(adam)
    made = post(admin, "erasure-requests", {"runs": [str(run.uuid)], "reason": "x"}).json()
    r = post(admin, f"erasure-requests/{made['id']}/approve", {})
    assert r.status_code == 403
    assert "requester may not approve" in r.json()["detail"]


@pytest.mark.parametrize("path,body,named", [
    ("legal-holds", {"reason": "x"}, "runs"),
    ("legal-holds", {"runs": None, "reason": "x"}, "runs"),
    ("legal-holds", {"tenant": False, "reason": "x"}, "tenant"),
    ("legal-holds", {"tenant": True}, "reason"),
    ("legal-holds", {"tenant": True, "reason": "x", "extra": 1}, "extra"),
    ("legal-holds", {"tenant": True, "runs": [], "reason": "x"}, "runs"),
    ("legal-holds", {"subject": {"field": "customer", "value": SECRET_CUSTOMER, "v": 1},
                     "reason": "x"}, "subject.v"),
    ("legal-holds", {"runs": ["x"], "reason": "x"}, "runs"),
    ("legal-holds", {"tenant": True, "reason": "r" * 1025}, "reason"),
    ("erasure-requests", {"reason": "x"}, "runs"),
    ("erasure-requests", {"subject": None, "reason": "x"}, "subject"),
    ("erasure-requests", {"subject": {"field": "nope", "value": SECRET_CUSTOMER},
                          "reason": "x"}, "subject.field"),
    ("erasure-requests", {"runs": [str(uuid.uuid4())], "reason": "x"}, "runs"),
    ("erasure-requests", {"tenant": True, "reason": "x"}, "tenant"),
])
def test_every_bad_body_is_400_naming_the_field(acme, adam, api_as, path, body, named):
    DataPolicy.objects.create(tenant=acme, subject_fields=FIELDS)
    r = post(api_as(adam), path, body)
    assert r.status_code == 400, r.content
    assert r.json()["detail"].startswith(named), r.json()
    assert SECRET_CUSTOMER not in r.content.decode()
    assert api_as(adam).get(BASE + path).json() == {"results": []}
