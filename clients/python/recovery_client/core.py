"""The sans-IO core of the runtime clients: the protocol rules of CONTRACT.md section 3
as data and generators, with no I/O of its own.

Standard library only, like ``client.py``, which builds on it: a runtime that vendors the
client copies both files, ``core.py`` and ``client.py``, into one package of its own
(``client.py`` imports this module relatively; docs/client.md). ``aclient.py`` (httpx)
and ``langgraph.py`` use it too, so every client shares one set of rules: URLs, headers,
the size check, answer decoding, error kinds, retries and lost answers.

Shapes: every store operation (``StoreCore._op_*``, ``client.effect_walk``) is a
generator (``Op``) that yields what it needs done and receives the outcome:

- ``Call(method, path, url, data, headers)``: one HTTP exchange; the store sends back
  its ``Answer(status, headers, body)`` (a 2xx, ``body`` the decoded JSON or ``None``;
  ``decode_answer`` makes it) or throws in the ``CheckpointError`` of any other answer
  (``decode_answer``) or of no answer (``network_error``);
- ``Sleep(seconds)``: a pause before a retry;
- ``Invoke(fn, args)``: the caller's function (``perform_effect``'s ``call`` and
  ``on_step``); the async store awaits an awaitable result.

``Steps(op)`` walks an operation for a store's ``_drive``, which does the I/O:
``client.HttpCheckpointStore`` with http.client/urllib and ``time.sleep``,
``aclient.AsyncHttpCheckpointStore`` with httpx and ``asyncio.sleep``.

Errors: every failure is a ``CheckpointError`` (its docstring: the kinds); what is
retried, and how a lost answer is resolved, is the module docstring of ``client.py``.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import random
import time
import urllib.parse
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping
from typing import Any, NamedTuple

NOT_FOUND, CONFLICT, INVALID_PAYLOAD, STORAGE = "not_found", "conflict", "invalid_payload", "storage"

#: The server's default body limit, ``RECOVERY_MAX_BODY_BYTES`` (CONTRACT.md 6): 1 MiB.
MAX_BODY_BYTES = 1024 * 1024
#: Fields a write sends that the record's read never answers (an effect's ``request``
#: is stored encrypted for the replay reconciler): left out when a lost answer is
#: checked against the stored record.
UNECHOED_FIELDS = frozenset({"request"})
#: How many runs' fencing tokens one store remembers (least recently used dropped first:
#: a dropped run's writes then carry no token and are refused ``fenced``, never let by).
MAX_RUN_TOKENS = 4096


def _run_key(run_id) -> str:
    """One key per run whatever the spelling of its id (the server reads any UUID form:
    the stop-39 attack leased ``RUN.upper()`` and its lower-case writes went without
    their token); a value that is no UUID keys as itself (the server refuses it)."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        return str(run_id)


