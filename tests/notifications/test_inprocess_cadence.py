"""Without a broker the in-process worker runs the notification round every
``RECOVERY_NOTIFY_INTERVAL_S`` (5 s), not only with the sweep (every 10 s): a message
waits for the notification interval (``jobs.inprocess._loop``)."""

from __future__ import annotations

import threading
import time

from checkpoints.jobs import inprocess


def test_the_notification_round_runs_between_sweeps_at_its_own_interval(monkeypatch):
    rounds, notified = [], []
    monkeypatch.setattr(inprocess, "_notify", lambda stats: notified.append(time.monotonic()))
    stop = threading.Event()
    worker = threading.Thread(target=inprocess._loop, args=(
        0.4, stop, lambda: rounds.append(time.monotonic()), 0.1))
    worker.start()
    time.sleep(2.1)
    stop.set()
    worker.join(timeout=5)
    # About 5 sweep rounds (each also notifies, inside run_once) and 15 lone notifications.
    assert 3 <= len(rounds) <= 6, rounds
    assert len(notified) >= 2 * len(rounds), (len(notified), len(rounds))


def test_with_no_notify_interval_the_loop_runs_its_round_only(monkeypatch):
    rounds, notified = [], []
    monkeypatch.setattr(inprocess, "_notify", lambda stats: notified.append(1))
    stop = threading.Event()
    worker = threading.Thread(target=inprocess._loop, args=(
        0.2, stop, lambda: rounds.append(1)))
    worker.start()
    time.sleep(1.1)
    stop.set()
    worker.join(timeout=5)
    assert 3 <= len(rounds) <= 6 and notified == []
