"""What every API shape shares: the ``Answer`` base (one definition of an answer's
keys, for the schema and for ``render``), the custom fields, and the error bodies
(``ErrorSerializer``, the specific ones, ``error_body``)."""

from __future__ import annotations

import threading

from rest_framework import serializers

from ... import crypto, exceptions


def _words(values) -> str:
    """``"a, b or c"``: an enum's values for a help text."""
    values = list(values)
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else "".join(values)


class Answer(serializers.Serializer):
    """Base of every answer's shape (output only): its fields are the one definition of
    the answer's keys (in order), types and nulls, for the schema and for ``render``.

    Field values come from the instance's attribute or key of the field's name (or
    ``source``; dotted paths follow relations), ``None`` is always written as ``null``.
    Keyword arguments of ``render`` are the serializer's context (e.g. ``tenant`` for
    ``RunSerializer``, ``receipts`` for ``EffectSerializer``), passed on to nested shapes.
    """

    @classmethod
    def render(cls, instance, **context) -> dict:
        """The answer's dict for ``instance`` (a model row, an object or a dict).

        Uses one bound serializer per class and thread (``_bound``): building one per
        answer deep-copies every field, about 50 times the cost of rendering a
        checkpoint's metadata, on the write path."""
        serializer = cls._bound()
        serializer._context = context
        try:
            return serializer.to_representation(instance)
        finally:
            serializer._context = {}

    @classmethod
    def _bound(cls) -> Answer:
        cache = _BOUND.__dict__.setdefault("serializers", {})
        serializer = cache.get(cls)
        if serializer is None:
            serializer = cache[cls] = cls()
            serializer.fields  # noqa: B018 - bind the fields once
        return serializer


#: Per thread: one bound serializer of each ``Answer`` class (``Answer.render``).
_BOUND = threading.local()


class IsoDateTimeField(serializers.DateTimeField):
    """A time as ``datetime.isoformat()`` writes it (``2025-01-02T03:04:05.123456+00:00``),
    the API's format since version 1 (DRF's own would write ``Z`` and convert zones). A
    string is taken as already formatted."""

    def to_representation(self, value):
        return value if isinstance(value, str) else value.isoformat()


def error_word(word: str) -> serializers.ChoiceField:
    """The ``error`` of a specific error body: always ``word`` (an enum of one in the
    schema), so that a client can tell the bodies of one status apart."""
    return serializers.ChoiceField(choices=[word])


class TenantSlugField(serializers.CharField):
    """The slug of the answer's tenant, from the context's ``tenant`` (a ``Tenant``)."""

    def get_attribute(self, instance):
        return self.context["tenant"].slug


class RunUuidField(serializers.UUIDField):
    """The UUID of the row's run: the context's ``run_id`` when the caller knows it (it
    then saves loading the run; every row of such an answer belongs to that run), else
    ``instance.run.uuid``."""

    def __init__(self, **kwargs):
        kwargs.setdefault("source", "run.uuid")
        super().__init__(**kwargs)

    def get_attribute(self, instance):
        run_id = self.context.get("run_id")
        return run_id if run_id is not None else super().get_attribute(instance)


class WriterReceiptField(serializers.JSONField):
    """An effect's receipt when the context's ``receipts`` is true
    (``permissions.receipts_in_answers``), else ``None`` without decrypting it. Every
    caller must say which: a missing ``receipts`` is a ``KeyError``. A receipt whose
    tenant was crypto-shredded is ``None`` too (``has_receipt`` still says there was
    one): an effect answer, a list, a write's answer stay readable; revealing it answers
    410 ``erased``."""

    def get_attribute(self, instance):
        if not self.context["receipts"]:
            return None
        try:
            return super().get_attribute(instance)
        except crypto.DataKeyGone:
            return None


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

# Rendered from a ``DomainError`` (its ``error`` and ``detail``) or a dict; an empty
# ``detail`` is left out.
class ErrorSerializer(Answer):
    """Every error answer: a stable snake_case ``error`` word and, usually, a ``detail``
    that names the offending field (``"revision: must be an integer in 0..N"``)."""

    error = serializers.CharField()
    detail = serializers.CharField(required=False)

    def to_representation(self, instance):
        out = super().to_representation(instance)
        if not out.get("detail", True):
            del out["detail"]
        return out


