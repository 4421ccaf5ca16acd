"""LangGraph threads: checkpoints and pending writes (issue 10)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .runs import Checkpoint, Run
from .tenancy import Tenant, TenantOwned


class GraphCheckpoint(TenantOwned):
    """One LangGraph checkpoint (issue 10, docs/langgraph.md): a row per checkpoint of a
    thread's namespace, kept beside the recovery checkpoint ``envelope`` of that
    (thread, namespace), whose revisions summarise the namespace's head.

    ``checkpoint_ciphertext`` is LangGraph's checkpoint JSON (channel values as the
    serializer's ``{"type", "b64"}``, never decoded here) and ``metadata_ciphertext`` its
    metadata JSON, each encrypted like a payload (the metadata apart, so a list filter
    decrypts only it). ``lg_run_id`` is ``metadata["run_id"]`` in clear (for
    ``delete_for_runs``), ``""`` when there is none. ``envelope_revision`` is the
    envelope revision the put that stored this row wrote (its answer's ``revision``).
    Unique per (tenant, thread, namespace, checkpoint id); thread, namespace and id compare
    byte-wise on PostgreSQL (collation "C", migration 0016), as Python and SQLite compare.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+",
                               db_index=False)  # the unique key and indexes start with it
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="graph_checkpoints",
                            db_index=False)  # (run, ...) is never a query of its own
    envelope = models.ForeignKey(Checkpoint, on_delete=models.PROTECT,
                                 related_name="graph_checkpoints")
    thread_id = models.CharField(max_length=256)
    checkpoint_ns = models.CharField(max_length=256, blank=True)
    checkpoint_id = models.CharField(max_length=128)
    parent_checkpoint_id = models.CharField(max_length=128, blank=True,
                                            help_text='"" when the checkpoint has no parent')
    lg_run_id = models.CharField(max_length=128, blank=True,
                                 help_text='LangGraph\'s metadata["run_id"], "" without one')
    checkpoint_ciphertext = models.TextField()
    metadata_ciphertext = models.TextField()
    payload_size = models.PositiveIntegerField(
        help_text="bytes of the checkpoint's and the metadata's JSON text")
    envelope_revision = models.BigIntegerField()
    created_at = models.DateTimeField(help_text="database time of the put")
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "thread_id", "checkpoint_ns", "checkpoint_id"],
                                    name="graph_checkpoint_unique"),
        ]
        indexes = [
            # ``GET …/langgraph/checkpoints`` without a thread: the tenant's newest first.
            models.Index(fields=["tenant", "-checkpoint_id"], name="graph_checkpoint_new_idx"),
            # ... of one thread, every namespace (the unique key orders by namespace first).
            models.Index(fields=["tenant", "thread_id", "-checkpoint_id"],
                         name="graph_checkpoint_thread_idx"),
            # ``POST …/langgraph/runs/delete``.
            models.Index(fields=["tenant", "lg_run_id"], name="graph_checkpoint_lg_run_idx"),
        ]

    def __str__(self) -> str:
        return f"graph checkpoint {self.thread_id}/{self.checkpoint_ns}/{self.checkpoint_id}"


class GraphWrite(TenantOwned):
    """One pending write of a LangGraph task on a checkpoint (``put_writes``): ``value``
    is the serializer's ``{"type", "b64"}`` JSON, encrypted (``value_ciphertext``).
    Unique per (checkpoint, task, idx); ``idx`` < 0 marks LangGraph's special channels
    (error, interrupt, scheduled, resume), which a later write replaces."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    graph_checkpoint = models.ForeignKey(GraphCheckpoint, on_delete=models.CASCADE,
                                         related_name="writes",
                                         db_index=False)  # the unique key starts with it
    task_id = models.CharField(max_length=128)
    task_path = models.CharField(max_length=1024, blank=True)
    idx = models.IntegerField()
    channel = models.CharField(max_length=256)
    value_ciphertext = models.TextField()
    value_size = models.PositiveIntegerField(help_text="bytes of the value's JSON text")
    created_at = models.DateTimeField(help_text="database time of the write")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["graph_checkpoint", "task_id", "idx"],
                                    name="graph_write_unique"),
        ]
