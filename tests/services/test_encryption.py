"""Payloads are encrypted at rest (``checkpoints.crypto``); keys rotate by prepending a new
one, and old keys still decrypt (CONTRACT.md 7, DESIGN.md 5)."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.db import connection

from checkpoints import crypto, services
from checkpoints.exceptions import InvalidPayload, StaleRevision
from checkpoints.models import AuditEvent, Checkpoint, CheckpointRevision, Conflict
from tests.helpers import envelope, put_checkpoint

SECRET = "card-4242-4242-4242-4242-secret-marker"


def _raw_column(model, column: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {column} FROM {model._meta.db_table}")
        return [row[0] for row in cur.fetchall()]


def test_it_never_stores_the_plaintext_payload(acme, wendy):
    body = envelope(payload={"phase": "ready", "order_id": SECRET})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    with pytest.raises(StaleRevision):
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    stored = (_raw_column(Checkpoint, "payload_ciphertext")
              + _raw_column(CheckpointRevision, "payload_ciphertext")
              + _raw_column(Conflict, "refused_ciphertext"))
    assert len(stored) == 4
    for value in stored:
        assert SECRET not in value
        assert "order_id" not in value
    assert SECRET in crypto.decrypt_text(stored[0])


def test_it_decrypts_with_an_old_key_after_rotation(acme, wendy, rita, settings):
    old = list(settings.RECOVERY_ENCRYPTION_KEYS)  # wraps acme's data key
    new = Fernet.generate_key().decode()
    body = envelope(payload={"phase": "ready", "order_id": SECRET})
    cp = put_checkpoint(wendy, acme, body)
    legacy = crypto.encrypt_text(SECRET, tenant=None)  # a token written before issue 20
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    revealed = services.payload_reveal(actor=rita, tenant=acme, checkpoint=cp, reason="audit")
    assert revealed["payload"]["order_id"] == SECRET
    cp = put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    # The data key is still wrapped by the old master key: dropping it before rotating
    # makes acme's payloads unreadable ("erased": the key cannot be unwrapped), and the
    # legacy token too.
    settings.RECOVERY_ENCRYPTION_KEYS = [new]
    with pytest.raises(crypto.DataKeyGone, match="cannot be unwrapped"):
        crypto.decrypt_text(Checkpoint.objects.get().payload_ciphertext, tenant=acme)
    with pytest.raises(InvalidToken):
        crypto.decrypt_text(legacy)
    # Rotating a master-key token (a wrapped data key, a legacy token) re-encrypts it
    # under the newest master key.
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    rotated = crypto.rotate_token(legacy)
    settings.RECOVERY_ENCRYPTION_KEYS = [new]
    assert crypto.decrypt_text(rotated) == SECRET


def test_it_refuses_a_key_that_is_not_a_fernet_key(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.RECOVERY_ENCRYPTION_KEYS = ["not-a-key"]
    with pytest.raises(ImproperlyConfigured):
        crypto.encrypt_text("x", tenant=None)


def _to_legacy(model, column: str) -> None:
    """Rewrite every ``column`` in the form written before issue 20 (the master key)."""
    for pk, token in model.objects.values_list("pk", column):
        model.objects.filter(pk=pk).update(
            **{column: crypto.encrypt_text(crypto.decrypt_text(token), tenant=None)})


def test_it_rotates_every_stored_payload_to_the_newest_key(acme, wendy, settings):
    from django.core.management import call_command

    old = list(settings.RECOVERY_ENCRYPTION_KEYS)
    new = Fernet.generate_key().decode()
    body = envelope(payload={"phase": "ready", "order_id": SECRET})
    put_checkpoint(wendy, acme, body)
    with pytest.raises(StaleRevision):
        put_checkpoint(wendy, acme, body)  # a conflict keeps the refused body, encrypted
    # Written under acme's data key: rotating re-wraps that key only.
    enveloped = _raw_column(CheckpointRevision, "payload_ciphertext")
    assert all(v.startswith(crypto.PREFIX) for v in enveloped)
    _to_legacy(Checkpoint, "payload_ciphertext")  # two written before issue 20
    _to_legacy(Conflict, "refused_ciphertext")
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    assert services.payloads_rotate_keys(batch_size=1) == {"rows": 2, "keys": 1, "tenants": 1}
    assert _raw_column(CheckpointRevision, "payload_ciphertext") == enveloped  # untouched
    settings.RECOVERY_ENCRYPTION_KEYS = [new]  # the old key is gone
    stored = (_raw_column(Checkpoint, "payload_ciphertext")
              + _raw_column(CheckpointRevision, "payload_ciphertext")
              + _raw_column(Conflict, "refused_ciphertext"))
    assert all(SECRET in crypto.decrypt_text(value) for value in stored)
    settings.RECOVERY_ENCRYPTION_KEYS = [new, old]
    call_command("rotate_payload_keys")  # a second run finds nothing left to rewrite
    assert services.payloads_rotate_keys() == {"rows": 0, "keys": 0, "tenants": 0}
    assert AuditEvent.objects.filter(action="payload.rotate_keys").count() == 1


@pytest.mark.parametrize("size", [0, -1, 10_001, 2**70])
def test_rotate_payload_keys_refuses_a_batch_size_out_of_range_before_any_query(size):
    """(stop 33, the attack's finding) ``--batch-size 2**70`` reached PostgreSQL's
    ``LIMIT`` as ``bigint out of range``: a traceback, not the command's error."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"--batch-size: must be an integer in 1\.\.10000"):
        call_command("rotate_payload_keys", "--batch-size", str(size))
    with pytest.raises(InvalidPayload, match="batch_size"):
        services.payloads_rotate_keys(batch_size=size)
