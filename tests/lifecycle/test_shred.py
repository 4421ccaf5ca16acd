"""Envelope encryption and crypto-shredding (issue 20, item 3; docs/security/encryption.md):
each tenant's ciphertexts are written under its own data key, wrapped by the master keys;
``services.tenant_shred`` destroys the tenant's data keys, so nothing it stored can be read
again, while its rows, metadata and audit stay."""

from __future__ import annotations

import uuid

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from checkpoints import crypto, services
from checkpoints.exceptions import Forbidden, InvalidPayload
from checkpoints.models import (
    AuditEvent,
    Checkpoint,
    LegalHold,
    Tenant,
    TenantDataKey,
)
from tests.api.apihelpers import get, post
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect, walk_effect

SECRET = "SHRED-MARK-41c7"


def _acme_world(wendy, acme):
    body = envelope(payload={"phase": "charging", "note": SECRET})
    cp = put_checkpoint(wendy, acme, body)
    fx = effect_body(run_id=body["run_id"])
    walk_effect(wendy, acme, fx, "submitted")
    put_effect(wendy, acme, dict(fx, revision=2, state="confirmed",
                                 receipt={"charge_id": SECRET}), expected=1)
    return body, cp, fx


def test_each_tenant_writes_under_its_own_data_key(acme, globex, wendy, wes):
    a = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    g = put_checkpoint(wes, globex, envelope(payload={"phase": "ready", "n": SECRET}))
    ka, kg = (crypto.key_id_of(c.payload_ciphertext) for c in (a, g))
    assert ka and kg and ka != kg
    assert TenantDataKey.objects.get(key_id=ka).tenant_id == acme.pk
    # A ciphertext is never decrypted for another tenant, even with its key cached.
    assert SECRET in crypto.decrypt_text(a.payload_ciphertext, tenant=acme)
    with pytest.raises(InvalidToken):
        crypto.decrypt_text(a.payload_ciphertext, tenant=globex)
    # The wrapped key is a master-key token, never the key itself.
    row = TenantDataKey.objects.get(key_id=ka)
    raw = crypto.fernet().decrypt(row.wrapped.encode())
    assert raw.decode() not in row.wrapped


def test_shredding_erases_every_payload_and_keeps_the_metadata(acme, globex, wendy, wes, rita,
                                                               api_as):
    body, cp, fx = _acme_world(wendy, acme)
    other = put_checkpoint(wes, globex, envelope(payload={"phase": "ready", "n": "kept"}))
    assert services.payload_reveal(actor=rita, tenant=acme, checkpoint=cp,
                                   reason="warm the cache")["payload"]["note"] == SECRET
    done = services.tenant_shred(actor=None, tenant=acme, confirm_slug="acme")
    assert len(done["key_ids"]) == 1 and done["legacy_rows"] == 0

    key = TenantDataKey.objects.get(key_id=done["key_ids"][0])
    assert key.wrapped == "" and key.destroyed_at is not None
    # Served from no cache: the destroying process forgot the key.
    with pytest.raises(crypto.DataKeyGone, match="the tenant's key was destroyed"):
        services.payload_reveal(actor=rita, tenant=acme, checkpoint=cp, reason="after")
    # The API answers 410 erased for a payload or a receipt, never a 500 ...
    r = get(api_as(wendy), "acme", f"checkpoints/{body['id']}")
    assert r.status_code == 410 and r.json()["error"] == "erased"
    r = post(api_as(rita), "acme", f"effects/{fx['id']}/reveal-receipt", {"reason": "x"})
    assert r.status_code == 410 and r.json()["error"] == "erased"
    # ... and lists and metadata still answer (a writer's receipt is shown as null).
    assert get(api_as(rita), "acme", "runs").status_code == 200
    detail = get(api_as(wendy), "acme", f"runs/{body['run_id']}")
    assert detail.status_code == 200
    assert detail.json()["effects"][0]["receipt"] is None
    assert detail.json()["effects"][0]["has_receipt"] is True
    # Another tenant is untouched.
    assert services.payload_reveal(actor=wes, tenant=globex, checkpoint=other,
                                   action="payload.read")["payload"]["n"] == "kept"
    # The destruction is audited in acme's chain, with key ids and no key material.
    event = AuditEvent.objects.get(tenant=acme, action="tenant.key_destroy")
    assert event.after["key_ids"] == done["key_ids"] and event.actor_id is None
    assert services.audit_verify(tenant=acme)[0]
    # Later writes use a fresh key and read back.
    cp2 = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": "new"}))
    assert crypto.key_id_of(cp2.payload_ciphertext) == done["new_key_id"]
    assert services.payload_reveal(actor=rita, tenant=acme, checkpoint=cp2,
                                   reason="new")["payload"]["n"] == "new"


