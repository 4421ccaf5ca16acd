"""``bench/lean_wsgi.py`` (issue 22): the measurement of a framework-free runtime route
stays a measurement of the same work as the API's ``PUT``. Through it and through the
API, the same update answers the same body and ``ETag`` and writes the same kinds of row
(history, audit event), on both backends."""

from __future__ import annotations

import io
import json
import sys

import pytest
from django.test import Client

from bench import lean_wsgi
from checkpoints.models import AuditEvent, CheckpointRevision
from tests.helpers import envelope, plumbing_token, put_checkpoint

pytestmark = pytest.mark.django_db


def _lean_put(token: str, body: dict, revision: int) -> tuple[str, dict, dict]:
    raw = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "PUT", "PATH_INFO": f"/api/v1/tenants/acme/checkpoints/{body['id']}",
        "CONTENT_LENGTH": str(len(raw)), "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_IF_MATCH": f'"{revision}"', "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
    }
    answer = {}
    chunks = lean_wsgi.app(environ, lambda status, headers: answer.update(
        status=status, headers=dict(headers)))
    return answer["status"], answer["headers"], json.loads(b"".join(chunks) or b"null")


def test_the_lean_route_answers_and_writes_what_the_api_does(acme, wendy):
    token = plumbing_token(wendy)
    lean_body, api_body = envelope(payload={"phase": "a"}), envelope(payload={"phase": "a"})
    put_checkpoint(wendy, acme, lean_body)
    put_checkpoint(wendy, acme, api_body)
    status, headers, lean = _lean_put(token, dict(lean_body, revision=1,
                                                  payload={"phase": "b"}), 0)
    r = Client().put(f"/api/v1/tenants/acme/checkpoints/{api_body['id']}",
                     data=json.dumps(dict(api_body, revision=1, payload={"phase": "b"})),
                     content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
                     HTTP_IF_MATCH='"0"')
    assert (status, r.status_code) == ("200 OK", 200)
    api = r.json()
    assert headers["ETag"] == r["ETag"] == '"1"'
    assert set(lean) == set(api)
    for key in set(api) - {"id", "run_id", "updated_at_ms", "received_at"}:
        assert lean[key] == api[key], key
    for checkpoint_id in (lean_body["id"], api_body["id"]):
        assert CheckpointRevision.objects.filter(checkpoint__uuid=checkpoint_id,
                                                 revision=1).count() == 1
        assert AuditEvent.objects.filter(action="checkpoint.write", target_ref=checkpoint_id,
                                         after__revision=1).count() == 1
    stale, _, _ = _lean_put(token, dict(lean_body, revision=1, payload={"phase": "c"}), 0)
    assert stale == "412 Precondition Failed"
