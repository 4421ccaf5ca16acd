"""The audit export covers a prefix of the sealed Merkle tree (docs/security/audit.md,
"The audit export"): exactly the leaves 0..S-1 of a signed tree head, in leaf order, the
head in the manifest; an event committed after the export's head (even with a lower seq)
is in the next export, never claimed by the first; the verifier recomputes the leaves
from the file and checks their root against the signed head."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from checkpoints import auditexport, audittree, services
from checkpoints.audit import audit_record
from checkpoints.exceptions import InvalidPayload
from checkpoints.jsonparse import content_sha256, dumps
from checkpoints.models import (
    AuditEvent,
    AuditExport,
    AuditLeaf,
    AuditPending,
    AuditTreeHead,
)
from checkpoints.vocab import AuditAction, TargetType
from tests.lifecycle.governance import purged_runs
from tests.security import tampering
from tests.security.test_tamper import _as_chained_before_the_tree

pytestmark = pytest.mark.django_db


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def note(tenant) -> AuditEvent:
    """One audit event of the tenant, committed (queued for the sequencer)."""
    with transaction.atomic():
        return audit_record(tenant=tenant, actor=None, action=AuditAction.AUDIT_EXPORT_HEAD,
                            target_type=TargetType.TENANT, target_id=tenant.slug,
                            after={"key_id": "k"})


def lines(out) -> list[dict]:
    return [json.loads(x) for x in (out / "audit.jsonl").read_text().splitlines()]


def leaf_events(tenant, size: int) -> list[int]:
    """The ids of the events of leaves 0..size-1, in leaf order."""
    return list(AuditLeaf.objects.for_tenant(tenant).filter(index__lt=size)
                .order_by("index").values_list("event_id", flat=True))


def resign(out, **changes) -> None:
    """The manifest rewritten by the key holder: ``changes`` applied, the audit file's
    SHA-256 and line count recomputed, signed again (the checks below the signature)."""
    m = json.loads((out / "manifest.json").read_text())
    text = (out / "audit.jsonl").read_text()
    m["sha256"]["audit.jsonl"] = content_sha256(text)
    m["counts"]["events"] = len(text.splitlines())
    m.update(changes)
    (out / "manifest.json").write_text(json.dumps(auditexport.sign_manifest(
        {k: v for k, v in m.items() if k not in ("key_id", "signature")})))


def test_an_export_holds_exactly_the_leaves_of_its_signed_head(acme, wendy, tmp_path):
    purged_runs(wendy, acme, 1)
    note(acme)  # queued: the export integrates it first
    out = tmp_path / "x"
    line = run("export_audit", "acme", out=str(out))
    m = json.loads((out / "manifest.json").read_text())
    export_event = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    assert export_event.action == "audit.export"
    size = m["through_tree_size"]
    head = AuditTreeHead.objects.for_tenant(acme).get(tree_size=size)
    # Every event but the export's own, which comes after the head.
    assert size == AuditEvent.objects.for_tenant(acme).count() - 1
    by_id = AuditEvent.objects.for_tenant(acme).in_bulk(leaf_events(acme, size))
    assert [x["seq"] for x in lines(out)] == [by_id[i].seq for i in leaf_events(acme, size)]
    assert m["tree_head"] == {"tenant": "acme", **audittree.head_json(head)}
    assert m["format"] == auditexport.FORMAT and m["counts"]["events"] == size
    assert m["through_seq"] == max(e.seq for e in by_id.values())
    row = AuditExport.objects.for_tenant(acme).get()
    assert (row.through_tree_size, row.through_seq) == (size, m["through_seq"])
    assert export_event.after["through_tree_size"] == size
    assert f"(tree size {size}, seq up to {m['through_seq']})" in line
    assert auditexport.verify_export(out)[1] == []
    # The head in the manifest is the line export_audit_head prints: --against takes it.
    heads = tmp_path / "head.jsonl"
    heads.write_text(json.dumps(m["tree_head"]) + "\n")
    text = run("verify_audit_chain", "acme", export=[str(out)], against=str(heads))
    assert f"holds exported head size {size}" in text
    assert f"{size} event(s), tree size {size} under its signed head" in text


def test_an_export_through_an_older_head_holds_its_leaves_only(acme, wendy, tmp_path):
    purged_runs(wendy, acme, 1)
    services.audit_integrate(acme)
    older = audittree.newest_head(acme.pk).tree_size
    purged_runs(wendy, acme, 1)
    services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "x",
                          through_tree_size=older)
    by_id = AuditEvent.objects.for_tenant(acme).in_bulk(leaf_events(acme, older))
    assert [x["seq"] for x in lines(tmp_path / "x")] == [
        by_id[i].seq for i in leaf_events(acme, older)]
    assert auditexport.verify_export(tmp_path / "x")[1] == []


def test_a_late_commit_is_in_the_next_export_not_claimed_by_the_first(acme, tmp_path):
    """Event ``late`` gets the lower seq (its INSERT came first) but commits after
    ``early`` was integrated: simulated by holding its queue row back (an uncommitted
    event's row is invisible to the sequencer). The first export holds ``early`` and
    not ``late``, although its highest seq is above ``late``'s; ``late`` is a later leaf,
    in the next export, after ``early``."""
    late, early = note(acme), note(acme)
    assert late.seq < early.seq
    held = AuditPending.objects.for_tenant(acme).get(event_id=late.pk)
    held.delete()
    first = services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "a")
    seqs = [x["seq"] for x in lines(tmp_path / "a")]
    assert early.seq in seqs and late.seq not in seqs
    assert first["through_seq"] >= early.seq > late.seq
    assert first["through_tree_size"] == len(seqs)
    assert auditexport.verify_export(tmp_path / "a")[1] == []
    AuditPending.objects.create(tenant=acme, event_id=late.pk)  # it commits now
    second = services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / "b")
    later = [x["seq"] for x in lines(tmp_path / "b")]
    assert later[: len(seqs)] == seqs  # the first export is a prefix of the second
    assert late.seq in later[len(seqs):] and later.index(late.seq) > later.index(early.seq)
    assert second["through_tree_size"] > first["through_tree_size"]
    assert second["watermark_moved"] is True
    assert auditexport.verify_export(tmp_path / "b")[1] == []  # seq not increasing: fine
    out = run("verify_audit_chain", "acme", export=[str(tmp_path / "a"), str(tmp_path / "b")])
    assert out.count(" verifies (") == 2


def _swap_lines(out) -> None:
    rows = (out / "audit.jsonl").read_text().splitlines(keepends=True)
    rows[1], rows[2] = rows[2], rows[1]
    (out / "audit.jsonl").write_text("".join(rows))


def _drop_line(out) -> None:
    rows = (out / "audit.jsonl").read_text().splitlines(keepends=True)
    (out / "audit.jsonl").write_text("".join(rows[:1] + rows[2:]))


def _edit_seq(out) -> None:
    """A scheme-4 event's seq is not under its HMAC (the database gives it after the MAC):
    only its leaf hash, and so the root, covers it."""
    rows = (out / "audit.jsonl").read_text().splitlines()
    line = json.loads(rows[1])
    assert line["hash_scheme"] == 4
    rows[1] = dumps(dict(line, seq=line["seq"] + 1))
    (out / "audit.jsonl").write_text("\n".join(rows) + "\n")


def _edit_reason(out) -> None:
    rows = (out / "audit.jsonl").read_text().splitlines()
    rows[1] = dumps(dict(json.loads(rows[1]), reason="nothing to see"))
    (out / "audit.jsonl").write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("tamper, plain, resigned", [
    (_edit_reason, "audit.jsonl: its SHA-256", "audit.jsonl line 2: event seq"),
    (_edit_seq, "audit.jsonl: its SHA-256",
     "audit.jsonl: the Merkle root of its 3 leaves is not the signed tree head's"),
    (_drop_line, "audit.jsonl: its SHA-256",
     "audit.jsonl: 2 event(s), the signed tree head covers 3 leaves"),
    (_swap_lines, "audit.jsonl: its SHA-256",
     "audit.jsonl: the Merkle root of its 3 leaves is not the signed tree head's"),
])
def test_an_altered_event_file_is_named(acme, tmp_path, tamper, plain, resigned):
    """Caught by the file's SHA-256; and, the manifest re-signed by the key holder, by
    the event's HMAC or the leaves' Merkle root against the signed head."""
    note(acme)
    note(acme)
    out = tmp_path / "x"
    services.audit_export(actor=None, tenant=acme, out_dir=out)
    assert len(lines(out)) == 3  # the tenant's creation and the two
    tamper(out)
    problems = auditexport.verify_export(out)[1]
    assert problems and problems[0].startswith(plain)
    resign(out)
    problems = auditexport.verify_export(out)[1]
    assert problems and problems[0].startswith(resigned), problems
    with pytest.raises(CommandError, match="BROKEN|export"):
        run("verify_audit_chain", "acme", export=[str(out)])


def _later_head(acme) -> dict:
    note(acme)
    services.audit_integrate(acme)
    return {"tenant": "acme", **audittree.head_json(audittree.newest_head(acme.pk))}


def test_a_swapped_tree_head_is_named(acme, globex, tmp_path):
    note(acme)
    out = tmp_path / "x"
    services.audit_export(actor=None, tenant=acme, out_dir=out)
    m = json.loads((out / "manifest.json").read_text())
    later = _later_head(acme)
    # Swapped, not re-signed: the manifest's HMAC covers the head.
    (out / "manifest.json").write_text(json.dumps(dict(m, tree_head=later)))
    assert auditexport.verify_export(out)[1] == [
        "manifest: the signature does not verify (altered?)"]
    # Re-signed by the key holder: the head no longer covers the file.
    resign(out, tree_head=later)
    size = later["tree_size"]
    assert auditexport.verify_export(out)[1] == [
        f"manifest.tree_head (size {size}): not the size the manifest exports "
        f"({m['through_tree_size']})"]
    resign(out, tree_head=later, through_tree_size=size)
    assert auditexport.verify_export(out)[1] == [
        f"audit.jsonl: {m['counts']['events']} event(s), the signed tree head covers "
        f"{size} leaves (a line dropped or added?)"]
    # A head whose root was changed: it no longer matches its signed checkpoint text.
    resign(out, tree_head=dict(m["tree_head"], root_hash="ab" * 32),
           through_tree_size=m["through_tree_size"])
    problems = auditexport.verify_export(out)[1]
    assert problems[0].startswith(f"manifest.tree_head (size {m['through_tree_size']}): "
                                  "the checkpoint text does not match")
    # Another tenant's head: named.
    services.audit_integrate(globex)
    theirs = {"tenant": "acme", **audittree.head_json(audittree.newest_head(globex.pk))}
    resign(out, tree_head=theirs, through_tree_size=theirs["tree_size"])
    assert "another tree's" in auditexport.verify_export(out)[1][0]


def test_a_bad_through_tree_size_names_the_option(acme, wendy, tmp_path):
    purged_runs(wendy, acme, 1)
    services.audit_integrate(acme)
    first = audittree.newest_head(acme.pk).tree_size
    note(acme)
    services.audit_integrate(acme)
    newest = audittree.newest_head(acme.pk).tree_size
    gaps = sorted(set(range(1, newest)) - set(
        AuditTreeHead.objects.for_tenant(acme).values_list("tree_size", flat=True)))
    assert gaps, "heads are signed per batch: some sizes have none"
    for bad in (0, -1, newest + 1, gaps[0]):
        with pytest.raises(CommandError, match="^--through-tree-size: "):
            run("export_audit", "acme", out=str(tmp_path / f"c{bad}"), through_tree_size=bad)
        with pytest.raises(InvalidPayload, match="^through_tree_size: "):
            services.audit_export(actor=None, tenant=acme, out_dir=tmp_path / f"s{bad}",
                                  through_tree_size=bad)
    with pytest.raises(CommandError, match="--through-seq: .*--through-tree-size"):
        run("export_audit", "acme", out=str(tmp_path / "q"), through_seq=3)
    assert not AuditExport.objects.for_tenant(acme).exists()
    assert not any((tmp_path / name).exists() for name in ("q", f"c{gaps[0]}"))
    run("export_audit", "acme", out=str(tmp_path / "ok"), through_tree_size=first)
    assert AuditExport.objects.for_tenant(acme).get().through_tree_size == first


def test_an_export_by_seq_written_before_still_verifies(acme, tmp_path):
    """A ``FORMAT_V1`` manifest (no tree head; events by seq, increasing) verifies as it
    did; the same file claimed as v1 with its seqs out of order does not."""
    note(acme)
    out = tmp_path / "x"
    services.audit_export(actor=None, tenant=acme, out_dir=out)
    m = json.loads((out / "manifest.json").read_text())
    v1 = {k: v for k, v in m.items() if k in auditexport.MANIFEST_FIELDS_V1}
    (out / "manifest.json").write_text(json.dumps(auditexport.sign_manifest(
        dict(v1, format=auditexport.FORMAT_V1))))
    assert auditexport.verify_export(out)[1] == []
    assert "through seq" in run("verify_audit_chain", "acme", export=[str(out)])
    rows = (out / "audit.jsonl").read_text().splitlines(keepends=True)
    (out / "audit.jsonl").write_text("".join(reversed(rows)))
    resign(out)
    assert "is not after seq" in auditexport.verify_export(out)[1][0]


def test_a_tree_that_does_not_hash_to_its_head_is_not_exported(acme, tmp_path):
    """The export recomputes the leaves from the events it writes: a rewritten event
    (its leaf no longer matches) refuses the export and leaves no file behind."""
    note(acme)
    services.audit_integrate(acme)
    event = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    tampering.raw(f"UPDATE {tampering.EVENTS} SET reason = %s WHERE id = %s",
                  ["rewritten", event.pk])
    with pytest.raises(CommandError, match="the audit tree is broken"):
        run("export_audit", "acme", out=str(tmp_path / "x"))
    assert not (tmp_path / "x" / "audit.jsonl").exists()
    assert not AuditExport.objects.for_tenant(acme).exists()


def test_an_upgraded_chain_exports_as_the_leaves_it_was_sealed_as(acme, tmp_path):
    """A deployment upgraded from before issue 22: the chained events (scheme 3, seq 1..n)
    were sealed under the first head as leaves of the same input (``leaf_input``); the
    export of their leaves and of the events keyed alone after them verifies, and the
    chain's links are still checked line by line."""
    note(acme)
    note(acme)
    n = _as_chained_before_the_tree(acme)
    assert n == 3
    note(acme)  # keyed alone, after the chain
    out = tmp_path / "x"
    services.audit_export(actor=None, tenant=acme, out_dir=out)
    schemes = [x["hash_scheme"] for x in lines(out)]
    assert schemes == [3] * n + [4]
    assert auditexport.verify_export(out)[1] == []
    _swap_lines(out)  # two chained events
    resign(out)
    assert auditexport.verify_export(out)[1][0].startswith(
        "audit.jsonl line 2: seq 3 where 2 was expected")


def test_an_export_whose_manifest_names_another_tenant_is_broken_not_skipped(acme, tmp_path):
    """The manifest's "tenant" edited: ``verify_audit_chain acme --export DIR`` reports
    the export BROKEN under acme and fails, instead of skipping it as another tenant's
    (an attack's finding: it printed nothing and succeeded)."""
    out = tmp_path / "x"
    services.audit_export(actor=None, tenant=acme, out_dir=out)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(dict(manifest, tenant="zzz")))
    text = io.StringIO()
    with pytest.raises(CommandError, match="acme: export"):
        call_command("verify_audit_chain", "acme", export=[str(out)], stdout=text)
    assert f"acme: BROKEN export {out}" in text.getvalue()
