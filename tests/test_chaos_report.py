"""The chaos run's analysis catches what it must: fed planted records of a run (no database,
no worker processes), it fails each kind of bug and passes a clean run."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.chaos import fleet, records, report, verify
from tests.chaos.evidence import (
    Faults,
    Published,
    Run,
    Transaction,
    read_faults,
    read_published,
    read_runs,
)

GROUPS = report.GROUPS
STRICT = report.STRICT_GROUP
WORKER, OTHER, SKEWED = 100, 200, 300


@dataclass
class Planted:
    """A small clean run: two transactions over keys a, b and c, every row handled once in
    publish order in every group, the poison row dead-lettered once, every fault seen."""

    published: Published = field(default_factory=Published)
    runs: list[Run] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)
    dead: dict[str, Counter[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.published.add(Transaction("9:1", 1.0, 1.1),
                           [(1, "a", 1), (2, "a", 2), (3, "b", 3)])
        self.published.add(Transaction("9:2", 2.0, 2.1), [(4, "a", 4), (5, "c", 5)],
                           {5: "poison"})
        self.published.rolled_back.add(6)
        for group in GROUPS:
            self.dead[group] = Counter({5: 1})
            t = 10.0
            for n, key, offset in ((1, "a", 1), (2, "a", 2), (3, "b", 3), (4, "a", 4)):
                self.run(group, n, key, offset, start=t)
                t += 1.0
            for attempt in (1, 2):
                self.run(group, 5, "c", 5, start=t, attempt=attempt, ok=False)
                t += 0.5
        self.faults.skewed = {SKEWED}
        self.faults.clock = (0.0, 1_000.0)
        self.faults.clocks = [(SKEWED, 3.0, 1_063.0, 1_003.0), (WORKER, 3.0, 1_003.0, 1_003.0)]
        self.faults.kills = {400: 30.0}
        self.faults.kill_codes = {400: -signal.SIGKILL}
        self.faults.pauses[500].append((31.0, 45.0))
        self.faults.pause_states = ["T"]
        self.faults.locks = [{"offset": 3, "probed": True, "held": 13.0, "error": ""}]
        self.faults.restarts = [({"started": 100.0, "pid": 7}, {"started": 160.0, "pid": 8})]
        self.faults.db_outages = [(50.0, 52.5)]
        self.published.flags[1_000] = "hang"
        for group in GROUPS:
            self.run(group, 1_000, "hang", 99, start=0.0, ok=False, end=None, pid=600)
            self.run(group, 1_000, "hang", 99, start=9.0, attempt=2, pid=WORKER)
        self.faults.kills[600] = 20.0
        self.faults.kill_codes[600] = -signal.SIGKILL
        self.published.add(Transaction("0:0", 0.0, 0.1), [(1_000, "hang", 99)])

    def run(self, group: str, n: int, key: str, offset: int, start: float, *,
            attempt: int = 1, ok: bool = True, end: float | None = -1.0, pid: int = WORKER,
            position: int | None = None, partition: str = "0", thread: int = 1) -> Run:
        run = Run(group, n, offset, key, offset if position is None else position, attempt,
                  pid, start, start + 0.2 if end == -1.0 else end, ok, partition, thread)
        self.runs.append(run)
        return run

    def find(self, group: str, offset: int) -> list[Run]:
        return [r for r in self.runs if r.group == group and r.offset == offset]

    def analyse(self, group: str) -> report.GroupReport:
        return report.analyse(group, self.published, self.runs, self.faults, self.dead[group], 0)

    def failures(self) -> list[str]:
        return [f for g in GROUPS for f in self.analyse(g).failures()]


PLAN = verify.Plan(kills=2, pauses=1, pause_seconds=14.0, skew_seconds=60.0, lock_seconds=13.0,
                   max_handler_time=8.0, vendor="mysql")


def fault_status(planted: Planted) -> dict[str, str]:
    checks = verify.check_faults(PLAN, planted.faults, planted.runs, planted.published, GROUPS)
    return {c.fault: c.status for c in checks}


# --------------------------------------------------------------------------- clean


def test_a_clean_planted_run_passes() -> None:
    planted = Planted()
    assert planted.failures() == []
    assert set(fault_status(planted).values()) == {"verified"}
    ledger = planted.analyse("ledger")
    assert (ledger.published, ledger.handled, ledger.dead_letters, ledger.poison) == (6, 6, 1, 1)


# --------------------------------------------------------------------------- loss


def test_a_lost_republish_is_caught_although_its_original_was_handled() -> None:
    planted = Planted()
    # Message 3 re-published after GC collected its original: a new row, never handled.
    planted.published.add(Transaction("9:3", 3.0, 3.1), [])
    planted.published.add_republish("9:3", 3, "b", 3, 10, None, 0)
    for group in GROUPS:
        assert planted.analyse(group).lost == ["m3@10"]


def test_a_lost_original_is_caught_although_its_republish_was_handled() -> None:
    planted = Planted()
    planted.published.add(Transaction("9:3", 3.0, 3.1), [])
    planted.published.add_republish("9:3", 3, "b", 3, 10, None, 0)
    for group in GROUPS:
        original = planted.find(group, 3)[0]
        original.offset, original.position = 10, 10
    assert planted.analyse("ledger").lost == ["m3@3"]


# --------------------------------------------------------------------------- order


def test_a_sequencer_that_splits_a_transaction_fails_every_group() -> None:
    planted = Planted()
    for group in GROUPS:  # m2 was positioned before m1, its predecessor in one transaction
        planted.find(group, 1)[0].position = 20
        planted.find(group, 2)[0].position = 19
    for group in GROUPS:
        violations = planted.analyse(group).order_violations
        assert violations and "m1@1 published before m2@2" in violations[0], group


def test_a_message_committed_later_but_positioned_first_fails() -> None:
    planted = Planted()
    for run in planted.find("ledger", 4):  # tx 2 committed after tx 1 ended
        run.position = 0
    assert any("m1@1 published before m4@4" in v
               for v in planted.analyse("ledger").order_violations)


def test_concurrent_transactions_promise_no_order_between_them() -> None:
    planted = Planted()
    # A third transaction overlapping tx 2's commit, with a lower offset: no order promised.
    planted.published.add(Transaction("8:1", 1.9, 2.2), [(7, "a", 0)])
    for group in GROUPS:
        planted.run(group, 7, "a", 0, start=15.0, position=50)
    assert planted.failures() == []


def test_strict_mode_starting_a_key_s_next_message_before_the_last_finished_fails() -> None:
    planted = Planted()
    for group in GROUPS:  # positions right, but m2 started while m1 still ran
        planted.find(group, 2)[0].start = planted.find(group, 1)[0].start + 0.1
    assert planted.analyse("ledger").order_violations == []
    assert planted.analyse(STRICT).order_violations


# --------------------------------------------------------------------------- overlaps


def test_one_key_on_two_processes_at_once_fails_every_group() -> None:
    planted = Planted()
    for group in GROUPS:
        second = planted.find(group, 2)[0]
        second.pid, second.start = OTHER, planted.find(group, 1)[0].start + 0.1
    for group in GROUPS:
        assert planted.analyse(group).overlaps, group


def test_an_overlap_of_a_run_its_worker_was_paused_in_is_explained() -> None:
    planted = Planted()
    by_design = planted.analyse("ledger").overlaps_explained  # the hung run's redelivery
    first = planted.find("ledger", 1)[0]
    second = planted.find("ledger", 2)[0]
    second.pid, second.start = OTHER, first.start + 0.1
    planted.faults.pauses[WORKER].append((first.start + 0.05, first.start + 0.15))
    result = planted.analyse("ledger")
    assert (result.overlaps, result.overlaps_explained) == ([], by_design + 1)


def test_one_key_on_two_threads_of_one_process_fails_strict_mode_only() -> None:
    planted = Planted()
    for group in GROUPS:
        second = planted.find(group, 2)[0]
        second.thread, second.start = 2, planted.find(group, 1)[0].start + 0.1
    assert planted.analyse("ledger").overlaps == []
    overlaps = planted.analyse(STRICT).overlaps
    assert overlaps and "two threads" in overlaps[0]
    # A pause freezes both threads: it explains nothing within one process.
    planted.faults.pauses[WORKER].append((0.0, 100.0))
    assert planted.analyse(STRICT).overlaps


# --------------------------------------------------------------------------- dead letters


def test_a_message_dead_lettered_twice_fails() -> None:
    planted = Planted()
    planted.dead["audit"] = Counter({5: 2})
    result = planted.analyse("audit")
    assert result.dead_letters == 2
    assert result.dead_letters_twice == ["m5@5 x2"]
    assert result.failures()


def test_a_dead_letter_of_a_message_that_is_not_poison_fails() -> None:
    planted = Planted()
    planted.dead["ledger"][3] = 1
    assert planted.analyse("ledger").dead_letters_unexplained == ["m3@3"]


# --------------------------------------------------------------------------- duplicates


def redeliver(planted: Planted, *, acked: float | None, kill: float | None) -> report.GroupReport:
    """m3 ran ok on WORKER at 12.0-12.2 (acked at ``acked``), and again on OTHER at 20."""
    first = planted.find("ledger", 3)[0]
    if acked is not None:
        planted.faults.acks[(WORKER, "ledger", 3)].append(acked)
    if kill is not None:
        planted.faults.kills[WORKER] = kill
    planted.run("ledger", 3, "b", 3, start=first.start + 8.0, attempt=2, pid=OTHER)
    return planted.analyse("ledger")


def test_a_redelivery_after_the_ack_committed_is_unexplained_even_if_the_worker_died_later() -> None:
    result = redeliver(Planted(), acked=12.3, kill=14.0)
    assert result.duplicates == 1
    assert result.duplicates_unexplained


def test_a_kill_after_the_redelivery_explains_nothing() -> None:
    result = redeliver(Planted(), acked=None, kill=25.0)
    assert result.duplicates_unexplained


def test_a_kill_before_the_ack_committed_explains_a_redelivery() -> None:
    result = redeliver(Planted(), acked=None, kill=16.0)
    assert result.duplicates_unexplained == []
    assert dict(result.duplicates_explained) == {"worker killed before the ack": 1}


def test_a_lease_the_worker_lost_explains_a_redelivery_of_its_partition_only() -> None:
    planted = Planted()
    planted.faults.lease_losses[(WORKER, "ledger", "7")].append(21.0)
    assert redeliver(planted, acked=12.3, kill=None).duplicates_unexplained
    planted = Planted()
    planted.faults.lease_losses[(WORKER, "ledger", "0")].append(21.0)
    assert redeliver(planted, acked=12.3, kill=None).duplicates_unexplained == []


def test_a_run_recorded_between_the_kill_signal_and_the_death_is_cut_off_by_it() -> None:
    planted = Planted()
    first = planted.find("ledger", 3)[0]
    planted.faults.kills_sent[WORKER] = first.start - 0.001
    result = redeliver(planted, acked=None, kill=first.start + 0.201)
    assert dict(result.duplicates_explained) == {"worker killed before the ack": 1}


def test_a_fault_on_another_worker_explains_nothing() -> None:
    planted = Planted()
    planted.faults.kills[OTHER + 1] = 15.0
    planted.faults.pauses[OTHER + 1].append((11.0, 25.0))
    assert redeliver(planted, acked=None, kill=None).duplicates_unexplained


# --------------------------------------------------------------------------- partitions


def test_one_partition_on_two_processes_at_once_fails_every_group() -> None:
    planted = Planted()
    for group in GROUPS:  # m3 (key b) on another worker while m2 (key a) runs: partition 0
        third = planted.find(group, 3)[0]
        third.pid, third.start = OTHER, planted.find(group, 2)[0].start + 0.1
    for group in GROUPS:
        result = planted.analyse(group)
        assert result.overlaps == [] and result.owned_twice, group
        assert "partition owned twice" in " ".join(result.failures())


def test_a_partition_on_two_processes_is_explained_by_a_pause() -> None:
    planted = Planted()
    by_design = planted.analyse("ledger").owned_twice_explained  # the hung run's redelivery
    second, third = planted.find("ledger", 2)[0], planted.find("ledger", 3)[0]
    third.pid, third.start = OTHER, second.start + 0.1
    planted.faults.pauses[WORKER].append((second.start + 0.05, second.start + 0.15))
    result = planted.analyse("ledger")
    assert (result.owned_twice, result.owned_twice_explained) == ([], by_design + 1)


def test_one_partition_on_two_threads_or_two_partitions_on_two_processes_pass() -> None:
    planted = Planted()
    second, third = planted.find("ledger", 2)[0], planted.find("ledger", 3)[0]
    third.thread, third.start = 2, second.start + 0.1
    assert planted.analyse("ledger").owned_twice == []
    third.pid, third.partition = OTHER, "1"
    assert planted.analyse("ledger").owned_twice == []


# --------------------------------------------------------------------------- failover

PG_FAILOVER = dataclasses.replace(PLAN, failover="pg", lease=10.0, retry_delay=5.0)
PRIMARY = {"node": "primary", "port": 25432, "pid": 7, "running": True, "primary": True}
REPLICA = {"node": "replica", "port": 25433, "pid": 8, "running": True, "primary": True}


def failed_over(planted: Planted, *, old: dict[str, object] | None = None,
                resumed: dict[int, float] | None = None) -> dict[str, verify.FaultCheck]:
    """The checks of a PostgreSQL failover at t=50 s (clients could write again at 51.2 s)
    with workers WORKER and OTHER running through it, each running a handler again
    ``resumed[pid]`` seconds after the failure (default 2 s)."""
    faults = planted.faults
    gone = {**PRIMARY, "running": False, "primary": False}
    faults.failovers = [(50.0, 51.2, PRIMARY, REPLICA, gone if old is None else old)]
    faults.started.update({WORKER: 0.0, OTHER: 0.0})
    faults.listeners = (2, 2)
    runs = list(planted.runs)
    for pid, after in ({WORKER: 2.0, OTHER: 2.0} if resumed is None else resumed).items():
        runs.append(Run("ledger", 4, 4, "a", 4, 1, pid, 50.0 + after, 50.3 + after, True, "0"))
    checks = verify.check_faults(PG_FAILOVER, faults, runs, planted.published, GROUPS)
    return {c.fault: c for c in checks}


def test_a_failover_to_the_replica_with_every_worker_back_passes() -> None:
    checks = failed_over(Planted())
    assert "database restart" not in checks
    assert checks["failover (PostgreSQL promotion)"].status == "verified"
    resumed = checks["workers resumed after the failover"]
    assert resumed.status == "verified" and "every worker's within 2.0 s" in resumed.detail
    assert checks["wake-up listeners on the new primary"].status == "verified"


def test_a_failover_that_left_the_old_writer_running_fails() -> None:
    checks = failed_over(Planted(), old={**PRIMARY, "running": True})
    assert checks["failover (PostgreSQL promotion)"].status == "FAILED"


def test_a_worker_that_never_ran_again_or_later_than_the_bound_fails() -> None:
    never = failed_over(Planted(), resumed={WORKER: 2.0})
    assert never["workers resumed after the failover"].status == "FAILED"
    # The bound: outage 1.2 s + lease 10 s + retry wait 5 s.
    late = failed_over(Planted(), resumed={WORKER: 2.0, OTHER: 16.5})
    assert late["workers resumed after the failover"].status == "FAILED"
    in_time = failed_over(Planted(), resumed={WORKER: 2.0, OTHER: 16.0})
    assert in_time["workers resumed after the failover"].status == "verified"


def test_a_worker_killed_before_it_ran_again_is_not_counted() -> None:
    planted = Planted()
    planted.faults.kills_sent[OTHER] = 53.0
    checks = failed_over(planted, resumed={WORKER: 2.0, OTHER: 4.0})
    assert checks["workers resumed after the failover"].applied == 1


def test_listeners_missing_on_the_new_primary_fail() -> None:
    planted = Planted()
    planted.faults.listeners = (1, 2)
    checks = verify.check_faults(PG_FAILOVER, planted.faults, planted.runs, planted.published,
                                 GROUPS)
    assert {c.fault: c.status for c in checks}["wake-up listeners on the new primary"] == "FAILED"


def test_a_worker_that_exits_by_itself_is_noticed_once_and_a_killed_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_DIR", str(tmp_path))
    worker = fleet.Worker("chaos-1", tmp_path)
    worker.proc = subprocess.Popen(["sh", "-c", "exit 1"])
    worker.proc.wait()
    assert worker.exited_by_itself() == 1
    assert worker.exited_by_itself() is None
    worker.proc, worker.down_on_purpose = subprocess.Popen(["sleep", "60"]), False
    worker.kill()
    assert worker.exited_by_itself() is None
    assert [r["e"] for r in records.read(tmp_path, "faults")] == ["exited", "kill"]


# --------------------------------------------------------------------------- faults


def test_a_restart_that_did_not_restart_the_server_fails() -> None:
    planted = Planted()
    planted.faults.restarts = [({"started": 100.0, "pid": 7}, {"started": 100.0, "pid": 7})]
    assert fault_status(planted)["database restart"] == "FAILED"
    planted.faults.restarts = [({"started": 100.0, "pid": 0}, {"started": 100.0, "pid": 0})]
    assert fault_status(planted)["database restart"] == "FAILED"  # PostgreSQL: no pid


def test_a_lock_nobody_else_saw_or_held_too_briefly_fails() -> None:
    planted = Planted()
    planted.faults.locks = [{"offset": 3, "probed": False, "held": 13.0, "error": ""}]
    assert fault_status(planted)["idle transaction's lock"] == "FAILED"
    planted.faults.locks = [{"offset": 3, "probed": True, "held": 2.0, "error": ""}]
    assert fault_status(planted)["idle transaction's lock"] == "FAILED"


def test_a_skew_the_worker_did_not_see_fails() -> None:
    planted = Planted()
    planted.faults.clocks = [(SKEWED, 3.0, 1_003.0, 1_003.0)]
    assert fault_status(planted)["clock skew"] == "FAILED"
    planted.faults.clocks = []
    assert fault_status(planted)["clock skew"] == "FAILED"


def test_a_kill_or_pause_that_did_not_take_effect_fails() -> None:
    planted = Planted()
    planted.faults.kill_codes[400] = 0
    planted.faults.pause_states = ["S"]
    status = fault_status(planted)
    assert status["kill -9"] == status["SIGSTOP pause"] == "FAILED"


def test_a_fault_that_cannot_be_applied_is_reported_as_not_exercised() -> None:
    planted = Planted()
    planted.faults.restarts = []
    planted.faults.not_exercised["restart_db"] = "the server is not on this machine"
    check = next(c for c in verify.check_faults(PLAN, planted.faults, planted.runs,
                                                planted.published, GROUPS)
                 if c.fault == "database restart")
    assert (check.status, check.detail) == ("not exercised", "the server is not on this machine")
    planted.faults.not_exercised.clear()
    assert fault_status(planted)["database restart"] == "FAILED"


TRACEBACK_LOG = """\
2026-11-26 10:00:00,000 INFO django_sqlqueue.worker worker started name=chaos-1
Traceback (most recent call last):
  File "x.py", line 1, in <module>
