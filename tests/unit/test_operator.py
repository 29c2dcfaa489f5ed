"""The owner an operator command records in the txnlog's history."""

from __future__ import annotations

import os

import pytest

from service.ops.common import command_owner


def test_a_user_without_a_name_is_recorded_by_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container run with an arbitrary UID has no passwd entry: getpass.getuser() raises there."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pwd.getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    owner = command_owner("txnlog abandon")
    assert owner.startswith(f"icesink txnlog abandon ({os.getuid()}@") and owner.endswith(f":{os.getpid()})")
