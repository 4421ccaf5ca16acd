"""Shapes of the LangGraph thread API (issue 10, docs/langgraph.md): the bodies of its
writes and its answers."""

from __future__ import annotations

from rest_framework import serializers

from .common import Answer


class TypedValueSerializer(serializers.Serializer):
    """A value as LangGraph's serializer wrote it (``dumps_typed``): its type tag and its
    bytes in standard base64. The server never decodes it."""

    type = serializers.CharField(max_length=64)
    b64 = serializers.CharField(allow_blank=True)


class GraphPutInputSerializer(serializers.Serializer):
    """``POST …/langgraph/checkpoints`` body."""

    thread_id = serializers.CharField(max_length=256)
    checkpoint_ns = serializers.CharField(max_length=256, allow_blank=True, required=False,
                                          help_text='default ""')
    parent_checkpoint_id = serializers.CharField(max_length=128, allow_null=True,
                                                 required=False)
    checkpoint = serializers.JSONField(
        help_text="LangGraph's checkpoint: id, v, ts, channel_values ({channel: "
                  "{type, b64}}), channel_versions, versions_seen, updated_channels")
    metadata = serializers.JSONField(help_text="LangGraph's checkpoint metadata (an object)")
    identity = serializers.DictField(child=serializers.CharField(allow_blank=True),
                                     required=False,
                                     help_text="agent, model, workflow, definition_version")
    sends = serializers.IntegerField(
        min_value=0, max_value=2**31 - 1, required=False,
        help_text="the Send packets pending in __pregel_tasks, counted by the saver")
    interrupt_before = serializers.JSONField(
        required=False, help_text='the graph\'s static breakpoints: null, "*" or node names')
    interrupt_after = serializers.JSONField(
        required=False, help_text='the graph\'s static breakpoints: null, "*" or node names')


# Rendered from ``langgraph.graph_put``'s answer.
class GraphPutSerializer(Answer):
    """A stored LangGraph checkpoint: its run and the envelope revision its put wrote."""

    thread_id = serializers.CharField()
    checkpoint_ns = serializers.CharField(allow_blank=True)
    checkpoint_id = serializers.CharField()
    run_id = serializers.UUIDField()
    revision = serializers.IntegerField()


class GraphWriteInputSerializer(serializers.Serializer):
    idx = serializers.IntegerField(min_value=-2**31, max_value=2**31 - 1)
    channel = serializers.CharField(max_length=256)
    value = TypedValueSerializer()


class GraphWritesInputSerializer(serializers.Serializer):
    """``POST …/langgraph/writes`` body."""

    thread_id = serializers.CharField(max_length=256)
    checkpoint_ns = serializers.CharField(max_length=256, allow_blank=True, required=False)
    checkpoint_id = serializers.CharField(max_length=128)
    task_id = serializers.CharField(max_length=128)
    task_path = serializers.CharField(max_length=1024, allow_blank=True, required=False)
    writes = GraphWriteInputSerializer(many=True)


class StoredSerializer(Answer):
    """How many pending writes the call inserted or replaced."""

    stored = serializers.IntegerField()


class PendingWriteSerializer(Answer):
    task_id = serializers.CharField()
    channel = serializers.CharField()
    value = serializers.JSONField(help_text="{type, b64}")
    idx = serializers.IntegerField()


class GraphTupleSerializer(Answer):
    """One LangGraph checkpoint as stored, with its pending writes (task path, task id,
    idx order)."""

    thread_id = serializers.CharField()
    checkpoint_ns = serializers.CharField(allow_blank=True)
    checkpoint_id = serializers.CharField()
    parent_checkpoint_id = serializers.CharField(allow_null=True)
    run_id = serializers.UUIDField()
    checkpoint = serializers.JSONField()
    metadata = serializers.JSONField()
    pending_writes = PendingWriteSerializer(many=True)


class GraphPageSerializer(Answer):
    """Newest first; ``next_before`` (pass it as ``before``) is set while more checkpoints
    remain, even when this page holds fewer than ``limit``."""

    results = GraphTupleSerializer(many=True)
    next_before = serializers.CharField(allow_null=True)


class ThreadInputSerializer(serializers.Serializer):
    thread_id = serializers.CharField(max_length=256)


class ThreadCopyInputSerializer(serializers.Serializer):
    source_thread_id = serializers.CharField(max_length=256)
    target_thread_id = serializers.CharField(max_length=256)


class ThreadPruneInputSerializer(serializers.Serializer):
    thread_ids = serializers.ListField(child=serializers.CharField(max_length=256),
                                       max_length=1000)
    strategy = serializers.ChoiceField(choices=["keep_latest", "delete"])


class RunsDeleteInputSerializer(serializers.Serializer):
    run_ids = serializers.ListField(child=serializers.CharField(max_length=128),
                                    max_length=1000, help_text="LangGraph run ids")


class DeletedSerializer(Answer):
    """How many LangGraph checkpoints the call deleted."""

    deleted = serializers.IntegerField()


class CopiedSerializer(Answer):
    """How many LangGraph checkpoints the call copied."""

    copied = serializers.IntegerField()
