"""runifold in and out (issue 10, item 4): JSON Lines of runifold checkpoint envelopes
and effect records, in runifold's own shapes (RUNIFOLD.md 1-4), imported into one
tenant and exported back. The format, the mapping and the rules are written up in
``docs/runifold.md``; in short:

- **A line says what it is by its shape.** An object with ``kind`` and ``payload`` is a
  checkpoint envelope (``runifold.agent`` v1, ``runifold.workflow`` v3/v4, checked by
  ``parse_envelope`` and the kind registry like an API write, except that a payload the
  registry refuses is an error here instead of a ``schema_mismatch`` run: a file is
  checked before it lands, and its operator is there to read the answer). An object with
  ``request`` and ``status`` is an effect record (``EffectRecord``, RUNIFOLD.md 4), which
  may carry one extra top-level field, ``run_id``. Anything else is an error.
- **Effects.** runifold keeps no run id on an effect: a line without ``run_id`` takes the
  run of the checkpoint its agent idempotency key names
  (``{execution_id}:agent:...``, the execution id being a checkpoint id known in the
  tenant, earlier in the file or already stored), else it is an error naming ``run_id``.
  Statuses map prepared -> ``planned``, started -> ``unresolved`` (in doubt, see below),
  completed -> ``confirmed`` (receipt: the output), failed -> ``failed`` (receipt: the
  ``RunError``). ``service`` is ``<kind>:<capability_id>`` and ``operation_key`` the
  idempotency key (else the effect id), so (service, operation_key) is unique exactly
  where runifold's (capability_id, idempotency_key) is. The request itself, in
  canonical JSON, is kept encrypted in ``request_ciphertext``; ``request_fingerprint`` is
  its SHA-256. That is what export needs to write the record back.
- **Why started -> unresolved and not submitted.** ``submitted`` means "an owner sent it
  and may still be waiting for the answer"; nobody in this store ever will: the process
  that wrote the record wrote it to runifold's store, not here. runifold itself treats
  ``started`` as ambiguous on every load (reconcile first, RUNIFOLD.md 4), which is what
  ``unresolved`` means here (CONTRACT.md 3: "submitted -> unresolved: runtime on
  restart"; an import is such a restart). So the run is ``ambiguous`` at once and
  reconciliation may be asked for it, instead of looking healthy for the tenant's
  ambiguity threshold. ``submitted_at`` is the import's database time (the settle delay
  counts from the latest moment the call could have been sent).
- **Revisions.** A checkpoint or effect not in the store is created at the line's
  revision (``checkpoint.import``/``effect.import``, one audit event per line written).
  One that is advances only by the exact next revision. A line whose (id, revision) is
  stored with identical content is skipped and counted; different content is an error
  (a conflict, never overwritten); a revision further ahead is an error (a gap), and
  one older than the first stored revision too. Fencing holds: a run that has had an
  owner here (a lease, a fencing token) is not written by an import, which carries no
  token.
- **Batches.** Lines are read one at a time and written ``batch_size`` at a time, each
  batch in one transaction: the rights check, the run locks (in id order), the writes,
  the runs' recovery state (``runs.run_save_many``) and one audit event per written line
  (``audit.audit_record_many``). A bad line is reported and left out; the rest of its
  batch is written. If the database refuses a batch (another writer took an id or a key
  meanwhile), the batch is rolled back and written again one line per transaction, so
  the refusal lands on its own line. Memory holds one batch, never the file.
- **Export** writes the latest revision of every runifold checkpoint (or, with
  ``history``, every stored revision after the checkpoint's last unsupported one, oldest
  first: no gap, and the left-out revisions counted), then every effect that carries a
  runifold request, rendered back (``planned`` -> prepared at revision 0, started after
  it: runifold has no re-plan, see ``runifold_status``; ``submitted``, ``unresolved``,
  ``unknown``, ``not_executed`` -> started: still in doubt for runifold, which fails
  closed; ``confirmed`` -> completed; ``failed`` -> failed). An effect line
  gets ``run_id`` only when its key would not lead an import back to its run. Each page is
  read, decrypted and audited (``runifold.export``) in one transaction and written out
  after it commits. What export writes, import accepts; re-importing it into the same
  tenant skips every line.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce

from .. import crypto, intranges, kinds, locks, policy, roles, writepath
from ..audit import audit_record, audit_record_many
from ..dbclock import db_now
from ..exceptions import Forbidden, InvalidPayload, NotFound
from ..jsonparse import dumps, loads_any, loads_object, printable
from ..models import (
    Checkpoint,
    CheckpointRevision,
    Effect,
    EffectRevision,
    Run,
    Tenant,
)
from ..permissions import require, tenant_perms
from ..vocab import (
    AuditAction,
    EffectClass,
    EffectSource,
    EffectState,
    PhaseClass,
    TargetType,
)
from .checkpoints import Envelope, parse_envelope
from .common import _actor_name, _uuid_field
from .runs import run_save_many

# --------------------------------------------------------------------------------------
# runifold's words (RUNIFOLD.md 0, 4): its own vocabulary, not ours
# --------------------------------------------------------------------------------------

#: The checkpoint kinds a runifold file holds (RUNIFOLD.md 1).
KINDS = ("runifold.agent", "runifold.workflow")

#: ``EffectStatus`` tags (RUNIFOLD.md 4).
PREPARED, STARTED, COMPLETED, FAILED = "prepared", "started", "completed", "failed"
#: runifold's moves of one effect record (RUNIFOLD.md 4: prepared(0) -> started ->
#: completed | failed; an allowed retry writes started -> started).
MOVES = frozenset({(PREPARED, STARTED), (STARTED, STARTED), (STARTED, COMPLETED),
                   (STARTED, FAILED)})
#: The least revision a record in each status can have (prepared is always revision 0).
LEAST_REVISION = {PREPARED: 0, STARTED: 1, COMPLETED: 2, FAILED: 2}

#: runifold status -> ours (CONTRACT.md 3 effects). started is in doubt: module doc.
STATE_IN = {PREPARED: EffectState.PLANNED, STARTED: EffectState.UNRESOLVED,
            COMPLETED: EffectState.CONFIRMED, FAILED: EffectState.FAILED}
#: ours -> runifold status, for export. Every state still in doubt, and ``not_executed``
#: (sent again only through an approved retry here), is ``started``: runifold reconciles
#: or refuses it, never sends it again on its own. ``planned`` is ``prepared`` only at
#: revision 0; a re-planned effect is ``started`` (``runifold_status``).
STATE_OUT = {EffectState.PLANNED: PREPARED, EffectState.SUBMITTED: STARTED,
             EffectState.UNRESOLVED: STARTED, EffectState.UNKNOWN: STARTED,
             EffectState.NOT_EXECUTED: STARTED, EffectState.CONFIRMED: COMPLETED,
             EffectState.FAILED: FAILED}
#: The states an import may move an effect out of: the ones an import writes itself, and
#: ``submitted`` (a runtime's own; runifold's next record settles it). Not the answers of
#: reconciliation or a reviewer (``unknown``, ``not_executed``, ``confirmed``, ...).
IMPORT_MAY_MOVE = frozenset({EffectState.PLANNED, EffectState.SUBMITTED,
                             EffectState.UNRESOLVED})

#: ``EffectKind`` unit variants (RUNIFOLD.md 4); ``{"Extension": name}`` besides.
EFFECT_KINDS = ("Model", "Tool", "Agent", "Approval", "Wait")
#: ``EffectClass`` -> ours. Pure and ReadOnly change nothing; IdempotentWrite is
#: ``idempotent`` only with an idempotency key (runifold retries it only then, and a
#: replay needs the key); Destructive and Unknown fail closed.
EFFECT_CLASSES = {"Pure": EffectClass.READ_ONLY, "ReadOnly": EffectClass.READ_ONLY,
                  "IdempotentWrite": EffectClass.IDEMPOTENT,
                  "NonIdempotentWrite": EffectClass.NON_IDEMPOTENT,
                  "Destructive": EffectClass.NON_IDEMPOTENT,
                  "Unknown": EffectClass.NON_IDEMPOTENT}
RETRY_SAFETY = ("Safe", "RequiresIdempotency", "UnsafeAfterVisibleOutput",
                "UnsafeAfterSideEffect", "Unknown")
RUN_ERROR_KINDS = ("InvalidInput", "CapabilityDenied", "BudgetExceeded", "DeadlineExceeded",
                   "Cancelled", "Transport", "Protocol", "Invocation")
REQUEST_FIELDS = ("effect_id", "invocation_id", "kind", "capability_id", "input",
                  "effect_class", "idempotency_key")
#: A completed record's output is the effect's receipt; a receipt is a JSON object, so
#: any other output (and an object whose only key is this one) is kept as
#: ``{"runifold_output": output}`` and unwrapped on export.
OUTPUT_KEY = "runifold_output"
AGENT_KEY = ":agent:"

DEFAULT_BATCH = 500


def _max_line_bytes() -> int:
    """A line is a body: at most ``RECOVERY_MAX_BODY_BYTES`` (CONTRACT.md 6, 1 MiB)."""
    return settings.RECOVERY_MAX_BODY_BYTES


# --------------------------------------------------------------------------------------
# Reading lines
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RawLine:
    """One physical line of a JSON Lines file: its 1-based number, its bytes (``None``
    when it was longer than the limit: only its length was read), and how many bytes of
    the file it took (for a progress bar)."""

    number: int
    data: bytes | None
    size: int


def jsonl_lines(stream: IO[bytes], max_bytes: int | None = None) -> Iterator[RawLine]:
    """The lines of a binary ``stream``, one at a time. The limit ``max_bytes`` (default
    ``RECOVERY_MAX_BODY_BYTES``) applies to a line without its line ending (``\\n`` or
    ``\\r\\n``), so a CRLF line reads as its LF twin (issue 10 hostile findings). Each
    line is read with at most ``max_bytes`` + 2 bytes in memory: a longer line is consumed
    in 1 MiB pieces and handed over as ``data=None``. So memory stays bounded by the
    limit, whatever the file holds. ``data`` keeps the line ending (``parse_line`` strips
    it); ``size`` counts every byte, ending included."""
    limit = max_bytes or _max_line_bytes()
    number = 0
    while True:
        # limit + 2: room for a line of exactly the limit and its "\r\n".
        data = stream.readline(limit + 2)
        if not data:
            return
        number += 1
        size = len(data)
        ended = data.endswith(b"\n")
        content = len(data) - (2 if data.endswith(b"\r\n") else 1 if ended else 0)
        if content > limit:
            while not ended:
                rest = stream.readline(1 << 20)
                size += len(rest)
                ended = not rest or rest.endswith(b"\n")
            yield RawLine(number, None, size)
            continue
        yield RawLine(number, data, size)


# --------------------------------------------------------------------------------------
# Parsing one line (no database)
# --------------------------------------------------------------------------------------

@dataclass
class CheckpointLine:
    """A checkpoint envelope line, checked: the envelope, its classification, and its
    payload encrypted (``payload_ciphertext``), ready to write."""

    number: int
    envelope: Envelope
    cls: kinds.Classification
    phase_label: str
    ciphertext: str
    size: int

    @property
    def content(self) -> tuple:
        """What "identical" compares: everything of the envelope but id and revision."""
        e = self.envelope
        return (e.run_id, e.kind, e.schema_version, e.updated_at_ms, e.payload_json)


@dataclass
class EffectLine:
    """An effect record line, checked and mapped onto an effect of ours."""

    number: int
    effect_id: uuid.UUID
    revision: int
    run_id: uuid.UUID | None  # the extra top-level field, if given
    execution_id: uuid.UUID | None  # from an agent idempotency key
    request_json: str  # canonical JSON of ``request``
    request_ciphertext: str
    fingerprint: str
    service: str
    operation_key: str
    effect_class: str
    status: str  # runifold's
    status_json: str  # canonical JSON of ``status``
    state: str  # ours
    receipt_ciphertext: str

    @property
    def content(self) -> tuple:
        return (self.request_json, self.status_json)


class LineError(Exception):
    """One line's problem: ``detail`` names the field and the rule (``payload: ...``)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def parse_line(raw: bytes, number: int = 0) -> CheckpointLine | EffectLine | None:
    """Check one line of a runifold file (module doc), without the database. Returns
    ``None`` for a blank line (skipped, not counted). Raises ``LineError`` naming the
    field: the strict JSON rules of ``jsonparse`` (duplicate keys, NaN, U+0000, unpaired
    surrogates, depth), then those of the envelope (``parse_envelope`` and the kind
    registry) or of the effect record (RUNIFOLD.md 4)."""
    if not raw.strip():
        return None
    try:
        body = loads_object(raw.strip(), what="record")
        if "kind" in body and "payload" in body:
            if "request" in body or "status" in body:
                raise InvalidPayload("record: has both an envelope's kind and payload and an "
                                     "effect record's request and status")
            return _parse_checkpoint(body, number)
        if "request" in body and "status" in body:
            return _parse_effect(body, number)
        raise InvalidPayload("record: neither a checkpoint envelope (kind and payload) nor an "
                             "effect record (request and status)")
    except InvalidPayload as exc:
        raise LineError(exc.detail) from None


