"""``make demo`` with ``CELERY_BROKER_URL`` naming a broker that does not answer: it
refuses before it recreates the SQLite database (it used to delete the database first,
then find the broker down, leaving the operator with neither); on PostgreSQL, where the
database is checked first, a filled database is refused before the broker's queue is
emptied."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import closed_port

from .conftest import ROOT


@pytest.mark.parametrize("broker", ["closed port", "notascheme://x"])
def test_a_demo_whose_broker_does_not_answer_keeps_the_database(tmp_path, broker):
    # An unknown scheme (stop 40's attack) was a KeyError traceback from kombu.
    database = tmp_path / "recovery.sqlite3"
    database.write_bytes(b"an earlier demo's database")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(RECOVERY_VAR_DIR=str(tmp_path),
               CELERY_BROKER_URL=f"redis://127.0.0.1:{closed_port()}/0"
               if broker == "closed port" else broker)
    proc = subprocess.run([sys.executable, "manage.py", "demo", "--no-serve"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "the broker in CELERY_BROKER_URL does not answer" in proc.stderr
    assert database.read_bytes() == b"an earlier demo's database"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the demo closes its connections
def test_on_postgresql_a_filled_database_is_refused_before_the_broker_is_emptied(
        acme, settings, monkeypatch, tmp_path):
    # Stop 40's attack: on PostgreSQL the demo emptied the broker's queue first, then found
    # the database filled (a live deployment's) and refused, its queue already gone.
    from django.core.management import CommandError, call_command

    from checkpoints.management.commands import demo

    purged = []
    monkeypatch.setattr(demo.Command, "_broker_connection", lambda self: "a connection")
    monkeypatch.setattr(demo.Command, "_purge_broker",
                        lambda self, conn=None: purged.append(True))
    settings.CELERY_TASK_ALWAYS_EAGER = False  # a broker is configured
    settings.VAR_DIR = tmp_path
    with pytest.raises(CommandError, match="tenants already exist .*acme"):
        call_command("demo", "--no-serve")
    assert purged == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the demo closes its connections
def test_a_deployments_database_is_refused_before_its_queue_is_emptied(
        settings, monkeypatch, tmp_path):
    # Stop 41's attack: "filled" meant the demo's own tenants; a live deployment's
    # database (tenants of its own) had its queue emptied and the demo tenants added.
    from django.core.management import CommandError, call_command

    from checkpoints import services
    from checkpoints.management.commands import demo

    services.tenant_create(slug="prod", name="a deployment's tenant")
    purged = []
    monkeypatch.setattr(demo.Command, "_broker_connection", lambda self: "a connection")
    monkeypatch.setattr(demo.Command, "_purge_broker",
                        lambda self, conn=None: purged.append(True))
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.VAR_DIR = tmp_path
    with pytest.raises(CommandError, match=r"tenants already exist .*\(prod\)"):
        call_command("demo", "--no-serve")
    assert purged == []
