"""A runifold JSON Lines file, line by line, without the database (issue 10, item 4;
``docs/runifold.md``): runifold's own words (RUNIFOLD.md 0, 4: statuses, effect kinds and
classes, and how they map to ours), reading a file into lines of bounded size
(``jsonl_lines``), checking one line into a ``CheckpointLine`` or an ``EffectLine``
(``parse_line``), and rendering an effect's state back as a runifold status
(``runifold_status``, ``status_out``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from django.conf import settings

from ... import crypto, intranges, kinds
from ...exceptions import InvalidPayload, SecretDetected
from ...jsonparse import check_name, content_sha256, dumps, loads_object, printable
from ...models import Effect
from ...services import screening
from ...services.checkpoints import Envelope, parse_envelope
from ...services.common import _uuid_field
from ...vocab import EffectClass, EffectState

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
    # The usage counters its write stores: the payload's, or for an unsupported payload
    # the checkpoint's last known ones (set by the import's decision, ``_decide_checkpoint``).
    usage: dict = field(default_factory=dict)
    # Screening's findings and size flag (``services.screening``), as an API write's.
    secret_paths: list = field(default_factory=list)
    large_above: int | None = None

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
    receipt_sha256: str = ""  # of the receipt's stored JSON text (its audit event's)
    secret_paths: list = field(default_factory=list)  # screening's, as an API write's

    @property
    def content(self) -> tuple:
        return (self.request_json, self.status_json)


class LineError(Exception):
    """One line's problem: ``detail`` names the field and the rule (``payload: ...``)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def parse_line(raw: bytes, number: int = 0, *, tenant=None,
               policy=None) -> CheckpointLine | EffectLine | None:
    """Check one line of a runifold file (module doc) and encrypt what it stores under
    ``tenant``'s data key (``crypto.encrypt_text``; ``None``, as in tests of the format:
    the legacy master-key form, without the database). Returns
    ``None`` for a blank line (skipped, not counted). Raises ``LineError`` naming the
    field: the strict JSON rules of ``jsonparse`` (duplicate keys, NaN, U+0000, unpaired
    surrogates, depth), then those of the envelope (``parse_envelope`` and the kind
    registry) or of the effect record (RUNIFOLD.md 4), then screening for credentials
    (``services.screening``) as an API write's: under ``policy`` (the tenant's
    ``DataPolicy``, read once per file) a ``refuse`` makes the line an error naming the
    path, else the findings are stored with it (``None``: recorded, never refused)."""
    if not raw.strip():
        return None
    try:
        body = loads_object(raw.strip(), what="record")
        if "kind" in body and "payload" in body:
            if "request" in body or "status" in body:
                raise InvalidPayload("record: has both an envelope's kind and payload and an "
                                     "effect record's request and status")
            return _screened_checkpoint(_parse_checkpoint(body, number, tenant), policy)
        if "request" in body and "status" in body:
            return _screened_effect(_parse_effect(body, number, tenant), body, policy)
        raise InvalidPayload("record: neither a checkpoint envelope (kind and payload) nor an "
                             "effect record (request and status)")
    except (InvalidPayload, SecretDetected) as exc:
        raise LineError(exc.detail) from None


def _screened_checkpoint(line: CheckpointLine, policy) -> CheckpointLine:
    screened = screening.screen_payload(line.envelope.payload, line.size)
    if policy is not None:
        screened = screened.decided(policy.secrets_policy, policy.payload_flag_bytes)
    line.secret_paths, line.large_above = screened.secret_paths, screened.large_above
    return line


def _screened_effect(line: EffectLine, body: dict, policy) -> EffectLine:
    # The status holds the receipt (a completed output, a failure's error): scanned whole.
    paths = screening.effect_findings(request=body.get("request"), receipt=body.get("status"))
    if policy is not None:
        paths = screening.effect_decided(paths, policy.secrets_policy)
    line.secret_paths = paths
    return line


def _parse_checkpoint(body: dict, number: int, tenant) -> CheckpointLine:
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
                          crypto.encrypt_text(envelope.payload_json, tenant=tenant), len(data))


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
    # The names rule of the API's effect service and operation key (``name_problem``):
    # an imported line passes the same checks as a PUT (the attack's finding, stop 33).
    check_name(service, "request.kind")
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
    if key is not None:
        check_name(key, "request.idempotency_key",
                   blank_words="must be a non-empty string or null")
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


def _parse_effect(body: dict, number: int, tenant) -> EffectLine:
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
    receipt_json = dumps(receipt) if receipt is not None else ""
    return EffectLine(
        number=number, effect_id=uuid.UUID(effect_id), revision=revision, run_id=run_id,
        execution_id=execution_id(body["request"].get("idempotency_key")),
        request_json=request_json, request_ciphertext=crypto.encrypt_text(request_json, tenant=tenant),
        fingerprint=hashlib.sha256(request_json.encode("utf-8")).hexdigest(),
        service=service, operation_key=operation_key, effect_class=effect_class,
        status=state, status_json=dumps(body["status"]), state=STATE_IN[state],
        receipt_ciphertext=(crypto.encrypt_text(receipt_json, tenant=tenant)
                            if receipt_json else ""),
        receipt_sha256=content_sha256(receipt_json) if receipt_json else "",
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