def test_shredding_moves_legacy_ciphertexts_under_the_key_first(acme, wendy):
    cp = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    legacy = crypto.encrypt_text(crypto.decrypt_text(cp.payload_ciphertext), tenant=None)
    Checkpoint.objects.filter(pk=cp.pk).update(payload_ciphertext=legacy)
    done = services.tenant_shred(actor=None, tenant=acme, confirm_slug="acme")
    assert done["legacy_rows"] == 1
    stored = Checkpoint.objects.get(pk=cp.pk).payload_ciphertext
    assert crypto.key_id_of(stored) == done["key_ids"][0]  # not decryptable by a master key
    with pytest.raises(crypto.DataKeyGone):
        crypto.decrypt_text(stored, tenant=acme)


def test_only_an_operator_shreds_and_only_with_the_slug_repeated(acme, adam, wendy):
    put_checkpoint(wendy, acme, envelope())
    with pytest.raises(Forbidden):
        services.tenant_shred(actor=adam, tenant=acme, confirm_slug="acme")  # tenant admin
    with pytest.raises(InvalidPayload, match="confirm_slug"):
        services.tenant_shred(actor=None, tenant=acme, confirm_slug="acm")
    with pytest.raises(CommandError, match="confirm_slug"):
        call_command("shred_tenant", "acme", "--confirm", "globex")
    with pytest.raises(CommandError, match="no tenant"):
        call_command("shred_tenant", "nope", "--confirm", "nope")
    assert not TenantDataKey.objects.filter(tenant=acme, destroyed_at__isnull=False).exists()
    adam.is_superuser = True
    services.tenant_shred(actor=adam, tenant=acme, confirm_slug="acme")
    assert TenantDataKey.objects.get(tenant=acme, generation=1).destroyed_by == adam


def test_a_legal_hold_stops_the_shredding(acme, adam, wendy):
    put_checkpoint(wendy, acme, envelope())
    hold = LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope="tenant",
                                    reason="litigation", placed_by=adam, placed_by_name="adam")
    with pytest.raises(services.TenantHeld):
        services.tenant_shred(actor=None, tenant=acme, confirm_slug="acme")
    with pytest.raises(CommandError, match="legal hold") as refused:
        call_command("shred_tenant", "acme", "--confirm", "acme")
    # (the operator's walk, item 6) the refusal names the hold: id, scope, who, reason
    assert (f"release it first: {hold.uuid} (scope tenant, placed by adam: 'litigation')"
            in str(refused.value))
    assert not TenantDataKey.objects.filter(destroyed_at__isnull=False).exists()
    second = LegalHold.objects.create(tenant=acme, uuid=uuid.uuid4(), scope="runs",
                                      run_uuids=[], reason="audit 2026", placed_by=adam,
                                      placed_by_name="adam")
    with pytest.raises(services.TenantHeld) as refused:
        services.tenant_shred(actor=None, tenant=acme, confirm_slug="acme")
    assert "active legal holds: release them first" in str(refused.value)
    assert str(hold.uuid) in str(refused.value) and str(second.uuid) in str(refused.value)
    LegalHold.objects.filter(pk=second.pk).update(released_at=second.placed_at)
    LegalHold.objects.filter(pk=hold.pk).update(released_at=hold.placed_at)
    call_command("shred_tenant", "acme", "--confirm", "acme")
    assert TenantDataKey.objects.filter(tenant=acme, destroyed_at__isnull=False).count() == 1


def test_the_sweep_and_reviewers_still_move_a_shredded_tenants_effects(acme, wendy, rita):
    from tests.helpers import age_world

    fx = effect_body()
    walk_effect(wendy, acme, fx, "submitted")
    put_effect(wendy, acme, dict(fx, revision=2, state="unresolved",
                                 receipt={"partial": SECRET}), expected=1)
    services.tenant_shred(actor=None, tenant=acme, confirm_slug="acme")
    age_world(3600)
    effect = services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=fx["id"],
                                          reason="gateway has no lookup")
    assert effect.state == "unknown" and effect.has_receipt  # the erased receipt is kept


