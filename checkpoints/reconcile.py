"""Reconcilers: ask the external service whether an operation happened, by its key.

A reconciler is a class with a ``name`` and one method::

    def lookup(self, effect: EffectRef) -> Answer

that asks its service about ``effect.operation_key`` and answers one of:

- ``Answer.found(receipt)``: the operation happened; ``receipt`` (a JSON object) becomes
  the effect's receipt (``confirmed``);
- ``Answer.refused(receipt)``: the service refused it for good (``failed``);
- ``Answer.not_executed()``: the service never saw the key (``not_executed``, but only
  once the owner is gone and the settle delay has passed since ``submitted``);
- ``Answer.cannot_tell(detail)``: an error, a timeout or an answer that makes no sense;
  the effect stays as it is and the request tries again later (capped back-off);
- ``Answer.no_lookup()``: the service offers no look-up: the outcome is ``unknown`` and a
  human decides (CONTRACT.md 3).

Plugins are registered per service per tenant (``ReconcilerConfig`` rows, written by
``services.reconciler_configure`` / ``manage.py set_reconciler``), falling back to the
``RECOVERY_RECONCILERS`` environment default (``service=base_url`` pairs, HTTP status
look-up). ``plugin`` is a name in ``REGISTRY`` or a dotted path to a class taking
``(url=..., timeout_s=...)``. Every call runs under a timeout
(``reconciliation.lookup_with_timeout``), and whatever a plugin returns or raises, its
answer passes the same strict checks as an API body before anything is stored: a bad
answer is recorded as ``cannot_tell`` with the reason (CONTRACT.md 6).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from .exceptions import InvalidPayload
from .jsonparse import loads_object
from .models import ReconcilerConfig
from .vocab import EffectClass, ReconcileAnswer

# The most of an answer a reconciler reads, and of a plugin's receipt or evidence that is
# stored; more is "cannot tell" (a receipt is small).
MAX_ANSWER_BYTES = 256 * 1024

# A plugin's answers (``ReconcileAnswer.SERVICE``), by the names plugins use.
FOUND, REFUSED, NOT_EXECUTED, CANNOT_TELL, NO_LOOKUP = ReconcileAnswer.SERVICE


@dataclass(frozen=True)
class EffectRef:
    """What a reconciler may know about the effect it looks up (no payloads).

    ``request`` is the canonical request the runtime sent with the effect (a dict), or
    ``None`` when it sent none; only the replay reconciler needs it.
    """

    tenant: str
    effect_id: uuid.UUID
    service: str
    operation_key: str
    effect_class: str
    request_fingerprint: str
    attempt: int
    request: dict | None = None


@dataclass(frozen=True)
class Answer:
    """A reconciler's answer. ``kind`` is one of ``ReconcileAnswer.SERVICE``; ``receipt`` a JSON object for found/failed; ``evidence`` what the service
    actually answered (kept, encrypted, for reviewers); ``detail`` one line for people.

    ``detail`` is stored in clear and shown to every role (viewers included) and written
    into audit reasons: say what happened and why, never a value from the receipt or the
    evidence (those are encrypted and revealed only with an audit event)."""

    kind: str
    receipt: dict | None = None
    detail: str = ""
    evidence: Any = field(default=None)

    @classmethod
    def found(cls, receipt: dict, detail: str = "", evidence: Any = None) -> Answer:
        return cls(FOUND, receipt, detail, receipt if evidence is None else evidence)

    @classmethod
    def refused(cls, receipt: dict, detail: str = "", evidence: Any = None) -> Answer:
        return cls(REFUSED, receipt, detail, receipt if evidence is None else evidence)

    @classmethod
    def not_executed(cls, detail: str = "", evidence: Any = None) -> Answer:
        return cls(NOT_EXECUTED, None, detail, evidence)

    @classmethod
    def cannot_tell(cls, detail: str, evidence: Any = None) -> Answer:
        return cls(CANNOT_TELL, None, detail, evidence)

    @classmethod
    def no_lookup(cls, detail: str = "the service offers no status look-up") -> Answer:
        return cls(NO_LOOKUP, None, detail, None)


class NoLookupReconciler:
    """For services that cannot be asked: the outcome is ``unknown``, a human decides."""

    name = "none"

    def __init__(self, url: str = "", timeout_s: float = 5.0):
        pass

    def lookup(self, effect: EffectRef) -> Answer:
        return Answer.no_lookup()


def _http(method: str, url: str, timeout_s: float, body: bytes | None = None,
          headers: dict | None = None) -> tuple[int, bytes]:
    """One HTTP exchange; returns (status, at most MAX_ANSWER_BYTES + 1 bytes of body).
    Network errors propagate as ``OSError``."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return resp.status, resp.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_ANSWER_BYTES + 1) if exc.fp else b""


