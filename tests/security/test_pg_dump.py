"""Issue 6, "Done when": a ``pg_dump`` of a database the service has used holds no payload,
receipt, request, reconciler evidence, refused write or token in clear.

Every path that stores such a value is driven through the real services with a marker
string only that value carries (a checkpoint and its revisions, a refused write kept as
a conflict, an effect's request and receipt and its history, a reconcile look-up's
evidence, a bearer token), committed, and the whole database dumped with the real
``pg_dump``. Metadata (operation keys, states, labels) is not secret and may show.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest
from django.db import connection

from checkpoints import crypto, reconcile, services
from checkpoints.exceptions import StaleRevision
from checkpoints.models import ReconcileAttempt
from recovery_client.client import fingerprint
from tests.helpers import age_world, effect_body, envelope, put_checkpoint, put_effect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

MARKERS = {
    "payload": "PAYLOAD-MARK-7f3a",
    "revision": "REVISION-MARK-91c2",
    "refused": "REFUSED-MARK-c0de",
    "request": "REQUEST-MARK-5e11",
    "receipt": "RECEIPT-MARK-ab12",
    "evidence": "EVIDENCE-MARK-e7e7",
}


class EvidenceReconciler:
    """Answers "found" with a receipt and evidence that carry their markers."""

    name = "mark"

    def __init__(self, url: str = "", timeout_s: float = 5):
        pass

    def lookup(self, effect: reconcile.EffectRef) -> reconcile.Answer:
        return reconcile.Answer.found({"charge_id": MARKERS["receipt"] + "-reconciled"},
                                      evidence={"raw": MARKERS["evidence"]})


def test_a_pg_dump_holds_no_secret_in_clear(acme, wendy, rita, tmp_path):
    if shutil.which("pg_dump") is None:
        pytest.skip("pg_dump is not installed")
    token = services.token_issue(user=wendy)

    # A checkpoint, a second revision, and a refused (stale) write kept as a conflict.
    body = envelope(payload={"phase": "charging", "note": MARKERS["payload"]})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1,
                                     payload={"phase": "charging", "n": MARKERS["revision"]}),
                   expected=0)
    with pytest.raises(StaleRevision):
        put_checkpoint(wendy, acme, dict(body, revision=1,
                                         payload={"phase": "x", "n": MARKERS["refused"]}),
                       expected=0)

    # An effect with its request, confirmed with a receipt by the runtime.
    request = {"order": MARKERS["request"]}
    fx = effect_body(run_id=body["run_id"], operation_key="k-1", effect_class="idempotent",
                     fingerprint=fingerprint(request))
    put_effect(wendy, acme, dict(fx, request=request))
    put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0)
    put_effect(wendy, acme, dict(fx, revision=2, state="confirmed",
                                 receipt={"charge_id": MARKERS["receipt"]}), expected=1)

    # A second effect settled by reconciliation, whose look-up kept evidence.
    reconcile.REGISTRY["mark"] = EvidenceReconciler
    try:
        services.reconciler_configure(actor=None, tenant=acme, service="cards", plugin="mark")
        fx2 = effect_body(run_id=body["run_id"], operation_key="k-2", service="cards")
        put_effect(wendy, acme, fx2)
        put_effect(wendy, acme, dict(fx2, revision=1, state="submitted"), expected=0)
        age_world(3600)
        services.run_reconcile(actor=rita, tenant=acme, run_id=uuid.UUID(body["run_id"]),
                               reason="look it up")
    finally:
        reconcile.REGISTRY.pop("mark", None)
    attempt = ReconcileAttempt.objects.get()
    assert attempt.applied == "confirmed"  # the paths above really stored every value
    assert MARKERS["evidence"] in crypto.decrypt_text(attempt.evidence_ciphertext)

    settings = connection.settings_dict
    dump = subprocess.run(
        ["pg_dump", "--no-owner", "-h", settings["HOST"] or "127.0.0.1",
         "-p", str(settings["PORT"] or 5432), "-U", settings["USER"] or "postgres",
         settings["NAME"]],
        capture_output=True, text=True, timeout=120, check=True).stdout
    assert "k-1" in dump and "confirmed" in dump  # metadata is there: the dump is real
    found = {what: mark for what, mark in MARKERS.items() if mark in dump}
    assert found == {}, f"in clear in pg_dump: {found}"
    assert token not in dump and token[4:] not in dump
