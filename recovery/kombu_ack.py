"""A worker that could not acknowledge a message must keep consuming (issue 17, item 11).

kombu's Redis transport counts a delivered message against the prefetch limit until its
ack (or reject) reaches Redis: ``QoS.ack`` first removes the message from Redis's
``unacked`` keys, and only then forgets it locally. When that first step fails (the
broker frozen or partitioned, not closed: the ack times out while the consumer's own
connection looks alive), the delivery is never forgotten. With this service's prefetch
of one (``CELERY_WORKER_PREFETCH_MULTIPLIER = 1``, concurrency 1 per slot), the worker
then never fetches again: alive, connected, silent, for good (seen with kombu 5.6.2 and
5.7.0; ``tests/celery/test_broker_outage.py``, the ``freeze`` outage).

``SafeAckQoS`` forgets such a delivery locally anyway and re-raises (Celery still logs
"Couldn't ack"). Nothing is lost: Redis keeps the message in its ``unacked`` hash and
gives it back after ``visibility_timeout``; the redelivered job finds its stored request
already done (``reconciliation.execute``: "skipped"), so it runs once.

``install()`` (called by ``recovery/celery.py``) makes the Redis transport's channels use
it; every other transport is left alone.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual


class SafeAckQoS(kombu_redis.QoS):
    """``kombu.transport.redis.QoS`` whose ack and reject free the prefetch slot even
    when Redis could not be told (the error is re-raised)."""

    def ack(self, delivery_tag):
        try:
            super().ack(delivery_tag)
        except self.channel.connection_errors:
            virtual.QoS.ack(self, delivery_tag)
            raise

    def reject(self, delivery_tag, requeue=False):
        try:
            super().reject(delivery_tag, requeue=requeue)
        except self.channel.connection_errors:
            virtual.QoS.ack(self, delivery_tag)
            raise


def install() -> None:
    """Use ``SafeAckQoS`` for every Redis channel of this process (idempotent)."""
    kombu_redis.Channel.QoS = SafeAckQoS
