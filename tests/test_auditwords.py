"""Audit events as sentences (checkpoints/auditwords.py; issue 9, item 5): every
``AuditAction`` has a sentence, built from the event's actor, target, before/after and
reason; the shapes below are those the services write (``audit_record`` calls)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from checkpoints import auditwords
from checkpoints.vocab import AuditAction, TargetType

A, T = AuditAction, TargetType
EFFECT = "0f9b2c44-7a51-4c1e-9a52-2f7f5c1a9d10"
CP = "5c0e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
RUN = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
HOLD = "3e1f5a7c-2b4d-4c6e-8f0a-1b3c5d7e9f11"
PURGE = "9d2f0c3e-1111-4222-8333-444455556666"

#: One event per action as its service writes it: (actor, target type, target ref,
#: before, after, reason).
SAMPLES = {
    A.TENANT_CREATE: ("adam", T.TENANT, "acme", None, {"slug": "acme", "name": "Acme"}, ""),
    A.TENANT_THRESHOLD: ("adam", T.TENANT, "acme", {"ambiguity_threshold_s": 60},
                         {"ambiguity_threshold_s": 300}, ""),
    A.ROLE_GRANT: ("adam", T.ACCOUNT, "rita", None, {"role": "reviewer"}, ""),
    A.ROLE_REVOKE: ("adam", T.ACCOUNT, "rita", {"role": "reviewer"}, {"roles": ["viewer"]}, ""),
    A.TOKEN_ISSUE: ("adam", T.ACCOUNT, "wendy", None,
                    {"prefix": "rcv_ab12cd34", "roles": ["writer"]}, ""),
    A.TOKEN_REVOKE: ("adam", T.ACCOUNT, "wendy", None,
                     {"revoked": ["rk_ab", "rk_cd"], "roles": ["writer"]}, ""),
    A.ACCOUNT_DEACTIVATE: ("adam", T.ACCOUNT, "wendy", {"is_active": True, "roles": ["writer"]},
                           {"is_active": False, "tokens_revoked": ["rk_ab"]}, ""),
    A.RECONCILER_CONFIGURE: ("adam", T.SERVICE, "payments", None,
                             {"plugin": "http", "url": "https://x", "timeout_s": 5,
                              "settle_delay_s": 0}, ""),
    A.CHECKPOINT_WRITE: ("wendy", T.CHECKPOINT, CP, {"revision": 2},
                         {"revision": 3, "phase": "charging", "phase_class": "in_flight"}, ""),
    A.CHECKPOINT_CONFLICT: ("wendy", T.CHECKPOINT, CP, {"current_revision": 4},
                            {"reason": "stale_revision", "expected_revision": 2,
                             "attempted_revision": 3}, ""),
    A.EFFECT_WRITE: ("wendy", T.EFFECT, EFFECT, {"revision": 0},
                     {"revision": 1, "state": "submitted", "operation_key": "charge:A-7",
                      "service": "payments"}, ""),
    A.EFFECT_CONFLICT: ("wendy", T.EFFECT, EFFECT, {"current_revision": 1},
                        {"reason": "fenced", "expected_revision": 1}, ""),
    A.PAYLOAD_REVEAL: ("rita", T.CHECKPOINT, CP, None, {"revision": 3}, "what was charged"),
    A.PAYLOAD_READ: ("wendy", T.CHECKPOINT, CP, None, {"revision": 3}, ""),
    A.PAYLOAD_EXPORT: ("adam", T.CHECKPOINT, CP, None, {"revisions": 4, "from": 0, "to": 3}, ""),
    A.PAYLOAD_ROTATE_KEYS: ("system", T.TENANT, "acme", None, {"rows": 12, "keys": 1}, ""),
    A.TENANT_KEY_DESTROY: ("system", T.TENANT, "acme", None,
                           {"key_ids": ["9f0c794a9072546e"], "legacy_rows": 0,
                            "new_key_id": "0a1b2c3d4e5f6a7b"}, ""),
    A.RECEIPT_REVEAL: ("rita", T.EFFECT, EFFECT, None, {"revision": 2}, "which charge"),
    A.EVIDENCE_REVEAL: ("rita", T.EFFECT, EFFECT, None, {"request": 4, "attempt": 1}, "why"),
    A.LEASE_ACQUIRE: ("wendy", T.RUN, RUN, {"owner": None, "fencing_token": 0},
                      {"owner": "worker-1", "fencing_token": 1}, ""),
    A.LEASE_REVOKE: ("rita", T.RUN, RUN, {"owner": "worker-1", "fencing_token": 1,
                                          "expires_at": "2026-12-07T04:00:00+00:00"},
                     {"fencing_token": 2, "expires_at": "2026-12-07T03:10:00+00:00"},
                     "its node was drained"),
    A.LEASE_RELEASE: ("wendy", T.RUN, RUN, {"owner": "worker-1", "fencing_token": 1,
                                            "expires_at": "2026-12-07T04:00:00+00:00"},
                      {"fencing_token": 2, "expires_at": "2026-12-07T03:10:00+00:00"}, ""),
    A.RETRY_REQUEST: ("rita", T.RETRY_REQUEST, "7", {"recovery_state": "unknown_outcome"},
                      {"state": "requested", "recovery_state": "awaiting_approval",
                       "preview": []}, "worker died"),
    A.RETRY_APPROVE: ("april", T.RETRY_REQUEST, "7", {"state": "requested"},
                      {"state": "approved", "recovery_state": "retry_approved"}, "ok"),
    A.RETRY_REJECT: ("april", T.RETRY_REQUEST, "7", {"state": "requested"},
                     {"state": "rejected", "recovery_state": "unknown_outcome"}, "no"),
    A.RETRY_WITHDRAW: ("rita", T.RETRY_REQUEST, "7",
                       {"state": "requested", "recovery_state": "awaiting_approval"},
                       {"state": "withdrawn", "recovery_state": "unknown_outcome"}, "not needed"),
    A.BULK_SUBMIT: ("rita", T.BULK_ACTION, "9d2f0c3e-1111-4222-8333-444455556666", None,
                    {"action": "mark_unknown", "runs": 3, "run_ids": []}, "gateway down"),
    A.MIGRATION_SUBMIT: ("adam", T.MIGRATION_JOB, "9d2f0c3e-1111-4222-8333-444455556666",
                         None, {"kind": "acme.order", "to_version": 2, "reverse": False,
                                "runs": None}, ""),
    A.BULK_FINISH: ("rita", T.BULK_ACTION, "9d2f0c3e-1111-4222-8333-444455556666",
                    {"state": "running"}, {"state": "finished", "done": 2, "refused": 1,
                                           "failed": 0}, ""),
    A.BULK_ABORT: ("rita", T.BULK_ACTION, "9d2f0c3e-1111-4222-8333-444455556666",
                   {"state": "running"}, {"state": "aborted"}, "wrong filter"),
    A.BULK_FAIL: ("system", T.BULK_ACTION, "9d2f0c3e-1111-4222-8333-444455556666",
                  {"state": "running"}, {"state": "failed", "done": 4, "refused": 1,
                                         "failed": 0, "total": 7, "attempts": 1,
                                         "failures": 0},
                  "rita's account was deactivated; stopped after 5 of 7 runs"),
    A.MIGRATION_FAIL: ("system", T.MIGRATION_JOB, "9d2f0c3e-1111-4222-8333-444455556666",
                       {"state": "running"}, {"state": "failed", "kind": "acme.order",
                                              "to_version": 2, "migrated": 1, "skipped": 0,
                                              "refused": 2, "conflict": 0, "attempts": 3,
                                              "failures": 3},
                       "gave up after 3 failed attempts in a row"),
    A.RETRY_CONSUME: ("wendy", T.RETRY_REQUEST, "7", {"state": "approved"},
                      {"state": "consumed", "fencing_token": 3}, ""),
    A.EFFECT_MARK_UNKNOWN: ("rita", T.EFFECT, EFFECT, {"state": "unresolved", "revision": 2},
                            {"state": "unknown", "revision": 3}, "gateway has no lookup"),
    A.EFFECT_UNRESOLVED: ("system", T.EFFECT, EFFECT, {"state": "submitted"},
                          {"state": "unresolved"}, ""),
    A.EFFECT_RECONCILE: ("system", T.EFFECT, EFFECT, {"state": "unresolved", "revision": 2},
                         {"state": "confirmed", "revision": 3, "answer": "found", "request": 4,
                          "reconciler": "http"}, "charge ch_42 succeeded"),
    A.RUN_RECONCILE: ("rita", T.RUN, RUN, None,
                      {"task_id": "t", "requests": [4, 5], "effects": [EFFECT, CP]}, "stuck"),
    A.RUN_AMBIGUOUS: ("system", T.RUN, RUN, {"recovery_state": "healthy"},
                      {"recovery_state": "ambiguous"}, ""),
    A.RUN_CLOSE: ("rita", T.RUN, RUN, {"recovery_state": "unknown_outcome"},
                  {"recovery_state": "closed"}, "refunded by hand"),
    A.CONFLICTS_ACKNOWLEDGE: ("rita", T.RUN, RUN, {"recovery_state": "conflicted",
                                                   "open_conflicts": 2},
                              {"recovery_state": "healthy", "open_conflicts": 0}, "seen"),
    A.RECONCILE_GAVE_UP: ("system", T.EFFECT, EFFECT, None,
                          {"request": 4, "attempts": 5, "failures": 5}, "timeout"),
    A.RECONCILE_MOVED_ON: ("system", T.EFFECT, EFFECT, None, {"request": 4, "state": "failed"},
                           ""),
    A.AUDIT_EXPORT_HEAD: ("adam", T.TENANT, "acme", None, {"key_id": "k1"}, ""),
    # LangGraph threads (issue 10): interop.langgraph's audit_record calls.
    A.LANGGRAPH_WRITES: ("wendy", T.CHECKPOINT, CP, None,
                         {"checkpoint_id": "1ef0a", "task_id": "t9", "stored": 2}, ""),
    A.LANGGRAPH_THREAD_DELETE: ("wendy", T.RUN, RUN, None,
                                {"thread_id": "t-1", "deleted": 3, "run": "closed"}, ""),
    A.LANGGRAPH_THREAD_COPY: ("wendy", T.RUN, RUN, None,
                              {"source_thread_id": "t-1", "target_thread_id": "t-2",
                               "source_run_id": RUN, "copied": 3, "namespaces": 1}, ""),
    A.LANGGRAPH_THREAD_PRUNE: ("wendy", T.RUN, RUN, None,
                               {"strategy": "keep_latest", "thread_id": "t-1", "deleted": 2,
                                "run": "kept"}, ""),
    A.LANGGRAPH_RUNS_DELETE: ("wendy", T.RUN, RUN, None,
                              {"run_ids": ["r-1"], "run_ids_given": 1, "thread_id": "t-1",
                               "deleted": 1, "run": "deleted"}, ""),
    A.CHECKPOINT_IMPORT: ("system", T.CHECKPOINT, CP, None,
                          {"revision": 3, "phase": "completed after 1 turn(s)",
                           "phase_class": "completed"}, ""),
    A.EFFECT_IMPORT: ("system", T.EFFECT, EFFECT, {"revision": 0, "state": "planned"},
                      {"revision": 1, "state": "unresolved", "runifold_state": "started",
                       "operation_key": "charge:A-7", "service": "payments"}, ""),
    A.RUNIFOLD_EXPORT: ("adam", T.TENANT, "acme", None,
                        {"checkpoint_lines": 200, "effect_lines": 12, "history": False}, ""),
    # Declarative kinds (issue 19, item 1): services.kind_declare.
    A.KIND_DECLARE: ("adam", T.KIND, "acme.refunds v2", {"digest": "ab" * 32},
                     {"digest": "cd" * 32, "reversible_from_previous": True}, ""),
    # Migrations (issue 19, item 2): writepath._write_audit with a Migrating.
    A.CHECKPOINT_MIGRATE: ("system", T.CHECKPOINT, CP,
                           {"revision": 3, "schema_version": 1, "fencing_token": 2},
                           {"revision": 4, "phase": "charged", "phase_class": "stable",
                            "schema_version": 2, "fencing_token": 3,
                            "migration": ["acme.order amount_cents -> amount"],
                            "batch_id": "9d2f0c3e-1111-4222-8333-444455556666"}, ""),
    # Legal holds and erasure (issue 20): services.holds, services.erasure, and the
    # erasure's purge_run_payloads.
    A.LEGAL_HOLD_PLACE: ("adam", T.LEGAL_HOLD, HOLD, None,
                         {"scope": "subject", "runs": 0, "subject_field": "customer_id"},
                         "case 17"),
    A.LEGAL_HOLD_RELEASE: ("adam", T.LEGAL_HOLD, HOLD, {"active": True, "scope": "runs"},
                           {"active": False, "scope": "runs"}, "settled"),
    A.ERASURE_REQUEST: ("rita", T.ERASURE_REQUEST, HOLD, None,
                        {"state": "requested", "scope": "runs", "runs": 2,
                         "subject_field": None}, "art. 17"),
    A.ERASURE_APPROVE: ("april", T.ERASURE_REQUEST, HOLD, {"state": "requested"},
                        {"state": "approved"}, ""),
    A.ERASURE_REJECT: ("april", T.ERASURE_REQUEST, HOLD, {"state": "requested"},
                       {"state": "rejected"}, "not ours"),
    A.ERASURE_EXECUTE: ("april", T.ERASURE_REQUEST, HOLD, {"state": "approved"},
                        {"state": "executed", "counts": {
                            "runs": 3, "erased": 2, "blocked": 1, "legal_hold": 1,
                            "not_ended": 0, "effect_in_doubt": 0, "already_deleted": 0}}, ""),
    A.RUN_ERASE: ("april", T.RUN, RUN, None,
                  {"tombstone": 12, "cause": "erasure", "policy": {"erasure_request": HOLD},
                   "counts": {"checkpoints": 1, "revisions": 3}}, ""),
    # Tombstone governance (issue 20, item 5): services.audit_export, tombstone purges.
    A.AUDIT_EXPORT: ("system", T.TENANT, "acme", None,
                     {"export": 1, "through_seq": 40, "through_tombstone": 3, "events": 38,
                      "through_tree_size": 38,
                      "tombstones": 3, "manifest_sha256": "ab" * 32, "key_id": "k",
                      "watermark_moved": True}, ""),
    A.TOMBSTONE_PURGE_PREPARE: ("adam", T.TOMBSTONE_PURGE, PURGE, None,
                                {"purge": PURGE, "state": "prepared", "tombstones": 3}, ""),
    A.TOMBSTONE_PURGE_APPROVE: ("april", T.TOMBSTONE_PURGE, PURGE, {"state": "prepared"},
                                {"purge": PURGE, "state": "approved"}, ""),
    A.TOMBSTONE_PURGE_REJECT: ("april", T.TOMBSTONE_PURGE, PURGE, {"state": "prepared"},
                               {"purge": PURGE, "state": "rejected"}, "not yet"),
    A.TOMBSTONE_PURGE_EXECUTE: ("adam", T.TOMBSTONE_PURGE, PURGE, {"state": "approved"},
                                {"purge": PURGE, "state": "executed", "tombstones": 3}, ""),
    # Notifications (issue 21): services.notify_endpoints, services.notify_delivery.
    A.NOTIFICATION_ENDPOINT_CREATE: ("adam", T.NOTIFICATION_ENDPOINT, HOLD, None,
                                     {"name": "on-call", "channel": "webhook",
                                      "destination": "https://hooks.example.com",
                                      "event_types": ["run.needs_review"], "kinds": [],
                                      "agents": [], "services": [], "group_window_s": 120,
                                      "quiet_period_s": 0, "enabled": True}, ""),
    A.NOTIFICATION_ENDPOINT_UPDATE: ("adam", T.NOTIFICATION_ENDPOINT, HOLD,
                                     {"group_window_s": 120}, {"group_window_s": 60}, ""),
    A.NOTIFICATION_ENDPOINT_DELETE: ("adam", T.NOTIFICATION_ENDPOINT, HOLD,
                                     {"name": "on-call", "channel": "email"}, None, ""),
    A.NOTIFICATION_ENDPOINT_ROTATE: ("adam", T.NOTIFICATION_ENDPOINT, HOLD, None,
                                     {"previous_valid_until": "2025-01-02T03:04:05+00:00"},
                                     ""),
    A.NOTIFICATION_ENDPOINT_DISABLE: ("system", T.NOTIFICATION_ENDPOINT, HOLD,
                                      {"enabled": True},
                                      {"enabled": False, "failed_messages": 3},
                                      "every delivery failed for more than 5 day(s)"),
    A.NOTIFICATION_TEST: ("adam", T.NOTIFICATION_ENDPOINT, HOLD, None,
                          {"event_id": "msg_3f2a9c01aa"}, ""),
    A.NOTIFICATION_RESEND: ("adam", T.NOTIFICATION_MESSAGE, "msg_3f2a9c01aa",
                            {"state": "failed", "attempts": 8},
                            {"state": "pending", "endpoint": HOLD}, ""),
    # The data lifecycle (issue 20): services.data_policy_set, purge_run_payloads, the
    # retention purge's second phase.
    A.DATA_POLICY_SET: ("adam", T.DATA_POLICY, "acme", None,
                        {"payload_retention_days": 30, "effect_retention_days": None,
                         "restart_interval_s": 86400, "tombstone_retention_days": None,
                         "secrets_policy": "warn", "payload_flag_bytes": None,
                         "subject_fields": {}}, ""),
    A.RUN_PURGE: ("system", T.RUN, RUN, None,
                  {"tombstone": 7, "cause": "retention",
                   "policy": {"payload_retention_days": 30}, "counts": {"checkpoints": 1}}, ""),
    A.RUN_EXPIRE: ("system", T.RUN, RUN, None,
                   {"cause": "retention", "counts": {"effects": 2},
                    "policy": {"effect_retention_days": 90, "restart_interval_s": 86400}}, ""),
}

NAMES = {EFFECT: "charge:A-7 at payments"}


def event(action, actor, target_type, target_ref, before, after, reason):
    return SimpleNamespace(action=action, actor_name=actor, target_type=target_type,
                           target_ref=target_ref, before=before, after=after, reason=reason)


def test_every_audit_action_has_a_sentence():
    assert set(auditwords.SENTENCES) == set(AuditAction.values)
    assert set(SAMPLES) == set(AuditAction.values)


@pytest.mark.parametrize("action", AuditAction.values)
def test_each_sentence_says_who_did_what_in_words(action):
    actor, *rest = SAMPLES[action]
    words = auditwords.sentence(event(action, actor, *rest), NAMES)
    assert words.startswith(actor + " ")
    assert f"did {action}" not in words  # not the fallback
    what = auditwords.sentence(event(action, actor, *rest[:-1], ""), NAMES)  # no reason
    for leftover in ("None", "?", "{", "_"):  # no raw value or state word left
        assert leftover not in what, what


@pytest.mark.parametrize(("action", "expected"), [
    (A.EFFECT_MARK_UNKNOWN,
     "rita marked charge:A-7 at payments outcome unknown: gateway has no lookup"),
    (A.RUN_AMBIGUOUS, "system moved the run healthy → ambiguous"),
    (A.RUN_CLOSE, "rita closed the run (unknown outcome → closed): refunded by hand"),
    (A.RETRY_REQUEST, "rita requested a retry of the run (unknown outcome → awaiting approval)"
                      ": worker died"),
    (A.RETRY_APPROVE, "april approved retry request #7: ok"),
    (A.RETRY_WITHDRAW, "rita withdrew retry request #7 (awaiting approval → unknown outcome)"
                       ": not needed"),
    (A.BULK_SUBMIT, "rita asked for mark unknown on 3 runs at once (bulk 9d2f0c3e): "
                    "gateway down"),
    (A.MIGRATION_SUBMIT, "adam asked to migrate acme.order's checkpoints to v2 "
                         "(job 9d2f0c3e)"),
    (A.LEGAL_HOLD_PLACE, "adam placed legal hold 3e1f5a7c on every run of one customer id: "
                         "case 17"),
    (A.ERASURE_EXECUTE, "april executed erasure request 3e1f5a7c: 2 runs erased, 1 not "
                        "erased (1 under legal hold)"),
    (A.RUN_ERASE, "april erased the payloads of the run for erasure request 3e1f5a7c: 1 "
                  "checkpoint, 3 revisions deleted; tombstone #12"),
    (A.BULK_FINISH, "rita finished bulk 9d2f0c3e: 2 done, 1 refused, 0 failed"),
    (A.BULK_ABORT, "rita aborted bulk 9d2f0c3e while running (the runs done stay done): "
                   "wrong filter"),
    (A.BULK_FAIL, "system gave up bulk 9d2f0c3e after 5 of 7 runs (4 done, 1 refused, 0 "
                  "failed): rita's account was deactivated; stopped after 5 of 7 runs"),
    (A.MIGRATION_FAIL, "system gave up migration job 9d2f0c3e (acme.order to v2) with 1 "
                       "checkpoint migrated, 0 skipped, 2 refused, 0 in conflict: gave up "
                       "after 3 failed attempts in a row"),
    (A.EFFECT_RECONCILE, "system reconciled charge:A-7 at payments: unresolved → confirmed "
                         "(the service answered found via the http reconciler): charge ch_42 "
                         "succeeded"),
    (A.CHECKPOINT_CONFLICT, "wendy was refused writing checkpoint 5c0e1a2b: stale revision "
                            "(sent for revision 2, store at 4)"),
    (A.CHECKPOINT_WRITE, "wendy wrote checkpoint 5c0e1a2b revision 3 at phase charging"),
    (A.AUDIT_EXPORT, "system exported the audit of tenant acme through tree size 38 (events "
                     "up to seq 40) with 3 tombstones"),
    (A.TOMBSTONE_PURGE_EXECUTE, "adam executed tombstone purge 9d2f0c3e: deleted 3 "
                                "tombstones"),
    (A.TOMBSTONE_PURGE_REJECT, "april rejected tombstone purge 9d2f0c3e: not yet"),
    (A.CHECKPOINT_IMPORT, "system imported checkpoint 5c0e1a2b revision 3 from a runifold "
                          "file at phase completed after 1 turn(s)"),
    (A.EFFECT_IMPORT, "system imported charge:A-7 at payments revision 1 from a runifold file"
                      ", now unresolved (runifold: started)"),
    (A.KIND_DECLARE, "adam replaced the declaration of kind acme.refunds v2"),
    (A.CHECKPOINT_MIGRATE, "system migrated checkpoint 5c0e1a2b from v1 to v2 as revision 4 "
                           "in batch 9d2f0c3e; fencing token 3"),
    (A.RUNIFOLD_EXPORT, "adam exported 200 checkpoint lines and 12 effect lines of "
                        "tenant acme as runifold JSON Lines"),
    (A.TENANT_KEY_DESTROY, "system destroyed 1 data key of tenant acme: everything "
                           "stored under them is erased (crypto-shredding)"),
    (A.PAYLOAD_ROTATE_KEYS, "system re-encrypted 12 stored values with the tenant's data "
                            "key and re-wrapped 1 data key with the newest master key"),
    (A.LEASE_ACQUIRE, "wendy gave the run's lease to worker-1, fencing token 1"),
    (A.LEASE_REVOKE, "rita ended worker-1's lease on the run (fencing token 1 → 2): its "
                     "owner's writes are refused from now on: its node was drained"),
    (A.LEASE_RELEASE, "wendy gave back worker-1's lease on the run (fencing token 1 → 2)"),
    (A.CONFLICTS_ACKNOWLEDGE, "rita acknowledged 2 conflicts of the run "
                              "(conflicted → healthy): seen"),
    (A.LANGGRAPH_THREAD_DELETE, "wendy deleted LangGraph thread t-1: 3 checkpoints; the "
                                "run is closed (something else refers to it)"),
    (A.LANGGRAPH_THREAD_PRUNE, "wendy pruned LangGraph thread t-1 (keep latest): 2 "
                               "checkpoints deleted"),
    (A.LANGGRAPH_THREAD_COPY, "wendy copied LangGraph thread t-1 onto t-2: 3 checkpoints"),
    (A.LANGGRAPH_RUNS_DELETE, "wendy deleted 1 checkpoint of 1 LangGraph run from "
                              "thread t-1; the run is deleted"),
])
def test_the_sentences_read_as_the_issue_asks(action, expected):
    assert auditwords.sentence(event(action, *SAMPLES[action]), NAMES) == expected


def test_an_effect_is_named_by_its_key_from_the_events_themselves():
    write = event(A.EFFECT_WRITE, *SAMPLES[A.EFFECT_WRITE])
    mark = event(A.EFFECT_MARK_UNKNOWN, *SAMPLES[A.EFFECT_MARK_UNKNOWN])
    names = auditwords.names_from_events([mark, write])
    assert names == NAMES
    assert "marked charge:A-7 at payments outcome unknown" in auditwords.sentence(mark, names)
    # Without a name, the effect's short id.
    assert "marked effect 0f9b2c44 outcome unknown" in auditwords.sentence(mark)


def test_odd_or_old_shapes_give_a_shorter_sentence_never_an_error():
    for action in [*AuditAction.values, "some.future_action"]:
        for before, after in [(None, None), ([1, 2], "x"), ({"state": None}, {"answer": 3})]:
            words = auditwords.sentence(event(action, "", T.RUN, RUN, before, after, ""))
            assert words.startswith("system ")
    assert auditwords.sentence(event("some.future_action", "rita", T.RUN, RUN, None, None, "")) \
        == "rita did some.future_action on the run"


def test_a_service_without_a_look_up_reads_as_such():
    # A newcomer read "(the service answered no lookup via none)".
    _, kind, ref, before, after, reason = SAMPLES[A.EFFECT_RECONCILE]
    after = {**after, "answer": "no_lookup", "reconciler": "none", "state": "unknown"}
    words = auditwords.sentence(event(A.EFFECT_RECONCILE, "system", kind, ref, before, after,
                                      ""), NAMES)
    assert "offers no look-up, so nobody can tell" in words and "via none" not in words


def test_a_write_since_issue_20_names_its_phase_class_not_a_label():
    """Since issue 20 a write's event holds the payload's hash, not its phase label
    (which a declared kind may build from payload fields)."""
    after = {"revision": 3, "phase_class": "in_flight", "payload_sha256": "ab" * 32}
    words = auditwords.sentence(event(A.CHECKPOINT_WRITE, "wendy", T.CHECKPOINT, CP,
                                      {"revision": 2}, after, ""))
    assert words == "wendy wrote checkpoint 5c0e1a2b revision 3 (in flight phase)"
