"""One readable sentence per audit event, for people (issue 9, item 5).

The audit trail stores each event as ``action``, ``target_type``/``target_ref``, ``reason``
and the ``before``/``after`` JSON its service wrote (the shapes are the ``audit_record``
calls in ``checkpoints.services``, ``checkpoints.jobs.reconciliation``, ``checkpoints.audit``
and ``checkpoints.services.writepath``). The dashboard shows ``sentence(event)`` instead of the
JSON (which stays one click away), e.g.::

    rita marked charge:A-7 at payments outcome unknown: gateway has no lookup
    system moved the run ambiguous → unknown outcome

``SENTENCES`` has one function per ``vocab.AuditAction`` (``tests/test_auditwords.py``
checks that none is missing); an action written before this module knew it falls back to
``"<actor> did <action> on <target>"``. Presentation only: no query, no domain rule; a
missing or odd key in ``before``/``after`` (events are kept forever, shapes changed over
time) gives a shorter sentence, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .vocab import AuditAction, ReconcileAnswer, TargetType

A = AuditAction

#: ``{target_ref: "charge:A-7 at payments"}``: readable names for effects (and other
#: targets) the caller already has; ``names_from_events`` fills it from effect writes.
Names = Mapping[str, str]


def _words(value: Any) -> str:
    """A state word for people: ``"unknown_outcome"`` -> ``"unknown outcome"``."""
    return str(value).replace("_", " ") if value not in (None, "") else ""


def _get(d: Any, key: str) -> Any:
    return d.get(key) if isinstance(d, Mapping) else None


def _short(ref: str) -> str:
    """A UUID's first 8 characters (the dashboard's short id); other refs as they are."""
    ref = str(ref or "")
    return ref[:8] if len(ref) == 36 and ref.count("-") == 4 else ref


def _move(before: Any, after: Any, key: str) -> str:
    """``"ambiguous → unknown outcome"``, or just the new state, or ""."""
    old, new = _words(_get(before, key)), _words(_get(after, key))
    if old and new and old != new:
        return f"{old} → {new}"
    return new or old


def target_name(event, names: Names | None = None) -> str:
    """What the event was about, in words: an effect by ``operation_key at service``
    (from ``names`` or the event's own ``after``), a run as "the run", a checkpoint as
    "checkpoint 1a2b3c4d", an account by its username, a tenant by its slug."""
    ref, kind = str(event.target_ref or ""), event.target_type
    if names and ref in names:
        return names[ref]
    after = event.after
    if _get(after, "operation_key") and _get(after, "service"):
        return f"{after['operation_key']} at {after['service']}"
    if kind == TargetType.RUN:
        return "the run"
    if kind == TargetType.RETRY_REQUEST:
        return f"retry request #{ref}"
    if kind in (TargetType.ACCOUNT, TargetType.TENANT, TargetType.SERVICE, TargetType.KIND):
        return f"{_words(kind)} {ref}"
    return f"{_words(kind)} {_short(ref)}".strip()


def _event(ref) -> str:
    """A notification's event id, short: ``msg_3f2a9c01…`` -> ``3f2a9c01``."""
    ref = str(ref or "")
    return ref[4:12] if ref.startswith("msg_") else ref[:12]


def _declared(e, t) -> str:
    """A declared kind version by its whole name (the event's ``after``), else ``t`` (an
    event written before they were recorded: ``target_ref``, cut at 64 characters)."""
    kind, version = _get(e.after, "kind"), _get(e.after, "version")
    return f"kind {kind} v{version}" if kind and version is not None else t


def _run_state(e, _t) -> str:
    move = _move(e.before, e.after, "recovery_state")
    return f" ({move})" if move and "→" in move else ""


def _phase(e) -> str:
    """" at phase LABEL" for an event written before issue 20 (which held the label); else
    " (a CLASS phase)" from the phase class, since an event holds no payload-derived label."""
    phase = _get(e.after, "phase")
    if phase:
        return f" at phase {phase}"
    cls = _words(_get(e.after, "phase_class"))
    return f" ({cls} phase)" if cls else ""


def _write(noun: str) -> Callable:
    def say(e, t) -> str:
        rev, old = _get(e.after, "revision"), _get(e.before, "revision")
        what = f"wrote {t}" + (f" revision {rev}" if rev is not None else "")
        if old is None and rev in (0, None):
            what = f"created {t}"
        state = _words(_get(e.after, "state"))
        if state:
            what += f", now {state}"
        else:
            what += _phase(e)
        if _get(e.after, "reopened"):
            what += ", reopening the closed run"
        return what
    say.__doc__ = f"a runtime's {noun} write"
    return say


def _imported(e, t) -> str:
    """a line of a runifold file written by ``import_runifold`` (issue 10, item 4)"""
    rev = _get(e.after, "revision")
    what = f"imported {t}" + (f" revision {rev}" if rev is not None else "")
    what += " from a runifold file"
    state, theirs = _words(_get(e.after, "state")), _words(_get(e.after, "runifold_state"))
    if state:
        what += f", now {state}" + (f" (runifold: {theirs})" if theirs and theirs != state
                                    else "")
    else:
        what += _phase(e)
    if _get(e.after, "reopened"):
        what += ", reopening the closed run"
    return what


def _migrated(e, t) -> str:
    """a checkpoint migrated to another schema version (``migrate_checkpoints``, issue 19;
    the steps' names are in the event's ``after``)"""
    old, new = _get(e.before, "schema_version"), _get(e.after, "schema_version")
    text = f"migrated {t}" + (f" from v{old}" if old is not None else "")
    text += f" to v{new}" if new is not None else " to another schema version"
    if _get(e.after, "revision") is not None:
        text += f" as revision {e.after['revision']}"
    if _get(e.after, "batch_id"):
        text += f" in batch {_short(e.after['batch_id'])}"
    if _get(e.after, "fencing_token") is not None:
        text += f"; fencing token {e.after['fencing_token']}"
    return text


def _exported(e, t) -> str:
    """one page of ``export_runifold`` (issue 10, item 4)"""
    checkpoints, effects = _get(e.after, "checkpoint_lines"), _get(e.after, "effect_lines")
    return (f"exported {_n(checkpoints or 0, 'checkpoint line')} and "
            f"{_n(effects or 0, 'effect line')} of {t} as runifold JSON Lines")


def _conflict(e, t) -> str:
    why = _words(_get(e.after, "reason")) or "a conflict"
    exp, cur = _get(e.after, "expected_revision"), _get(e.before, "current_revision")
    detail = ""
    if exp is not None or cur is not None:
        detail = (f" (sent for revision {'none' if exp is None else exp}, "
                  f"store at {'none' if cur is None else cur})")
    return f"was refused writing {t}: {why}{detail}"


def _n(n: Any, word: str) -> str:
    """``"1 run"``, ``"2 runs"``, ``"? look-ups"``: a count and its noun, plural unless 1."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _count(d: Any, key: str) -> int:
    """A count of ``d`` (an event's ``after``), 0 when missing or not a whole number."""
    n = _get(d, key)
    return n if type(n) is int else 0


def _days(n: Any) -> str:
    return "kept forever" if n is None else f"{_n(n, 'day')}"


def _policy_set(e, _t) -> str:
    a = e.after or {}
    return (f"set the data policy: payloads {_days(a.get('payload_retention_days'))}, effect "
            f"records {_days(a.get('effect_retention_days'))}, restart interval "
            f"{a.get('restart_interval_s')} s, tombstones "
            f"{_days(a.get('tombstone_retention_days'))}, credentials "
            f"{_words(a.get('secrets_policy'))}")


def _reveal(what: str) -> Callable:
    def say(e, t) -> str:
        rev = _get(e.after, "revision")
        at = f" at revision {rev}" if rev is not None else ""
        if _get(e.after, "attempt") is not None:
            at = f" from look-up #{e.after['attempt']}"
        return f"revealed the {what} of {t}{at}"
    return say


def _lease(e, t) -> str:
    owner, token = _get(e.after, "owner"), _get(e.after, "fencing_token")
    old = _get(e.before, "owner")
    text = f"gave {t}'s lease to {owner or 'nobody'}"
    if old and old != owner:
        text += f" (was {old})"
    if token is not None:
        text += f", fencing token {token}"
    if _get(e.after, "reopened"):
        text += ", reopening the closed run"
    return text


def _lease_revoked(e, t) -> str:
    """*ended worker-1's lease on the run (fencing token 3 → 4): its owner's writes are
    refused from now on* (``services.lease_revoke``)."""
    owner = _get(e.before, "owner")
    old, new = _get(e.before, "fencing_token"), _get(e.after, "fencing_token")
    who = f"{owner}'s" if owner else "the"
    text = f"ended {who} lease on {t}"
    if old is not None and new is not None:
        text += f" (fencing token {old} → {new})"
    elif new is not None:
        text += f" (fencing token {new})"
    return text + ": its owner's writes are refused from now on"


def _lease_released(e, t) -> str:
    """*gave back worker-1's lease on the run (fencing token 3 → 4)*, by the account of
    the runtime that held it (``services.lease_release``)."""
    owner = _get(e.before, "owner")
    old, new = _get(e.before, "fencing_token"), _get(e.after, "fencing_token")
    text = f"gave back {owner + chr(39) + 's' if owner else 'its'} lease on {t}"
    if old is not None and new is not None:
        text += f" (fencing token {old} → {new})"
    return text


def _retry_decision(verb: str) -> Callable:
    def say(e, t) -> str:
        return f"{verb} {t}{_run_state(e, t)}"
    return say


def _reconciled(e, t) -> str:
    answer, move = _words(_get(e.after, "answer")), _move(e.before, e.after, "state")
    by = _get(e.after, "reconciler")
    text = f"reconciled {t}"
    if move:
        text += f": {move}"
    if _get(e.after, "answer") == ReconcileAnswer.NO_LOOKUP:
        text += " (the service offers no look-up, so nobody can tell)"
    elif answer:
        via = f" via the {by} reconciler" if by and by != "none" else ""
        text += f" (the service answered {answer}{via})"
    return text


def _reconcile_run(e, t) -> str:
    n = len(_get(e.after, "effects") or [])
    return f"asked to reconcile {n} in-doubt effect{'s' if n != 1 else ''} of {t}"


def _run_after(e) -> str:
    """What a LangGraph deletion left of the thread's run (``after["run"]``)."""
    outcome = _get(e.after, "run")
    return {"closed": "; the run is closed (something else refers to it)",
            "deleted": "; the run is deleted",
            "awaiting_review": "; the run stays open: it awaits review (an effect in "
                               "doubt or an open review request)"}.get(outcome, "")


def _lg_delete(e, t) -> str:
    return (f"deleted LangGraph thread {_get(e.after, 'thread_id') or '(unknown)'}: "
            f"{_n(_get(e.after, 'deleted') or 0, 'checkpoint')}{_run_after(e)}")


def _lg_prune(e, t) -> str:
    return (f"pruned LangGraph thread {_get(e.after, 'thread_id') or '(unknown)'} "
            f"({_words(_get(e.after, 'strategy')) or 'a strategy'}): "
            f"{_n(_get(e.after, 'deleted') or 0, 'checkpoint')} deleted{_run_after(e)}")


def _lg_runs_delete(e, t) -> str:
    runs = _get(e.after, "run_ids_given") or len(_get(e.after, "run_ids") or [])
    return (f"deleted {_n(_get(e.after, 'deleted') or 0, 'checkpoint')} of "
            f"{_n(runs, 'LangGraph run')} from thread {_get(e.after, 'thread_id') or '(unknown)'}{_run_after(e)}")


def _lg_copy(e, t) -> str:
    return (f"copied LangGraph thread {_get(e.after, 'source_thread_id') or '(unknown)'} onto "
            f"{_get(e.after, 'target_thread_id') or '(unknown)'}: "
            f"{_n(_get(e.after, 'copied') or 0, 'checkpoint')}")


def _lg_writes(e, t) -> str:
    return (f"stored {_n(_get(e.after, 'stored') or 0, 'pending write')} of a task on LangGraph "
            f"checkpoint {_get(e.after, 'checkpoint_id') or '(unknown)'} of {t}, which is "
            f"not its newest")


def _roles(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "none"
    return str(value) if value else "none"


#: One sentence maker per action: ``(event, target name) -> the words after the actor``.
def _held_what(e) -> str:
    """What a legal hold or an erasure request covers, from its event's ``after`` (the
    subject by its field's name only: its value is never in an event)."""
    field, runs = _get(e.after, "subject_field"), _get(e.after, "runs")
    if _get(e.after, "scope") == "tenant":
        return "every run of the tenant"
    if field:
        return f"every run of one {_words(field)}"
    return f"{_n(runs if isinstance(runs, int) else 'some', 'run')}"


def _erasure_counts(counts) -> str:
    """``"2 runs erased, 1 not erased (1 under legal hold)"`` from an erasure's counts."""
    if not isinstance(counts, Mapping):
        return "done"
    out = f"{_n(counts.get('erased') or 0, 'run')} erased"
    stopped = [f"{counts[word]} {label}" for word, label in (
        ("legal_hold", "under legal hold"), ("not_ended", "not ended"),
        ("effect_in_doubt", "with an effect in doubt"), ("already_deleted", "already deleted"))
        if isinstance(counts.get(word), int) and counts[word]]
    if counts.get("blocked"):
        out += f", {counts['blocked']} not erased ({', '.join(stopped)})"
    return out


def _erased_run(e, t) -> str:
    policy, counts = _get(e.after, "policy"), _get(e.after, "counts")
    request = _get(policy, "erasure_request")
    by = f" for erasure request {_short(request)}" if request else ""
    rows = (f": {_n(counts.get('checkpoints') or 0, 'checkpoint')}, "
            f"{_n(counts.get('revisions') or 0, 'revision')} deleted"
            if isinstance(counts, Mapping) else "")
    stone = _get(e.after, "tombstone")
    return (f"erased the payloads of {t}{by}{rows}"
            + (f"; tombstone #{stone}" if stone is not None else ""))


SENTENCES: dict[str, Callable[[Any, str], str]] = {
    A.TENANT_CREATE: lambda e, t: f"created {t}",
    A.TENANT_THRESHOLD: lambda e, t: (
        f"set {t}'s ambiguity threshold to {_get(e.after, 'ambiguity_threshold_s')} s"
        + (f" (was {_get(e.before, 'ambiguity_threshold_s')} s)"
           if _get(e.before, "ambiguity_threshold_s") is not None else "")),
    A.ROLE_GRANT: lambda e, t: f"granted {t} the {_get(e.after, 'role') or '?'} role",
    A.ROLE_REVOKE: lambda e, t: (f"took the {_get(e.before, 'role') or '?'} role from {t}"
                                 f" (roles left: {_roles(_get(e.after, 'roles'))})"),
    A.TOKEN_ISSUE: lambda e, t: f"issued an API token to {t}",
    A.TOKEN_REVOKE: lambda e, t: (
        f"revoked {_n(len(_get(e.after, 'revoked') or []), 'API token')} of {t}"),
    A.ACCOUNT_DEACTIVATE: lambda e, t: (
        f"deactivated {t} and revoked {_n(len(_get(e.after, 'tokens_revoked') or []), 'token')}"),
    A.RECONCILER_CONFIGURE: lambda e, t: (
        f"set the reconciler of {t} to {_get(e.after, 'plugin')}" if e.after
        else f"reset the reconciler of {t} to the default"),
    A.CHECKPOINT_WRITE: _write("checkpoint"),
    A.CHECKPOINT_CONFLICT: _conflict,
    A.EFFECT_WRITE: _write("effect"),
    A.EFFECT_CONFLICT: _conflict,
    A.PAYLOAD_REVEAL: _reveal("payload"),
    A.PAYLOAD_READ: lambda e, t: (f"read the payload of {t}"
                                  + (f" at revision {_get(e.after, 'revision')}"
                                     if _get(e.after, "revision") is not None else "")
                                  + " through the API"),
    A.PAYLOAD_EXPORT: lambda e, t: (f"exported {_n(_get(e.after, 'revisions') or 0, 'revision')}"
                                    f" of {t}"),
    A.PAYLOAD_ROTATE_KEYS: lambda e, t: (
        f"re-encrypted {_n(_get(e.after, 'rows') or 0, 'stored value')} with the tenant's data key"
        f" and re-wrapped {_n(_get(e.after, 'keys') or 0, 'data key')} with the newest master key"),
    A.TENANT_KEY_DESTROY: lambda e, t: (
        f"destroyed {_n(len(_get(e.after, 'key_ids') or []), 'data key')} of {t}: everything "
        f"stored under them is erased (crypto-shredding)"),
    A.RECEIPT_REVEAL: _reveal("receipt"),
    A.EVIDENCE_REVEAL: _reveal("reconciliation evidence"),
    A.LEASE_ACQUIRE: _lease,
    A.LEASE_REVOKE: _lease_revoked,
    A.LEASE_RELEASE: _lease_released,
    A.RETRY_REQUEST: lambda e, t: f"requested a retry of the run{_run_state(e, t)}",
    A.RETRY_APPROVE: _retry_decision("approved"),
    A.RETRY_REJECT: _retry_decision("rejected"),
    A.RETRY_WITHDRAW: lambda e, t: f"withdrew {t}{_run_state(e, t)}",
    A.BULK_SUBMIT: lambda e, t: (
        f"asked for {str(_get(e.after, 'action') or 'an action').replace('_', ' ')} on "
        f"{_n(_get(e.after, 'runs') or 0, 'run')} at once (bulk {str(e.target_ref)[:8]})"),
    A.BULK_FINISH: lambda e, t: (
        f"finished bulk {str(e.target_ref)[:8]}: {_get(e.after, 'done') or 0} done, "
        f"{_get(e.after, 'refused') or 0} refused, {_get(e.after, 'failed') or 0} failed"),
    A.BULK_ABORT: lambda e, t: (
        f"aborted bulk {str(e.target_ref)[:8]} while "
        f"{str(_get(e.before, 'state') or 'open').replace('_', ' ')} (the runs done stay "
        "done)"),
    A.BULK_FAIL: lambda e, t: (
        f"gave up bulk {_short(e.target_ref)} after "
        f"{sum(_count(e.after, k) for k in ('done', 'refused', 'failed'))} of "
        f"{_n(_count(e.after, 'total'), 'run')} ({_count(e.after, 'done')} done, "
        f"{_count(e.after, 'refused')} refused, {_count(e.after, 'failed')} failed)"),
    A.RETRY_CONSUME: lambda e, t: (
        f"resumed the run with approved {t}"
        + (f" (fencing token {_get(e.after, 'fencing_token')})"
           if _get(e.after, "fencing_token") is not None else "")),
    A.EFFECT_MARK_UNKNOWN: lambda e, t: f"marked {t} outcome unknown",
    A.EFFECT_UNRESOLVED: lambda e, t: (f"moved {t} {_move(e.before, e.after, 'state')}"
                                       " (its run went quiet after sending it)"),
    A.EFFECT_RECONCILE: _reconciled,
    A.RUN_RECONCILE: _reconcile_run,
    A.RUN_AMBIGUOUS: lambda e, t: f"moved {t} {_move(e.before, e.after, 'recovery_state')}",
    A.RUN_CLOSE: lambda e, t: f"closed {t}{_run_state(e, t)}",
    A.CONFLICTS_ACKNOWLEDGE: lambda e, t: (
        f"acknowledged {_n(_get(e.before, 'open_conflicts') or 0, 'conflict')} of {t}"
        f"{_run_state(e, t)}"),
    A.RECONCILE_GAVE_UP: lambda e, t: (
        f"gave up reconciling {t} after {_n(_get(e.after, 'attempts') or '?', 'look-up')};"
        " a human decides"),
    A.RECONCILE_MOVED_ON: lambda e, t: (
        f"dropped a reconciliation of {t}: it had moved on to "
        f"{_words(_get(e.after, 'state')) or 'another state'}"),
    A.AUDIT_EXPORT_HEAD: lambda e, t: f"exported the audit chain head of {t}",
    A.LANGGRAPH_WRITES: _lg_writes,
    A.LANGGRAPH_THREAD_DELETE: _lg_delete,
    A.LANGGRAPH_THREAD_COPY: _lg_copy,
    A.LANGGRAPH_THREAD_PRUNE: _lg_prune,
    A.LANGGRAPH_RUNS_DELETE: _lg_runs_delete,
    A.CHECKPOINT_IMPORT: _imported,
    A.CHECKPOINT_MIGRATE: _migrated,
    A.KIND_DECLARE: lambda e, t: (f"replaced the declaration of {_declared(e, t)}"
                                  if e.before else f"declared {_declared(e, t)}"),
    A.MIGRATION_SUBMIT: lambda e, t: (
        f"asked to migrate {_get(e.after, 'kind') or 'a kind'}"
        + (f"'s checkpoints of {_n(_get(e.after, 'runs'), 'run')}"
           if _get(e.after, "runs") is not None else "'s checkpoints")
        + (f" back to v{_get(e.after, 'to_version')}" if _get(e.after, "reverse")
           else f" to v{_get(e.after, 'to_version')}")
        + f" (job {_short(e.target_ref)})"),
    A.MIGRATION_FAIL: lambda e, t: (
        f"gave up migration job {_short(e.target_ref)}"
        + (f" ({_get(e.after, 'kind')} to v{_get(e.after, 'to_version')})"
           if _get(e.after, "kind") and _get(e.after, "to_version") is not None else "")
        + f" with {_n(_count(e.after, 'migrated'), 'checkpoint')} migrated, "
          f"{_count(e.after, 'skipped')} skipped, {_count(e.after, 'refused')} refused, "
          f"{_count(e.after, 'conflict')} in conflict"),
    A.EFFECT_IMPORT: _imported,
    A.RUNIFOLD_EXPORT: _exported,
    # Legal holds and erasure (issue 20): services.holds, services.erasure.
    A.LEGAL_HOLD_PLACE: lambda e, t: f"placed {t} on {_held_what(e)}",
    A.LEGAL_HOLD_RELEASE: lambda e, t: f"released {t}",
    A.ERASURE_REQUEST: lambda e, t: f"asked to erase the payloads of {_held_what(e)} ({t})",
    A.ERASURE_APPROVE: lambda e, t: f"approved {t}",
    A.ERASURE_REJECT: lambda e, t: f"rejected {t}",
    A.ERASURE_EXECUTE: lambda e, t: (f"executed {t}: "
                                     f"{_erasure_counts(_get(e.after, 'counts'))}"),
    A.RUN_ERASE: _erased_run,
    # Tombstone governance (issue 20, item 5): the audit export and the four-eyes purge.
    A.AUDIT_EXPORT: lambda e, t: (
        f"exported the audit of {t} "
        + (f"through tree size {_get(e.after, 'through_tree_size')} (events up to seq "
           f"{_get(e.after, 'through_seq') or 0})" if _get(e.after, "through_tree_size")
           else f"through event {_get(e.after, 'through_seq') or 0}")
        + f" with {_n(_get(e.after, 'tombstones') or 0, 'tombstone')}"
        + ("" if _get(e.after, "watermark_moved") is not False
           else " (not past an earlier export: watermark not moved)")),
    A.TOMBSTONE_PURGE_PREPARE: lambda e, t: (
        f"prepared {t} of {_n(_get(e.after, 'tombstones') or 0, 'tombstone')}"),
    A.TOMBSTONE_PURGE_APPROVE: lambda e, t: f"approved {t}",
    A.TOMBSTONE_PURGE_REJECT: lambda e, t: f"rejected {t}",
    A.TOMBSTONE_PURGE_EXECUTE: lambda e, t: (
        f"executed {t}: deleted {_n(_get(e.after, 'tombstones') or 0, 'tombstone')}"),
    # Notifications (issue 21; services.notify_endpoints, services.notify_delivery).
    A.NOTIFICATION_ENDPOINT_CREATE: lambda e, t: (
        f"added {_words(_get(e.after, 'channel')) or 'a'} notification endpoint "
        f"{_get(e.after, 'name') or _short(e.target_ref)!r}"
        + (f" to {_get(e.after, 'destination')}" if _get(e.after, "destination") else "")),
    A.NOTIFICATION_ENDPOINT_UPDATE: lambda e, t: (
        f"changed {', '.join(sorted(_words(k) for k in (e.after or {}))) or 'nothing'} of {t}"),
    A.NOTIFICATION_ENDPOINT_DELETE: lambda e, t: (
        f"deleted notification endpoint {_get(e.before, 'name') or _short(e.target_ref)!r}"),
    A.NOTIFICATION_ENDPOINT_ROTATE: lambda e, t: (
        f"rotated the signing secret of {t}; the previous one signs until "
        f"{_get(e.after, 'previous_valid_until') or 'a day later'}"),
    A.NOTIFICATION_ENDPOINT_DISABLE: lambda e, t: (
        f"disabled {t}" + (f": {e.reason}" if e.reason else "")
        + (f" ({_n(_get(e.after, 'failed_messages'), 'waiting message')} failed)"
           if _get(e.after, "failed_messages") else "")),
    A.NOTIFICATION_TEST: lambda e, t: (
        f"sent a test event to {t}"
        + (f" (event {_event(_get(e.after, 'event_id'))})" if _get(e.after, "event_id")
           else "")),
    A.NOTIFICATION_RESEND: lambda e, t: (
        f"sent notification {_event(e.target_ref)} again with the same event id"
        + (f" (it was {_words(_get(e.before, 'state'))})" if _get(e.before, "state") else "")),
    # The data lifecycle (issue 20; services.retention, services.lifecycle).
    A.DATA_POLICY_SET: _policy_set,
    A.RUN_PURGE: lambda e, t: (
        f"deleted the payloads of {t} by retention "
        f"({_days(_get(_get(e.after, 'policy'), 'payload_retention_days'))}; "
        f"tombstone #{_get(e.after, 'tombstone')})"),
    A.RUN_EXPIRE: lambda e, t: (
        f"expired {t}: its {_n(_get(_get(e.after, 'counts'), 'effects') or 0, 'effect record')} "
        "and the run left once their idempotency window passed"),
}


def sentence(event, names: Names | None = None) -> str:
    """``"<actor> <what happened>[: <reason>]"`` for one ``AuditEvent`` (or any object
    with its fields: ``actor_name``, ``action``, ``target_type``, ``target_ref``,
    ``reason``, ``before``, ``after``). ``names`` maps target refs to readable names
    (``target_name``). Never raises on an odd event: it falls back to the action word."""
    target = target_name(event, names)
    say = SENTENCES.get(event.action)
    try:
        what = say(event, target) if say else f"did {event.action} on {target}"
    except (TypeError, ValueError, KeyError, AttributeError):
        what = f"did {event.action} on {target}"
    reason = (event.reason or "").strip()
    actor = event.actor_name or "system"
    return f"{actor} {what}: {reason}" if reason else f"{actor} {what}"


def names_from_events(events) -> dict[str, str]:
    """``{effect uuid: "operation_key at service"}`` from the effect writes among
    ``events`` (their ``after`` names both), so a page's other events about the same
    effect read with its name, without a query."""
    names: dict[str, str] = {}
    for e in events:
        key, service = _get(e.after, "operation_key"), _get(e.after, "service")
        if e.target_type == TargetType.EFFECT and key and service:
            names.setdefault(str(e.target_ref), f"{key} at {service}")
    return names
