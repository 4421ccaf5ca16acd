"""Shapes of runs: a run, a page of runs, a run with everything under it, its lease and
the resume decision."""

from __future__ import annotations

import re

from rest_framework import serializers

from ... import intranges
from ...exceptions import InvalidPayload
from ...models import Run
from ...selectors import nextstep
from ...vocab import LeaseState, RecoveryState, ResumeAction
from .checkpoints import CheckpointMetaSerializer
from .common import Answer, IsoDateTimeField, TenantSlugField
from .effects import EffectSerializer
from .lifecycle_requests import HeldBySerializer  # a hold as a run shows it
from .review import (
    ConflictSerializer,
    ReconcileRequestSerializer,
    RetryPreviewSerializer,
    RetryRequestSerializer,
)
from .tombstones import TombstoneSerializer  # one shape, the run's and the list's

#: Every value ``Run.recovery_state`` can hold, ``closed`` included (a reviewer's close).
RECOVERY_STATES = list(RecoveryState.values)


# Rendered from a ``Run`` row or a ``selectors.run_list`` row, with ``tenant=`` its Tenant.
class RunSerializer(Answer):
    """A run's metadata and materialised recovery state (never a payload)."""

    run_id = serializers.UUIDField(source="uuid")
    tenant = TenantSlugField(help_text="tenant slug")
    kind = serializers.CharField()
    schema_version = serializers.IntegerField(allow_null=True)
    agent = serializers.CharField()
    model = serializers.CharField(help_text="provider/name")
    workflow = serializers.CharField()
    definition_version = serializers.CharField()
    phase_class = serializers.CharField()
    phase_label = serializers.CharField()
    # Every value ``Run.recovery_state`` can hold, ``closed`` included (a reviewer's close).
    recovery_state = serializers.ChoiceField(choices=RecoveryState.values)
    recovery_reason = serializers.CharField()
    lease_owner = serializers.CharField()
    fencing_token = serializers.IntegerField()
    unacknowledged_conflicts = serializers.IntegerField()
    state_changed_at = IsoDateTimeField(allow_null=True)
    last_write_at = IsoDateTimeField(allow_null=True)
    created_at = IsoDateTimeField()
    lease_expires_at = IsoDateTimeField(allow_null=True)
    lease_state = serializers.ChoiceField(
        choices=LeaseState.values, allow_null=True,
        help_text="live (its owner holds it), expired (it timed out) or ended (a reviewer "
                  "ended it: lease_ended_by, lease_ended_at); null when the run has no "
                  "lease owner. The run page's and the inbox's word (policy.lease_state)")
    lease_ended_by = serializers.CharField(
        allow_null=True, help_text="the reviewer who ended the lease (username); null "
                                   "unless lease_state is ended")
    lease_ended_at = IsoDateTimeField(
        allow_null=True, help_text="when a reviewer ended the lease (the database's time, "
                                   "its lease_expires_at); null unless lease_state is ended")
    payloads_deleted_at = IsoDateTimeField(
        allow_null=True, help_text="when retention or erasure deleted the run's payloads and "
                                   "history (its tombstone says why); such a run takes no "
                                   "more writes (409 run_deleted). Null: not deleted")

    def to_representation(self, instance) -> dict:
        """The fields, ``recovery_reason`` as the dashboard words it
        (``selectors.nextstep.state_reason``: one rule for both); ``lease_state`` the
        row's (``selectors.common.lease_state_of``), null with no owner, and who ended
        the lease and when only while it says ``ended``."""
        data = super().to_representation(instance)
        data["lease_state"] = data["lease_state"] or None
        if data["lease_state"] != LeaseState.ENDED:
            data["lease_ended_by"] = data["lease_ended_at"] = None
        data["recovery_reason"] = nextstep.state_reason(
            data["recovery_state"], data["recovery_reason"], data["kind"],
            data["schema_version"])
        return data


#: ``next_step`` of a run in the list and in its detail (the same words: ``selectors.nextstep``).
NEXT_STEP_HELP = ('what is true · what a person does, e.g. "payments confirmed · a retry '
                  'replays it", "nobody can tell · possible duplicate"; "" when nothing '
                  'waits for a person')


# Rendered from a ``selectors.run_list`` row with ``next_step`` added (``page_steps``).
class RunListItemSerializer(RunSerializer):
    """A run of the list, with what to do next in a few words (the dashboard inbox's
    reason column, the run page's next step: ``selectors.nextstep``)."""

    next_step = serializers.CharField(help_text=NEXT_STEP_HELP)


class RunPageSerializer(Answer):
    """One keyset page; ``next`` is the URL of the following page, or null on the last;
    ``previous`` the URL of the page before, or null on the first."""

    results = RunListItemSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class OpenReviewItemsSerializer(Answer):
    """What awaits a decision on the run: its open retry request and its unacknowledged
    conflicts."""

    retry_request = RetryRequestSerializer(allow_null=True,
                                           help_text="the open (requested or approved) one")
    conflicts = ConflictSerializer(many=True, help_text="unacknowledged conflicts")


