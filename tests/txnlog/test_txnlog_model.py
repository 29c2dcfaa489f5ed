"""Property test: random interleavings of several leases' operations against a reference model.

A hypothesis state machine claims (making new leases, fencing old ones) and, through any lease it
holds, precommits, commits (plain or through ``committing``), and aborts — optionally losing the
connection just before or just after the Postgres COMMIT, which the log must retry without double
applying. After every step the real row must equal the model, and these safety properties must hold
whatever the model says:

* a write through a fenced lease never changes the row;
* a committed payload is exactly a payload that was precommitted under that seq, and it was
  committed by the epoch that was live at the time;
* epoch, seq and committed seq never go backwards.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from txnlog import Fenced, InvalidPhase, Lease, Phase, SinkState, TransactionLog

MakeLog = Callable[..., TransactionLog]
SEEN: Counter[str] = Counter()  # outcomes reached, to show the run was not vacuous
FAULTS = st.sampled_from([None, None, "before_commit", "after_commit"])
PAYLOADS = st.builds(lambda n: {"n": n, "files": [f"f{n}.parquet"]}, st.integers(0, 3))


@dataclass(frozen=True)
class Model:
    """The reference: the sink row's protocol fields and what each operation must do to them."""

    epoch: int = 0  # 0: no row yet
    phase: Phase = Phase.IDLE
    seq: int = 0
    payload: dict[str, Any] | None = None
    precommit_epoch: int | None = None
    committed_seq: int | None = None
    committed_epoch: int | None = None
    committed_payload: dict[str, Any] | None = None

    def claim(self) -> Model:
        return replace(self, epoch=self.epoch + 1)

    def precommit(self, epoch: int, payload: dict[str, Any]) -> tuple[str, Model]:
        if epoch != self.epoch:
            return "fenced", self
        if self.phase is Phase.PRECOMMIT:
            same = self.precommit_epoch == epoch and self.payload == payload
            return ("ok" if same else "invalid"), self
        return "ok", replace(
            self, phase=Phase.PRECOMMIT, seq=self.seq + 1, payload=payload, precommit_epoch=epoch
        )

    def commit(self, epoch: int, seq: int | None, *, locked: bool = False) -> tuple[str, Model]:
        if not locked and seq is not None and (self.committed_seq, self.committed_epoch) == (seq, epoch):
            return "ok", self  # that very plan was already committed by this epoch
        if epoch != self.epoch:
            return "fenced", self
        if self.phase is not Phase.PRECOMMIT or (seq is not None and seq != self.seq):
            return "invalid", self
        return "ok", replace(
            self,
            phase=Phase.COMMITTED,
            committed_seq=self.seq,
            committed_epoch=epoch,
            committed_payload=self.payload,
        )

    def abort(self, epoch: int) -> tuple[str, Model]:
        if epoch != self.epoch:
            return "fenced", self
        if self.phase is not Phase.PRECOMMIT:
            return "ok", self
        phase = Phase.COMMITTED if self.committed_seq is not None else Phase.IDLE
        return "ok", replace(self, phase=phase, payload=None, precommit_epoch=None)

    def matches(self, s: SinkState) -> bool:
        return (
            s.epoch,
            s.phase,
            s.seq,
            s.payload,
            s.precommit_epoch,
            s.committed_seq,
            s.committed_epoch,
            s.committed_payload,
        ) == (
            self.epoch,
            self.phase,
            self.seq,
            self.payload,
            self.precommit_epoch,
            self.committed_seq,
            self.committed_epoch,
            self.committed_payload,
        )


class BodyFailed(Exception):
    """Stands for a failed Iceberg commit inside ``committing``."""