class CheckpointError(Exception):
    """A store operation failed; ``kind`` says how (runifold-core's ``CheckpointErrorKind``).

    - ``not_found``: 404 (no such checkpoint, effect, run or tenant for this token).
    - ``conflict``: 412 stale revision (``current_revision`` set), 409 ``fenced`` (another
      owner took the run; ``fencing_token`` in ``body``), 409 ``lease_held``, 409
      ``operation_exists`` (``body["effect_id"]``), 409 ``no_live_lease`` (a lease
      revoke on a run holding none), 409 ``run_deleted``.
    - ``invalid_payload``: 400, 413, 422 (bad field, invalid effect transition,
      idempotency key reused with another fingerprint), 428; and, with ``status`` 0,
      a body the client refused before sending (longer than ``max_body_bytes``:
      ``error == "payload_too_large"``; or not JSON).
    - ``storage``: network error, timeout, 5xx, 429, 401/403 (``forbidden`` true) or an
      unreadable answer.

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
    def forbidden(self) -> bool:
        """Whether the server refused the token (401) or its role (403): still kind
        ``storage`` (runifold's four kinds), never retried; a token or role to fix, not
        an outage (the SDK newcomer's finding 7)."""
        return self.status in (401, 403)

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


# --- steps and their outcomes (module docstring, "Shapes") ------------------------------


class UnreadableWrite(UserWarning):
    """Warned when the server stored a checkpoint it cannot read (an unregistered kind, an
    unsupported ``schema_version``, a payload failing the declared schema): the write
    returns its revision as any other, but the run reads as ``schema_mismatch``. The
    message names ``phase_label``, the server's reason (the SDK newcomer's finding 4)."""


def warn_if_unreadable(path: str, stored: Any) -> None:
    """Warn ``UnreadableWrite`` if a write's answer ``stored`` says ``phase_class``
    ``unsupported``."""
    if isinstance(stored, dict) and stored.get("phase_class") == "unsupported":
        warnings.warn(UnreadableWrite(f"PUT {path}: stored, but unreadable: "
                                      f"{stored.get('phase_label')}"), stacklevel=2)


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
    """``value`` as compact UTF-8 JSON bytes (no spaces, non-ASCII as UTF-8), as every
    client sends bodies, so size checks count the server's bytes (CONTRACT.md 6, issue
    10). Raises ``CheckpointError`` ``invalid_payload`` (``sent`` false) for a value that
    is not JSON or holds an unpaired surrogate, naming where (``body.payload.note``)."""
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
    """``body`` as the JSON bytes to send (``encode_json``), measured as sent. Raises
    ``CheckpointError`` ``invalid_payload`` (``sent`` false) as ``encode_json`` does, or
    when longer than ``limit`` bytes (``error == "payload_too_large"``: the server's 413)."""
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
    """What ``HttpCheckpointStore`` and ``AsyncHttpCheckpointStore`` share: settings (the
    stores' docstrings), each run's fencing token, and every operation as a generator of
    steps (no I/O here). Raises ``ValueError`` for a setting out of range."""

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
        #: The token of the last ``lease`` or claimed ``retry``, whichever run it was
        #: (deprecated, informational: writes send ``fencing_token_of(their run)``).
        self.fencing_token: int | None = None
        self._run_tokens: OrderedDict[str, int] = OrderedDict()

    def fencing_token_of(self, run_id: str) -> int | None:
        """The token this store's writes to ``run_id`` send (its last ``lease`` or claimed
        ``retry`` of it), or ``None``: never leased nor claimed, or ``fenced`` since.
        Any spelling of the run's UUID names the same run (upper case, no dashes)."""
        return self._run_tokens.get(_run_key(run_id))

    def _token_for_write(self, run_id: str) -> int | None:
        """``fencing_token_of(run_id)``, the run then the most recently used: a run
        written all along is not the one dropped past ``MAX_RUN_TOKENS`` (the stop-39
        attack: it was the least recently leased)."""
        key = _run_key(run_id)
        token = self._run_tokens.get(key)
        if token is not None:
            self._run_tokens.move_to_end(key)
        return token

    def _hold_token(self, run_id: str, token: int | None) -> None:
        """Remember ``token`` as run ``run_id``'s (``None``: forget it), and as the
        deprecated ``fencing_token``."""
        run_id = _run_key(run_id)
        self._run_tokens.pop(run_id, None)
        if token is None:
            return
        self.fencing_token = self._run_tokens[run_id] = token
        while len(self._run_tokens) > MAX_RUN_TOKENS:
            self._run_tokens.popitem(last=False)

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

    def _write_headers(self, expected_revision: int | None, fencing_token: int | None = None,
                       run_id: str | None = None) -> dict:
        """The conditional headers of a write, and ``Fencing-Token``: ``fencing_token``
        when given (a call made for another holder of the run's lease, e.g. a LangGraph
        saver's), else this store's token of run ``run_id`` if it holds one."""
        headers = ({"If-None-Match": "*"} if expected_revision is None
                   else {"If-Match": f'"{expected_revision}"'})
        token = fencing_token
        if token is None and run_id is not None:
            token = self._token_for_write(run_id)
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
        and lost answers as ``client.py``'s module docstring says; ``look_with_head``: a
        HEAD tells the revision before any GET (a checkpoint's GET is an audited payload
        read). A ``fenced`` answer to this store's own token of the run forgets it."""
        run_id = record.get("run_id")
        try:
            return (yield from self._op_write_once(path, record, expected_revision,
                                                   look_with_head, fencing_token, run_id))
        except CheckpointError as exc:
            if exc.error == "fenced" and fencing_token is None and run_id is not None:
                self._hold_token(run_id, None)
            raise

    def _op_write_once(self, path, record, expected_revision, look_with_head, fencing_token,
                       run_id) -> Op:
        call = self._call("PUT", path, record,
                          self._write_headers(expected_revision, fencing_token, run_id))
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
            warn_if_unreadable(path, answer.body)
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
        self._hold_token(run_id, answer["fencing_token"])
        return answer

    def _op_revoke_lease(self, run_id: str, reason: str, owner: str | None,
                         fencing_token: int | None) -> Op:
        """``POST …/runs/{run_id}/lease/revoke`` (``HttpCheckpointStore.revoke_lease``),
        resent only when the server surely did nothing (``ONCE``)."""
        body: dict = {"reason": reason}
        if owner is not None:
            body["owner"] = owner
        if fencing_token is not None:
            body["fencing_token"] = fencing_token
        call = self._call("POST", f"runs/{run_id}/lease/revoke", body)
        return (yield from self._send(call, ONCE)).body

    def _op_release_lease(self, run_id: str, owner: str) -> Op:
        """``POST …/runs/{run_id}/lease/release`` with the token this store holds for the
        run (``HttpCheckpointStore.release_lease``), resent only when the server surely
        did nothing (``ONCE``); the run's token is forgotten once released."""
        token = self.fencing_token_of(run_id)
        if token is None:
            raise CheckpointError(INVALID_PAYLOAD, f"release_lease: this store holds no "
                                                   f"lease of run {run_id}; nothing was sent",
                                  sent=False)
        call = self._call("POST", f"runs/{run_id}/lease/release",
                          {"owner": owner, "fencing_token": token})
        answer = (yield from self._send(call, ONCE)).body
        self._hold_token(run_id, None)
        return answer

    @staticmethod
    def _identity(agent, model, workflow, definition_version) -> dict:
        """The identity given; ``definition_version`` may be an ``int`` (kinds number
        their versions) and is sent as its decimal string, the run's form."""
        if type(definition_version) is int:
            definition_version = str(definition_version)
        given = {"agent": agent, "model": model, "workflow": workflow,
                 "definition_version": definition_version}
        return {k: v for k, v in given.items() if v is not None}

    def _op_resume_preview(self, run_id: str, identity: dict) -> Op:
        return (yield from self._send(self._call("GET", f"runs/{run_id}/resume",
                                                 query=identity))).body

    def _op_resume(self, run_id: str, identity: dict, usage: dict | None = None) -> Op:
        body = identity if usage is None else {**identity, "usage": usage}
        answer = (yield from self._send(self._call("POST", f"runs/{run_id}/resume", body),
                                        ONCE)).body
        if answer.get("action") == "retry":
            self._hold_token(run_id, answer.get("fencing_token"))
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
