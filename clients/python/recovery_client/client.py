"""The runtime client: checkpoints, effects, leases and resume decisions over HTTP.

Standard library only (``urllib`` + ``json``), so any Python runtime can vendor this one
file (``recovery_client/aclient.py`` is the asyncio variant, on httpx; docs/client.md). It
speaks CONTRACT.md section 3 and mirrors runifold-core's checkpoint store (RUNIFOLD.md
section 1, DESIGN.md section 1)::

    with HttpCheckpointStore("http://127.0.0.1:8000", "acme", token) as store:
        store.compare_and_swap(envelope, None)            # create revision 0
        store.lease(run_id, "worker-7", ttl_s=5)           # later writes carry Fencing-Token
        store.compare_and_swap(next_envelope, 0)          # revision 0 -> 1
        receipt = perform_effect(store, run_id=run_id, service="payments",
                                 operation_key="charge:A-1042",
                                 effect_class="non_idempotent",
                                 request={"amount_cents": 2599}, call=charge_card)
        # after a restart:
        store.resume_preview(run_id)                       # look: changes nothing (GET)
        decision = store.resume(run_id, workflow="acme.order")  # claim (POST); on "retry"
                                                           # the old owner is fenced

Errors: every failure is a ``CheckpointError`` whose ``kind`` is one of runifold's
``not_found``, ``conflict``, ``invalid_payload``, ``storage``; ``status`` is the HTTP
status (0 when there was no answer: a network error, or a body refused before sending)
and ``body`` the decoded JSON answer (``{}`` if none). ``error`` is the server's stable
word (``conflict``, ``fenced``, ``lease_held``, ``operation_exists``,
``idempotency_key_reuse``, ``payload_too_large``, ...).

Size limit (issue 10): a body longer than ``max_body_bytes`` (default 1 MiB, the
server's default ``RECOVERY_MAX_BODY_BYTES``, CONTRACT.md 6) is refused before anything
is sent: ``invalid_payload``, ``error == "payload_too_large"``, naming both sizes. It is
never a ``storage`` error, which a runtime would retry forever.

Retries (issue 10): a ``storage`` failure that retrying can cure (no answer: network
error or timeout; 5xx; 429) is tried again up to ``retries`` times (default 3) after a
full-jitter pause, ``uniform(0, min(max_backoff_s, backoff_s * 2**(n-1)))`` seconds
before try n+1, or the server's ``Retry-After`` (seconds or an HTTP date) capped at
``max_backoff_s``. ``conflict``, ``not_found``, ``invalid_payload`` and 401/403 are
never retried. Each operation decides whether resending is safe:

- reads (``load``, ``revision``, ``revisions``, ``resume_preview``, ``list_runs``,
  ``find_effect``) and ``lease`` (the same owner renewing keeps its fencing token) are
  resent after any of those failures;
- the ``resume`` claim (it consumes an approved retry) is resent only when the server
  surely did nothing: the connection could not be opened, or it answered 503/429;
- ``compare_and_swap`` and ``put_effect`` are resent safely: at once when the server
  surely did nothing, as above. After a failure the write may have been stored by (a
  timeout, a reset, a 5xx but 503), the store first looks where the record stands,
  writing nothing: a ``HEAD`` of the checkpoint (its revision), then, if it is the
  revision this write made, a ``GET`` (an audited payload read) compared with what was
  sent; for an effect one ``GET``. If the store holds exactly this write, the call
  succeeds without resending (and no conflict is recorded). Otherwise the write is
  resent, and if that resend is refused with 412 and ``current_revision`` equal to the
  revision it wrote (the first request landed after the look, e.g. a slow server past
  the client's timeout), the record is read back once more: the call succeeds if it
  holds exactly what was sent (the server has then kept the refused resend as a
  conflict of the run), else the 412 is raised as the conflict it is. Only the fields
  the write sent are compared (an effect's ``request`` is stored encrypted and never
  answered, so it is left out). A look that fails counts as one of the retries.

Connections: ``HttpCheckpointStore`` keeps one HTTP/1.1 connection (issue 8);
``close()`` or ``with store:`` closes it. The async store keeps a pool (httpx).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import random
import select
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Generator, Mapping
from typing import Any, NamedTuple

NOT_FOUND, CONFLICT, INVALID_PAYLOAD, STORAGE = "not_found", "conflict", "invalid_payload", "storage"

#: The server's default body limit, ``RECOVERY_MAX_BODY_BYTES`` (CONTRACT.md 6): 1 MiB.
MAX_BODY_BYTES = 1024 * 1024
#: Fields a write sends that the record's read never answers (an effect's ``request``
#: is stored encrypted for the replay reconciler): left out when a lost answer is
#: checked against the stored record.
UNECHOED_FIELDS = frozenset({"request"})


class CheckpointError(Exception):
    """A store operation failed; ``kind`` says how (runifold-core's ``CheckpointErrorKind``).

    - ``not_found``: 404 (no such checkpoint, effect, run or tenant for this token).
    - ``conflict``: 412 stale revision (``current_revision`` set), 409 ``fenced`` (another
      owner took the run; ``fencing_token`` in ``body``), 409 ``lease_held``, 409
      ``operation_exists`` (``body["effect_id"]``).
    - ``invalid_payload``: 400, 413, 422 (bad field, invalid effect transition,
      idempotency key reused with another fingerprint), 428; and, with ``status`` 0,
      a body the client refused before sending (longer than ``max_body_bytes``:
      ``error == "payload_too_large"``; or not JSON).
    - ``storage``: network error, timeout, 5xx, 429, 401/403 or an unreadable answer.

    ``sent`` is ``False`` when the request never left this process (the connection
    could not be opened, or the body was refused before sending), so the server surely
    did nothing. ``retry_after_s`` is the answer's ``Retry-After`` in seconds, or ``None``.
    """

    def __init__(self, kind: str, message: str, *, status: int = 0, body: dict | None = None,
                 sent: bool = True, retry_after_s: float | None = None):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body or {}
        self.error = self.body.get("error", "")
        self.sent = sent
        self.retry_after_s = retry_after_s

    def answered(self, key: str, kind: type) -> Any:
        """The answer's ``body[key]`` if it is a ``kind``, else ``None``."""
        value = self.body.get(key)
        return value if isinstance(value, kind) else None

    @property
    def current_revision(self) -> int | None:
        """The store's revision after a 412, else ``None``."""
        return self.answered("current_revision", int)


def kind_for_status(status: int) -> str:
    """The ``CheckpointError`` kind of a non-2xx HTTP status (see ``CheckpointError``)."""
    if status == 404:
        return NOT_FOUND
    if status in (409, 412):
        return CONFLICT
    if status in (400, 413, 422, 428):
        return INVALID_PAYLOAD
    return STORAGE


def retryable(exc: CheckpointError) -> bool:
    """Whether trying ``exc``'s request again may succeed: a ``storage`` failure with no
    answer (network error, timeout), a 5xx or a 429. Never 401/403 (a token or role
    problem), an unreadable 2xx answer, or any other kind."""
    return exc.kind == STORAGE and (exc.status in (0, 429) or 500 <= exc.status <= 599)


def may_have_acted(exc: CheckpointError) -> bool:
    """Whether the server may have carried out the request that failed with ``exc``:
    always, unless it was never sent or the server answered 503 or 429 (it says it did
    not: an outage answer rolls back, CONTRACT.md 6)."""
    return exc.sent and exc.status not in (429, 503)


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


# --- the I/O-free part, shared with recovery_client/aclient.py --------------------------
#
# Every store operation is a generator that yields what it needs done (``Call``: one HTTP
# exchange; ``Sleep``: a pause before a retry; ``Invoke``: the caller's function) and
# receives the outcome (an ``Answer``, or a ``CheckpointError`` thrown in; see ``Steps``).
# A store's ``_drive`` does the I/O: ``HttpCheckpointStore`` with http.client/urllib and
# ``time.sleep``, ``AsyncHttpCheckpointStore`` with httpx and ``asyncio.sleep``; so both
# share every rule (URLs, headers, size check, decoding, retries, lost answers).


class Answer(NamedTuple):
    """A 2xx answer: ``status``, ``headers`` (a mapping; look names up with ``header``)
    and ``body`` (the decoded JSON, or ``None`` for an empty body)."""

    status: int
    headers: Mapping[str, str]
    body: Any


class Call(NamedTuple):
    """One HTTP exchange an operation asks for: ``path`` under the tenant (for
    messages), the full ``url``, the encoded body ``data`` (``None``: no body) and every
    header to send."""

    method: str
    path: str
    url: str
    data: bytes | None
    headers: dict


class Sleep(NamedTuple):
    """A pause of ``seconds`` before the next try."""

    seconds: float


class Invoke(NamedTuple):
    """Call the caller's ``fn(*args)`` (``perform_effect``'s ``call`` and ``on_step``);
    the async store awaits the result when it is awaitable."""

    fn: Callable
    args: tuple


Op = Generator[Any, Any, Any]


class Steps:
    """The steps of operation ``op``, for a store's ``_drive``: iterate, do each step and
    set ``reply`` (its outcome) or ``error`` (its exception, thrown into ``op``) before
    the next; once the iteration ends, ``value`` is what ``op`` returned. An error
    ``op`` does not handle propagates out of the iteration."""

    def __init__(self, op: Op):
        self.op = op
        self.reply: Any = None
        self.error: BaseException | None = None
        self.value: Any = None

    def __iter__(self):
        while True:
            reply, error, self.reply, self.error = self.reply, self.error, None, None
            try:
                step = self.op.throw(error) if error is not None else self.op.send(reply)
            except StopIteration as stop:
                self.value = stop.value
                return
            yield step


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` in ``headers``, whatever the case of its key."""
    wanted = name.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


def etag_revision(headers: Mapping[str, str]) -> int | None:
    """The revision in an ``ETag: "N"`` header, or ``None`` if there is none."""
    etag = (header(headers, "ETag") or "").strip('"')
    return int(etag) if etag.isdigit() else None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds from now (delta seconds or an HTTP date), or ``None``."""
    value = (header(headers, "Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def decode_answer(call: Call, status: int, headers: Mapping[str, str], raw: bytes) -> Answer:
    """The ``Answer`` of a 2xx exchange; for any other status the ``CheckpointError`` its
    status and JSON body say (``storage`` for a 2xx that is not JSON)."""
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        if 200 <= status < 300:
            raise CheckpointError(STORAGE, f"{call.method} {call.path}: unreadable answer "
                                           f"(HTTP {status})", status=status) from None
        decoded = None
    if 200 <= status < 300:
        return Answer(status, headers, decoded)
    answer = decoded if isinstance(decoded, dict) else {}
    detail = answer.get("detail") or answer.get("error") or http.client.responses.get(status, "")
    raise CheckpointError(kind_for_status(status), f"{call.method} {call.path}: HTTP {status} "
                                                   f"{detail}", status=status, body=answer,
                          retry_after_s=retry_after_seconds(headers))


def network_error(call: Call, exc: BaseException, *, sent: bool) -> CheckpointError:
    """The ``storage`` error of an exchange that got no answer (``sent``: the request
    may have reached the server)."""
    text = str(exc) or type(exc).__name__
    return CheckpointError(STORAGE, f"{call.method} {call.path}: {text}", sent=sent)


def _surrogate_at(value: Any, where: str) -> str | None:
    """Where in ``value`` (``body.a[2]`` style, keys included) the first string holding an
    unpaired surrogate is, or ``None``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = (_surrogate_at(key, f"{where} (a key)") if isinstance(key, str) else None
                     ) or _surrogate_at(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if found := _surrogate_at(item, f"{where}[{i}]"):
                return found
    return None


def encode_json(value: Any, what: str = "body") -> bytes:
    """``value`` as compact UTF-8 JSON bytes (no spaces, non-ASCII text as UTF-8, not
    ``\\uXXXX``), as both clients and ``RecoverySaver`` send bodies, so their size checks
    count the bytes the server counts (CONTRACT.md 6, issue 10).

    Raises ``CheckpointError`` ``invalid_payload`` (``sent`` false) when ``value`` is not
    JSON (NaN, a set, ...) or a string in it holds an unpaired surrogate (UTF-8 cannot
    carry it; the server refuses it too, CONTRACT.md 6): the message names where
    (``what`` then the path, e.g. ``body.payload.note``)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except UnicodeEncodeError:
        where = _surrogate_at(value, what) or what
        detail = f"{where}: an unpaired surrogate cannot be sent as UTF-8"
    except (TypeError, ValueError) as exc:
        detail = f"{what}: not JSON: {exc}"
    raise CheckpointError(INVALID_PAYLOAD, f"{detail}; nothing was sent",
                          body={"error": "invalid_payload", "detail": detail}, sent=False)


def encode_body(body: Any, limit: int | None, method: str, path: str) -> bytes:
    """``body`` as the JSON bytes to send (``encode_json``: UTF-8, compact), measured as
    sent. Raises ``CheckpointError`` ``invalid_payload`` (``sent`` false, nothing sent)
    when it is not JSON (NaN, a set, ...), holds an unpaired surrogate (the message names
    the field), or is longer than ``limit`` bytes (``error == "payload_too_large"``; the
    server would answer 413)."""
    try:
        data = encode_json(body, "body")
    except CheckpointError as exc:
        raise CheckpointError(INVALID_PAYLOAD, f"{method} {path}: {exc.message}",
                              body=exc.body, sent=False) from None
    if limit is not None and len(data) > limit:
        detail = f"body: {len(data)} bytes, larger than the limit of {limit} bytes"
        raise CheckpointError(INVALID_PAYLOAD, f"{method} {path}: body is {len(data)} bytes, "
                                               f"larger than the server's limit of {limit} "
                                               f"bytes (max_body_bytes); nothing was sent",
                              body={"error": "payload_too_large", "detail": detail},
                              sent=False)
    return data


#: Retry policies of an operation: resend after any ``retryable`` failure, or only when
#: the server surely did nothing (not sent, or answered 503/429).
IDEMPOTENT, ONCE = "idempotent", "once"


def _same_write(sent: dict, stored: Any) -> bool:
    """Whether the record the store answers holds every field of the write ``sent``
    (as JSON decoded it), but those it never answers (``UNECHOED_FIELDS``)."""
    return isinstance(stored, dict) and all(
        stored.get(key) == value for key, value in sent.items() if key not in UNECHOED_FIELDS)


class StoreCore:
    """What ``HttpCheckpointStore`` and ``AsyncHttpCheckpointStore`` share: settings,
    the fencing token, and every operation as a generator of steps (no I/O here).

    ``base_url`` is the server root, ``tenant`` the tenant's slug, ``token`` a bearer
    token of an account with the writer role, ``timeout_s`` the per-request timeout in
    seconds. ``retries`` (>= 0) is how many times a retryable failure is tried again,
    ``backoff_s`` the base of the full-jitter pause and ``max_backoff_s`` its cap (also
    of ``Retry-After``), in seconds; ``max_body_bytes`` the largest body sent (``None``:
    no check). Raises ``ValueError`` for a setting out of range.
    """

    def __init__(self, base_url: str, tenant: str, token: str, *, timeout_s: float,
                 retries: int, backoff_s: float, max_backoff_s: float,
                 max_body_bytes: int | None):
        if type(retries) is not int or retries < 0:
            raise ValueError("retries: must be an integer >= 0")
        if not 0 <= backoff_s <= max_backoff_s:
            raise ValueError("backoff_s, max_backoff_s: need 0 <= backoff_s <= max_backoff_s")
        if max_body_bytes is not None and (type(max_body_bytes) is not int or max_body_bytes < 1):
            raise ValueError("max_body_bytes: must be a positive integer or None")
        self.base_url = base_url.rstrip("/")
        self.tenant = tenant
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_body_bytes = max_body_bytes
        self.fencing_token: int | None = None

    # --- steps ------------------------------------------------------------------------

    def _url(self, path: str, query: dict | None = None) -> str:
        url = f"{self.base_url}/api/v1/tenants/{urllib.parse.quote(self.tenant, safe='')}/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def _call(self, method: str, path: str, body: Any = None, headers: dict | None = None,
              query: dict | None = None) -> Call:
        """The ``Call`` of one request; the body is encoded and size-checked here, so an
        oversized body raises before any step is yielded."""
        all_headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = encode_body(body, self.max_body_bytes, method, path)
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        return Call(method, path, self._url(path, query), data, all_headers)

    def _write_headers(self, expected_revision: int | None,
                       fencing_token: int | None = None) -> dict:
        """The conditional headers of a write, and ``Fencing-Token``: ``fencing_token``
        when given (a call made for another holder of the run's lease, e.g. a LangGraph
        saver's), else the store's own token once it has one."""
        headers = ({"If-None-Match": "*"} if expected_revision is None
                   else {"If-Match": f'"{expected_revision}"'})
        token = self.fencing_token if fencing_token is None else fencing_token
        if token is not None:
            headers["Fencing-Token"] = str(token)
        return headers

    def _may_retry(self, exc: CheckpointError, tries: int, policy: str) -> bool:
        """Whether a request that failed with ``exc`` after ``tries`` retries is tried
        again under ``policy`` (``IDEMPOTENT`` or ``ONCE``)."""
        if tries >= self.retries or not retryable(exc):
            return False
        return policy == IDEMPOTENT or not may_have_acted(exc)

    def _pause(self, exc: CheckpointError, retry: int) -> Sleep:
        """The pause before retry number ``retry`` (1, 2, ...) after ``exc``: the server's
        ``Retry-After`` capped at ``max_backoff_s``, else full jitter."""
        if exc.retry_after_s is not None:
            return Sleep(min(exc.retry_after_s, self.max_backoff_s))
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))
        return Sleep(random.uniform(0, ceiling))  # noqa: S311 - jitter, not a secret

    def _send(self, call: Call, policy: str = IDEMPOTENT) -> Op:
        """``yield from``: the ``Answer`` of ``call``, retried as ``policy`` allows."""
        tries = 0
        while True:
            try:
                return (yield call)
            except CheckpointError as exc:
                if not self._may_retry(exc, tries, policy):
                    raise
                tries += 1
                yield self._pause(exc, tries)

    # --- operations (generators; see the stores' methods for their contracts) ---------

    def _op_request(self, method: str, path: str, body: Any = None, headers: dict | None = None,
                    query: dict | None = None) -> Op:
        call = self._call(method, path, body, headers, query)
        policy = IDEMPOTENT if method in ("GET", "HEAD") else ONCE
        return (yield from self._send(call, policy))

    def _op_load(self, checkpoint_id: str) -> Op:
        try:
            return (yield from self._send(self._call("GET", f"checkpoints/{checkpoint_id}"))).body
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:
                return None
            raise

    def _op_revision(self, checkpoint_id: str) -> Op:
        try:
            answer = yield from self._send(self._call("HEAD", f"checkpoints/{checkpoint_id}"))
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:
                return None
            raise
        revision = etag_revision(answer.headers)
        if revision is None:
            raise CheckpointError(STORAGE, f"HEAD checkpoints/{checkpoint_id}: no ETag")
        return revision

    def _op_write(self, path: str, record: dict, expected_revision: int | None, *,
                  look_with_head: bool, fencing_token: int | None = None) -> Op:
        """Compare-and-swap ``record`` at ``path``; returns the stored revision. Retries
        and lost answers as the module docstring says; ``look_with_head``: a HEAD tells
        the revision before any GET (a checkpoint's GET is an audited payload read)."""
        call = self._call("PUT", path, record,
                          self._write_headers(expected_revision, fencing_token))
        sent, wrote = json.loads(call.data), record["revision"]
        tries, failure = 0, None
        while True:
            if failure is not None:
                tries += 1
                yield self._pause(failure, tries)
                if may_have_acted(failure):
                    try:
                        if (yield from self._holds(path, sent, look_with_head)):
                            return wrote
                    except CheckpointError as exc:
                        if not self._may_retry(exc, tries, IDEMPOTENT):
                            raise
                        failure = exc
                        continue
            try:
                answer = yield call
            except CheckpointError as exc:
                if failure is not None and exc.status == 412 and exc.current_revision == wrote:
                    if (yield from self._holds(path, sent, False)):
                        return wrote
                    raise exc from None
                if not self._may_retry(exc, tries, IDEMPOTENT):
                    raise
                failure = exc
                continue
            revision = etag_revision(answer.headers)
            return wrote if revision is None else revision

    def _holds(self, path: str, sent: dict, look_with_head: bool) -> Op:
        """Whether the store holds exactly the write ``sent`` at ``path`` (one try of each
        request; a failure propagates). Writes nothing."""
        try:
            if look_with_head:
                answer = yield self._call("HEAD", path)
                if etag_revision(answer.headers) != sent["revision"]:
                    return False
            answer = yield self._call("GET", path)
        except CheckpointError as exc:
            if exc.kind == NOT_FOUND:
                return False
            raise
        return _same_write(sent, answer.body)

    def _op_page(self, path: str, query: dict) -> Op:
        """One page of a listing: ``(results, query of the next page or None)``."""
        page = (yield from self._send(self._call("GET", path, query=query))).body or {}
        nxt = page.get("next")
        cursor = urllib.parse.parse_qs(urllib.parse.urlsplit(nxt).query).get("cursor") \
            if nxt else None
        return page.get("results", []), (dict(query, cursor=cursor[0]) if cursor else None)

    def _op_revisions(self, checkpoint_id: str) -> Op:
        out: list[dict] = []
        query: dict | None = {}
        while query is not None:
            results, query = yield from self._op_page(
                f"checkpoints/{checkpoint_id}/revisions", query)
            out.extend(results)
        return out

    def _op_lease(self, run_id: str, owner: str, ttl_s: int) -> Op:
        call = self._call("POST", f"runs/{run_id}/lease", {"owner": owner, "ttl_s": ttl_s})
        answer = (yield from self._send(call)).body
        self.fencing_token = answer["fencing_token"]
        return answer

    @staticmethod
    def _identity(agent, model, workflow, definition_version) -> dict:
        given = {"agent": agent, "model": model, "workflow": workflow,
                 "definition_version": definition_version}
        return {k: v for k, v in given.items() if v is not None}

    def _op_resume_preview(self, run_id: str, identity: dict) -> Op:
        return (yield from self._send(self._call("GET", f"runs/{run_id}/resume",
                                                 query=identity))).body

    def _op_resume(self, run_id: str, identity: dict) -> Op:
        answer = (yield from self._send(self._call("POST", f"runs/{run_id}/resume", identity),
                                        ONCE)).body
        if answer.get("action") == "retry":
            self.fencing_token = answer.get("fencing_token")
        return answer

    @staticmethod
    def _runs_query(recovery_state: str | None, limit: int) -> dict:
        query: dict = {"limit": limit}
        if recovery_state is not None:
            query["recovery_state"] = recovery_state
        return query

    def _op_find_effect(self, service: str, operation_key: str) -> Op:
        query = {"service": service, "operation_key": operation_key}
        answer = (yield from self._send(self._call("GET", "effects", query=query))).body
        if isinstance(answer, dict):
            answer = answer.get("results", answer.get("effects", []))
        for effect in answer or []:
            if effect.get("operation_key") == operation_key and effect.get("service") == service:
                return effect
        return None


class HttpCheckpointStore(StoreCore):
    """A runtime's view of one tenant of the recovery service.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), ``tenant`` the tenant's
    slug, ``token`` a bearer token of an account with the writer role, ``timeout_s`` the
    per-request socket timeout in seconds. ``fencing_token`` is ``None`` until ``lease``
    (or ``resume`` claiming a ``retry``) sets it; from then on every write sends it in
    ``Fencing-Token``. ``resume_preview`` only looks. Not thread-safe: use one store per
    worker thread.

    Retries and the size check (module docstring): ``retries`` (default 3), ``backoff_s``
    (0.2) and ``max_backoff_s`` (5.0) in seconds, ``max_body_bytes`` (1 MiB; ``None``:
    no check); ``sleep`` is the pause function (``time.sleep``; tests pass their own).
    ``retries=0`` sends every request once.

    Connections: with ``keep_alive`` (the default) the store keeps one HTTP/1.1
    connection open and sends every request on it, so a write costs no TCP (or TLS)
    handshake (issue 8); ``close()`` (or ``with store:``) closes it. A connection the
    server has closed while idle (gunicorn's ``keepalive``) is noticed before the next
    request and opened again; if it breaks under a ``GET`` or ``HEAD`` it had served
    others on, the request is sent once more on a new connection (not counted as a
    retry); any other break is a ``storage`` error, which the retries above handle (a
    write is resent only as they say). Without ``keep_alive``, or when a proxy is
    configured for the URL (``HTTP_PROXY`` ...), every request opens its own
    connection through ``urllib``.
    """

    def __init__(self, base_url: str, tenant: str, token: str, timeout_s: float = 10,
                 keep_alive: bool = True, *, retries: int = 3, backoff_s: float = 0.2,
                 max_backoff_s: float = 5.0, max_body_bytes: int | None = MAX_BODY_BYTES,
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__(base_url, tenant, token, timeout_s=timeout_s, retries=retries,
                         backoff_s=backoff_s, max_backoff_s=max_backoff_s,
                         max_body_bytes=max_body_bytes)
        parts = urllib.parse.urlsplit(self.base_url)
        proxied = bool(urllib.request.getproxies()) and not urllib.request.proxy_bypass(
            parts.hostname or "")
        self.keep_alive = keep_alive and parts.scheme in ("http", "https") and not proxied
        self._parts = parts
        self._conn: http.client.HTTPConnection | None = None
        self._sleep = sleep

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

    def _drive(self, op: Op) -> Any:
        """Run operation ``op`` to its end, doing its steps; returns its value."""
        steps = Steps(op)
        for step in steps:
            try:
                steps.reply = self._do(step)
            except Exception as exc:  # handed to op, which raises what it does not handle
                steps.error = exc
        return steps.value

    def _do(self, step: Call | Sleep | Invoke) -> Any:
        if isinstance(step, Call):
            return self._exchange(step)
        if isinstance(step, Sleep):
            return self._sleep(step.seconds)
        return step.fn(*step.args)

    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None,
                query: dict | None = None) -> tuple[int, Mapping[str, str], Any]:
        """Send one request to ``path`` under the tenant; returns ``(status, headers,
        decoded JSON or None)`` for 2xx. A ``GET``/``HEAD`` is retried like a read, any
        other method only when the server surely did nothing (module docstring).

        Raises ``CheckpointError`` for any other answer or a network failure (``storage``),
        and ``invalid_payload`` before sending a body over ``max_body_bytes``.
        """
        return self._drive(self._op_request(method, path, body, headers, query))

    def _exchange(self, call: Call) -> Answer:
        """One exchange, no retry (but the kept-alive connection's own resend of a read)."""
        if self.keep_alive:
            status, headers, raw = self._kept_alive(call)
        else:
            status, headers, raw = self._urlopen(call)
        return decode_answer(call, status, headers, raw)

    def _urlopen(self, call: Call) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(call.url, data=call.data, method=call.method,
                                     headers=call.headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers or {}), exc.read()
        except urllib.error.URLError as exc:  # raised before an answer: connect or send
            unsent = isinstance(exc.reason, (ConnectionRefusedError, socket.gaierror))
            raise network_error(call, exc.reason, sent=not unsent) from None
        except OSError as exc:  # timeouts and resets while reading the answer
            raise network_error(call, exc, sent=True) from None

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

    def _kept_alive(self, call: Call) -> tuple[int, dict, bytes]:
        """``(status, headers, body)`` of one request on the kept-alive connection.
        A connection that breaks under a ``GET``/``HEAD`` it had already served others
        on is replaced once; any other failure closes it and raises ``storage`` (``sent``
        false when the connection could not even be opened)."""
        target = urllib.parse.urlsplit(call.url)
        target = target.path + (f"?{target.query}" if target.query else "")
        for attempt in (1, 2):
            conn, reused = self._connection()
            if conn.sock is None:
                try:
                    conn.connect()
                except OSError as exc:
                    self.close()
                    raise network_error(call, exc, sent=False) from None
            try:
                conn.request(call.method, target, body=call.data, headers=call.headers)
                resp = conn.getresponse()
                raw = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, dict(resp.headers), raw
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                broken = isinstance(exc, (ConnectionError, http.client.RemoteDisconnected))
                if attempt == 1 and reused and broken and call.method in ("GET", "HEAD"):
                    continue
                raise network_error(call, exc, sent=True) from None
        raise AssertionError("unreachable")

    # --- checkpoints --------------------------------------------------------------------

    def load(self, checkpoint_id: str) -> dict | None:
        """The latest envelope of ``checkpoint_id`` (CONTRACT.md 2), or ``None`` if there
        is none. Raises ``CheckpointError`` (``storage`` and others) for any other failure."""
        return self._drive(self._op_load(checkpoint_id))

    def revision(self, checkpoint_id: str) -> int | None:
        """The current revision of ``checkpoint_id``, or ``None`` if there is none: a
        ``HEAD`` (its ``ETag``), which reads no payload, so the server audits and writes
        nothing (``load`` is an audited read). For a runtime that needs only the revision,
        e.g. to check where a checkpoint stands after a ``storage`` error on a write.
        Raises ``CheckpointError`` as ``load``."""
        return self._drive(self._op_revision(checkpoint_id))

    def compare_and_swap(self, checkpoint: dict, expected_revision: int | None) -> int:
        """Write ``checkpoint`` (an envelope) if the store still holds ``expected_revision``.

        ``expected_revision=None`` creates (``checkpoint["revision"]`` must be 0); N
        updates N -> N+1 (``checkpoint["revision"]`` must be N+1). Returns the stored
        revision. A ``storage`` failure is retried safely, a lost answer resolved by
        reading back (module docstring "Retries"). Raises ``CheckpointError``:
        ``conflict`` (412: the id exists / revision is stale, see ``current_revision``;
        409 ``fenced``: another owner holds the run), ``not_found`` (update of a missing
        checkpoint), ``invalid_payload`` (400/413/422, or a body over ``max_body_bytes``,
        not sent), ``storage`` once the retries are spent (the write may have been stored:
        ``revision()`` tells).
        """
        return self._drive(self._op_write(f"checkpoints/{checkpoint['id']}", checkpoint,
                                          expected_revision, look_with_head=True))

    def revisions(self, checkpoint_id: str) -> list[dict]:
        """Every accepted revision of a checkpoint, oldest first (every page: the server
        answers them a bounded page at a time and this follows ``next``)."""
        return self._drive(self._op_revisions(checkpoint_id))

    # --- leases and resume --------------------------------------------------------------

    def lease(self, run_id: str, owner: str, ttl_s: int) -> dict:
        """Take or renew the run's lease for ``ttl_s`` seconds as ``owner``.

        Returns ``{"fencing_token": int, "expires_at": str}`` and remembers the token for
        later writes. Retried like a read: the same owner renewing keeps its token.
        Raises ``CheckpointError``: ``conflict`` (409 ``lease_held``: another owner's
        lease is live), ``not_found`` (the run has no checkpoint or effect yet),
        ``invalid_payload`` (bad owner or ttl).
        """
        return self._drive(self._op_lease(run_id, owner, ttl_s))

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
        identity = self._identity(agent, model, workflow, definition_version)
        return self._drive(self._op_resume_preview(run_id, identity))

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
        The claim is resent only when the server surely did nothing (not sent, 503, 429):
        a claim whose answer was lost may have consumed the approval.

        Raises ``CheckpointError``: ``not_found`` (no such run, or a tenant this token has
        no role in), ``invalid_payload`` (400, a bad field), ``storage`` (403 for a token
        without the writer role, 5xx, network).
        """
        identity = self._identity(agent, model, workflow, definition_version)
        return self._drive(self._op_resume(run_id, identity))

    def list_runs(self, *, recovery_state: str | None = None, limit: int = 50):
        """Yield the tenant's runs (``GET …/runs``), newest write first, every page.

        Each run is the API's run object (``run_id``, ``recovery_state``,
        ``recovery_reason``, ``kind``, ...). ``recovery_state`` filters (``ambiguous``,
        ``retry_approved``, ...); ``limit`` is the page size (1..200). Raises
        ``CheckpointError`` (``invalid_payload`` for a bad filter, ``storage``, ...).
        """
        query: dict | None = self._runs_query(recovery_state, limit)
        while query is not None:
            results, query = self._drive(self._op_page("runs", query))
            yield from results

    # --- effects ------------------------------------------------------------------------

    def put_effect(self, effect: dict, expected_revision: int | None) -> int:
        """Compare-and-swap one effect record (same headers, errors and retries as
        checkpoints; a lost answer is looked up with one ``GET``, which audits nothing).

        ``effect``: ``{id, run_id, revision, operation_key, service, effect_class,
        request_fingerprint, state, receipt}``. Returns the stored revision. Besides the
        checkpoint errors: ``conflict`` with ``error == "operation_exists"`` (another
        effect id holds the key with the same fingerprint: ``body["effect_id"]``),
        ``invalid_payload`` with ``error`` ``idempotency_key_reuse`` or
        ``invalid_transition``.
        """
        return self._drive(self._op_write(f"effects/{effect['id']}", effect,
                                          expected_revision, look_with_head=False))

    def find_effect(self, service: str, operation_key: str) -> dict | None:
        """The effect record holding ``(service, operation_key)``, or ``None``."""
        return self._drive(self._op_find_effect(service, operation_key))


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


def effect_walk(store: StoreCore, *, run_id: str, service: str, operation_key: str,
                effect_class: str, request: Any, call: Callable, effect_id: str | None,
                on_step: Callable | None, retry: bool, store_request: bool | None,
                fencing_token: int | None = None) -> Op:
    """``perform_effect`` as an operation of ``store`` (its steps are done by the
    store's ``_drive``, sync or async; ``call`` and ``on_step`` are ``Invoke`` steps)."""
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
    planned = dict(record, request=request) if store_request else record
    try:
        yield from store._op_write(f"effects/{record['id']}", planned, None,
                                   look_with_head=False, fencing_token=fencing_token)
    except CheckpointError as exc:
        if exc.error != "operation_exists":
            raise
        existing = yield from store._op_find_effect(service, operation_key)
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

    def advance_to(new_state: str, receipt: dict | None) -> Op:
        nxt = dict(record, revision=record["revision"] + 1, state=new_state, receipt=receipt)
        yield from store._op_write(f"effects/{record['id']}", nxt, record["revision"],
                                   look_with_head=False, fencing_token=fencing_token)
        record.update(nxt)

    def step(name: str) -> Op:
        if on_step is not None:
            yield Invoke(on_step, (name,))

    if retry and state in ("unknown", "not_executed"):
        yield from advance_to("planned", None)
    elif state != "planned":
        raise EffectInDoubt(record)

    yield from advance_to("submitted", None)
    yield from step("submitted")
    try:
        receipt = yield Invoke(call, (operation_key,))
    except EffectFailed as exc:
        yield from advance_to("failed", exc.receipt)
        raise
    yield from step("called")
    yield from advance_to("confirmed", receipt)
    yield from step("confirmed")
    return receipt


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
    fencing_token: int | None = None,
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

    Every record write is a ``put_effect``, so its ``storage`` failures are retried and
    lost answers resolved as there; ``call`` itself is never repeated by this function.
    ``request`` is what the fingerprint is computed over. With ``store_request`` (default:
    only for ``idempotent`` effects) the planned record also carries ``request`` itself
    (stored encrypted), so that the service's ``replay`` reconciler can send it again with
    the same key if this process dies mid-call. ``fencing_token``, when given, is sent
    with the record writes instead of the store's own (the token of whoever holds the
    run's lease for this call, e.g. ``RecoverySaver.fencing_token(thread_id)``; the store
    is left unchanged, so threads may share it). Returns the receipt. Raises
    ``CheckpointError`` from the store (422 ``idempotency_key_reuse`` when the key holds
    another request; ``conflict`` if fenced or raced), ``EffectFailed``, ``EffectInDoubt``.
    """
    return store._drive(effect_walk(
        store, run_id=run_id, service=service, operation_key=operation_key,
        effect_class=effect_class, request=request, call=call, effect_id=effect_id,
        on_step=on_step, retry=retry, store_request=store_request,
        fencing_token=fencing_token))