def parse_answer(raw: bytes) -> dict:
    """An outside service's JSON answer, under the API's strict rules (CONTRACT.md 6).
    Raises ``InvalidPayload`` naming what is wrong (``answer: ...``)."""
    if len(raw) > MAX_ANSWER_BYTES:
        raise InvalidPayload(f"answer: larger than {MAX_ANSWER_BYTES} bytes")
    return loads_object(raw or b"{}", what="answer")


def _classify_status_body(body: dict, where: str) -> Answer:
    status = body.get("status")
    if not isinstance(status, str):  # e.g. an object: unhashable, and no status at all
        return Answer.cannot_tell(f"{where}: unexpected status {type(status).__name__!r}",
                                  evidence=body)
    if status in {"succeeded", "confirmed", "completed"}:
        return Answer.found(body, f"{where}: {status}")
    if status == "failed":
        return Answer.refused(body, f"{where}: failed")
    # Not the value itself: the detail is stored and shown in clear, while what the
    # service answered is evidence, encrypted and revealed only with an audit event.
    return Answer.cannot_tell(f"{where}: unexpected status (expected succeeded, confirmed, "
                              f"completed or failed)", evidence=body)


class HttpStatusReconciler:
    """Looks an operation up with ``GET {url}/{quoted operation_key}``:

    - 200 ``{"status": "succeeded" | "confirmed" | "completed", ...}`` -> found (the body
      is the receipt); 200 ``{"status": "failed", ...}`` -> refused;
    - 404 -> not executed (the service never saw the key);
    - anything else, a network error, a timeout or a body that breaks the strict JSON
      rules -> cannot tell.
    """

    name = "http_status"

    def __init__(self, url: str, timeout_s: float = 5.0):
        self.base_url = url.rstrip("/")
        self.timeout_s = timeout_s

    def lookup(self, effect: EffectRef) -> Answer:
        url = f"{self.base_url}/{urllib.parse.quote(effect.operation_key, safe='')}"
        where = f"GET {self.base_url}/…"
        try:
            status, raw = _http("GET", url, self.timeout_s)
        except OSError as exc:
            return Answer.cannot_tell(f"{where}: {type(exc).__name__}: {str(exc)[:200]}")
        if status == 404:
            return Answer.not_executed(f"{where}: 404, the service never saw the key")
        if status != 200:
            return Answer.cannot_tell(f"{where}: HTTP {status}")
        try:
            body = parse_answer(raw)
        except InvalidPayload as exc:
            return Answer.cannot_tell(f"{where}: {exc.detail}")
        return _classify_status_body(body, where)


