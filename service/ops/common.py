"""What operator commands share: who runs one (the owner its claim and entries carry in the txnlog's
history)."""

from __future__ import annotations

import getpass
import os
import socket


def command_owner(command: str) -> str:
    """``icesink <command> (<user>@<host>:<pid>)``, e.g. ``icesink offsets reset (ops@host:42)``.

    ``getpass.getuser()`` raises in a container run with a UID that has no passwd entry (and no
    ``USER``/``LOGNAME``): the numeric uid stands in for the name then.
    """
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"icesink {command} ({user}@{socket.gethostname()}:{os.getpid()})"
