"""Whether the deployment's background worker runs: the one rule that the dashboard's
banner ("Background work is not running ...", templates/base.html) and ``/readyz``'s
``worker`` check (``checkpoints.ops.health``) both read.

Two copies of this rule drifted (a newcomer's finding): the banner called a worker late
after two sweep intervals (20 s) and said "no sweep has finished yet" while ``/readyz``
waited ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S`` (60 s) and showed ``sweep.web`` 7 s ago.
Now both ask ``worker_status``: one source, one bound, one grace for a fresh start.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from .. import heartbeat
from . import inprocess


@dataclass(frozen=True)
class WorkerStatus:
    """The deployment's background worker as read now (database clock).

    - ``source``: the heartbeat that shows it runs (``heartbeat.background_source``:
      ``sweep.celery`` with a broker, ``sweep.inprocess`` embedded, ``sweep`` when no
      worker is expected);
    - ``expected``: whether a worker is expected at all (a broker or the in-process
      worker); when not, ``late`` is always false;
    - ``late``: its last sweep is older than ``bound_s`` or absent, past the grace of a
      fresh in-process worker (``inprocess.first_round_pending``);
    - ``last``: its last sweep (None: never);
    - ``last_any``: the last sweep by anyone (the ``sweep`` heartbeat, e.g. the web
      process catching up, ``sweep.web``); None: never;
    - ``web_sweeps``: the web processes sweep while it is late (a broker and
      ``RECOVERY_SWEEP_WATCHDOG``);
    - ``bound_s``: ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S``, seconds.
    """

    source: str
    expected: bool
    late: bool
    last: heartbeat.Beat | None
    last_any: heartbeat.Beat | None
    web_sweeps: bool
    bound_s: int

    def detail(self) -> str:
        """One line for a log: ``"sweep.celery: last 75 s ago"`` or ``"...: never"``."""
        return f"{self.source}: " + (f"last {self.last.age_s:.0f} s ago" if self.last
                                     else "never")


def worker_status(beats: dict[str, heartbeat.Beat] | None = None) -> WorkerStatus:
    """Read the background worker's state (one query for the heartbeats unless ``beats``
    is given; none when no worker is expected). Raises the database's error when it
    cannot answer (the callers say so their own way). The rule: late when the
    ``source`` heartbeat is older than ``RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S`` or absent,
    except during the first such span after this process started its in-process worker
    (its first round may not have come yet). Reads only."""
    source = heartbeat.background_source()
    bound = settings.RECOVERY_WORKER_HEARTBEAT_MAX_AGE_S
    web_sweeps = heartbeat.broker_configured() and settings.RECOVERY_SWEEP_WATCHDOG
    if source == heartbeat.SWEEP:
        return WorkerStatus(source, False, False, None, None, web_sweeps, bound)
    beats = heartbeat.read() if beats is None else beats
    last = beats.get(source)
    late = last is None or last.age_s > bound
    if late and source == "sweep.inprocess" and inprocess.first_round_pending():
        late = False  # this process's worker has not had its first round yet
    return WorkerStatus(source, True, late, last, beats.get(heartbeat.SWEEP), web_sweeps,
                        bound)