def _parse_checkpoint(body: dict, number: int) -> CheckpointLine:
    envelope = parse_envelope(body, url_id=_uuid_field(body, "id"))
    if envelope.kind not in KINDS:
        raise InvalidPayload(f"kind: must be {' or '.join(KINDS)} (a runifold checkpoint)")
    cls = kinds.classify(envelope.kind, envelope.schema_version, envelope.payload)
    if not cls.supported:
        supported = kinds.registered().get(envelope.kind, [])
        if envelope.schema_version not in supported:
            raise InvalidPayload(f"schema_version: {envelope.kind} v{envelope.schema_version} "
                                 f"is not supported (supported: "
                                 f"{', '.join(str(v) for v in supported)})")
        raise InvalidPayload("payload: " + cls.error.removeprefix("payload "))
    data = envelope.payload_json.encode("utf-8")
    return CheckpointLine(number, envelope, cls, cls.phase.label[:256],
                          crypto.encrypt_text(envelope.payload_json), len(data))


def _only(obj: dict, allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise InvalidPayload(f"{where}{printable(unknown[0])}: unknown field")


def _effect_kind_word(kind: Any) -> str:
    """``"tool"`` for ``"Tool"``, the extension's own name for ``{"Extension": name}``;
    raises ``InvalidPayload`` for anything else."""
    if isinstance(kind, str) and kind in EFFECT_KINDS:
        return kind.lower()
    if isinstance(kind, dict) and set(kind) == {"Extension"}:
        name = kind["Extension"]
        if isinstance(name, str) and name:
            return name
    raise InvalidPayload(f"request.kind: must be one of {', '.join(EFFECT_KINDS)} or "
                         '{"Extension": name}')


def _request(request: Any) -> tuple[str, str, str, str]:
    """Check an ``EffectRequest`` (RUNIFOLD.md 4); returns (effect id, service,
    operation key, effect class). Raises ``InvalidPayload`` naming the field."""
    if not isinstance(request, dict):
        raise InvalidPayload("request: must be an object (EffectRequest)")
    _only(request, REQUEST_FIELDS, "request.")
    ids = {}
    for key in ("effect_id", "invocation_id", "capability_id"):
        try:
            ids[key] = _uuid_field(request, key)
        except InvalidPayload as exc:
            raise InvalidPayload("request." + exc.detail) from None
    if "input" not in request:
        raise InvalidPayload("request.input: required")
    word = _effect_kind_word(request.get("kind"))
    service = f"{word}:{ids['capability_id']}"
    limit = Effect._meta.get_field("service").max_length
    if len(service) > limit:
        raise InvalidPayload(f"request.kind: the extension name makes the service "
                             f"{word[:40]}...:<capability_id> longer than {limit} characters")
    effect_class = request.get("effect_class")
    if effect_class not in EFFECT_CLASSES:
        raise InvalidPayload(f"request.effect_class: must be one of {', '.join(EFFECT_CLASSES)}")
    key = request.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidPayload("request.idempotency_key: must be a non-empty string or null")
    limit = Effect._meta.get_field("operation_key").max_length
    if key is not None and len(key) > limit:
        raise InvalidPayload(f"request.idempotency_key: at most {limit} characters (the "
                             f"store's operation_key)")
    ours = EFFECT_CLASSES[effect_class]
    if ours == EffectClass.IDEMPOTENT and key is None:
        ours = EffectClass.NON_IDEMPOTENT  # nothing to replay it safely by
    return str(ids["effect_id"]), service, key if key is not None else str(ids["effect_id"]), ours


def _run_error(error: Any) -> str:
    """Why ``error`` is not a runifold ``RunError`` ({kind, message, retry_safety,
    metadata}), or ""."""
    if not isinstance(error, dict):
        return "must be an object (RunError)"
    if set(error) != {"kind", "message", "retry_safety", "metadata"}:
        return "must have exactly kind, message, retry_safety and metadata (RunError)"
    kind = error["kind"]
    if not (kind in RUN_ERROR_KINDS or (isinstance(kind, dict) and set(kind) == {"Extension"}
                                        and isinstance(kind["Extension"], str))):
        return f"kind must be one of {', '.join(RUN_ERROR_KINDS)} or {{\"Extension\": name}}"
    if not isinstance(error["message"], str):
        return "message must be a string"
    if error["retry_safety"] not in RETRY_SAFETY:
        return f"retry_safety must be one of {', '.join(RETRY_SAFETY)}"
    if not isinstance(error["metadata"], dict):
        return "metadata must be an object"
    return ""


def _status(status: Any, revision: int) -> tuple[str, Any]:
    """Check an ``EffectStatus``; returns (runifold state, output or error or None)."""
    if not isinstance(status, dict):
        raise InvalidPayload("status: must be an object (EffectStatus)")
    state = status.get("state")
    if state not in STATE_IN:
        raise InvalidPayload(f"status.state: must be one of {', '.join(STATE_IN)}")
    value: Any = None
    if state == COMPLETED:
        _only(status, ("state", "output"), "status.")
        if "output" not in status:
            raise InvalidPayload("status.output: required when completed")
        value = status["output"]
    elif state == FAILED:
        _only(status, ("state", "error"), "status.")
        if "error" not in status:
            raise InvalidPayload("status.error: required when failed")
        problem = _run_error(status["error"])
        if problem:
            raise InvalidPayload(f"status.error: {problem}")
        value = status["error"]
    else:
        _only(status, ("state",), "status.")
    if state == PREPARED and revision != 0:
        raise InvalidPayload("revision: a prepared record is revision 0 (runifold writes "
                             "started at the next revision)")
    if revision < LEAST_REVISION[state]:
        raise InvalidPayload(f"status.state: a {state} record is at least revision "
                             f"{LEAST_REVISION[state]} (runifold writes prepared at revision "
                             f"0, then started, then completed or failed)")
    return state, value


def _wrap(output: Any) -> dict:
    if isinstance(output, dict) and set(output) != {OUTPUT_KEY}:
        return output
    return {OUTPUT_KEY: output}


def _unwrap(receipt: Any) -> Any:
    if isinstance(receipt, dict) and set(receipt) == {OUTPUT_KEY}:
        return receipt[OUTPUT_KEY]
    return receipt


def execution_id(key: str | None) -> uuid.UUID | None:
    """The execution id an agent idempotency key starts with
    (``{execution_id}:agent:{agent}:turn:{n}:call:{i}``, RUNIFOLD.md 4), or ``None``."""
    if not key or AGENT_KEY not in key:
        return None
    head = key.split(AGENT_KEY, 1)[0]
    try:
        return uuid.UUID(head)
    except ValueError:
        return None


def _parse_effect(body: dict, number: int) -> EffectLine:
    _only(body, ("revision", "request", "status", "run_id"), "")
    revision = intranges.REVISION.check(body.get("revision"), "revision")
    run_id = _uuid_field(body, "run_id") if "run_id" in body else None
    effect_id, service, operation_key, effect_class = _request(body["request"])
    state, value = _status(body["status"], revision)
    request_json = dumps(body["request"])
    receipt = None
    if state == COMPLETED:
        receipt = _wrap(value)
    elif state == FAILED:
        receipt = value
    return EffectLine(
        number=number, effect_id=uuid.UUID(effect_id), revision=revision, run_id=run_id,
        execution_id=execution_id(body["request"].get("idempotency_key")),
        request_json=request_json, request_ciphertext=crypto.encrypt_text(request_json),
        fingerprint=hashlib.sha256(request_json.encode("utf-8")).hexdigest(),
        service=service, operation_key=operation_key, effect_class=effect_class,
        status=state, status_json=dumps(body["status"]), state=STATE_IN[state],
        receipt_ciphertext=crypto.encrypt_text(dumps(receipt)) if receipt is not None else "",
    )


def runifold_status(state: str, revision: int) -> str:
    """The runifold status tag of an effect of ours in ``state`` at ``revision``:
    ``STATE_OUT``, except that ``planned`` after revision 0 is ``started``.

    runifold has no re-plan: ``prepared`` is only ever revision 0 (RUNIFOLD.md 4), and its
    store keeps one record per effect, so an attempt it made stays ``started`` until
    something settles it. An effect ``planned`` again here (an approved retry, CONTRACT.md
    3) is, to runifold, that record: still in doubt, which its executor reconciles or
    refuses but never sends again on its own (the retry was approved here, not there).
    Writing it as ``prepared`` at revision 3 would be a record runifold never holds, which
    the import refuses, and which an executor would send again without asking (issue 10
    hostile findings)."""
    if state == EffectState.PLANNED and revision > 0:
        return STARTED
    return STATE_OUT[state]


def status_out(state: str, receipt: Any, revision: int) -> dict:
    """The runifold ``EffectStatus`` of an effect of ours in ``state`` with ``receipt``
    at ``revision`` (``runifold_status``). A ``failed`` effect whose receipt is not a
    ``RunError`` (a reconciler's answer) gets one that says so and carries the
    receipt."""
    theirs = runifold_status(state, revision)
    if theirs == COMPLETED:
        return {"state": COMPLETED, "output": _unwrap(receipt)}
    if theirs == FAILED:
        if _run_error(receipt):
            receipt = {"kind": {"Extension": "recovery.failed"},
                       "message": "failed, as recorded by the recovery service",
                       "retry_safety": "Unknown",
                       "metadata": {} if receipt is None else {"receipt": receipt}}
        return {"state": FAILED, "error": receipt}
    return {"state": theirs}


# --------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------

@dataclass
class ImportReport:
    """What an import did: lines ``imported`` (written), ``skipped`` (already stored,
    identical), ``failed`` (each reported once through ``on_error``); ``lines`` is how
    many non-blank lines were read."""

    lines: int = 0
    imported: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass
class _Checkpoint:
    """A checkpoint as one batch sees it: stored (``pk``) or created by the batch."""

    pk: int | None
    run_uuid: uuid.UUID
    kind: str
    revision: int
    start: int | None  # the stored revision before the batch; None: new in this batch
    ciphertext: str = ""  # of the stored current revision (not decrypted unless needed)
    stored: tuple | None = None  # content of the stored current revision (once decrypted)
    meta: tuple = ()  # stored (kind, schema_version, updated_at_ms) of the current revision
    written: list[CheckpointLine] = field(default_factory=list)


@dataclass
class _Effect:
    pk: int | None
    run_uuid: uuid.UUID
    revision: int
    state: str
    start: int | None
    start_state: str = ""
    receipt_ciphertext: str = ""
    request_ciphertext: str = ""
    request_json: str | None = None  # decrypted lazily
    attempt: int = 1
    written: list[EffectLine] = field(default_factory=list)


class _Redo(Exception):
    """The batch met a row another writer changed meanwhile: roll it back, write its
    lines again one per transaction."""


def runifold_import(*, actor, tenant: Tenant, lines: Iterable[RawLine],
                    batch_size: int = DEFAULT_BATCH,
                    on_error: Callable[[int, str], None] | None = None,
                    on_progress: Callable[[int], None] | None = None) -> ImportReport:
    """Import a runifold JSON Lines file into ``tenant`` (issue 10, item 4; module doc
    and ``docs/runifold.md``). ``lines`` comes from ``jsonl_lines``; it is read once,
    ``batch_size`` lines at a time (1..10000).

    ``actor`` needs ``write_runs`` in the tenant, or is ``None`` for the operator's
    command line (audited as ``system``). Each bad line is reported once, as
    ``on_error(line number, "field: rule")``, and left out; the others are written.
    ``on_progress(bytes)`` is called after each batch with the bytes it read. Returns the
    counts. Raises ``NotFound``/``Forbidden`` for an actor without the right,
    ``InvalidPayload`` for a bad ``batch_size``; a database outage is raised as is (the
    batches before it are committed; importing the file again skips them).
    """
    if actor is not None:
        require(actor, tenant, roles.WRITE)
    if type(batch_size) is not int or not 1 <= batch_size <= 10_000:
        raise InvalidPayload("batch_size: must be an integer in 1..10000")
    report = ImportReport()
    batch: list[CheckpointLine | EffectLine] = []
    errors: list[tuple[int, str]] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if batch:
            _import_lines(actor, tenant, batch, report, errors)
        for number, detail in sorted(errors):
            report.failed += 1
            if on_error is not None:
                on_error(number, detail)
        if on_progress is not None and size:
            on_progress(size)
        batch.clear()
        errors.clear()
        size = 0

    for raw in lines:
        size += raw.size
        try:
            if raw.data is None:
                raise LineError(f"record: longer than {_max_line_bytes()} bytes "
                                "(RECOVERY_MAX_BODY_BYTES)")
            parsed = parse_line(raw.data, raw.number)
        except LineError as exc:
            report.lines += 1
            errors.append((raw.number, exc.detail))
            parsed = None
        if parsed is not None:
            report.lines += 1
            batch.append(parsed)
        if len(batch) >= batch_size or len(errors) >= batch_size:
            flush()
    flush()
    return report


def _import_lines(actor, tenant, batch, report: ImportReport, errors: list) -> None:
    """Write ``batch`` in one transaction; if the database refuses it, write its lines
    again one per transaction, so that each refusal is its own line's error."""
    try:
        imported, skipped, bad = _import_batch(actor, tenant, batch)
    except (IntegrityError, _Redo):
        if len(batch) == 1:
            errors.append((batch[0].number, "id: another writer wrote this id or key while "
                                            "the import ran; import the file again to "
                                            "compare"))
            return
        for line in batch:
            _import_lines(actor, tenant, [line], report, errors)
        return
    report.imported += imported
    report.skipped += skipped
    errors.extend(bad)


def _import_batch(actor, tenant: Tenant, batch) -> tuple[int, int, list[tuple[int, str]]]:
    """One transaction for ``batch`` (module doc): returns (written, skipped, errors).
    Raises ``IntegrityError``/``_Redo`` when another writer got in the way (rolled
    back)."""
    cp_lines = [x for x in batch if isinstance(x, CheckpointLine)]
    ef_lines = [x for x in batch if isinstance(x, EffectLine)]
    with transaction.atomic():
        now = db_now()
        # 1. Which runs the batch may touch. A checkpoint's or an effect's run never
        # changes, so this is read before any lock.
        cp_ids = {x.envelope.checkpoint_id for x in cp_lines} | {
            x.execution_id for x in ef_lines if x.execution_id is not None}
        ef_ids = {x.effect_id for x in ef_lines}
        cp_runs = dict(Checkpoint.objects.for_tenant(tenant).filter(uuid__in=cp_ids)
                       .values_list("uuid", "run__uuid")) if cp_ids else {}
        ef_runs = dict(Effect.objects.for_tenant(tenant).filter(uuid__in=ef_ids)
                       .values_list("uuid", "run__uuid")) if ef_ids else {}
        candidates = ({x.envelope.run_id for x in cp_lines} | set(cp_runs.values())
                      | set(ef_runs.values()) | {x.run_id for x in ef_lines if x.run_id})
        # 2. Lock them (the store's lock order, ``locks.lock_runs``: the tenant's audit
        # head, then the runs in ascending id),
        # then read what the batch needs under the locks.
        runs = _lock_runs(tenant, candidates)
        checkpoints = _stored_checkpoints(tenant, cp_ids)
        effects = _stored_effects(tenant, ef_ids)
        keys = _stored_keys(tenant, ef_lines)
        # 3. Decide each line, in file order, against the store and the lines before it.
        ops: list[CheckpointLine | EffectLine] = []
        errors: list[tuple[int, str]] = []
        skipped = 0
        for line in batch:
            try:
                if isinstance(line, CheckpointLine):
                    write = _decide_checkpoint(tenant, line, checkpoints, runs, now)
                else:
                    write = _decide_effect(tenant, line, effects, checkpoints, keys, runs,
                                           now)
            except LineError as exc:
                errors.append((line.number, exc.detail))
                continue
            if write:
                ops.append(line)
            else:
                skipped += 1
        if not ops:
            return 0, skipped, errors
        # 4. Write: the runs that are new, the checkpoints, the effects, their history,
        # each touched run's state, one audit event per written line.
        _create_runs(tenant, ops, checkpoints, effects, runs, now)
        _write_checkpoints(actor, tenant, checkpoints, runs, now)
        _write_effects(actor, tenant, effects, runs, now)
        reopened = _save_runs(tenant, ops, checkpoints, effects, runs, now)
        audit_record_many(tenant=tenant, actor=actor,
                          events=_events(ops, checkpoints, effects, reopened))
    return len(ops), skipped, errors


def _lock_runs(tenant: Tenant, run_ids: set) -> dict[uuid.UUID, Run]:
    if not run_ids:
        return {}
    return {run.uuid: run for run in locks.lock_runs(tenant, run_ids)}


def _stored_checkpoints(tenant: Tenant, ids: set) -> dict[uuid.UUID, _Checkpoint]:
    if not ids:
        return {}
    rows = (Checkpoint.objects.for_tenant(tenant).filter(uuid__in=ids)
            .values_list("pk", "uuid", "run__uuid", "kind", "revision", "payload_ciphertext",
                         "schema_version", "updated_at_ms"))
    return {cid: _Checkpoint(pk, run_uuid, kind, rev, rev, ciphertext,
                             meta=(kind, schema_version, updated_at_ms))
            for pk, cid, run_uuid, kind, rev, ciphertext, schema_version, updated_at_ms in rows}


def _stored_effects(tenant: Tenant, ids: set) -> dict[uuid.UUID, _Effect]:
    if not ids:
        return {}
    rows = (Effect.objects.for_tenant(tenant).filter(uuid__in=ids)
            .values_list("pk", "uuid", "run__uuid", "revision", "state", "receipt_ciphertext",
                         "request_ciphertext", "attempt"))
    return {eid: _Effect(pk, run_uuid, rev, state, rev, state, receipt, request, attempt=attempt)
            for pk, eid, run_uuid, rev, state, receipt, request, attempt in rows}


def _stored_keys(tenant: Tenant, lines: list[EffectLine]) -> dict[tuple[str, str], uuid.UUID]:
    """(service, operation_key) -> effect id, for the keys the batch's effects use."""
    if not lines:
        return {}
    services = {x.service for x in lines}
    keys = {x.operation_key for x in lines}
    rows = (Effect.objects.for_tenant(tenant).filter(service__in=services,
                                                     operation_key__in=keys)
            .values_list("service", "operation_key", "uuid"))
    wanted = {(x.service, x.operation_key) for x in lines}
    return {(s, k): eid for s, k, eid in rows if (s, k) in wanted}


def _check_fence(runs: dict, run_uuid: uuid.UUID, now) -> None:
    """An import carries no fencing token: it may not write a run that has had an owner
    here (CONTRACT.md 3, ``policy.fence_refuses``)."""
    run = runs.get(run_uuid)
    if run is None:
        return
    live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
    if policy.fence_refuses(None, run.fencing_token, live):
        raise LineError(f"run_id: run {run_uuid} has had an owner in this store (fencing "
                        f"token {run.fencing_token}); an import carries no fencing token, "
                        f"so it does not write that run")


def _checkpoint_content(tenant: Tenant, cp: _Checkpoint, revision: int) -> tuple | None:
    """The content (``CheckpointLine.content``) of revision ``revision`` of ``cp``: one
    written earlier in the batch, the stored current one, or a stored older one
    (``None`` if the store never held it)."""
    for line in reversed(cp.written):
        if line.envelope.revision == revision:
            return line.content
    if cp.pk is None:
        return None
    if revision == cp.start:
        if cp.stored is None:
            kind, schema_version, updated_at_ms = cp.meta
            cp.stored = (cp.run_uuid, kind, schema_version, updated_at_ms,
                         crypto.decrypt_text(cp.ciphertext))
        return cp.stored
    row = (CheckpointRevision.objects.for_tenant(tenant)
           .filter(checkpoint_id=cp.pk, revision=revision)
           .values_list("kind", "schema_version", "updated_at_ms", "payload_ciphertext").first())
    if row is None:
        return None
    return (cp.run_uuid, row[0], row[1], row[2], crypto.decrypt_text(row[3]))


def _is_next(what: str, revision: int, stored_revision: int, stored_content, content) -> bool:
    """Whether a line at ``revision`` of ``what`` (``"checkpoint <id>"``, ``"effect <id>"``),
    whose store holds ``stored_revision``, is the next one to write (``True``) or one
    already stored with the same content (``False``: skipped, idempotent re-import).
    ``stored_content()`` gives the stored content of ``revision`` (``None``: older than
    what is kept). Raises ``LineError`` for other content under a stored revision (a
    conflict: the stored one is kept), a revision older than what is kept, or a gap."""
    if revision <= stored_revision:
        stored = stored_content()
        if stored is None:
            raise LineError(f"revision: {revision} is older than the first revision stored "
                            f"for {what}; import its lines oldest first")
        if stored != content:
            raise LineError(f"revision: revision {revision} of {what} is stored with other "
                            f"content (a conflict: the stored revision is kept)")
        return False
    if revision != stored_revision + 1:
        raise LineError(f"revision: the store holds revision {stored_revision} of {what}; "
                        f"the next line for it must be revision {stored_revision + 1}")
    return True


def _decide_checkpoint(tenant: Tenant, line: CheckpointLine, checkpoints: dict, runs: dict,
                       now) -> bool:
    """Whether ``line`` is written (``True``) or already stored (``False``); raises
    ``LineError``. Updates ``checkpoints`` as if it were written."""
    env = line.envelope
    cp = checkpoints.get(env.checkpoint_id)
    if cp is not None:
        if cp.run_uuid != env.run_id:
            raise LineError(f"run_id: checkpoint {env.checkpoint_id} belongs to run "
                            f"{cp.run_uuid}; a checkpoint's run_id never changes")
        if cp.kind != env.kind:
            raise LineError(f"kind: checkpoint {env.checkpoint_id} is {cp.kind}; a "
                            f"checkpoint's kind never changes")
        if not _is_next(f"checkpoint {env.checkpoint_id}", env.revision, cp.revision,
                        lambda: _checkpoint_content(tenant, cp, env.revision), line.content):
            return False
    _check_fence(runs, env.run_id, now)
    if cp is None:
        cp = checkpoints[env.checkpoint_id] = _Checkpoint(None, env.run_id, env.kind,
                                                          env.revision, None)
    cp.revision = env.revision
    cp.written.append(line)
    return True


def _effect_request(effect: _Effect) -> str:
    if effect.request_json is None:
        effect.request_json = (crypto.decrypt_text(effect.request_ciphertext)
                               if effect.request_ciphertext else "")
    return effect.request_json


def _effect_status(state: str, receipt_ciphertext: str, revision: int) -> str:
    receipt = loads_any(crypto.decrypt_text(receipt_ciphertext)) if receipt_ciphertext else None
    return dumps(status_out(state, receipt, revision))


def _effect_content(tenant: Tenant, effect: _Effect, revision: int) -> tuple | None:
    for line in reversed(effect.written):
        if line.revision == revision:
            return line.content
    if effect.pk is None:
        return None
    if revision == effect.start:
        state, receipt = effect.start_state, effect.receipt_ciphertext
    else:
        row = (EffectRevision.objects.for_tenant(tenant)
               .filter(effect_id=effect.pk, revision=revision)
               .values_list("state", "receipt_ciphertext").first())
        if row is None:
            return None
        state, receipt = row
    return (_effect_request(effect), _effect_status(state, receipt, revision))


def _decide_effect(tenant: Tenant, line: EffectLine, effects: dict, checkpoints: dict,
                   keys: dict, runs: dict, now) -> bool:
    """As ``_decide_checkpoint``, for an effect record: its run (``run_id``, else the
    checkpoint its agent key names), then create, advance (a move runifold makes, out of
    a state an import may leave), skip, or ``LineError``."""
    effect = effects.get(line.effect_id)
    run_uuid = line.run_id
    if run_uuid is None and line.execution_id is not None:
        cp = checkpoints.get(line.execution_id)
        run_uuid = cp.run_uuid if cp is not None else None
    if run_uuid is None:
        raise LineError("run_id: required: runifold keeps no run id on an effect record, and "
                        "this record's idempotency key does not start with the id of a "
                        "checkpoint known in this tenant ({execution_id}:agent:...); add "
                        "\"run_id\" to the line, or import its checkpoint first")
    if effect is not None:
        if effect.run_uuid != run_uuid:
            raise LineError(f"run_id: effect {line.effect_id} belongs to run "
                            f"{effect.run_uuid}; an effect's run never changes")
        if not _is_next(f"effect {line.effect_id}", line.revision, effect.revision,
                        lambda: _effect_content(tenant, effect, line.revision), line.content):
            return False
        if _effect_request(effect) != line.request_json:
            raise LineError(f"request: differs from the request stored for effect "
                            f"{line.effect_id}; an effect's request never changes")
        if effect.state not in IMPORT_MAY_MOVE:
            raise LineError(f"status.state: effect {line.effect_id} is {effect.state} in this "
                            f"store; an import moves an effect only out of planned, "
                            f"submitted or unresolved")
        theirs = runifold_status(effect.state, effect.revision)
        if (theirs, line.status) not in MOVES:
            raise LineError(f"status.state: runifold does not move a record from "
                            f"{theirs} to {line.status}")
    else:
        owner = keys.get((line.service, line.operation_key))
        if owner is not None and owner != line.effect_id:
            raise LineError(f"request.idempotency_key: already used by effect {owner} "
                            f"(service {line.service}); runifold keeps one record per "
                            f"capability and idempotency key")
    _check_fence(runs, run_uuid, now)
    if effect is None:
        effect = effects[line.effect_id] = _Effect(None, run_uuid, line.revision, line.state,
                                                   None)
        effect.request_json = line.request_json
        keys[(line.service, line.operation_key)] = line.effect_id
    effect.revision = line.revision
    effect.state = line.state
    effect.written.append(line)
    return True


def _run_of(line, checkpoints: dict, effects: dict) -> uuid.UUID:
    if isinstance(line, CheckpointLine):
        return checkpoints[line.envelope.checkpoint_id].run_uuid
    return effects[line.effect_id].run_uuid


def _create_runs(tenant, ops, checkpoints, effects, runs, now) -> None:
    """Create (race-safe) and lock the runs the written lines name that do not exist
    yet; ``_Redo`` if one that appeared meanwhile has had an owner."""
    new = sorted({_run_of(x, checkpoints, effects) for x in ops} - set(runs))
    if not new:
        return
    Run.objects.bulk_create([Run(tenant=tenant, uuid=u, last_write_at=now) for u in new],
                            ignore_conflicts=True)
    found = _lock_runs(tenant, set(new))
    for run in found.values():
        live = policy.lease_live(run.lease_owner, run.lease_expires_at, now)
        if policy.fence_refuses(None, run.fencing_token, live):
            raise _Redo()
    runs.update(found)


def _checkpoint_fields(line: CheckpointLine, actor, now) -> dict:
    """The columns a checkpoint and its revision row share, by attname."""
    env = line.envelope
    return dict(kind=env.kind, schema_version=env.schema_version,
                payload_ciphertext=line.ciphertext, payload_size=line.size,
                phase_class=line.cls.phase.phase_class, phase_label=line.phase_label,
                updated_at_ms=env.updated_at_ms, received_at=now,
                written_by_id=actor.pk if actor is not None else None)


def _insert_created(model, tenant: Tenant, created: list[dict], holders: dict) -> None:
    """Insert the ``created`` rows of ``model`` (``Checkpoint`` or ``Effect``) in one
    statement, then give each holder (``holders[uuid]``) its new primary key, which the
    history rows that follow refer to."""
    if not created:
        return
    writepath.insert_rows(model, created)
    pks = dict(model.objects.for_tenant(tenant)
               .filter(uuid__in=[row["uuid"] for row in created]).values_list("uuid", "pk"))
    for row in created:
        holders[row["uuid"]].pk = pks[row["uuid"]]


def _write_checkpoints(actor, tenant, checkpoints: dict, runs: dict, now) -> None:
    """New checkpoints at their last revision in the batch, stored ones advanced by a
    conditional UPDATE from the revision read under the run's lock (``_Redo`` if it
    moved), and one history row per written line."""
    created = []
    for cid, cp in checkpoints.items():
        if not cp.written:
            continue
        final = cp.written[-1]
        fields = _checkpoint_fields(final, actor, now)
        if cp.start is None:
            created.append(dict(tenant_id=tenant.pk, run_id=runs[cp.run_uuid].pk, uuid=cid,
                                revision=final.envelope.revision, **fields))
        else:
            updated = (Checkpoint.objects.for_tenant(tenant)
                       .filter(pk=cp.pk, revision=cp.start)
                       .update(revision=final.envelope.revision, **fields))
            if updated != 1:
                raise _Redo()
    _insert_created(Checkpoint, tenant, created, checkpoints)
    writepath.insert_rows(CheckpointRevision, [
        dict(tenant_id=tenant.pk, checkpoint_id=cp.pk, revision=line.envelope.revision,
             **_checkpoint_fields(line, actor, now))
        for cp in checkpoints.values() for line in cp.written])


def _write_effects(actor, tenant, effects: dict, runs: dict, now) -> None:
    """As ``_write_checkpoints``, for effects: the request, fingerprint and identity on
    creation; state, receipt and times on every write; one history row per line."""
    created = []
    for eid, effect in effects.items():
        if not effect.written:
            continue
        final = effect.written[-1]
        started = any(x.status == STARTED for x in effect.written)
        fields = dict(revision=final.revision, state=final.state,
                      receipt_ciphertext=final.receipt_ciphertext, state_changed_at=now,
                      updated_at=now)
        if effect.start is None:
            created.append(dict(
                tenant_id=tenant.pk, run_id=runs[effect.run_uuid].pk, uuid=eid,
                operation_key=final.operation_key, service=final.service,
                effect_class=final.effect_class, request_fingerprint=final.fingerprint,
                request_ciphertext=final.request_ciphertext, attempt=1,
                submitted_at=now if started else None, retry_authorized_by_id=None,
                created_at=now, **fields))
        else:
            if started:
                fields["submitted_at"] = now
            updated = (Effect.objects.for_tenant(tenant)
                       .filter(pk=effect.pk, revision=effect.start).update(**fields))
            if updated != 1:
                raise _Redo()
    _insert_created(Effect, tenant, created, effects)
    name = _actor_name(actor)
    writepath.insert_rows(EffectRevision, [
        dict(tenant_id=tenant.pk, effect_id=effect.pk, revision=line.revision, state=line.state,
             receipt_ciphertext=line.receipt_ciphertext, attempt=effect.attempt, actor_name=name,
             source=EffectSource.IMPORT, created_at=now)
        for effect in effects.values() for line in effect.written])


def _save_runs(tenant, ops, checkpoints, effects, runs, now) -> set[uuid.UUID]:
    """Each touched run's new facts and recovery state (``runs.run_save_many``: what
    ``run_save`` does on every write, for all the batch's runs at once); returns the runs
    a write reopened (a reviewer had closed them)."""
    latest: dict[uuid.UUID, CheckpointLine | None] = {}
    for line in ops:
        run_uuid = _run_of(line, checkpoints, effects)
        if isinstance(line, CheckpointLine):
            latest[run_uuid] = line
        else:
            latest.setdefault(run_uuid, None)
    changes = []
    for run_uuid in sorted(latest):
        fields: dict[str, Any] = {"last_write_at": now}
        line = latest[run_uuid]
        if line is not None:
            env, ident = line.envelope, line.cls.identity
            fields.update(
                latest_checkpoint=Checkpoint(pk=checkpoints[env.checkpoint_id].pk),
                kind=env.kind, schema_version=env.schema_version,
                phase_class=line.cls.phase.phase_class, phase_label=line.phase_label,
                agent=ident.agent, model=ident.model, workflow=ident.workflow,
                definition_version=ident.definition_version)
        changes.append((runs[run_uuid], fields))
    reopened = run_save_many(changes, now, reopen=True)
    return {run.uuid for run, _ in changes if run.pk in reopened}


def _events(ops, checkpoints, effects, reopened: set) -> list[dict]:
    """One audit event per written line, in file order."""
    events, previous = [], {}
    for line in ops:
        if isinstance(line, CheckpointLine):
            env = line.envelope
            cp = checkpoints[env.checkpoint_id]
            before = previous.get(env.checkpoint_id, None if cp.start is None
                                  else {"revision": cp.start})
            after = {"revision": env.revision, "phase": line.phase_label,
                     "phase_class": line.cls.phase.phase_class}
            previous[env.checkpoint_id] = {"revision": env.revision}
            target, target_type, run_uuid = env.checkpoint_id, TargetType.CHECKPOINT, cp.run_uuid
            action = AuditAction.CHECKPOINT_IMPORT
        else:
            effect = effects[line.effect_id]
            before = previous.get(line.effect_id, None if effect.start is None else
                                  {"revision": effect.start, "state": effect.start_state})
            after = {"revision": line.revision, "state": line.state,
                     "runifold_state": line.status, "operation_key": line.operation_key,
                     "service": line.service}
            previous[line.effect_id] = {"revision": line.revision, "state": line.state}
            target, target_type, run_uuid = line.effect_id, TargetType.EFFECT, effect.run_uuid
            action = AuditAction.EFFECT_IMPORT
        if run_uuid in reopened:
            after["reopened"] = True
            reopened.discard(run_uuid)
        events.append(dict(action=action, target_type=target_type, target_id=target,
                           run_id=run_uuid, before=before, after=after))
    return events


# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------

@dataclass
class ExportReport:
    """What an export wrote: ``checkpoint_lines``, ``effect_lines``; and what it left out
    because runifold has no shape for it: checkpoints of other kinds or of a schema the
    registry refuses (``left_out_checkpoints``), effects written through the API without
    a runifold request (``left_out_effects``); with ``history``, the revisions of exported
    checkpoints up to and including their last unsupported (schema-mismatch) revision
    (``left_out_revisions``: a checkpoint's history starts after it, so the lines of one
    checkpoint have no gap an import would refuse)."""

    checkpoint_lines: int = 0
    effect_lines: int = 0
    left_out_checkpoints: int = 0
    left_out_effects: int = 0
    left_out_revisions: int = 0


#: Rows per page, and payload bytes per page of checkpoints (at least one row).
EXPORT_PAGE = 200
EXPORT_PAGE_BYTES = 8 << 20


def _envelope_line(cid, run_uuid, revision, kind, schema_version, payload_text,
                   updated_at_ms) -> str:
    """The envelope as ``dumps`` writes it (sorted keys, compact); the payload text is
    stored canonical already (``parse_envelope``), so it is put in as it is."""
    return (f'{{"id":"{cid}","kind":{dumps(kind)},"payload":{payload_text},'
            f'"revision":{revision},"run_id":"{run_uuid}","schema_version":{schema_version},'
            f'"updated_at_ms":{updated_at_ms}}}')


def runifold_export(*, actor, tenant: Tenant, write: Callable[[str], None],
                    run_ids: Iterable[uuid.UUID] | None = None, history: bool = False,
                    page_size: int = EXPORT_PAGE,
                    on_progress: Callable[[int], None] | None = None) -> ExportReport:
    """Write ``tenant``'s runifold checkpoints and effect records as JSON Lines, one
    ``write(line)`` per line (no newline), checkpoints first (module doc,
    ``docs/runifold.md``): the latest revision of each, or every stored revision oldest
    first with ``history`` (after the checkpoint's last unsupported revision, if any:
    ``ExportReport.left_out_revisions``); then each effect's current record (or every
    revision).
    ``run_ids`` limits the export to those runs.

    Each page (``page_size`` rows, and at most 8 MiB of checkpoint payloads) is read,
    decrypted and audited (``runifold.export``, target the tenant) in one transaction;
    its lines are written after that commits, so nothing leaves unaudited. ``actor``
    needs a role that may read payloads (``write_runs`` or ``reveal_payload``), or is
    ``None`` for the operator's command line. ``on_progress(lines)`` after each page.
    Raises ``NotFound`` naming ``run_id`` for a run the tenant does not have,
    ``Forbidden``/``NotFound`` as ``permissions.require``.
    """
    if actor is not None:
        require(actor, tenant, roles.VIEW)
        if not tenant_perms(actor, tenant) & {roles.WRITE, roles.REVEAL}:
            raise Forbidden("your role may not read payloads")
    if type(page_size) is not int or not 1 <= page_size <= 10_000:
        raise InvalidPayload("page_size: must be an integer in 1..10000")
    report = ExportReport()
    run_pks = None
    if run_ids is not None:
        wanted = set(run_ids)
        found = dict(Run.objects.for_tenant(tenant).filter(uuid__in=wanted)
                     .values_list("uuid", "pk"))
        missing = sorted(str(u) for u in wanted - set(found))
        if missing:
            raise NotFound(f"run_id: no run {missing[0]} in tenant {tenant.slug}")
        run_pks = list(found.values())

    def audit_page(checkpoint_lines: int, effect_lines: int) -> None:
        audit_record(tenant=tenant, actor=actor, action=AuditAction.RUNIFOLD_EXPORT,
                     target_type=TargetType.TENANT, target_id=tenant.slug,
                     after={"checkpoint_lines": checkpoint_lines,
                            "effect_lines": effect_lines, "history": history})

    def emit(lines: list[str]) -> None:
        for line in lines:
            write(line)
        if on_progress is not None:
            on_progress(len(lines))

    cps = Checkpoint.objects.for_tenant(tenant)
    effects = Effect.objects.for_tenant(tenant)
    if run_pks is not None:
        cps = cps.filter(run_id__in=run_pks)
        effects = effects.filter(run_id__in=run_pks)
    exported = cps.filter(kind__in=KINDS).exclude(phase_class=PhaseClass.UNSUPPORTED)
    report.left_out_checkpoints = cps.count() - exported.count()

    # Checkpoints: pages of rows in primary key order (a checkpoint's revisions are
    # inserted oldest first, so its lines come oldest first too).
    if history:
        # Each exported checkpoint's revisions after its last unsupported one: the
        # revisions ending at the current one with no gap (an import refuses a gap).
        revisions = CheckpointRevision.objects.for_tenant(tenant).filter(checkpoint__in=exported)
        last_unsupported = (CheckpointRevision.objects.for_tenant(tenant)
                            .filter(checkpoint_id=OuterRef("checkpoint_id"),
                                    phase_class=PhaseClass.UNSUPPORTED)
                            .order_by("-revision").values("revision")[:1])
        source = revisions.filter(revision__gt=Coalesce(Subquery(last_unsupported), -1))
        report.left_out_revisions = revisions.count() - source.count()
        columns = ("checkpoint__uuid", "checkpoint__run__uuid")
    else:
        source = exported
        columns = ("uuid", "run__uuid")
    last = 0
    while True:
        sizes = list(source.filter(pk__gt=last).order_by("pk")
                     .values_list("pk", "payload_size")[:page_size])
        if not sizes:
            break
        chosen, total = [], 0
        for pk, size in sizes:
            if chosen and total + size > EXPORT_PAGE_BYTES:
                break
            chosen.append(pk)
            total += size
        last = chosen[-1]
        with transaction.atomic():
            rows = (source.filter(pk__in=chosen).order_by("pk")
                    .values_list(*columns, "revision", "kind", "schema_version",
                                 "payload_ciphertext", "updated_at_ms"))
            lines = [_envelope_line(cid, run_uuid, rev, kind, sv, crypto.decrypt_text(ct), ms)
                     for cid, run_uuid, rev, kind, sv, ct, ms in rows]
            audit_page(len(lines), 0)
        report.checkpoint_lines += len(lines)
        emit(lines)

    # Effects: those that carry a runifold request, in primary key order.
    last = 0
    while True:
        with transaction.atomic():
            rows = list(effects.filter(pk__gt=last).order_by("pk")
                        .values_list("pk", "uuid", "run__uuid", "revision", "state",
                                     "receipt_ciphertext", "request_ciphertext")[:page_size])
            if not rows:
                break
            last = rows[-1][0]
            lines, left_out = _effect_lines(tenant, rows, history)
            report.left_out_effects += left_out
            if lines:
                audit_page(0, len(lines))
        report.effect_lines += len(lines)
        emit(lines)
    return report


def _runifold_request(effect_id: uuid.UUID, ciphertext: str) -> dict | None:
    """The stored request if it is a runifold ``EffectRequest`` of this effect, else
    ``None`` (an effect written through the API)."""
    if not ciphertext:
        return None
    try:
        request = loads_any(crypto.decrypt_text(ciphertext))
        if _request(request)[0] != str(effect_id):
            return None
    except (InvalidPayload, ValueError, TypeError):
        return None
    return request


def _effect_lines(tenant: Tenant, rows: list, history: bool) -> tuple[list[str], int]:
    requests = {}
    for pk, eid, _, _, _, _, ciphertext in rows:
        request = _runifold_request(eid, ciphertext)
        if request is not None:
            requests[pk] = request
    # A line needs run_id unless its agent key leads an import back to its run: the
    # execution id is a runifold checkpoint of the same run (exported above).
    exec_ids = {pk: execution_id(r.get("idempotency_key")) for pk, r in requests.items()}
    wanted = {x for x in exec_ids.values() if x is not None}
    derived = dict(Checkpoint.objects.for_tenant(tenant)
                   .filter(uuid__in=wanted, kind__in=KINDS)
                   .exclude(phase_class=PhaseClass.UNSUPPORTED)
                   .values_list("uuid", "run__uuid")) if wanted else {}
    revisions: dict[int, list] = {}
    if history and requests:
        for effect_pk, rev, state, receipt in (
                EffectRevision.objects.for_tenant(tenant).filter(effect_id__in=list(requests))
                .order_by("effect_id", "revision")
                .values_list("effect_id", "revision", "state", "receipt_ciphertext")):
            revisions.setdefault(effect_pk, []).append((rev, state, receipt))
    lines = []
    for pk, _, run_uuid, revision, state, receipt, _ in rows:
        request = requests.get(pk)
        if request is None:
            continue
        records = revisions.get(pk, []) if history else [(revision, state, receipt)]
        for rev, st, rc in records:
            record: dict[str, Any] = {
                "revision": rev, "request": request,
                "status": status_out(st, loads_any(crypto.decrypt_text(rc)) if rc else None,
                                     rev)}
            if derived.get(exec_ids[pk]) != run_uuid:
                record["run_id"] = str(run_uuid)
            lines.append(dumps(record))
    return lines, len(rows) - len(requests)

