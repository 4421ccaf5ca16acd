"""A measurement, not a route: the product's checkpoint ``PUT`` without Django's request
cycle (issue 22, item 3, "Targets": what a framework-free runtime route would reach).

    .venv/bin/python -m bench.profile_put --lean 2000

A bare WSGI callable, as ``bench/floor_wsgi.py``, that answers only the happy path of
``PUT /api/v1/tenants/{slug}/checkpoints/{uuid}`` with ``If-Match`` and calls exactly the
functions the API's view calls, in its order: the bearer token with the tenant and the
caller's rights in one statement (``api.auth.token_user``), the tenant and the ``write``
right (``permissions.access_tenant``, ``require``), the URL's id, the strict JSON body
(``jsonparse.loads_object``), ``services.parse_envelope``, ``services.checkpoint_put``
(the same transaction, audit event and refusals) and the view's answer
(``CheckpointMetaSerializer.render``, ``ETag``, ``Cache-Control: no-store``),
imported from the API, never copied (``tests/test_bench_lean.py`` holds it to the API).

Everything else a real route would need is left out on purpose, which is what makes it
a ceiling: no middleware (request id, request metrics, security headers, logging
context), no DRF (content negotiation, its error answers), errors answered with a bare
status and no body, no ``Fencing-Token``, ``If-None-Match`` or ``Content-Length`` checks.
``profile_put --lean`` times it in-process against the floor (``floor_wsgi.app``) and
the product (Django's handler), interleaved, so the team can weigh that route against
lowering the targets with a figure instead of a guess.
"""

from __future__ import annotations

import json
import uuid

# Imported once Django is set up (``profile_put`` and the tests import this module then).
from checkpoints import jsonparse, roles, services
from checkpoints.api.auth import token_user
from checkpoints.api.serializers import checkpoints as s
from checkpoints.api.views.common import _known_account
from checkpoints.exceptions import StaleRevision
from checkpoints.permissions import access_tenant, require

PREFIX = "/api/v1/tenants/"


def app(environ, start_response):
    """The WSGI callable."""
    path = environ.get("PATH_INFO", "")
    parts = path[len(PREFIX):].split("/") if path.startswith(PREFIX) else []
    if environ["REQUEST_METHOD"] != "PUT" or len(parts) != 3 or parts[1] != "checkpoints":
        return _answer(start_response, "404 Not Found")
    slug = parts[0]
    auth = environ.get("HTTP_AUTHORIZATION", "").split()
    if len(auth) != 2 or auth[0].lower() != "bearer":
        return _answer(start_response, "401 Unauthorized")
    user = token_user(auth[1], tenant_slug=slug)
    if user is None:
        return _answer(start_response, "401 Unauthorized")
    tenant = access_tenant(user, slug)
    require(user, tenant, roles.WRITE)
    url_id = uuid.UUID(parts[2])
    expected = int(environ["HTTP_IF_MATCH"].strip('"'))
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    envelope = services.parse_envelope(jsonparse.loads_object(body), url_id=url_id)
    try:
        cp, _created = services.checkpoint_put(actor=user, tenant=tenant, envelope=envelope,
                                               expected_revision=expected)
    except StaleRevision:
        return _answer(start_response, "412 Precondition Failed")
    _known_account(cp, "written_by", user)
    data = json.dumps(s.CheckpointMetaSerializer.render(cp, run_id=envelope.run_id)).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data))),
                              ("Cache-Control", "no-store"), ("ETag", f'"{cp.revision}"')])
    return [data]


def _answer(start_response, status: str) -> list[bytes]:
    start_response(status, [("Content-Length", "0")])
    return [b""]
