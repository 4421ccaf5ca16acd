"""Screening what a runtime writes for credentials and size (issue 20, item 7;
docs/security/secrets.md): every checkpoint payload, effect receipt and request is
scanned (``checkpoints.secrets_scan``) before its write; the tenant's data policy
(``services.lifecycle.policy_for``) decides what a finding does: ``warn`` (the default)
stores the write with the findings' paths on its row, ``refuse`` answers 422
``secret_detected`` naming the paths and stores nothing. A payload above the tenant's
``payload_flag_bytes`` is flagged on its row, never refused.

Findings are paths and detector words; the value never reaches a row, an error, a log
line or an audit event.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .. import secrets_scan
from ..exceptions import SecretDetected
from ..models import Tenant
from ..vocab import SecretsPolicy
from .lifecycle import policy_for

#: At most this many paths are named in a 422's ``detail`` (all are in ``paths``).
DETAIL_PATHS = 3


@dataclass(frozen=True)
class Screened:
    """What screening found in one payload: ``secret_paths`` as stored on the row
    (``[{"path", "type"}]``), the payload's ``size`` in bytes, whether a ``refuse``
    policy refuses it (``refuse``; false for an operator's migration, which records),
    and once the tenant's policy is applied (``decided``) ``large_above``, the tenant's
    ``payload_flag_bytes`` when the payload was above it."""

    secret_paths: list[dict] = field(default_factory=list)
    size: int = 0
    refuse: bool = True
    large_above: int | None = None

    def decided(self, secrets_policy: str, payload_flag_bytes: int | None) -> Screened:
        """The screening under the tenant's data policy (read in the write's
        transaction: ``writepath`` reads it with its lock, so the hot path keeps its
        round trips). Raises ``SecretDetected`` (422) when a credential-like value was
        found and the policy refuses; else returns what to store."""
        if self.refuse and self.secret_paths and secrets_policy == SecretsPolicy.REFUSE:
            _refuse(self.secret_paths, "payload")
        limit = payload_flag_bytes
        return replace(self, large_above=limit if limit is not None and self.size > limit
                       else None)


def _refuse(paths: list[dict], what: str) -> None:
    """Raise ``SecretDetected`` naming the first ``DETAIL_PATHS`` of ``paths``."""
    named = "; ".join(secrets_scan.sentence(p) for p in paths[:DETAIL_PATHS])
    more = f" (and {len(paths) - DETAIL_PATHS} more)" if len(paths) > DETAIL_PATHS else ""
    raise SecretDetected(f"{what}: {named}{more}; this tenant's data policy refuses "
                         "credentials in stored data", paths=paths)


def screen_payload(payload: Any, size: int, *, refuse: bool = True) -> Screened:
    """Scan a checkpoint payload (``size``: bytes of its JSON text); no query. The write
    path applies the tenant's policy in its transaction (``Screened.decided``), before
    it writes anything. ``refuse``: false for an operator's migration of what is stored
    (it records, never refuses)."""
    return Screened(secrets_scan.as_json(secrets_scan.scan(payload)), size, refuse)


def screen_effect(tenant: Tenant, *, receipt: Any = None, request: Any = None,
                  refuse: bool = True) -> list[dict]:
    """Screen an effect write's ``receipt`` and ``request`` (either may be ``None``):
    the findings, their paths under ``/receipt`` and ``/request``. Raises
    ``SecretDetected`` (422) under a ``refuse`` policy unless ``refuse`` is false. One
    query (the policy) when something was found, none otherwise."""
    paths = effect_findings(receipt=receipt, request=request)
    if paths and refuse and policy_for(tenant).secrets_policy == SecretsPolicy.REFUSE:
        _refuse(paths, "effect")
    return paths


def effect_findings(*, receipt: Any = None, request: Any = None) -> list[dict]:
    """What screening finds in an effect's ``request`` and ``receipt`` (either may be
    ``None``), paths under ``/request`` and ``/receipt``; no query, no decision."""
    paths = []
    for name, document in (("request", request), ("receipt", receipt)):
        if document is not None:
            paths += [{"path": f"/{name}{f.path}", "type": f.type}
                      for f in secrets_scan.scan(document)]
    return paths[:secrets_scan.MAX_FINDINGS]


def effect_decided(paths: list[dict], secrets_policy: str) -> list[dict]:
    """``paths`` (``effect_findings``) under a tenant's ``secrets_policy`` read once by
    the caller (the runifold import: one read per file): raises ``SecretDetected`` (422)
    under ``refuse``, else returns them to store."""
    if paths and secrets_policy == SecretsPolicy.REFUSE:
        _refuse(paths, "effect")
    return paths


def flag_sentences(secret_paths: list[dict] | None, *, size: int | None = None,
                   large_above: int | None = None) -> list[str]:
    """The words the run page shows beside a checkpoint or an effect: one per finding
    ('credential-like value at /headers/authorization (bearer token)') and the size
    flag ('large payload: 2400000 bytes, above the tenant's 1000000')."""
    out = [secrets_scan.sentence(p) for p in secret_paths or []]
    if large_above is not None and size is not None:
        out.append(f"large payload: {size} bytes, above the tenant's {large_above}")
    return out