class ReplayReconciler:
    """For ``idempotent`` effects whose runtime sent the request: send it again with the
    same operation key as ``Idempotency-Key`` (``POST {url}``). A service that honours the
    key answers the original outcome without doing it twice; its answer is classified
    like the status look-up's (2xx with a status -> found/refused; 4xx -> refused with the
    body; anything else -> cannot tell). Effects of another class, or without a stored
    request, are ``cannot_tell`` (never replayed: that could be a duplicate).
    """

    name = "replay"

    def __init__(self, url: str, timeout_s: float = 5.0):
        self.url = url
        self.timeout_s = timeout_s

    def lookup(self, effect: EffectRef) -> Answer:
        if effect.effect_class != EffectClass.IDEMPOTENT:
            return Answer.cannot_tell(
                f"replay: the effect is {effect.effect_class}, only idempotent effects replay")
        if effect.request is None:
            return Answer.cannot_tell("replay: the runtime stored no request to replay")
        where = f"POST {self.url}"
        body = json.dumps(effect.request, ensure_ascii=False).encode("utf-8")
        try:
            status, raw = _http("POST", self.url, self.timeout_s, body,
                                {"Content-Type": "application/json",
                                 "Idempotency-Key": effect.operation_key})
        except OSError as exc:
            return Answer.cannot_tell(f"{where}: {type(exc).__name__}: {str(exc)[:200]}")
        try:
            answer = parse_answer(raw)
        except InvalidPayload as exc:
            return Answer.cannot_tell(f"{where}: HTTP {status}, {exc.detail}")
        if 200 <= status < 300:
            if "status" not in answer:
                return Answer.found(answer, f"{where}: HTTP {status}")
            return _classify_status_body(answer, where)
        if 400 <= status < 500 and status not in (408, 409, 425, 429):
            return Answer.refused(answer, f"{where}: HTTP {status}, refused")
        return Answer.cannot_tell(f"{where}: HTTP {status}", evidence=answer)


REGISTRY: dict[str, type] = {
    NoLookupReconciler.name: NoLookupReconciler,
    HttpStatusReconciler.name: HttpStatusReconciler,
    ReplayReconciler.name: ReplayReconciler,
}


def register(cls: type) -> type:
    """Class decorator: make a reconciler available by its ``name`` to ``set_reconciler``."""
    REGISTRY[cls.name] = cls
    return cls


def plugin_class(plugin: str) -> type:
    """The class for a registered name or a dotted path. Raises ``InvalidPayload``."""
    if plugin in REGISTRY:
        return REGISTRY[plugin]
    if "." in plugin:
        try:
            cls = import_string(plugin)
        except ImportError as exc:
            raise InvalidPayload(f"plugin: cannot import {plugin!r} ({exc})") from None
        if not callable(getattr(cls, "lookup", None)):
            raise InvalidPayload(f"plugin: {plugin!r} has no lookup method")
        return cls
    raise InvalidPayload(f"plugin: must be one of {', '.join(sorted(REGISTRY))} or a dotted path")


@dataclass(frozen=True)
class Configured:
    """The reconciler that answers for one service in one tenant, and its limits."""

    reconciler: Any
    name: str
    timeout_s: float
    settle_delay_s: int


def reconciler_for(tenant_id: int, service: str) -> Configured:
    """The reconciler for ``service`` in the tenant: its ``ReconcilerConfig`` row, else the
    ``RECOVERY_RECONCILERS`` default (HTTP status look-up), else no look-up."""
    settle = settings.RECOVERY_RECONCILE_SETTLE_DELAY_S
    row = ReconcilerConfig.objects.for_tenant(tenant_id).filter(service=service).first()
    if row is not None:
        try:
            cls = plugin_class(row.plugin)
            instance = cls(url=row.url, timeout_s=row.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the others
            instance = _Broken(f"plugin {row.plugin!r} cannot be loaded: {exc}"[:300])
        return Configured(instance, row.plugin, row.timeout_s,
                          settle if row.settle_delay_s is None else row.settle_delay_s)
    base = settings.RECOVERY_RECONCILERS.get(service)
    timeout = settings.RECOVERY_RECONCILE_TIMEOUT_S
    if base:
        return Configured(HttpStatusReconciler(base, timeout), HttpStatusReconciler.name,
                          timeout, settle)
    return Configured(NoLookupReconciler(), NoLookupReconciler.name, timeout, settle)


class _Broken:
    name = "broken"

    def __init__(self, why: str):
        self.why = why

    def lookup(self, effect: EffectRef) -> Answer:
        return Answer.cannot_tell(self.why)
