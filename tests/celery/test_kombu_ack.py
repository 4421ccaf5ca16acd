"""``recovery/kombu_ack.py`` without a broker: an ack or reject that cannot reach Redis
still frees the prefetch slot (issue 17, item 11), where kombu's own Redis QoS keeps the
delivery counted for good (a worker with a prefetch of one then never fetches again;
the real-worker version of this is tests/celery/test_broker_outage.py, ``freeze``)."""

from __future__ import annotations

import pytest
import redis
from kombu.transport import redis as kombu_redis

from recovery.kombu_ack import SafeAckQoS


class Channel:
    connection_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
    do_restore = False  # nothing to restore when the test's QoS is collected


def _delivered_once(cls):
    qos = cls(Channel(), prefetch_count=1)
    qos._delivered["tag-1"] = object()  # what append() records locally
    assert not qos.can_consume()  # the one slot is taken

    def unreachable(*args, **kwargs):
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    qos._remove_from_indices = unreachable
    qos.restore_by_tag = unreachable
    return qos


@pytest.mark.parametrize("settle", ["ack", "reject"])
def test_a_settlement_redis_never_heard_of_still_frees_the_slot(settle):
    kombus = _delivered_once(kombu_redis.QoS)
    with pytest.raises(redis.exceptions.TimeoutError):
        getattr(kombus, settle)("tag-1")
    assert not kombus.can_consume()  # the fault: kombu's own QoS stays full

    ours = _delivered_once(SafeAckQoS)
    with pytest.raises(redis.exceptions.TimeoutError):  # still raised: Celery logs it
        getattr(ours, settle)("tag-1")
    assert ours.can_consume()


def test_the_celery_app_installs_it_for_redis_channels():
    import recovery.celery  # noqa: F401 - installs on import

    assert kombu_redis.Channel.QoS is SafeAckQoS