def test_another_process_sees_a_destroyed_key_within_the_cache_bound(acme, wendy, settings):
    cp = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    assert SECRET in crypto.decrypt_text(cp.payload_ciphertext, tenant=acme)  # cached
    # Another process destroys the key: this one keeps its cached copy for at most
    # RECOVERY_DATA_KEY_CACHE_S seconds, then reads the row again.
    TenantDataKey.objects.filter(tenant=acme).update(wrapped="", destroyed_at=timezone.now())
    assert SECRET in crypto.decrypt_text(cp.payload_ciphertext, tenant=acme)
    settings.RECOVERY_DATA_KEY_CACHE_S = 0
    with pytest.raises(crypto.DataKeyGone):
        crypto.decrypt_text(cp.payload_ciphertext, tenant=acme)


def test_a_key_created_in_a_rolled_back_transaction_is_never_reused(db):
    tenant = Tenant.objects.create(slug="bare", name="bare")  # no key yet (not tenant_create)
    with transaction.atomic():
        sid = transaction.savepoint()
        first = crypto.encrypt_text("x", tenant=tenant)
        transaction.savepoint_rollback(sid)
    assert not TenantDataKey.objects.filter(tenant=tenant).exists()
    second = crypto.encrypt_text("y", tenant=tenant)
    assert crypto.key_id_of(second) != crypto.key_id_of(first)
    assert TenantDataKey.objects.filter(key_id=crypto.key_id_of(second)).exists()
    assert crypto.decrypt_text(second, tenant=tenant) == "y"


def test_rotating_the_master_key_re_wraps_the_data_keys(acme, globex, wendy, rita, settings):
    cp = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    before = cp.payload_ciphertext
    old = list(settings.RECOVERY_ENCRYPTION_KEYS)
    new = Fernet.generate_key().decode()
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    call_command("rotate_payload_keys")
    settings.RECOVERY_ENCRYPTION_KEYS = [new]
    assert Checkpoint.objects.get(pk=cp.pk).payload_ciphertext == before  # not re-encrypted
    assert services.payload_reveal(actor=rita, tenant=acme, checkpoint=cp,
                                   reason="after rotation")["payload"]["n"] == SECRET
    assert all(crypto.is_current(w) for w in TenantDataKey.objects.values_list("wrapped",
                                                                              flat=True))


def test_the_keyring_brings_a_restored_copy_up_to_date(acme, globex, wendy, wes, rita,
                                                       settings, tmp_path):
    a = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    g = put_checkpoint(wes, globex, envelope(payload={"phase": "ready", "n": SECRET}))
    backup = list(TenantDataKey.objects.values("key_id", "wrapped"))  # as a dump holds them
    services.tenant_shred(actor=None, tenant=globex, confirm_slug="globex")
    old, new = list(settings.RECOVERY_ENCRYPTION_KEYS), Fernet.generate_key().decode()
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    call_command("rotate_payload_keys")
    keyring = tmp_path / "keyring.jsonl"
    call_command("export_keyring", out=str(keyring))
    assert "wrapped" in keyring.read_text() and SECRET not in keyring.read_text()
    settings.RECOVERY_ENCRYPTION_KEYS = [new]  # the old master key is gone

    # "Restore" the older backup's keys: wrapped by the old master key only.
    for row in backup:
        TenantDataKey.objects.filter(key_id=row["key_id"]).update(wrapped=row["wrapped"],
                                                                  destroyed_at=None)
    with pytest.raises(crypto.DataKeyGone, match="cannot be unwrapped"):
        services.payload_reveal(actor=rita, tenant=acme, checkpoint=a, reason="restored")
    call_command("import_keyring", str(keyring))
    assert services.payload_reveal(actor=rita, tenant=acme, checkpoint=a,
                                   reason="restored")["payload"]["n"] == SECRET
    with pytest.raises(crypto.DataKeyGone, match="destroyed"):
        crypto.decrypt_text(Checkpoint.objects.get(pk=g.pk).payload_ciphertext, tenant=globex)
    assert AuditEvent.objects.filter(tenant=globex, action="tenant.key_destroy").count() == 2
    assert services.keyring_restore(records=services.keyring_export()) == {
        "destroyed": 0, "rewrapped": 0, "unwrappable": 0}  # twice is harmless
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tenant": "acme"}\n')
    with pytest.raises(CommandError, match="record 1"):
        call_command("import_keyring", str(bad))