# Rendered from a dict of the rows, with ``tenant=``, ``receipts=`` and ``run_id=``.
class RunDetailSerializer(Answer):
    """A run, its latest checkpoints (metadata), effects, open review items, reconcile
    requests, and what an approved retry would do to each effect."""


    run = RunSerializer()
    checkpoints = CheckpointMetaSerializer(many=True, help_text="latest revision of each")
    effects = EffectSerializer(many=True)
    open_review_items = OpenReviewItemsSerializer()
    reconcile_requests = ReconcileRequestSerializer(many=True, help_text="newest first")
    retry_preview = RetryPreviewSerializer(many=True)
    tombstone = TombstoneSerializer(allow_null=True, help_text="the run's tombstone when its "
                                                               "payloads were deleted, else null")
    next_step = serializers.CharField(help_text=NEXT_STEP_HELP + " (as the run list says)")
    legal_holds = HeldBySerializer(many=True, help_text=(
        "the active legal holds that cover the run, newest first (the tenant's, those "
        "naming it, a subject's it was indexed under): retention and erasure keep it"))


class LeaseInputSerializer(serializers.Serializer):
    owner = serializers.CharField(max_length=Run._meta.get_field("lease_owner").max_length)
    ttl_s = serializers.IntegerField(**intranges.LEASE_TTL_S.field_kwargs())


# Rendered from the ``Run`` row.
class LeaseSerializer(Answer):
    """The run's lease: the owner's fencing token and when the lease expires."""


    fencing_token = serializers.IntegerField()
    expires_at = IsoDateTimeField(source="lease_expires_at")


class LeaseRevokeInputSerializer(serializers.Serializer):
    """Body of ``…/lease/revoke``: why (as every review action), and optionally the owner
    the caller saw, so a lease renewed by another owner since is not ended (409)."""

    reason = serializers.CharField(max_length=4000)
    owner = serializers.CharField(max_length=Run._meta.get_field("lease_owner").max_length,
                                  required=False,
                                  help_text="the owner whose lease you mean to end; 409 "
                                            "lease_held if another owner holds it now")
    fencing_token = serializers.IntegerField(
        **intranges.FENCING_TOKEN.field_kwargs(), required=False,
        help_text="the lease's token you saw; 409 lease_held if the lease was taken again "
                  "since (even by the same owner)")


class LeaseReleaseInputSerializer(serializers.Serializer):
    """Body of ``…/lease/release``: the lease the caller holds, both required."""

    owner = serializers.CharField(max_length=Run._meta.get_field("lease_owner").max_length,
                                  help_text="the owner that holds the live lease")
    fencing_token = serializers.IntegerField(
        **intranges.FENCING_TOKEN.field_kwargs(),
        help_text="the live lease's fencing token (the one taking it answered)")


# Rendered from the ``Run`` row ``services.lease_revoke`` (and ``lease_release``) returns.
class LeaseStateSerializer(Answer):
    """The run's lease after a reviewer ended it: who held it (kept as the record), the
    new fencing token (the old owner's writes are refused) and when it ended (the
    database time of the revoke); ``LeaseSerializer``'s fields with the owner."""

    owner = serializers.CharField(source="lease_owner", help_text="who held the lease")
    fencing_token = serializers.IntegerField()
    expires_at = IsoDateTimeField(source="lease_expires_at")


# Rendered from ``services.resume_preview`` / ``resume_claim``.
class ResumeSerializer(Answer):
    """The resume decision (CONTRACT.md section 3)."""

    action = serializers.ChoiceField(choices=ResumeAction.values)
    reason = serializers.CharField(help_text="stable snake_case word, e.g. in_flight")
    checkpoint_id = serializers.UUIDField(allow_null=True)
    revision = serializers.IntegerField(allow_null=True)
    fencing_token = serializers.IntegerField()
    detail = serializers.CharField(
        required=False,
        help_text="only with reason migration_required: which version must be migrated "
                  "and the command that does it (manage.py migrate_checkpoints KIND --to N "
                  "--tenant T --run R), or the Kinds page's Migrate to vN")


class ResumeInputSerializer(serializers.Serializer):
    agent = serializers.CharField(required=False)
    model = serializers.CharField(required=False, help_text="provider/name")
    workflow = serializers.CharField(required=False)
    definition_version = serializers.CharField(required=False)
    usage = serializers.DictField(
        required=False, child=serializers.IntegerField(**intranges.USAGE_COUNTER.field_kwargs()),
        help_text="the runtime's usage counters ({counter: int}, e.g. tokens, "
                  "cost_microusd): continue and replay need each equal to the checkpoint's, "
                  "retry at least the checkpoint's, else reject/usage_mismatch "
                  "(CONTRACT.md 8)")


#: A usage counter's name: what a kind declares (``kinds.USAGE_COUNTERS`` for runifold).
USAGE_COUNTER_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Counters one resume may carry.
USAGE_COUNTERS_MAX = 32


def resume_usage(value) -> dict[str, int]:
    """The ``usage`` of a ``POST …/resume`` body, checked as ``ResumeInputSerializer``
    documents it: an object of at most 32 counters, each named like ``tokens`` and an
    integer in ``intranges.USAGE_COUNTER`` (a JSON integer: never a float, a string or a
    boolean). Raises ``InvalidPayload`` (400) naming ``usage`` or ``usage.<counter>``."""
    if not isinstance(value, dict):
        raise InvalidPayload("usage: must be an object of counters")
    if len(value) > USAGE_COUNTERS_MAX:
        raise InvalidPayload(f"usage: at most {USAGE_COUNTERS_MAX} counters")
    for name, count in value.items():
        if not USAGE_COUNTER_NAME.fullmatch(name):
            raise InvalidPayload("usage: a counter's name is 1 to 64 of a-z, 0-9 and _, "
                                 "starting with a letter")
        intranges.USAGE_COUNTER.check(count, f"usage.{name}")
    return dict(value)
