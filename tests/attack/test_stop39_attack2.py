"""Stop 39, second attack: the lease release (API and SDK), the SDK's per-run tokens,
``/readyz?scope=node``, ``export_keyring --out``. Each finding is a test of what SHOULD
hold, marked ``xfail(strict=True)`` with the fault in one line; tests without a mark are
attacks that failed (kept where they cover something not yet tested)."""

from __future__ import annotations

import pytest

from recovery_client.client import next_revision
from tests.client.conftest import make_store, open_store, store  # noqa: F401 - fixtures
from tests.helpers import envelope

pytestmark = pytest.mark.django_db(transaction=True)


def _create(store) -> dict:  # noqa: F811 - the fixture's name
    body = envelope()
    assert store.compare_and_swap(body, None) == 0
    return body


@pytest.mark.xfail(strict=True, reason="FINDING: the SDK keys its per-run fencing tokens by "
                   "the run id's spelling: a run leased as its upper-case UUID (which the "
                   "server takes) has its own writes sent without a token and fenced")
def test_a_run_leased_in_another_spelling_of_its_id_keeps_its_token(store):  # noqa: F811
    first = _create(store)
    run_id = first["run_id"]
    taken = store.lease(run_id.upper(), "worker-1", ttl_s=3600)  # the same run, per the server
    assert taken["fencing_token"] == 1
    assert store.compare_and_swap(next_revision(first, {"phase": "charging"}), 0) == 1
    assert store.fencing_token_of(run_id) == 1