class TxnLogMachine(RuleBasedStateMachine):
    log: ClassVar[TransactionLog]

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.sink_id = f"prop-{uuid.uuid4().hex[:12]}"
        self.model = Model()
        self.precommitted: dict[int, dict[str, Any]] = {}  # seq -> payload, from successful precommits
        self.last: SinkState | None = None
        self.newest: Lease | None = None

    def _pick(self, drawn: Lease, newest: bool) -> Lease:
        """Mostly act through the newest lease (else the run is mostly fenced calls), sometimes any."""
        return self.newest if newest and self.newest is not None else drawn

    # -- helpers ----------------------------------------------------------------------------------------

    def _arm(self, operation: str, point: str | None) -> None:
        fired: list[bool] = []

        def hook(op: str, pt: str) -> None:
            if op == operation and pt == point and not fired:
                fired.append(True)
                raise psycopg.OperationalError("injected: connection lost")

        self.log._fault_hook = hook if point else None

    def _run(self, operation: str, fault: str | None, call: Callable[[], object]) -> str:
        self._arm(operation, fault)
        try:
            call()
            outcome = "ok"
        except Fenced:
            outcome = "fenced"
        except InvalidPhase:
            outcome = "invalid"
        finally:
            self.log._fault_hook = None
        label = f"{operation}: {outcome}" + (f" (connection lost {fault})" if fault else "")
        event(label)
        SEEN[label] += 1
        return outcome

    def _expect(self, outcome: str, expected: str, new_model: Model, lease: Lease) -> None:
        assert outcome == expected, f"lease epoch {lease.epoch}: got {outcome}, model says {expected}"
        row_before = self.last
        self.model = new_model
        if outcome == "fenced":
            assert lease.epoch < self.model.epoch
        if outcome in ("fenced", "invalid"):
            assert self.log.state(self.sink_id) == row_before, f"a refused {outcome} write changed the row"

    # -- rules --------------------------------------------------------------------------------------------

    @rule(target=leases, owner=st.sampled_from(["pod-a", "pod-b", "pod-c"]), fault=FAULTS)
    def claim(self, owner: str, fault: str | None) -> Lease:
        self._arm("claim", fault)
        try:
            lease = self.log.claim(self.sink_id, owner)
        finally:
            self.log._fault_hook = None
        self.model = self.model.claim()
        assert lease.epoch == self.model.epoch, "exactly one new epoch per claim call"
        self.newest = lease
        return lease

    @rule(lease=leases, newest=st.integers(0, 2).map(bool), payload=PAYLOADS, fault=FAULTS)
    def precommit(self, lease: Lease, newest: bool, payload: dict[str, Any], fault: str | None) -> None:
        lease = self._pick(lease, newest)
        expected, new_model = self.model.precommit(lease.epoch, payload)
        outcome = self._run("precommit", fault, lambda: self.log.precommit(lease, payload))
        self._expect(outcome, expected, new_model, lease)
        if outcome == "ok":
            self.precommitted.setdefault(self.model.seq, payload)

    @rule(
        lease=leases,
        newest=st.integers(0, 2).map(bool),
        which=st.sampled_from(["none", "current", "previous", "next"]),
        fault=FAULTS,
    )
    def commit(self, lease: Lease, newest: bool, which: str, fault: str | None) -> None:
        lease = self._pick(lease, newest)
        seq = {"none": None, "current": self.model.seq, "previous": self.model.seq - 1}.get(
            which, self.model.seq + 1
        )
        expected, new_model = self.model.commit(lease.epoch, seq)
        outcome = self._run("commit", fault, lambda: self.log.commit(lease, seq=seq))
        self._expect(outcome, expected, new_model, lease)

    @rule(lease=leases, newest=st.integers(0, 2).map(bool), body_fails=st.booleans(), fault=FAULTS)
    def committing(self, lease: Lease, newest: bool, body_fails: bool, fault: str | None) -> None:
        lease = self._pick(lease, newest)
        expected, new_model = self.model.commit(lease.epoch, None, locked=True)
        ran: list[bool] = []

        def call() -> None:
            try:
                with self.log.committing(lease):
                    ran.append(True)
                    if body_fails:
                        raise BodyFailed
            except BodyFailed:
                pass

        outcome = self._run("committing", fault, call)
        if body_fails:
            new_model = self.model  # rolled back: the plan stays pending
        assert bool(ran) == (expected == "ok"), "the block runs only for the live lease with a pending plan"
        self._expect(outcome, expected, new_model, lease)

    @rule(lease=leases, newest=st.integers(0, 2).map(bool), fault=FAULTS)
    def abort(self, lease: Lease, newest: bool, fault: str | None) -> None:
        lease = self._pick(lease, newest)
        expected, new_model = self.model.abort(lease.epoch)
        outcome = self._run("abort", fault, lambda: self.log.abort(lease))
        self._expect(outcome, expected, new_model, lease)

    # -- invariants -----------------------------------------------------------------------------------------

    @invariant()
    def row_matches_model_and_is_safe(self) -> None:
        s = self.log.state(self.sink_id)
        if self.model.epoch == 0:
            assert s is None
            return
        assert s is not None
        assert self.model.matches(s), f"row {s} differs from model {self.model}"
        prev = self.last
        if prev is not None:
            assert s.epoch >= prev.epoch and s.seq >= prev.seq, "epoch/seq went backwards"
            assert (s.committed_seq or 0) >= (prev.committed_seq or 0), "committed seq went backwards"
            if s.committed_seq != prev.committed_seq:
                # A new commit happened in this step: by the epoch that was live.
                assert s.committed_epoch == s.epoch == prev.epoch
        if s.committed_seq is not None:
            assert s.committed_payload == self.precommitted[s.committed_seq], "committed an unknown plan"
        if s.phase is Phase.PRECOMMIT:
            assert s.payload == self.precommitted[s.seq]
        self.last = s


def _settings(examples: int, steps: int, derandomize: bool = False) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=derandomize,
        deadline=None,
        database=None,  # no .hypothesis directory in the checkout
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


MUST_REACH = [
    f"{op}: {outcome}{fault}"
    for op in ("precommit", "commit", "committing", "abort")
    for outcome in ("ok", "fenced")
    for fault in ("", " (connection lost after_commit)")
    if not (outcome == "fenced" and fault)
    # A commit that succeeds after its acknowledgement was lost is asserted deterministically by
    # test_txnlog_protocol.py::test_retries_do_not_double_apply; the fixed-seed run here doesn't draw it.
    and f"{op}: {outcome}{fault}" != "commit: ok (connection lost after_commit)"
] + ["precommit: invalid", "commit: invalid", "committing: invalid"]


def test_random_interleavings_match_the_model(make_log: MakeLog) -> None:
    TxnLogMachine.log = make_log()
    SEEN.clear()
    examples = int(os.environ.get("TXNLOG_PROPERTY_EXAMPLES", "40"))
    # Derandomized: the default suite explores the same interleavings every run, so the coverage
    # check below can't fail by chance; the slow variant explores new ones each time.
    run_state_machine_as_test(TxnLogMachine, settings=_settings(examples, 30, derandomize=True))
    missing = [label for label in MUST_REACH if not SEEN[label]]
    assert not missing, f"the run never reached {missing}; seen: {dict(SEEN)}"


@pytest.mark.slow
def test_random_interleavings_match_the_model_long(make_log: MakeLog) -> None:
    TxnLogMachine.log = make_log()
    run_state_machine_as_test(TxnLogMachine, settings=_settings(200, 50))
