from checkpoints.models import Run
from tests.helpers import envelope, put_checkpoint


def test_it_creates_a_run_with_the_first_checkpoint(acme, wendy):
    body = envelope()
    cp = put_checkpoint(wendy, acme, body)
    assert cp.revision == 0
    assert Run.objects.get(uuid=body["run_id"]).recovery_state == "healthy"
