"""Fail points in the commit path, for fault-injection tests. Inert unless configured.

``ICESINK_FAILPOINTS="after_precommit=kill,during_catalog_commit=raise@2,after_catalog_commit=delay:5"``
switches them on: ``kill`` ends the process at once (``os._exit``, as SIGKILL would: no cleanup, no
flush), ``raise`` raises :class:`InjectedFault`, ``delay:S`` sleeps S seconds, ``wait:FILE`` waits until
the file FILE exists (a path without ``,`` or ``@``; at most :data:`WAIT_LIMIT_S`): a test holds the
process at the point for exactly as long as its other side takes, however slow the machine. ``@N``
fires on the N-th time the point is reached (default: the first).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POINTS = (
    "before_precommit",
    "after_precommit",
    "during_catalog_commit",
    "after_catalog_commit",
    "after_log_commit",
    "maintenance_before_task",  # icesink maintain: before a task's precommit (the lease row unlocked)
    "maintenance_during_task",  # icesink maintain: inside a task, its lease row locked, before its procedure
    "during_key_index_build",  # a key index build (delete_format: position), after its first data file
)
ENV = "ICESINK_FAILPOINTS"
KILL_EXIT_CODE = 137
WAIT_LIMIT_S = 600.0  # a wait:FILE whose file never comes goes on after this, with a warning
ACTIONS = "kill, raise, delay:SECONDS, wait:FILE"

logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised by a fail point whose action is ``raise``."""


@dataclass
class _Rule:
    action: str
    arg: str  # delay: seconds; wait: the file
    nth: int
    hits: int = 0


_rules: dict[str, _Rule] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, _Rule]:
    rules: dict[str, _Rule] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = item.partition("=")
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown fail point {name!r}; known: {', '.join(POINTS)}")
        action, _, nth = rest.partition("@")
        verb, _, arg = action.partition(":")
        if verb not in ("kill", "raise", "delay", "wait"):
            raise ValueError(f"{ENV}: unknown action {verb!r} for {name} ({ACTIONS})")
        if verb == "wait" and not arg:
            raise ValueError(f"{ENV}: {name}=wait needs the file to wait for (wait:FILE)")
        if verb == "delay":
            try:
                float(arg or 0)
            except ValueError:
                raise ValueError(f"{ENV}: {name}=delay needs seconds (delay:SECONDS), not {arg!r}") from None
        if not (nth or "1").isdigit():
            raise ValueError(f"{ENV}: {name}: @{nth} is not a count (a path may hold no ',' or '@')")
        rules[name] = _Rule(verb, arg, int(nth or 1))
    return rules


def configure(spec: str | None = None) -> None:
    """Load the rules from ``spec`` or from the environment; called once at start-up."""
    global _rules
    with _lock:
        _rules = parse(os.environ.get(ENV, "") if spec is None else spec)
    if _rules:
        logger.warning(
            "fail points armed: %s", ", ".join(f"{k}={v.action}@{v.nth}" for k, v in _rules.items())
        )


def failpoint(name: str) -> None:
    rule = _rules.get(name)
    if rule is None:
        return
    with _lock:
        rule.hits += 1
        fire = rule.hits == rule.nth
    if not fire:
        return
    logger.warning("fail point %s: %s", name, rule.action)
    if rule.action == "kill":
        sys.stderr.write(f"fail point {name}: killing the process\n")
        sys.stderr.flush()
        os._exit(KILL_EXIT_CODE)
    if rule.action == "raise":
        raise InjectedFault(f"fail point {name}")
    if rule.action == "delay":
        time.sleep(float(rule.arg or 0))
        return
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not Path(rule.arg).exists():
        if time.monotonic() > deadline:
            logger.warning(
                "fail point %s: %s never appeared in %.0fs; going on", name, rule.arg, WAIT_LIMIT_S
            )
            return
        time.sleep(0.1)
    logger.warning("fail point %s: %s appeared; going on", name, rule.arg)