KeyError: 'partition'
2026-11-26 10:00:01,000 WARNING django_sqlqueue.worker step=poll transient database error
2026-11-26 10:00:02,000 ERROR django_sqlqueue.worker gc failed: ValueError: bad
"""


def test_tracebacks_and_error_lines_in_worker_logs_fail_unless_expected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "worker-chaos-1.log").write_text(TRACEBACK_LOG)
    unexpected, expected = verify.log_problems(tmp_path)
    assert [line.split(": ", 1)[1] for line in unexpected] == [
        "Traceback: KeyError: 'partition'",
        "2026-11-26 10:00:02,000 ERROR django_sqlqueue.worker gc failed: ValueError: bad"]
    monkeypatch.setattr(verify, "EXPECTED_LOG_LINES", (("KeyError: 'partition'", "planted"),))
    unexpected, expected = verify.log_problems(tmp_path)
    assert len(unexpected) == 1 and expected == {"planted": 1}


# --------------------------------------------------------------------------- records


def test_the_records_the_processes_write_read_back(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_DIR", str(tmp_path))
    records.write("published", e="committed", tx=1, ns=[1, 2], keys=["a", "a"],
                  offsets=[11, 12], flags={"2": "poison"}, c0=1.0, c1=1.5)
    records.write("published", e="duplicate", tx=1, i=2, n=1, k="a", offset=11, again=13,
                  existed=None)
    records.write("runs", e="start", g="strict", n=1, k="a", o=11, pos=3, a=1, part="4",
                  th=7, t=2.0)
    records.write("runs", e="end", g="strict", n=1, k="a", o=11, pos=3, a=1, ok=True, t=2.5)
    records.write("faults", e="kill", pid=42, code=-9, t=3.0, dead=3.01)
    records.write("observed", e="lease_lost", g="strict", part="4", t=3.5)
    records.write("observed", e="acked", g="strict", o=11, t=2.6)
    published = read_published(tmp_path)
    assert sorted(published.rows) == [11, 12, 13]
    assert (published.rows[13].n, published.rows[13].index) == (1, 2)
    assert published.rows[12].flag == "poison"
    (run,) = read_runs(tmp_path)
    assert (run.partition, run.end, run.ok, run.position) == ("4", 2.5, True, 3)
    faults = read_faults(tmp_path)
    assert faults.kill_codes == {42: -9}
    assert (faults.kills_sent, faults.kills) == ({42: 3.0}, {42: 3.01})
    assert faults.lease_lost_within(run.pid, "strict", "4", 3.0, 4.0)
    assert faults.acked_after(run) == 2.6


def test_a_failover_s_records_read_back_as_an_outage(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_DIR", str(tmp_path))
    records.write("faults", e="start", name="chaos-1", pid=42, skewed=False, t=1.0)
    records.write("faults", e="failover_down", kind="pg", server=PRIMARY, t=50.0)
    records.write("faults", e="failover_up", kind="pg", server=REPLICA,
                  old={**PRIMARY, "running": False}, t=51.2)
    records.write("faults", e="listeners", n=5, workers=5, t=90.0)
    faults = read_faults(tmp_path)
    assert faults.started == {42: 1.0}
    assert faults.db_outages == [(50.0, 51.2)] and faults.outage_within(50.5, 60.0)
    assert [f[:4] for f in faults.failovers] == [(50.0, 51.2, PRIMARY, REPLICA)]
    assert faults.listeners == (5, 5)
