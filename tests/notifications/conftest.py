import pytest

from tests.notifications.receiver import Receiver


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def loopback_allowed(settings):
    """The operator allows private addresses and plain http (the receiver is on
    loopback), and a short send timeout."""
    settings.RECOVERY_NOTIFY_ALLOW_PRIVATE = True
    settings.RECOVERY_NOTIFY_ALLOW_HTTP = True
    settings.RECOVERY_NOTIFY_TIMEOUT_S = 2
    return settings
