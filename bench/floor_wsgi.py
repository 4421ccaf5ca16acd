"""The floor of a Python HTTP store on this stack (issue 22, item 3, "Targets"): a bare WSGI
app, no framework, that does for a checkpoint ``PUT`` only what a minimal real store must.

    python -m gunicorn bench.floor_wsgi:app     # from the project's root: gunicorn.conf.py

Per request, on one kept psycopg connection per thread (autocommit):

1. the bearer token: its SHA-256 looked up with the URL's tenant in one indexed
   ``SELECT`` (the token table's ``key_hash`` index, the tenant's ``slug`` index), a
   revoked token refused: what the product's look-up reads, minus the rights;
2. the JSON body parsed (``json.loads``) and its revision checked against ``If-Match``;
3. the payload serialised and encrypted with the product's own function
   (``checkpoints.crypto.encrypt_text``, the tenant's data key), so the cost is the same;
4. one statement: the compare-and-swap ``UPDATE ... WHERE tenant, uuid, revision`` and the
   history ``INSERT`` (a CTE, ``bench.writes._raw_sql``'s columns), then ``200`` with the
   new ``ETag`` and a small JSON answer, or ``412`` when the revision moved, ``401``,
   ``404``, ``400`` as the product would.

Django is set up once at import (the settings that name the database and the encryption
keys, the model names in the SQL); no request goes through it. ``make bench`` runs it
under the same gunicorn settings (``gunicorn.conf.py``) as the product
(``bench/writes.py``, scenario ``floor``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402

from checkpoints import crypto  # noqa: E402
from checkpoints.models import ApiToken, Checkpoint, CheckpointRevision, Tenant  # noqa: E402

_COLS = ("tenant_id, revision, kind, schema_version, payload_ciphertext, payload_size, "
         "phase_class, phase_label, updated_at_ms, usage, received_at, written_by_id")
AUTH_SQL = (f"SELECT t.user_id, tn.id FROM {ApiToken._meta.db_table} t "
            f"JOIN {get_user_model()._meta.db_table} u ON u.id = t.user_id AND u.is_active "
            f"JOIN {Tenant._meta.db_table} tn ON tn.slug = %s "
            f"WHERE t.key_hash = %s AND t.revoked_at IS NULL")
PUT_SQL = (
    f"WITH u AS (UPDATE {Checkpoint._meta.db_table} SET revision = %(new)s, "
    f"payload_ciphertext = %(ct)s, payload_size = %(size)s, phase_class = %(pc)s, "
    f"phase_label = %(pl)s, updated_at_ms = %(ms)s, usage = %(usage)s, "
    f"received_at = statement_timestamp(), written_by_id = %(user)s "
    f"WHERE tenant_id = %(tenant)s AND uuid = %(uuid)s AND revision = %(expected)s "
    f"RETURNING id, {_COLS}) "
    f"INSERT INTO {CheckpointRevision._meta.db_table} (checkpoint_id, {_COLS}) "
    f"SELECT id, {_COLS} FROM u RETURNING revision")
PREFIX = "/api/v1/tenants/"
_local = threading.local()


def _conn():
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        import psycopg

        db = settings.DATABASES["default"]
        conn = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                               password=db["PASSWORD"] or None, dbname=db["NAME"],
                               autocommit=True)
        _local.conn = conn
    return conn


def _answer(start_response, status: str, body: dict, extra=()) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data))),
                            ("Cache-Control", "no-store"), *extra])
    return [data]


def app(environ, start_response):
    """The WSGI callable: ``PUT /api/v1/tenants/{slug}/checkpoints/{uuid}`` only."""
    path = environ.get("PATH_INFO", "")
    parts = path[len(PREFIX):].split("/") if path.startswith(PREFIX) else []
    if environ["REQUEST_METHOD"] == "GET" and path == "/readyz":
        return _answer(start_response, "200 OK", {"ok": True})
    if environ["REQUEST_METHOD"] != "PUT" or len(parts) != 3 or parts[1] != "checkpoints":
        return _answer(start_response, "404 Not Found", {"detail": "not found"})
    slug, cid = parts[0], parts[2]
    auth = environ.get("HTTP_AUTHORIZATION", "")
    if not auth.startswith("Bearer "):
        return _answer(start_response, "401 Unauthorized", {"detail": "Authorization"})
    digest = hashlib.sha256(auth[7:].strip().encode()).hexdigest()
    conn = _conn()
    row = conn.execute(AUTH_SQL, (slug, digest)).fetchone()
    if row is None:
        return _answer(start_response, "401 Unauthorized", {"detail": "unknown token"})
    user_id, tenant_id = row
    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        body = json.loads(environ["wsgi.input"].read(length))
        expected = int(environ.get("HTTP_IF_MATCH", "").strip('"'))
        payload, revision = body["payload"], body["revision"]
    except (ValueError, KeyError, TypeError):
        return _answer(start_response, "400 Bad Request", {"detail": "body"})
    if revision != expected + 1 or body.get("id") != cid:
        return _answer(start_response, "400 Bad Request", {"detail": "revision"})
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    usage = payload.get("usage") if isinstance(payload, dict) else None
    row = conn.execute(PUT_SQL, {
        "new": revision, "ct": crypto.encrypt_text(text, tenant=tenant_id),
        "size": len(text.encode()), "pc": "stable", "pl": str(payload.get("phase", ""))[:256],
        "ms": int(body.get("updated_at_ms") or time.time() * 1000),
        "usage": json.dumps(usage or {}), "user": user_id, "tenant": tenant_id,
        "uuid": cid, "expected": expected}).fetchone()
    if row is None:
        return _answer(start_response, "412 Precondition Failed", {"error": "stale_revision"})
    return _answer(start_response, "200 OK", {"id": cid, "revision": row[0]},
                   [("ETag", f'"{row[0]}"')])
