"""``recovery_client.protocol``: what the server and the clients agree on (thread ids to
run and checkpoint ids, the limits both check). Standard library only."""

from __future__ import annotations

import uuid

import pytest

from recovery_client import protocol


def test_thread_ids_map_to_fixed_uuids():
    # Pinned: a change of NAMESPACE or of the name layout would move every stored
    # thread onto a new run (the server derives the same ids).
    assert protocol.NAMESPACE == uuid.UUID("6f1c2b0e-4a7d-5c3e-9b8f-1d2e3f405162")
    assert protocol.thread_run_id("t-1") == uuid.UUID("a6092d63-9fca-526a-9e55-19ec4a866ca7")
    assert protocol.thread_checkpoint_id("t-1", "") == uuid.UUID(
        "c7c86578-c997-5da5-89c8-6c2f2a84b134")
    assert protocol.thread_run_id("t-1") == uuid.uuid5(protocol.NAMESPACE, "thread\x1ft-1")


def test_run_and_checkpoint_ids_are_distinct_per_thread_and_namespace():
    ids = {protocol.thread_run_id("a"), protocol.thread_run_id("b"),
           protocol.thread_checkpoint_id("a", ""), protocol.thread_checkpoint_id("a", "sub"),
           protocol.thread_checkpoint_id("b", "")}
    assert len(ids) == 5
    # The separator keeps ("a", "b:c") and ("a:b", "c")-style pairs apart.
    assert protocol.thread_checkpoint_id("ab", "c") != protocol.thread_checkpoint_id("a", "bc")


@pytest.mark.parametrize("bad", [1, None, b"t-1", uuid.uuid4()])
def test_non_strings_are_a_type_error(bad):
    with pytest.raises(TypeError, match="thread_id must be a string"):
        protocol.thread_run_id(bad)
    with pytest.raises(TypeError, match="checkpoint_ns must be a string"):
        protocol.thread_checkpoint_id("t-1", bad)


def test_the_limits_are_the_servers():
    assert protocol.KIND == "langgraph.checkpoint"
    assert protocol.MAX_BODY_BYTES == 1024 * 1024  # CONTRACT.md 6, RECOVERY_MAX_BODY_BYTES
    assert protocol.DEFAULT_LIMIT <= protocol.MAX_LIMIT
