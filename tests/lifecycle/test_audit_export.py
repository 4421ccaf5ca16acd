"""The audit export (``manage.py export_audit``, ``services.audit_export``) and its
verifier (``verify_audit_chain --export``), and the chain after deletions (issue 20,
items 3 and 5)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from checkpoints import auditexport, crypto, services
from checkpoints.exceptions import Forbidden, InvalidPayload
from checkpoints.jsonparse import content_sha256
from checkpoints.models import AuditEvent, AuditExport, Checkpoint, Effect, Tombstone
from tests.lifecycle.governance import completed_run, purge, purged_runs

pytestmark = pytest.mark.django_db


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def test_write_events_name_the_payload_and_receipt_by_their_hash(acme, wendy):
    """The chain commits to the hash of the stored JSON text, never to a value."""
    r = completed_run(wendy, acme)
    cp = Checkpoint.objects.for_tenant(acme).get(run=r)
    stored = crypto.decrypt_text(cp.payload_ciphertext)
    write = (AuditEvent.objects.for_tenant(acme).filter(action="checkpoint.write")
             .order_by("-seq").first())
    assert write.after["payload_sha256"] == content_sha256(stored)
    assert set(write.after) == {"revision", "phase_class", "payload_sha256"}
    assert "A-1" not in json.dumps(write.after)
    effect = Effect.objects.for_tenant(acme).get(run=r)
    confirmed = (AuditEvent.objects.for_tenant(acme).filter(action="effect.write")
                 .order_by("-seq").first())
    assert confirmed.after["state"] == "confirmed"
    receipt_text = crypto.decrypt_text(effect.receipt_ciphertext)
    assert confirmed.after["receipt_sha256"] == content_sha256(receipt_text)


def test_an_export_writes_events_tombstones_and_a_signed_manifest(acme, wendy, tmp_path):
    stones = purged_runs(wendy, acme, 2)
    out = tmp_path / "x1"
    line = run("export_audit", "acme", out=str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    head = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    # Its own event comes after; events are numbered by row id (issue 22), with gaps.
    before = list(AuditEvent.objects.for_tenant(acme).filter(seq__lt=head.seq)
                  .order_by("seq").values_list("seq", flat=True))
    assert manifest["through_seq"] == before[-1]
    assert manifest["through_tombstone"] == stones[-1].pk
    assert manifest["counts"] == {"events": len(before), "tombstones": 2}
    assert f"exported {manifest['counts']['events']} event(s) (tree size " in line
    events = (out / "audit.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq"] for x in events] == before
    assert [json.loads(x)["id"] for x in (out / "tombstones.jsonl").read_text().splitlines()] \
        == [s.pk for s in stones]
    assert (head.action, head.after["through_seq"]) == ("audit.export", before[-1])
    row = AuditExport.objects.for_tenant(acme).get()
    assert row.through_tombstone == stones[-1].pk
    assert head.after["manifest_sha256"] == row.manifest_sha256 == content_sha256(
        (out / "manifest.json").read_text())
    assert auditexport.verify_export(out)[1] == []
    assert "verifies (" in run("verify_audit_chain", "acme", export=[str(out)])


@pytest.mark.parametrize("tamper, message", [
    ("edit an event line", "audit.jsonl: its SHA-256 is not the manifest's"),
    ("drop a tombstone line", "tombstones.jsonl: its SHA-256 is not the manifest's"),
    ("edit the manifest", "manifest: the signature does not verify"),
    ("edit a line and the manifest's hash", "manifest: the signature does not verify"),
])
def test_a_tampered_export_is_detected(acme, wendy, tmp_path, tamper, message):
    purged_runs(wendy, acme, 2)
    out = tmp_path / "x"
    run("export_audit", "acme", out=str(out))
    audit, stones, manifest = (out / "audit.jsonl", out / "tombstones.jsonl",
                               out / "manifest.json")
    m = json.loads(manifest.read_text())
    if tamper == "edit an event line":
        audit.write_text(audit.read_text().replace('"actor":"wendy"', '"actor":"mallory"', 1))
    elif tamper == "drop a tombstone line":
        stones.write_text("".join(stones.read_text().splitlines(keepends=True)[1:]))
    elif tamper == "edit the manifest":
        manifest.write_text(json.dumps(dict(m, through_tombstone=m["through_tombstone"] + 5)))
    else:
        audit.write_text(audit.read_text().replace('"actor":"wendy"', '"actor":"mallory"', 1))
        m["sha256"]["audit.jsonl"] = content_sha256(audit.read_text())
        manifest.write_text(json.dumps(m))
    problems = auditexport.verify_export(out)[1]
    assert problems and problems[0].startswith(message)
    with pytest.raises(CommandError, match="export"):
        run("verify_audit_chain", "acme", export=[str(out)])


def test_an_event_edited_with_a_resigned_manifest_fails_its_hmac(acme, wendy, tmp_path):
    """The verifier re-walks the chain in the file and does not trust the manifest alone:
    an event edited, the file's hash and the manifest re-signed (with the key), is still
    caught by that event's own HMAC."""
    purged_runs(wendy, acme, 1)
    out = tmp_path / "x"
    run("export_audit", "acme", out=str(out))
    audit = out / "audit.jsonl"
    lines = audit.read_text().splitlines(keepends=True)
    first = json.loads(lines[1])
    lines[1] = json.dumps(dict(first, reason="nothing to see"), separators=(",", ":"),
                          sort_keys=True, ensure_ascii=False) + "\n"
    audit.write_text("".join(lines))
    m = json.loads((out / "manifest.json").read_text())
    m["sha256"]["audit.jsonl"] = content_sha256(audit.read_text())
    (out / "manifest.json").write_text(json.dumps(auditexport.sign_manifest(
        {k: v for k, v in m.items() if k not in ("key_id", "signature")})))
    problems = auditexport.verify_export(out)[1]
    assert problems == [f"audit.jsonl line 2: event seq {first['seq']} does not match its "
                        "hash (HMAC)"]