class ConflictErrorSerializer(Answer):
    """412: the compare-and-swap was refused; the store holds ``current_revision``."""

    error = error_word("conflict")
    current_revision = serializers.IntegerField()


class FencedErrorSerializer(Answer):
    """409: the write carried a fencing token other than the run's current one."""

    error = error_word("fenced")
    fencing_token = serializers.IntegerField(source="extra.fencing_token")


class OwnerLiveSerializer(Answer):
    """409: reconciliation refused while the run's owner is alive; it counts as gone at
    ``lease_expires_at`` (lease expiry, or last write + the ambiguity threshold)."""

    error = error_word("owner_live")
    detail = serializers.CharField()
    lease_expires_at = IsoDateTimeField(source="extra.lease_expires_at", allow_null=True)


class OperationExistsSerializer(Answer):
    """409: another effect id already holds this (service, operation_key) with the same
    fingerprint; continue with ``effect_id``."""

    error = error_word("operation_exists")
    effect_id = serializers.UUIDField(source="extra.effect_id")


class ThreadConflictSerializer(Answer):
    """412 of a LangGraph put or copy (docs/langgraph.md): refused and kept as a conflict;
    ``current_revision`` is the namespace envelope's revision and ``head_checkpoint_id``
    LangGraph's id of its newest checkpoint (both null when it has none)."""

    error = error_word("conflict")
    current_revision = serializers.IntegerField(allow_null=True)
    head_checkpoint_id = serializers.CharField(allow_null=True)
    detail = serializers.CharField()


class SecretPathSerializer(Answer):
    """Where a credential-like value was found (never the value): an RFC 6901 JSON
    pointer (``/headers/authorization``; under ``/receipt`` or ``/request`` for an
    effect) and the detector's word (``bearer_token``, ``aws_access_key``, ...;
    docs/security/secrets.md)."""

    path = serializers.CharField()
    type = serializers.CharField()


class UnprocessableWriteSerializer(Answer):
    """422 of a checkpoint or effect write: ``error`` says which refusal
    (``usage_decreased``, ``invalid_transition``, ``idempotency_key_reuse``, ...);
    ``secret_detected`` (a credential under the tenant's ``refuse`` data policy; nothing
    stored) adds ``paths``."""

    error = serializers.CharField()
    detail = serializers.CharField(required=False)
    paths = SecretPathSerializer(many=True, required=False, source="extra.paths")
class PurgeRefusedSerializer(Answer):
    """409: a tombstone purge step refused by tombstone governance; ``reason`` says which
    rule (``exceptions.PurgeRefused``)."""

    error = error_word("purge_refused")
    detail = serializers.CharField()
    reason = serializers.ChoiceField(source="extra.reason", choices=[
        "no_tombstone_retention", "no_export", "legal_hold", "nothing_to_purge", "expired",
        "changed", "state"])
class RunDeletedSerializer(Answer):
    """409: the run's payloads were deleted by retention or erasure (its tombstone says
    when and why); it takes no more writes: start a new run (docs/security/retention.md)."""

    error = error_word("run_deleted")
    detail = serializers.CharField()


#: The body of each domain error that has its own shape; every other one is an
#: ``ErrorSerializer``.
ERROR_SHAPES: dict[type[exceptions.DomainError], type[Answer]] = {
    exceptions.StaleRevision: ConflictErrorSerializer,
    exceptions.ThreadConflict: ThreadConflictSerializer,
    exceptions.Fenced: FencedErrorSerializer,
    exceptions.OwnerLive: OwnerLiveSerializer,
    exceptions.OperationExists: OperationExistsSerializer,
    exceptions.SecretDetected: UnprocessableWriteSerializer,
    exceptions.PurgeRefused: PurgeRefusedSerializer,
    exceptions.RunDeleted: RunDeletedSerializer,
}


def error_body(exc: exceptions.DomainError) -> dict:
    """The JSON body of a domain error, in the shape ``ERROR_SHAPES`` gives its class."""
    return ERROR_SHAPES.get(type(exc), ErrorSerializer).render(exc)
