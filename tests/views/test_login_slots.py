"""Login slots (checkpoints.ops.security.LoginSlotsMiddleware): a login POST runs only while it
holds one of RECOVERY_LOGIN_SLOTS machine-wide slots, so guessers spread over many
addresses (which no lockout catches) cannot put more than that many cores to hashing.
With every slot taken, a login POST is answered 429 with Retry-After, nothing hashed."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.hashers import get_hasher
from django.test import Client, override_settings
from django.urls import reverse

from checkpoints.ops.security import acquire_login_slot, release_login_slot
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

LOGIN = reverse("login")


@pytest.fixture
def one_slot(tmp_path):
    with override_settings(RECOVERY_LOGIN_SLOTS=1, RECOVERY_LOGIN_SLOT_WAIT_MS=0,
                           RECOVERY_LOGIN_SLOT_DIR=str(tmp_path)):
        yield tmp_path


@pytest.fixture
def hashes(monkeypatch):
    counter = {"n": 0}
    hasher = type(get_hasher())
    encode = hasher.encode

    def counting_encode(self, *args, **kwargs):
        counter["n"] += 1
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(hasher, "encode", counting_encode)
    return counter


def login(url=LOGIN, password=PASSWORD):
    client = Client()
    response = client.post(url, {"username": "rita", "password": password})
    return client, response


def test_a_login_with_a_free_slot_goes_through(one_slot, rita):
    client, response = login()
    assert response.status_code == 302 and "_auth_user_id" in client.session
    # ... and gives the slot back.
    slot = acquire_login_slot(0)
    assert slot is not None
    release_login_slot(slot)


@pytest.mark.parametrize("url", [LOGIN, "/admin/login/"])
def test_with_every_slot_taken_a_login_is_refused_before_hashing(one_slot, rita, hashes, url):
    held = acquire_login_slot(0)
    try:
        for password in (PASSWORD, "wrong-guess"):
            client, response = login(url, password)
            assert response.status_code == 429
            assert response["Retry-After"] == "1"
            assert "Too many logins at once" in response.content.decode()
            assert "_auth_user_id" not in client.session
        assert hashes["n"] == 0
        assert not AccessAttempt.objects.exists()  # a busy refusal is no failed login
    finally:
        release_login_slot(held)
    client, response = login()
    assert response.status_code == 302 and "_auth_user_id" in client.session


def test_other_requests_never_wait_for_a_slot(one_slot, rita, wendy):
    held = acquire_login_slot(0)
    try:
        assert Client().get(LOGIN).status_code == 200
        client = Client()
        client.force_login(rita)
        assert client.get(reverse("run_list", args=["acme"])).status_code == 200
    finally:
        release_login_slot(held)


def test_a_second_slot_lets_a_second_login_through(tmp_path, rita):
    with override_settings(RECOVERY_LOGIN_SLOTS=2, RECOVERY_LOGIN_SLOT_WAIT_MS=0,
                           RECOVERY_LOGIN_SLOT_DIR=str(tmp_path)):
        held = acquire_login_slot(0)
        try:
            assert login()[1].status_code == 302
        finally:
            release_login_slot(held)


def test_a_slot_held_by_another_process_counts(one_slot, rita):
    """Slots are machine-wide: another worker process holding the only one blocks logins."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({str(one_slot / 'slot-0')!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert login()[1].status_code == 429
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert login()[1].status_code == 302


def test_a_login_waits_for_a_slot_up_to_the_configured_wait(tmp_path, rita):
    """A slot given back while the POST waits is taken (the wait is a bound, not a delay)."""
    with override_settings(RECOVERY_LOGIN_SLOTS=1, RECOVERY_LOGIN_SLOT_WAIT_MS=10_000,
                           RECOVERY_LOGIN_SLOT_DIR=str(tmp_path)):
        held = acquire_login_slot(0)
        threading.Timer(0.2, release_login_slot, args=(held,)).start()
        assert login()[1].status_code == 302
