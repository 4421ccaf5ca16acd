"""Backup and restore, proven (issue 20, item 6; docs/operations/backup.md), and what a
``pg_dump`` holds of a crypto-shredded tenant (item 3).

The drill dumps the test database with the real ``pg_dump``, restores it into a fresh
database (``recovery_crypto_drill``) with ``pg_restore``, and checks the copy in a new
process: the audit chain against the heads exported before the dump, and the API serving
each tenant's checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import pytest
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection

from checkpoints import crypto, services
from checkpoints.exceptions import StaleRevision
from checkpoints.models import Checkpoint
from checkpoints.ops import restoredrill
from recovery_client.client import fingerprint
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(900)]

TARGET = "recovery_crypto_drill"
MARK = {"acme": "ACME-MARK-3b9d", "globex": "GLOBEX-MARK-77e1"}


@pytest.fixture(autouse=True)
def _binaries():
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("pg_dump / pg_restore are not installed")


def _world(tenant, writer) -> dict:
    """A checkpoint with two revisions, a refused write, an effect with a request and a
    receipt, all carrying the tenant's marker; returns {checkpoint id: sha256 of the
    payload the API must serve}."""
    mark = MARK[tenant.slug]
    body = envelope(payload={"phase": "charging", "note": mark})
    put_checkpoint(writer, tenant, body)
    latest = {"phase": "charging", "note": mark, "n": 2}
    put_checkpoint(writer, tenant, dict(body, revision=1, payload=latest), expected=0)
    with pytest.raises(StaleRevision):
        put_checkpoint(writer, tenant, dict(body, revision=1, payload={"refused": mark}),
                       expected=0)
    request = {"order": mark}
    fx = effect_body(run_id=body["run_id"], operation_key=f"k-{tenant.slug}",
                     effect_class="idempotent", fingerprint=fingerprint(request))
    put_effect(writer, tenant, dict(fx, request=request))
    put_effect(writer, tenant, dict(fx, revision=1, state="submitted"), expected=0)
    put_effect(writer, tenant, dict(fx, revision=2, state="confirmed",
                                    receipt={"charge_id": mark}), expected=1)
    text = json.dumps(latest, sort_keys=True)
    return {body["id"]: hashlib.sha256(text.encode()).hexdigest()}


@pytest.mark.slow  # three dumps and restores, each checked in a new process: about 25 s
def test_the_restore_drill_serves_the_copy_and_a_tenant_shredded_since_stays_erased(
        acme, globex, wendy, wes, tmp_path, settings):
    expected = {"acme": _world(acme, wendy), "globex": _world(globex, wes)}
    heads = tmp_path / "heads.jsonl"
    call_command("export_audit_head", out=str(heads))
    before = restoredrill.dump(tmp_path / "before.dump")

    # The command, dumping now: every tenant serves every payload from the copy.
    out = _command("restore_drill", "--heads", str(heads), "--target", TARGET)
    assert "restore drill passed" in out
    # A dump given without heads: verified without them (heads exported now would name
    # events the dump never had: the newcomer's run of the drill failed so).
    call_command("export_audit_head", out=str(tmp_path / "later.jsonl"))
    result = restoredrill.drill(dump_path=str(before), target=TARGET)
    assert result.problems == [] and result.report["chain"]["ok"]

    # After the dump: globex is crypto-shredded, then the master key is rotated away
    # (new key first, re-wrap, export the keyring, drop the old key).
    call_command("shred_tenant", "globex", "--confirm", "globex")
    old = list(settings.RECOVERY_ENCRYPTION_KEYS)
    new = Fernet.generate_key().decode()
    settings.RECOVERY_ENCRYPTION_KEYS = [new, *old]
    call_command("rotate_payload_keys")
    keyring = tmp_path / "keyring.jsonl"
    call_command("export_keyring", out=str(keyring))
    settings.RECOVERY_ENCRYPTION_KEYS = [new]

    # Restoring the older dump with today's keys and keyring: the chain verifies against
    # the heads exported before, acme serves its payloads, globex serves none.
    result = restoredrill.drill(heads=str(heads), dump_path=str(before),
                                keyring=str(keyring), erased={"globex"}, target=TARGET)
    assert result.problems == []
    report = result.report
    assert report["chain"]["ok"] and any("holds exported head" in x
                                         for x in report["chain"]["lines"])
    assert report["keyring"] == {"destroyed": 1, "rewrapped": 1, "unwrappable": 0}
    assert report["tenants"]["acme"]["payloads"] == expected["acme"]
    assert report["tenants"]["globex"] == {"runs": 1, "read": 0, "erased": 1, "other": [],
                                           "payloads": {}}
    # Without the keyring the dump's data keys are wrapped by the dropped master key
    # only: nothing in it can be read any more (the drill's own judge says so).
    result = restoredrill.drill(heads=str(heads), dump_path=str(before), keyring=None,
                                erased={"acme", "globex"}, target=TARGET)
    assert result.problems == []
    # A judge that expects acme readable fails that copy, naming acme.
    assert restoredrill.judge(result.report, erased={"globex"}) == [
        "acme: 1 payload(s) unreadable"]


def test_a_pg_dump_after_shredding_holds_nothing_of_the_tenant_that_decrypts(
        acme, globex, wendy, wes, tmp_path):
    _world(acme, wendy)
    _world(globex, wes)
    # One of globex's ciphertexts written before issue 20 (the master-key form).
    cp = Checkpoint.objects.get(tenant=globex)
    Checkpoint.objects.filter(pk=cp.pk).update(payload_ciphertext=crypto.encrypt_text(
        crypto.decrypt_text(cp.payload_ciphertext), tenant=None))
    done = services.tenant_shred(actor=None, tenant=globex, confirm_slug="globex")
    assert done["legacy_rows"] == 1

    s = connection.settings_dict
    dump = subprocess.run(
        ["pg_dump", "--no-owner", "-h", s["HOST"] or "127.0.0.1", "-p", str(s["PORT"] or 5432),
         "-U", s["USER"] or "postgres", s["NAME"]],
        capture_output=True, text=True, timeout=120, check=True).stdout
    masters = MultiFernet([Fernet(k.encode()) for k in django_settings.RECOVERY_ENCRYPTION_KEYS])
    # Every master-key token in the dump that the remaining keys open: legacy
    # ciphertexts, and the wrapped data keys (each then tried on every k1 token).
    plain, data_keys = [], []
    for token in set(re.findall(r"gAAAAA[A-Za-z0-9_\-]+=*", dump)):
        try:
            opened = masters.decrypt(token.encode())
        except InvalidToken:
            continue
        try:
            data_keys.append(Fernet(opened))
        except ValueError:
            plain.append(opened.decode())
    enveloped = re.findall(r"k1\.([0-9a-f]{16})\.(gAAAAA[A-Za-z0-9_\-]+=*)", dump)
    assert {k for k, _ in enveloped} >= set(done["key_ids"])  # globex's are in the dump
    for _, token in enveloped:
        for key in data_keys:
            try:
                plain.append(key.decrypt(token.encode()).decode())
            except InvalidToken:
                continue
    readable = "\n".join(plain)
    assert MARK["acme"] in readable  # the method finds what can be read ...
    assert MARK["globex"] not in readable  # ... and nothing of globex is
    assert MARK["globex"] not in dump and MARK["acme"] not in dump  # nothing in clear


def _command(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
