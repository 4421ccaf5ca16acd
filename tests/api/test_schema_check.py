"""The check every API answer of the suite goes through (``tests/openapi_check.py``)
fails on what it must: a body of the wrong type, a key the schema does not name, a
missing key, a status the operation does not document, a non-JSON error, an unknown path
that is not a 404. And it is on for every test that does not opt out."""

from __future__ import annotations

import pytest
from rest_framework.response import Response
from rest_framework.test import APIClient

from checkpoints.api import views
from tests import openapi_check
from tests.api.apihelpers import get, url
from tests.openapi_check import SchemaMismatch

NOT_CHECKED = pytest.mark.no_schema_check(reason="checks the checker: calls it itself")


@pytest.fixture
def v(client, vic):
    client.force_login(vic)
    return client


def _answer(monkeypatch, body, status=200):
    """Make ``GET …/report`` answer ``body`` with ``status``, past its serializer."""
    monkeypatch.setattr(views.ReportApi, "get",
                        lambda self, request, tenant: Response(body, status=status))


GOOD = {"runs": {"healthy": 1}, "effects": {}, "retry_requests": {}, "open_conflicts": 0}


@NOT_CHECKED
def test_a_documented_answer_passes(v):
    r = get(v, "acme", "report")
    assert r.status_code == 200
    openapi_check.check(r)  # raises on a mismatch


@NOT_CHECKED
@pytest.mark.parametrize(("body", "status", "complaint"), [
    (dict(GOOD, open_conflicts="many"), 200, r"at open_conflicts: 'many' is not of type 'integer'"),
    (dict(GOOD, runs={"healthy": "1"}), 200, r"at runs/healthy: '1' is not of type 'integer'"),
    ({k: v for k, v in GOOD.items() if k != "effects"}, 200, r"'effects' is a required property"),
    (dict(GOOD, secret="leak"), 200, r"Additional properties are not allowed \('secret'"),
    (GOOD, 418, r"ResponseNotFound"),
    ({"detail": "no error word"}, 404, r"'error' is a required property"),
], ids=["wrong-type", "wrong-type-nested", "missing-key", "unknown-key", "undocumented-status",
        "error-without-word"])
def test_an_answer_the_schema_does_not_describe_fails(v, monkeypatch, body, status, complaint):
    _answer(monkeypatch, body, status)
    r = get(v, "acme", "report")
    assert r.status_code == status
    with pytest.raises(SchemaMismatch, match=complaint) as caught:
        openapi_check.check(r)
    # The failure names the method, the path and the status.
    assert f"GET /api/v1/tenants/acme/report answered {status}" in str(caught.value)


@NOT_CHECKED
def test_an_unknown_path_must_be_a_json_404(v, monkeypatch):
    r = v.get(url("acme", "no-such-thing"))
    assert r.status_code == 404
    openapi_check.check(r)
    r.status_code = 200
    with pytest.raises(SchemaMismatch, match="no operation has this path"):
        openapi_check.check(r)
    r.status_code, r.content = 404, b"<html>not found</html>"
    with pytest.raises(SchemaMismatch, match="not JSON"):
        openapi_check.check(r)


@NOT_CHECKED
def test_an_undocumented_method_must_be_a_405_or_401_error(v):
    r = v.delete(url("acme", "report"))
    assert r.status_code == 405
    openapi_check.check(r)
    anonymous = APIClient().delete(url("acme", "report"))  # authenticated before the method
    assert anonymous.status_code == 401
    openapi_check.check(anonymous)
    r.status_code = 200
    with pytest.raises(SchemaMismatch, match="documents no such method"):
        openapi_check.check(r)
    r.status_code, r.content = 405, b'{"detail": "no error word"}'
    with pytest.raises(SchemaMismatch, match="'error' is a required property"):
        openapi_check.check(r)


def test_every_test_client_answer_is_checked_without_asking(v, monkeypatch):
    """No marker, no explicit call: the suite's own wrapper of the test client fails the
    request whose answer the schema does not describe."""
    _answer(monkeypatch, dict(GOOD, open_conflicts="many"))
    with pytest.raises(SchemaMismatch, match="open_conflicts"):
        get(v, "acme", "report")


def test_closed_objects_only_closes_objects_that_name_their_properties():
    schema = {"components": {"schemas": {
        "A": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "B": {"type": "object", "additionalProperties": {"type": "integer"}},
        "C": {"type": "object", "properties": {"d": {"type": "object",
                                                     "properties": {"y": {}}}}},
    }}}
    closed = openapi_check.closed_objects(schema)["components"]["schemas"]
    assert closed["A"]["additionalProperties"] is False
    assert closed["B"]["additionalProperties"] == {"type": "integer"}
    assert closed["C"]["properties"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["components"]["schemas"]["A"]  # a copy
