"""Password rules (issue 6, fault 5): every password set goes through Django's
AUTH_PASSWORD_VALIDATORS (at least 12 characters, not a common password, not only digits,
not like the username): ``services.account_create``, so ``create_account
--password-stdin``, and Django's own forms and commands (admin, ``changepassword``)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import SetPasswordForm
from django.core.management import CommandError, call_command

from checkpoints import services
from checkpoints.exceptions import InvalidPayload
from checkpoints.management.commands.demo import PASSWORD as DEMO_PASSWORD
from tests.conftest import PASSWORD as TEST_PASSWORD

User = get_user_model()
ROOT = Path(__file__).resolve().parent.parent

WEAK = [
    ("a", "too short"),
    ("correct-hors", None),  # 12 characters: long enough (the control case)
    ("short-pass1", "too short"),
    ("password1234", "too common"),
    ("qwerty123456", "too common"),
    ("190377102938475612", "entirely numeric"),
    ("margaretthatcher1", "too similar to the username"),
]


@pytest.mark.parametrize(("password", "refusal"), WEAK)
def test_create_account_refuses_a_weak_password_with_the_rule_it_breaks(db, password, refusal):
    args = ["create_account", "margaretthatcher", "--password-stdin"]
    if refusal is None:
        call_command(*args, stdin=io.StringIO(password + "\n"), stdout=io.StringIO())
        assert User.objects.get(username="margaretthatcher").check_password(password)
        return
    with pytest.raises(CommandError, match=f"password: .*{refusal}"):
        call_command(*args, stdin=io.StringIO(password + "\n"), stdout=io.StringIO())
    assert not User.objects.exists()


def test_the_service_refuses_a_weak_password_and_stores_nothing(db):
    with pytest.raises(InvalidPayload, match="password: This password is too short"):
        services.account_create(username="ann", password="pw")
    assert not User.objects.exists()


def test_a_service_account_has_no_password_to_check(db):
    user = services.account_create(username="bot", password="pw", service=True)
    assert not user.has_usable_password()


def test_django_password_forms_apply_the_same_rules(db):
    user = services.account_create(username="ann", password=TEST_PASSWORD)
    form = SetPasswordForm(user, {"new_password1": "ann12345", "new_password2": "ann12345"})
    assert not form.is_valid()
    assert "too short" in " ".join(form.errors["new_password2"])
    strong = "a-longer-pass-phrase"
    form = SetPasswordForm(user, {"new_password1": strong, "new_password2": strong})
    assert form.is_valid()


@pytest.mark.parametrize("password", [TEST_PASSWORD, DEMO_PASSWORD])
def test_the_demo_and_test_passwords_satisfy_the_rules(db, password):
    for username in ("rita", "acme-reviewer", "globex-approver2"):
        services.account_create(username=username, password=password)


# Its own SQLite file in a child process whichever pass runs it: make test runs it once.
@pytest.mark.once
def test_the_command_line_exits_non_zero_with_the_rule_not_a_traceback(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RECOVERY_VAR_DIR": str(tmp_path),
           "RECOVERY_SQLITE_PATH": str(tmp_path / "cli.sqlite3")}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, capture_output=True)
    done = subprocess.run([*manage, "create_account", "rita", "--password-stdin"], env=env,
                          input="x\n", capture_output=True, text=True)
    assert done.returncode == 1
    assert ("CommandError: password: This password is too short. It must contain at least "
            "12 characters.") in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([*manage, "create_account", "rita", "--password-stdin"], env=env,
                          input="a-sound-pass-phrase\n", capture_output=True, text=True)
    assert done.returncode == 0 and "created account rita" in done.stdout
