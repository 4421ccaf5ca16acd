"""``HttpCheckpointStore.revisions`` follows the API's paged revision list (issue 6):
every revision, oldest first, whatever the page size."""

from __future__ import annotations

import pytest

from checkpoints.models import AuditEvent
from recovery_client.client import next_revision
from tests.helpers import envelope

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_reads_every_page_of_revisions(store):
    body = envelope()
    assert store.compare_and_swap(body, None) == 0
    for rev in range(1, 23):  # 23 revisions: two pages of the default 20
        body = next_revision(body, {"phase": "charging", "n": rev})
        assert store.compare_and_swap(body, rev - 1) == rev
    revisions = store.revisions(body["id"])
    assert [r["revision"] for r in revisions] == list(range(23))
    assert revisions[-1]["payload"] == {"phase": "charging", "n": 22}
    assert AuditEvent.objects.filter(action="payload.export").count() == 2
