"""Reconcilers: ask the external service whether an operation happened, by its key.

``reconciler_for(service)`` returns the reconciler configured for a service name
(``RECOVERY_RECONCILERS="payments=http://127.0.0.1:8765/operations,..."``), or a
``NoLookupReconciler`` that answers ``unknown`` (CONTRACT.md 3: reconciliation "where the
service offers no lookup").

The HTTP protocol: ``GET {base}/{operation_key}`` answers
- 200 ``{"status": "succeeded" | "confirmed", ...}`` -> ``confirmed`` (the body is the receipt),
- 200 ``{"status": "failed", ...}`` -> ``failed``,
- 404 -> ``not_executed`` (the service never saw the key),
- anything else, or a network error -> ``error`` (the effect stays as it is; try later).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from django.conf import settings


@dataclass(frozen=True)
class Lookup:
    """``outcome``: confirmed, failed, not_executed, unknown, or error (change nothing)."""

    outcome: str
    receipt: Any = None
    detail: str = ""


class NoLookupReconciler:
    """For services that cannot be asked: the outcome is ``unknown``, a human decides."""

    def lookup(self, operation_key: str) -> Lookup:
        return Lookup("unknown", detail="the service offers no status lookup")


class HttpStatusReconciler:
    """Looks an operation up with ``GET {base_url}/{quoted operation_key}``."""

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def lookup(self, operation_key: str) -> Lookup:
        url = f"{self.base_url}/{urllib.parse.quote(operation_key, safe='')}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310
                body = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return Lookup("not_executed", detail=f"{url}: 404, the service never saw the key")
            return Lookup("error", detail=f"{url}: HTTP {exc.code}")
        except (OSError, ValueError) as exc:
            return Lookup("error", detail=f"{url}: {exc}")
        status = body.get("status") if isinstance(body, dict) else None
        if status in {"succeeded", "confirmed", "completed"}:
            return Lookup("confirmed", receipt=body, detail=f"{url}: {status}")
        if status == "failed":
            return Lookup("failed", receipt=body, detail=f"{url}: failed")
        return Lookup("error", detail=f"{url}: unexpected status {status!r}")


def reconciler_for(service: str):
    """The reconciler configured for ``service`` (settings.RECOVERY_RECONCILERS)."""
    base = settings.RECOVERY_RECONCILERS.get(service)
    if base:
        return HttpStatusReconciler(base, timeout_s=settings.RECOVERY_RECONCILE_TIMEOUT_S)
    return NoLookupReconciler()
