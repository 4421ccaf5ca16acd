"""The runtime client: checkpoints, effects, leases and resume decisions over HTTP.

Standard library only (``urllib`` + ``json``), so any Python runtime can vendor this one
file. It speaks CONTRACT.md section 3 and mirrors runifold-core's checkpoint store
(RUNIFOLD.md section 1, DESIGN.md section 1)::

    store = HttpCheckpointStore("http://127.0.0.1:8000", "acme", token)
    store.compare_and_swap(envelope, None)            # create revision 0
    store.lease(run_id, "worker-7", ttl_s=5)           # later writes carry Fencing-Token
    store.compare_and_swap(next_envelope, 0)          # revision 0 -> 1
    receipt = perform_effect(store, run_id=run_id, service="payments",
                             operation_key="charge:A-1042", effect_class="non_idempotent",
                             request={"amount_cents": 2599}, call=charge_card)
    # after a restart:
    store.resume_preview(run_id)                       # look: changes nothing (GET)
    decision = store.resume(run_id, workflow="acme.order")  # claim (POST); on "retry"
                                                       # the old owner is fenced

Errors: every failure is a ``CheckpointError`` whose ``kind`` is one of runifold's
``not_found``, ``conflict``, ``invalid_payload``, ``storage``; ``status`` is the HTTP
status (0 for a network error) and ``body`` the decoded JSON answer (``{}`` if none).
``error`` is the server's stable word (``conflict``, ``fenced``, ``lease_held``,
``operation_exists``, ``idempotency_key_reuse``, ...).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import select
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

NOT_FOUND, CONFLICT, INVALID_PAYLOAD, STORAGE = "not_found", "conflict", "invalid_payload", "storage"


class CheckpointError(Exception):
    """A store operation failed; ``kind`` says how (runifold-core's ``CheckpointErrorKind``).

    - ``not_found``: 404 (no such checkpoint, effect, run or tenant for this token).
    - ``conflict``: 412 stale revision (``current_revision`` set), 409 ``fenced`` (another
      owner took the run; ``fencing_token`` in ``body``), 409 ``lease_held``, 409
      ``operation_exists`` (``body["effect_id"]``).
    - ``invalid_payload``: 400, 413, 422 (bad field, invalid effect transition,
      idempotency key reused with another fingerprint), 428.
    - ``storage``: network error, timeout, 5xx, 401/403 or an unreadable answer.
    """

    def __init__(self, kind: str, message: str, *, status: int = 0, body: dict | None = None):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body or {}
        self.error = self.body.get("error", "")

    @property
    def current_revision(self) -> int | None:
        """The store's revision after a 412, else ``None``."""
        value = self.body.get("current_revision")
        return value if isinstance(value, int) else None


def _kind_for_status(status: int, error: str) -> str:
    if status == 404:
        return NOT_FOUND
    if status in (409, 412):
        return CONFLICT
    if status in (400, 413, 422, 428):
        return INVALID_PAYLOAD
    return STORAGE


def fingerprint(request: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``request`` (sorted keys, no spaces, UTF-8).

    This is an effect's ``request_fingerprint``: the same request always gives the same
    64 lower-case hex digits.
    """
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def now_ms() -> int:
    """This process's wall clock in ms since the epoch (an envelope's ``updated_at_ms``)."""
    return int(time.time() * 1000)


def next_revision(checkpoint: dict, payload: Any) -> dict:
    """The envelope of the next revision: same id, run_id, kind and schema version,
    ``revision + 1``, the new ``payload`` and a fresh ``updated_at_ms`` (runifold ``next()``)."""
    return dict(checkpoint, revision=checkpoint["revision"] + 1, payload=payload,
                updated_at_ms=now_ms())


class HttpCheckpointStore:
    """A runtime's view of one tenant of the recovery service.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), ``tenant`` the tenant's
    slug, ``token`` a bearer token of an account with the writer role, ``timeout_s`` the
    per-request socket timeout in seconds. ``fencing_token`` is ``None`` until ``lease``
    (or ``resume`` claiming a ``retry``) sets it; from then on every write sends it in
    ``Fencing-Token``. ``resume_preview`` only looks. Not thread-safe: use one store per
    worker thread.

    Connections: with ``keep_alive`` (the default) the store keeps one HTTP/1.1
    connection open and sends every request on it, so a write costs no TCP (or TLS)
    handshake (issue 8); ``close()`` (or ``with store:``) closes it. A connection the
    server has closed while idle (gunicorn's ``keepalive``) is noticed before the next
    request and opened again; if it breaks under a request anyway, a ``GET`` or ``HEAD``
    is sent once more on a new connection, while a write raises ``storage`` (it may have
    been stored: re-read before writing again, as after any ``storage`` error). Without
    ``keep_alive``, or when a proxy is configured for the URL (``HTTP_PROXY`` ...),
    every request opens its own connection through ``urllib``.
    """

    def __init__(self, base_url: str, tenant: str, token: str, timeout_s: float = 10,
                 keep_alive: bool = True):
        self.base_url = base_url.rstrip("/")
        self.tenant = tenant
        self.token = token
        self.timeout_s = timeout_s
        self.fencing_token: int | None = None
        parts = urllib.parse.urlsplit(self.base_url)
        proxied = bool(urllib.request.getproxies()) and not urllib.request.proxy_bypass(
            parts.hostname or "")
        self.keep_alive = keep_alive and parts.scheme in ("http", "https") and not proxied
        self._parts = parts
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        """Close the kept-alive connection, if any (the next request opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> HttpCheckpointStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------

    def _url(self, path: str, query: dict | None = None) -> str:
        url = f"{self.base_url}/api/v1/tenants/{urllib.parse.quote(self.tenant, safe='')}/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None,
                query: dict | None = None) -> tuple[int, dict, Any]:
        """Send one request; returns ``(status, headers, decoded JSON or None)`` for 2xx.

        Raises ``CheckpointError`` for any other answer or a network failure (``storage``).
        """
        data = None
        all_headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode("utf-8")
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        if self.keep_alive:
            status, answer_headers, raw = self._kept_alive(method, self._url(path, query),
                                                           data, all_headers)
            return self._answer(method, path, status, answer_headers, raw)
        req = urllib.request.Request(self._url(path, query), data=data, method=method,
                                     headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read()
                return resp.status, dict(resp.headers), json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer = json.loads(raw) if raw else {}
            except ValueError:
                answer = {}
            if not isinstance(answer, dict):
                answer = {}
            detail = answer.get("detail") or answer.get("error") or exc.reason
            raise CheckpointError(_kind_for_status(exc.code, answer.get("error", "")),
                                  f"{method} {path}: HTTP {exc.code} {detail}",
                                  status=exc.code, body=answer) from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, bad JSON
            raise CheckpointError(STORAGE, f"{method} {path}: {exc}") from None

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """The kept-alive connection and whether it served a request before; a new one if
        there is none or the server closed it while idle (the socket is readable: EOF)."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                readable = select.select([conn.sock], [], [], 0)[0]
            except (OSError, ValueError):
                readable = True
            if not readable:
                return conn, True
            conn.close()
        if conn is None:
            cls = (http.client.HTTPSConnection if self._parts.scheme == "https"
                   else http.client.HTTPConnection)
            conn = self._conn = cls(self._parts.hostname, self._parts.port,
                                    timeout=self.timeout_s)
        return conn, False

    def _kept_alive(self, method: str, url: str, data: bytes | None,
                    headers: dict) -> tuple[int, dict, bytes]:
        """``(status, headers, body)`` of one request on the kept-alive connection.
        A connection that breaks under a ``GET``/``HEAD`` it had already served others
        on is replaced once; any other failure closes it and raises ``storage``."""
        target = urllib.parse.urlsplit(url)
        target = target.path + (f"?{target.query}" if target.query else "")
        for attempt in (1, 2):
            conn, reused = self._connection()
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, dict(resp.headers), raw
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                broken = isinstance(exc, (ConnectionError, http.client.RemoteDisconnected))
                if attempt == 1 and reused and broken and method in ("GET", "HEAD"):
                    continue
                raise CheckpointError(STORAGE, f"{method} {url}: {exc}") from None
        raise AssertionError("unreachable")

    def _answer(self, method: str, path: str, status: int, headers: dict,
                raw: bytes) -> tuple[int, dict, Any]:
        """``request``'s answer from a kept-alive exchange: decoded 2xx, else the
        ``CheckpointError`` the status and body say (as for ``urllib``'s answers)."""
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            if 200 <= status < 300:
                raise CheckpointError(STORAGE, f"{method} {path}: unreadable answer "
                                               f"(HTTP {status})", status=status) from None
            answer = None
        if 200 <= status < 300:
            return status, headers, answer
        if not isinstance(answer, dict):
            answer = {}
        detail = answer.get("detail") or answer.get("error") or http.client.responses.get(
            status, "")
        raise CheckpointError(_kind_for_status(status, answer.get("error", "")),
                              f"{method} {path}: HTTP {status} {detail}", status=status,
                              body=answer)

    def _write_headers(self, expected_revision: int | None) -> dict:
        headers = ({"If-None-Match": "*"} if expected_revision is None
                   else {"If-Match": f'"{expected_revision}"'})
        if self.fencing_token is not None:
            headers["Fencing-Token"] = str(self.fencing_token)
        return headers

    # --- checkpoints --------------------------------------------------------------------

    def load(self, checkpoint_id: str) -> dict | None:
        """The latest envelope of ``checkpoint_id`` (CONTRACT.md 2), or ``None`` if there
        is none. Raises ``CheckpointError`` (``storage`` and others) for any other failure."""
        try:
            return self.request("GET", f"checkpoints/{checkpoint_id}")[2]
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:
                return None
            raise

    def revision(self, checkpoint_id: str) -> int | None:
        """The current revision of ``checkpoint_id``, or ``None`` if there is none: a
        ``HEAD`` (its ``ETag``), which reads no payload, so the server audits and writes
        nothing (``load`` is an audited read). For a runtime that needs only the revision,
        e.g. to check where a checkpoint stands after a ``storage`` error on a write.
        Raises ``CheckpointError`` as ``load``."""
        try:
            _, headers, _ = self.request("HEAD", f"checkpoints/{checkpoint_id}")
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:
                return None
            raise
        etag = (headers.get("ETag") or headers.get("Etag") or "").strip('"')
        if not etag.isdigit():
            raise CheckpointError(STORAGE, f"HEAD checkpoints/{checkpoint_id}: no ETag")
        return int(etag)

    def compare_and_swap(self, checkpoint: dict, expected_revision: int | None) -> int:
        """Write ``checkpoint`` (an envelope) if the store still holds ``expected_revision``.

        ``expected_revision=None`` creates (``checkpoint["revision"]`` must be 0); N
        updates N -> N+1 (``checkpoint["revision"]`` must be N+1). Returns the stored
        revision. Raises ``CheckpointError``: ``conflict`` (412: the id exists / revision
        is stale, see ``current_revision``; 409 ``fenced``: another owner holds the
        run), ``not_found`` (update of a missing checkpoint), ``invalid_payload``
        (400/413/422), ``storage``.
        """
        status, headers, _ = self.request(
            "PUT", f"checkpoints/{checkpoint['id']}", checkpoint,
            headers=self._write_headers(expected_revision))
        etag = headers.get("ETag") or headers.get("Etag") or ""
        try:
            return int(etag.strip('"'))
        except ValueError:
            return checkpoint["revision"]

    def revisions(self, checkpoint_id: str) -> list[dict]:
        """Every accepted revision of a checkpoint, oldest first (every page: the server
        answers them a bounded page at a time and this follows ``next``)."""
        out: list[dict] = []
        query: dict = {}
        while True:
            page = self.request("GET", f"checkpoints/{checkpoint_id}/revisions",
                                query=query)[2] or {}
            out.extend(page.get("results", []))
            nxt = page.get("next")
            cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query).get("cursor") \
                if nxt else None
            if not cursor:
                return out
            query["cursor"] = cursor[0]

    # --- leases and resume --------------------------------------------------------------

    def lease(self, run_id: str, owner: str, ttl_s: int) -> dict:
        """Take or renew the run's lease for ``ttl_s`` seconds as ``owner``.

        Returns ``{"fencing_token": int, "expires_at": str}`` and remembers the token for
        later writes. Raises ``CheckpointError``: ``conflict`` (409 ``lease_held``: another
        owner's lease is live), ``not_found`` (the run has no checkpoint or effect yet),
        ``invalid_payload`` (bad owner or ttl).
        """
        answer = self.request("POST", f"runs/{run_id}/lease",
                              {"owner": owner, "ttl_s": ttl_s})[2]
        self.fencing_token = answer["fencing_token"]
        return answer

    @staticmethod
    def _identity(agent, model, workflow, definition_version) -> dict:
        given = {"agent": agent, "model": model, "workflow": workflow,
                 "definition_version": definition_version}
        return {k: v for k, v in given.items() if v is not None}

    def resume_preview(self, run_id: str, *, agent: str | None = None, model: str | None = None,
                       workflow: str | None = None,
                       definition_version: str | None = None) -> dict:
        """What ``resume`` would answer now, without claiming anything (``GET …/resume``).

        Same arguments as ``resume``. Returns ``{"action", "reason", "checkpoint_id",
        "revision"}`` (the server may add the run's current ``fencing_token``; this store
        does not adopt it). An approved retry shows as action ``retry``, reason
        ``retry_approved``, and stays approved: the preview never consumes it, never fences
        the owner and writes no audit event. Raises ``CheckpointError``: ``not_found`` (no
        such run, or a tenant this token has no role in), ``invalid_payload`` (400, a bad
        parameter), ``storage`` (403 for a token without the writer role, 5xx, network).
        """
        query = self._identity(agent, model, workflow, definition_version)
        return self.request("GET", f"runs/{run_id}/resume", query=query)[2]

    def resume(self, run_id: str, *, agent: str | None = None, model: str | None = None,
               workflow: str | None = None, definition_version: str | None = None) -> dict:
        """Claim the resume decision for ``run_id`` after a restart (``POST …/resume``).

        The identity arguments (``model`` is ``provider/name``) are sent in the JSON body,
        only those given; each one given must match the run's, else the answer is
        ``reject`` / ``identity_mismatch``. Returns ``{"action", "reason",
        "checkpoint_id", "revision", "fencing_token"}``; ``action`` is ``replay``,
        ``continue``, ``reject``, ``retry`` or ``reconcile`` (CONTRACT.md 3).

        ``retry`` means this call consumed an approved retry: the server bumped the
        fencing token (the old owner is fenced), dropped the lease, and authorised
        ``unknown``/``not_executed`` effects to go back to ``planned``. The returned
        ``fencing_token`` is remembered and sent with every later write (a ``lease``
        afterwards replaces it with a newer one). Only one caller gets ``retry`` for one
        approval. For any other action the store's fencing token is left as it was.

        Raises ``CheckpointError``: ``not_found`` (no such run, or a tenant this token has
        no role in), ``invalid_payload`` (400, a bad field), ``storage`` (403 for a token
        without the writer role, 5xx, network).
        """
        body = self._identity(agent, model, workflow, definition_version)
        answer = self.request("POST", f"runs/{run_id}/resume", body)[2]
        if answer.get("action") == "retry":
            self.fencing_token = answer.get("fencing_token")
        return answer

    def list_runs(self, *, recovery_state: str | None = None, limit: int = 50):
        """Yield the tenant's runs (``GET …/runs``), newest write first, every page.

        Each run is the API's run object (``run_id``, ``recovery_state``,
        ``recovery_reason``, ``kind``, ...). ``recovery_state`` filters (``ambiguous``,
        ``retry_approved``, ...); ``limit`` is the page size (1..200). Raises
        ``CheckpointError`` (``invalid_payload`` for a bad filter, ``storage``, ...).
        """
        query: dict = {"limit": limit}
        if recovery_state is not None:
            query["recovery_state"] = recovery_state
        while True:
            page = self.request("GET", "runs", query=query)[2] or {}
            yield from page.get("results", [])
            nxt = page.get("next")
            if not nxt:
                return
            cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query).get("cursor")
            if not cursor:
                return
            query["cursor"] = cursor[0]

    # --- effects ------------------------------------------------------------------------

    def put_effect(self, effect: dict, expected_revision: int | None) -> int:
        """Compare-and-swap one effect record (same headers and errors as checkpoints).

        ``effect``: ``{id, run_id, revision, operation_key, service, effect_class,
        request_fingerprint, state, receipt}``. Returns the stored revision. Besides the
        checkpoint errors: ``conflict`` with ``error == "operation_exists"`` (another
        effect id holds the key with the same fingerprint: ``body["effect_id"]``),
        ``invalid_payload`` with ``error`` ``idempotency_key_reuse`` or
        ``invalid_transition``.
        """
        status, headers, _ = self.request("PUT", f"effects/{effect['id']}", effect,
                                          headers=self._write_headers(expected_revision))
        etag = (headers.get("ETag") or headers.get("Etag") or "").strip('"')
        return int(etag) if etag.isdigit() else effect["revision"]

    def find_effect(self, service: str, operation_key: str) -> dict | None:
        """The effect record holding ``(service, operation_key)``, or ``None``."""
        answer = self.request("GET", "effects",
                              query={"service": service, "operation_key": operation_key})[2]
        if isinstance(answer, dict):
            answer = answer.get("results", answer.get("effects", []))
        for effect in answer or []:
            if effect.get("operation_key") == operation_key and effect.get("service") == service:
                return effect
        return None


class EffectFailed(Exception):
    """The service refused the effect (state ``failed``); ``receipt`` is its answer."""

    def __init__(self, message: str, receipt: dict | None = None):
        super().__init__(message)
        self.receipt = receipt


class EffectInDoubt(Exception):
    """The effect is ``submitted``, ``unresolved``, ``unknown`` or ``not_executed``: this
    runtime must not call the service; reconciliation or a human decides (DESIGN.md 4)."""

    def __init__(self, effect: dict):
        super().__init__(f"effect {effect.get('id')} is {effect.get('state')}: do not call again")
        self.effect = effect


_EFFECT_FIELDS = ("id", "run_id", "revision", "operation_key", "service", "effect_class",
                  "request_fingerprint", "state", "receipt")


def perform_effect(
    store: HttpCheckpointStore,
    *,
    run_id: str,
    service: str,
    operation_key: str,
    effect_class: str,
    request: Any,
    call: Callable[[str], dict],
    effect_id: str | None = None,
    on_step: Callable[[str], None] | None = None,
    retry: bool = False,
    store_request: bool | None = None,
) -> dict:
    """Perform one external side effect exactly as the write-ahead protocol says.

    Steps (CONTRACT.md 3 "Effects", DESIGN.md 4):

    1. Create the record ``planned`` (revision 0) under ``operation_key``. If another
       effect id already holds the key with the same fingerprint (409
       ``operation_exists``), continue with that record instead.
    2. ``confirmed``: return its receipt (replay; never call again). ``failed``: raise
       ``EffectFailed``. ``submitted``/``unresolved``/``unknown``/``not_executed``:
       raise ``EffectInDoubt`` (reconcile first; only an approved retry re-plans it).
       With ``retry=True`` (``resume`` claimed a ``retry``), an ``unknown`` or
       ``not_executed`` record first goes back to ``planned`` (the server counts the
       attempt) and the call is made again, with the same operation key: a service that
       dedupes by idempotency key still executes it at most once; for one that does not,
       a possible duplicate is what the approvers accepted.
    3. ``planned`` -> ``submitted``; ``on_step("submitted")``.
    4. ``call(operation_key)``: the caller sends the request with the operation key as its
       idempotency key and returns the receipt (a dict); ``on_step("called")``.
       If ``call`` raises ``EffectFailed`` the record becomes ``failed`` (the service
       refused); any other exception leaves it ``submitted`` (in doubt) and propagates.
    5. ``submitted`` -> ``confirmed`` with the receipt; ``on_step("confirmed")``.

    ``request`` is what the fingerprint is computed over. With ``store_request`` (default:
    only for ``idempotent`` effects) the planned record also carries ``request`` itself
    (stored encrypted), so that the service's ``replay`` reconciler can send it again with
    the same key if this process dies mid-call. Returns the receipt. Raises
    ``CheckpointError`` from the store (422 ``idempotency_key_reuse`` when the key holds
    another request; ``conflict`` if fenced or raced), ``EffectFailed``, ``EffectInDoubt``.
    """
    step = on_step or (lambda name: None)
    record = {
        "id": effect_id or str(uuid.uuid4()),
        "run_id": run_id,
        "revision": 0,
        "operation_key": operation_key,
        "service": service,
        "effect_class": effect_class,
        "request_fingerprint": fingerprint(request),
        "state": "planned",
        "receipt": None,
    }
    if store_request is None:
        store_request = effect_class == "idempotent"
    try:
        store.put_effect(dict(record, request=request) if store_request else record, None)
    except CheckpointError as exc:
        if exc.error != "operation_exists":
            raise
        existing = store.find_effect(service, operation_key)
        if existing is None:
            raise CheckpointError(STORAGE, f"effect {exc.body.get('effect_id')} holds "
                                           f"{operation_key!r} but cannot be found") from None
        record = {k: existing.get(k) for k in _EFFECT_FIELDS}
        record["id"] = str(existing.get("id") or exc.body.get("effect_id"))
    state = record["state"]
    if state == "confirmed":
        return record["receipt"]
    if state == "failed":
        raise EffectFailed(f"effect {record['id']} failed", record.get("receipt"))

    def advance(new_state: str, receipt: dict | None) -> None:
        nxt = dict(record, revision=record["revision"] + 1, state=new_state, receipt=receipt)
        store.put_effect(nxt, record["revision"])
        record.update(nxt)

    if retry and state in ("unknown", "not_executed"):
        advance("planned", None)
    elif state != "planned":
        raise EffectInDoubt(record)

    advance("submitted", None)
    step("submitted")
    try:
        receipt = call(operation_key)
    except EffectFailed as exc:
        advance("failed", exc.receipt)
        raise
    step("called")
    advance("confirmed", receipt)
    step("confirmed")
    return receipt