def test_a_keyring_record_never_swaps_in_another_key(acme, globex, wendy, wes, rita):
    """A keyring record re-wraps a key; one carrying a different key under the same id
    (here globex's, which a configured master key unwraps) is refused, and nothing of the
    file is imported (the attack helper's finding: acme's payloads then answered 500)."""
    a = put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    put_checkpoint(wes, globex, envelope(payload={"phase": "ready", "n": SECRET}))
    records = services.keyring_export()
    theirs = next(r for r in records if r["tenant"] == "globex")
    ours = next(r for r in records if r["tenant"] == "acme")
    before = dict(TenantDataKey.objects.values_list("key_id", "wrapped"))
    swapped = [dict(ours, wrapped=crypto.rotate_token(theirs["wrapped"]))]
    with pytest.raises(InvalidPayload, match="not the key this database holds"):
        services.keyring_restore(records=[dict(theirs, destroyed=True), *swapped])
    assert dict(TenantDataKey.objects.values_list("key_id", "wrapped")) == before
    assert not TenantDataKey.objects.filter(destroyed_at__isnull=False).exists()
    assert services.payload_reveal(actor=rita, tenant=acme, checkpoint=a,
                                   reason="still ours")["payload"]["n"] == SECRET
    # The same key re-wrapped (a newer wrapping of acme's own key) is taken.
    assert services.keyring_restore(records=[dict(ours, wrapped=crypto.rotate_token(
        ours["wrapped"]))]) == {"destroyed": 0, "rewrapped": 1, "unwrappable": 0}


def test_import_keyring_says_when_the_file_fits_no_master_key(acme, wendy, settings,
                                                               tmp_path):
    """A keyring wrapped by a master key this process lacks is not a silent success (the
    newcomer's finding: 'destroyed 1 and re-wrapped 0', exit 0)."""
    put_checkpoint(wendy, acme, envelope(payload={"phase": "ready", "n": SECRET}))
    backup = list(TenantDataKey.objects.values("key_id", "wrapped"))  # as a dump holds them
    old = list(settings.RECOVERY_ENCRYPTION_KEYS)
    settings.RECOVERY_ENCRYPTION_KEYS = [Fernet.generate_key().decode(), *old]
    call_command("rotate_payload_keys")
    keyring = tmp_path / "keyring.jsonl"
    call_command("export_keyring", out=str(keyring))
    for row in backup:  # "restored", on a machine without the newer master key
        TenantDataKey.objects.filter(key_id=row["key_id"]).update(wrapped=row["wrapped"])
    settings.RECOVERY_ENCRYPTION_KEYS = old
    with pytest.raises(CommandError, match="fit none of RECOVERY_ENCRYPTION_KEYS"):
        call_command("import_keyring", str(keyring))


@pytest.mark.parametrize("line, words", [
    ('{{"tenant": "acme", "key_id": "{k}", "generation": 1, "wrapped": "", '
     '"destroyed": false, "destroyed": true}}', "duplicated key"),
    ('{{"tenant": "acme", "key_id": "{k}", "generation": NaN, "wrapped": "", '
     '"destroyed": false}}', "NaN"),
    ('{{"tenant": "acme", "key_id": "{k}", "generation": "x", "wrapped": "", '
     '"destroyed": false}}', "generation"),
])
def test_import_keyring_reads_its_file_as_strictly_as_an_api_body(acme, tmp_path, line,
                                                                   words):
    """A repeated member once destroyed a key (the last one won): refused, nothing
    imported (the second attack's finding)."""
    key = TenantDataKey.objects.get(tenant=acme)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line.format(k=key.key_id) + "\n")
    with pytest.raises(CommandError, match=words):
        call_command("import_keyring", str(bad))
    assert TenantDataKey.objects.get(pk=key.pk).destroyed_at is None


def test_a_keyring_naming_one_key_twice_is_refused(acme):
    record = services.keyring_export()[0]
    with pytest.raises(InvalidPayload, match="given twice"):
        services.keyring_restore(records=[record, dict(record, destroyed=True)])