def test_watermarks_only_move_forward(acme, wendy, tmp_path):
    stones = purged_runs(wendy, acme, 1)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "a")
    first = services.export_watermark(acme)
    assert first[1] == stones[0].pk
    purged_runs(wendy, acme, 1)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "b")
    second = services.export_watermark(acme)
    assert second > first
    first_size = AuditExport.objects.for_tenant(acme).order_by("id")[0].through_tree_size
    behind = services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "c",
                                   through_tree_size=first_size)
    assert behind["watermark_moved"] is False and behind["through_tree_size"] == first_size
    assert behind["through_tombstone"] == stones[0].pk
    assert services.export_watermark(acme) == second
    assert AuditExport.objects.for_tenant(acme).count() == 3  # every export is recorded
    assert auditexport.verify_export(tmp_path / "c")[1] == []
    last = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    assert last.after["watermark_moved"] is False


def test_export_refusals(acme, adam, vic, wendy, tmp_path):
    with pytest.raises(Forbidden):
        services.audit_export(actor=vic, tenant=acme, out_dir=tmp_path / "v")
    services.audit_export(actor=adam, tenant=acme, out_dir=tmp_path / "a")
    with pytest.raises(InvalidPayload, match="already holds an export"):
        services.audit_export(actor=adam, tenant=acme, out_dir=tmp_path / "a")
    for bad in (0, 10**6, "3", True):
        with pytest.raises(InvalidPayload, match="^through_tree_size: "):
            services.audit_export(actor=adam, tenant=acme, out_dir=tmp_path / "b",
                                  through_tree_size=bad)
    with pytest.raises(CommandError, match="^--through-tree-size: "):
        run("export_audit", "acme", out=str(tmp_path / "c"), through_tree_size=0)
    with pytest.raises(CommandError, match="no tenant"):
        run("export_audit", "initech", out=str(tmp_path / "d"))
    assert AuditExport.objects.for_tenant(acme).count() == 1


def test_the_chain_verifies_after_deletion_and_counts_events_of_erased_data(acme, globex,
                                                                            wendy, wes):
    kept = completed_run(wendy, acme)
    gone = completed_run(wendy, acme)
    completed_run(wes, globex)
    n_gone = AuditEvent.objects.for_tenant(acme).filter(run_uuid=gone.uuid).count()
    purge(acme, gone)
    out = run("verify_audit_chain")
    # the run.purge event refers to the run too
    assert f"acme: {n_gone + 1} event(s) refer to erased data" in out
    assert "globex: 0 event(s) refer to erased data" in out
    assert "acme: intact" in out and kept.payloads_deleted_at is None
    assert Tombstone.objects.for_tenant(acme).count() == 1
