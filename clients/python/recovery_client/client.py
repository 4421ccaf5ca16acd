"""The runtime client: checkpoints, effects, leases and resume decisions over HTTP.

Standard library only (``urllib`` + ``json``), so any Python runtime can vendor it: two
files, ``core.py`` (the sans-IO protocol core: errors, steps, retries, lost answers) and
this one, copied together into one package of the runtime's own, since this module
imports ``core`` relatively (``recovery_client/aclient.py`` is the asyncio variant, on
httpx; docs/client.md). It speaks CONTRACT.md section 3 and mirrors runifold-core's
checkpoint store (RUNIFOLD.md section 1, DESIGN.md section 1)::

    owner = owner_name("order-worker")                    # unique per process lifetime
    envelope = new_checkpoint("acme.order", 1, {"phase": "ready"})  # a declared kind
    run_id = envelope["run_id"]
    with HttpCheckpointStore("http://127.0.0.1:8000", "acme", token) as store:
        store.compare_and_swap(envelope, None)            # create revision 0
        store.lease(run_id, owner, ttl_s=5)                # its writes carry Fencing-Token
        store.compare_and_swap(next_revision(envelope, {"phase": "charging"}), 0)
        receipt = perform_effect(store, run_id=run_id, service="payments",
                                 operation_key="charge:A-1042",
                                 effect_class="non_idempotent",
                                 request={"amount_cents": 2599}, call=charge_card)
        # after a restart:
        store.resume_preview(run_id)                       # look: changes nothing (GET)
        decision = store.resume(run_id, workflow="acme.order")  # claim (POST); on "retry"
                                                           # the old owner is fenced

Errors: every failure is a ``CheckpointError`` (``core.CheckpointError``: ``kind``,
``status``, ``body``, and ``error``, the server's stable word: ``fenced``, ...).

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
- the ``resume`` claim (it consumes an approved retry), ``revoke_lease`` and
  ``release_lease`` (each ends the lease once; a resend would find none) are resent only
  when the server surely did nothing: the connection could not be opened, or it
  answered 503/429;
- ``compare_and_swap`` and ``put_effect`` are resent safely: at once when the server
  surely did nothing; after a failure the write may have been stored by (a timeout, a
  reset, a 5xx but 503), only once a look (``HEAD`` then ``GET`` of a checkpoint, one
  ``GET`` of an effect; writing nothing) found the store does not hold exactly this
  write, and a resend refused 412 at the revision it wrote is read back once more
  (docs/client.md "Retries", the whole rule). A look that fails counts as a retry.

Connections: ``HttpCheckpointStore`` keeps one HTTP/1.1 connection (issue 8);
``close()`` or ``with store:`` closes it. The async store keeps a pool (httpx).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .core import (
    CONFLICT,
    IDEMPOTENT,
    INVALID_PAYLOAD,
    MAX_BODY_BYTES,
    MAX_RUN_TOKENS,
    NOT_FOUND,
    ONCE,
    STORAGE,
    UNECHOED_FIELDS,
    Answer,
    Call,
    CheckpointError,
    Invoke,
    Op,
    Sleep,
    Steps,
    StoreCore,
    UnreadableWrite,
    decode_answer,
    encode_body,
    encode_json,
    etag_revision,
    fingerprint,
    header,
    kind_for_status,
    may_have_acted,
    network_error,
    next_revision,
    now_ms,
    retry_after_seconds,
    retryable,
    warn_if_unreadable,
)

# This module's own names, then every public name of ``core`` it re-exports: callers
# import them from ``recovery_client.client`` as they did before the core had a module.
__all__ = [
    "EffectFailed", "EffectInDoubt", "HttpCheckpointStore", "ReceiptNotRecorded",
    "effect_fields", "effect_walk", "new_checkpoint", "owner_name", "perform_effect",
    "CONFLICT", "IDEMPOTENT", "INVALID_PAYLOAD", "MAX_BODY_BYTES", "MAX_RUN_TOKENS", "NOT_FOUND",
    "ONCE",
    "STORAGE", "UNECHOED_FIELDS", "Answer", "Call", "CheckpointError", "Invoke", "Op",
    "Sleep", "Steps", "StoreCore", "UnreadableWrite", "decode_answer", "encode_body", "encode_json",
    "etag_revision", "fingerprint", "header", "kind_for_status", "may_have_acted",
    "network_error", "next_revision", "now_ms", "retry_after_seconds", "retryable",
    "warn_if_unreadable",
]


def owner_name(prefix: str | None = None) -> str:
    """A lease owner name unique to this process's lifetime: ``[prefix:]host:pid:uuid4``
    (at most 256 characters, the server's limit). A restarted worker must not lease as
    the owner it was: the server keeps the token when the same owner renews, so the
    zombie of a fixed name would not be fenced (the SDK newcomer's finding 3;
    ``RecoverySaver``'s default owner). Raises ``ValueError`` for a prefix too long, or
    one the server's name rule refuses (a control, format or line-separating character:
    not ``str.isprintable``; blank), so no lease is tried with it (the stop-39 attack)."""
    if prefix is not None and (not prefix.isprintable() or not prefix.strip()):
        raise ValueError("prefix: printable characters only, not blank")
    name = f"{socket.gethostname()[:150]}:{os.getpid()}:{uuid.uuid4()}"
    name = name if prefix is None else f"{prefix}:{name}"
    if len(name) > 256:
        raise ValueError("prefix: the owner name would be longer than 256 characters")
    return name


def new_checkpoint(kind: str, schema_version: int, payload: Any, *,
                   run_id: str | None = None, checkpoint_id: str | None = None) -> dict:
    """The first envelope (revision 0) of a checkpoint (CONTRACT.md 2), for
    ``compare_and_swap(envelope, None)``: ``id`` and ``run_id`` a fresh ``uuid4`` each
    unless given (any UUID is accepted; runifold uses UUIDv7), ``updated_at_ms`` now.
    ``kind`` must be declared on the server (docs/kinds.md), else the run reads as
    ``schema_mismatch`` (``UnreadableWrite``). Later revisions: ``next_revision``."""
    return {"id": str(checkpoint_id or uuid.uuid4()), "run_id": str(run_id or uuid.uuid4()),
            "revision": 0, "kind": kind, "schema_version": schema_version,
            "payload": payload, "updated_at_ms": now_ms()}


class HttpCheckpointStore(StoreCore):
    """A runtime's view of one tenant of the recovery service.

    ``base_url`` is the server root (``http://127.0.0.1:8000``), ``tenant`` the tenant's
    slug, ``token`` a bearer token of an account with the writer role, ``timeout_s`` the
    per-request socket timeout in seconds. Fencing tokens are kept per run: a write sends,
    in ``Fencing-Token``, the token of its record's run that this store got from ``lease``
    or from ``resume`` claiming a ``retry`` (``fencing_token_of(run_id)``), and none for
    a run it never leased or claimed, so one store may loop over many runs (a ``fenced``
    answer forgets that run's token). ``fencing_token`` (deprecated) is the token of the
    last lease or claim, whichever run it was: informational, never sent for another
    run. ``resume_preview`` only looks. Not thread-safe: use one store per worker thread.

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
        later writes to this run (``fencing_token_of(run_id)``; other runs' are kept).
        Retried like a read: the same owner renewing keeps its token. Raises
        ``CheckpointError``: ``conflict`` (409 ``lease_held``: another owner's lease is
        live), ``not_found`` (the run has no checkpoint or effect yet),
        ``invalid_payload`` (bad owner or ttl).
        """
        return self._drive(self._op_lease(run_id, owner, ttl_s))

    @contextlib.contextmanager
    def keep_leased(self, run_id: str, owner: str, ttl_s: int, *,
                    every_s: float | None = None):
        """``with store.keep_leased(run_id, owner, ttl_s):`` takes the run's lease (as
        ``lease``: its errors raise here), then renews it every ``every_s`` seconds
        (default ``ttl_s / 3``) on a thread of its own, with a store of its own (a store
        is not thread-safe), until the block ends: a call that outlasts ``ttl_s``
        (``perform_effect``'s) does not let the sweep make its effect ``unresolved``.
        The same owner renewing keeps the token, so this store's writes go on. Yields a
        dict whose ``"error"`` is the last renewal's ``CheckpointError`` (``None``
        while all went well); a ``conflict`` (another owner took the run) stops the
        renewals, and so does this store no longer holding the run's token
        (``release_lease`` inside the block, or a ``fenced`` write: the renewer does not
        take the lease back; the stop-39 attack). The lease is not given up at the end
        (the SDK newcomer's finding 2)."""
        self.lease(run_id, owner, ttl_s)
        state: dict = {"error": None}
        stop = threading.Event()
        renewer = HttpCheckpointStore(self.base_url, self.tenant, self.token, self.timeout_s,
                                      self.keep_alive, retries=self.retries,
                                      backoff_s=self.backoff_s,
                                      max_backoff_s=self.max_backoff_s, sleep=self._sleep)

        def renew() -> None:
            while not stop.wait(ttl_s / 3 if every_s is None else every_s):
                if self.fencing_token_of(run_id) is None:  # released or fenced: stay so
                    return
                try:
                    renewer.lease(run_id, owner, ttl_s)
                    state["error"] = None
                except CheckpointError as exc:
                    state["error"] = exc
                    if exc.kind == CONFLICT:
                        return

        thread = threading.Thread(target=renew, name=f"lease {run_id}", daemon=True)
        thread.start()
        try:
            yield state
        finally:
            stop.set()
            thread.join()
            renewer.close()

    def revoke_lease(self, run_id: str, reason: str, *, owner: str | None = None,
                     fencing_token: int | None = None) -> dict:
        """End the run's live lease because its owner is gone (``POST …/runs/{run_id}/
        lease/revoke``, the run page's "End the lease"; a reviewer's right, so this store's
        token needs the reviewer role, not the writer's).

        The server sets the lease's expiry to its clock's now and raises the run's fencing
        token by one: the old owner's writes are refused (``fenced``) from then on, and
        reconcile, mark unknown and retry requests no longer answer ``owner_live``.
        ``reason`` is required (audited with the event ``lease.revoke``). ``owner`` and
        ``fencing_token`` (optional) are the lease you saw: a lease taken or renewed
        since by another owner, or taken again since (a new token), is not ended.

        Returns ``{"owner": str, "fencing_token": int, "expires_at": str}``: who held the
        lease, the new token, when it ended (ISO 8601). This store's own
        ``fencing_token`` is left as it was. Resent only when the server surely did
        nothing (module docstring). Raises ``CheckpointError``: ``conflict`` (409
        ``no_live_lease``: the run holds no live lease; ``lease_held``: not the lease
        ``owner``/``fencing_token`` name; ``run_deleted``), ``not_found`` (no such run, or
        a tenant this token has no role in), ``invalid_payload`` (400: no reason, a bad
        owner or token), ``storage`` (403 for a token without the reviewer role, 5xx,
        network).
        """
        return self._drive(self._op_revoke_lease(run_id, reason, owner, fencing_token))

    def release_lease(self, run_id: str, owner: str) -> dict:
        """Give back the run's live lease this store holds as ``owner`` (``POST …/runs/
        {run_id}/lease/release``, writer): when the runtime is done with the run or shuts
        down cleanly, so the next worker takes the run at once instead of waiting out the
        ttl. Sends the token this store holds for the run (``fencing_token_of``), which
        it then forgets: the server raises the run's token, so a write still on its way
        from this process is refused (``fenced``). A run released while its checkpoint
        is in flight is ambiguous at once (a reviewer's), as after the lease expired.

        Returns ``{"owner": str, "fencing_token": int, "expires_at": str}`` (the new
        token, the lease's end). Resent only when the server surely did nothing. Raises
        ``CheckpointError``: ``invalid_payload`` (this store holds no lease of the run:
        nothing sent; a bad owner), ``conflict`` (409 ``no_live_lease``: it expired or
        was ended; ``lease_held``: another owner or token holds it now), ``not_found``,
        ``storage`` (403 without the writer role, 5xx, network).
        """
        return self._drive(self._op_release_lease(run_id, owner))

    def resume_preview(self, run_id: str, *, agent: str | None = None, model: str | None = None,
                       workflow: str | None = None,
                       definition_version: str | int | None = None) -> dict:
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
               workflow: str | None = None, definition_version: str | int | None = None,
               usage: dict[str, int] | None = None) -> dict:
        """Claim the resume decision for ``run_id`` after a restart (``POST …/resume``).

        The identity arguments (``model`` is ``provider/name``) are sent in the JSON body,
        only those given; each one given must match the run's, else the answer is
        ``reject`` / ``identity_mismatch``. Returns ``{"action", "reason",
        "checkpoint_id", "revision", "fencing_token"}``; ``action`` is ``replay``,
        ``continue``, ``reject``, ``retry`` or ``reconcile`` (CONTRACT.md 3).

        ``usage`` (``{counter: int}``, e.g. ``{"tokens": 702, "cost_microusd": 215}``) is the
        runtime's own usage: ``continue`` and ``replay`` need it equal to the checkpoint's,
        ``retry`` at least the checkpoint's, else the answer is ``reject`` /
        ``usage_mismatch`` and an approved retry is not consumed (CONTRACT.md 8).

        ``retry`` means this call consumed an approved retry: the server bumped the
        fencing token (the old owner is fenced), dropped the lease, and authorised
        ``unknown``/``not_executed`` effects to go back to ``planned``. The returned
        ``fencing_token`` is remembered as this run's and sent with every later write to
        it (a ``lease`` afterwards replaces it with a newer one). Only one caller gets ``retry`` for one
        approval. For any other action the store's fencing token is left as it was.
        The claim is resent only when the server surely did nothing (not sent, 503, 429):
        a claim whose answer was lost may have consumed the approval.

        Raises ``CheckpointError``: ``not_found`` (no such run, or a tenant this token has
        no role in), ``invalid_payload`` (400, a bad field), ``storage`` (403 for a token
        without the writer role, 5xx, network).
        """
        identity = self._identity(agent, model, workflow, definition_version)
        return self._drive(self._op_resume(run_id, identity, usage))

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
        request_fingerprint, state, receipt}`` and optionally ``request``; only those
        fields are sent (``effect_fields``), so a record ``find_effect`` read back, with
        the server's extra fields, can be written back as its next revision.
        Returns the stored revision. Besides the
        checkpoint errors: ``conflict`` with ``error == "operation_exists"`` (another
        effect id holds the key with the same fingerprint: ``body["effect_id"]``),
        ``invalid_payload`` with ``error`` ``idempotency_key_reuse`` or
        ``invalid_transition``.
        """
        return self._drive(self._op_write(f"effects/{effect['id']}", effect_fields(effect),
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


class ReceiptNotRecorded(CheckpointError):
    """The service was called and answered, but its outcome could not be recorded:
    ``receipt`` is its answer (log it: reconciliation or a reviewer needs it, and the
    call must not be made again), ``effect`` the record as last seen; ``kind``,
    ``status``, ``body`` and ``error`` are those of the refused write (the SDK newcomer's
    finding 2)."""

    def __init__(self, exc: CheckpointError, receipt: dict | None, effect: dict):
        super().__init__(exc.kind, f"{exc.message}; the call was made, its receipt is not "
                                   f"recorded", status=exc.status, body=exc.body,
                         sent=exc.sent, retry_after_s=exc.retry_after_s)
        self.receipt = receipt
        self.effect = dict(effect)


_EFFECT_FIELDS = ("id", "run_id", "revision", "operation_key", "service", "effect_class",
                  "request_fingerprint", "state", "receipt")


def effect_fields(effect: dict) -> dict:
    """The fields of ``effect`` a write sends (``_EFFECT_FIELDS``, and ``request`` if
    present): a record read back (``find_effect``: ``attempt``, times, ...) minus what the
    server would refuse as unknown fields (400; the SDK newcomer's finding 5)."""
    return {k: v for k, v in effect.items() if k in _EFFECT_FIELDS or k == "request"}


def _advance(store: StoreCore, record: dict, new_state: str, receipt: dict | None,
             fencing_token: int | None) -> Op:
    """Write ``record``'s next revision in ``new_state`` with ``receipt``; on success
    ``record`` is updated to it."""
    nxt = dict(record, revision=record["revision"] + 1, state=new_state, receipt=receipt)
    yield from store._op_write(f"effects/{record['id']}", nxt, record["revision"],
                               look_with_head=False, fencing_token=fencing_token)
    record.update(nxt)


def _record_outcome(store: StoreCore, record: dict, new_state: str, receipt: dict | None,
                    fencing_token: int | None) -> Op:
    """``_advance`` after the call. Refused 412 because the record moved on meanwhile
    (the sweep made it ``unresolved`` once the lease ran out), it is read again and, if
    ``unresolved``, the outcome is written from there (the server decides; a runtime
    reconciling by itself may, checkpoints/policy.py). Any refusal left raises
    ``ReceiptNotRecorded`` holding the receipt (the SDK newcomer's finding 2)."""
    try:
        try:
            yield from _advance(store, record, new_state, receipt, fencing_token)
        except CheckpointError as exc:
            if exc.status != 412:
                raise
            now = yield from store._op_find_effect(record["service"], record["operation_key"])
            if not now or now.get("state") != "unresolved":
                raise
            record.update({k: now.get(k) for k in _EFFECT_FIELDS})
            yield from _advance(store, record, new_state, receipt, fencing_token)
    except CheckpointError as exc:
        raise ReceiptNotRecorded(exc, receipt, record) from exc


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
        return _advance(store, record, new_state, receipt, fencing_token)

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
        yield from _record_outcome(store, record, "failed", exc.receipt, fencing_token)
        raise
    yield from step("called")
    yield from _record_outcome(store, record, "confirmed", receipt, fencing_token)
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
       If the sweep made the record ``unresolved`` meanwhile (the call outlasted the
       lease: keep it renewed, ``keep_leased``), the outcome is recorded from
       ``unresolved``; a refusal left raises ``ReceiptNotRecorded`` (a
       ``CheckpointError``) whose ``receipt`` is the service's answer: log it.

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
