"""The history checker (support/history.py) finds each rule broken in a hand-written
history, and finds nothing in one that keeps it: a checker that passes everything would
make the cluster fault tests assert nothing.

Pure: histories are written op by op on a clock of their own, no server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.history import (
    History,
    LeaseLoss,
    MapVersion,
    NodeEvent,
    Op,
    Outcome,
    SlotSwitch,
    Violation,
    check,
    check_acknowledged_changes_present,
    check_live_holders_tokens_current,
    check_no_reply_for_a_slot_given_away,
    check_no_reply_from_a_replaced_primary,
    check_one_live_holder_per_claim,
    check_one_owner_per_slot_at_every_map_epoch,
    check_one_result_per_task,
    check_refused_completions_change_nothing,
    check_stale_tokens_refused,
    load,
    report,
)

from rsclient import ConflictError, UnavailableError

OLD, NEW = "127.0.0.1:7001", "127.0.0.1:7002"


class Writer:
    """A history written by hand: ``op(...)`` appends one completed op."""

    def __init__(self) -> None:
        self.history = History(lease_seconds=2.0, clock=lambda: 0.0)

    def op(self, process: str, f: str, value: dict[str, Any], invoked: float,
           outcome: Outcome | None = "ok", reply: Any = None, done: float | None = None,
           node: str | None = NEW) -> Op:
        history = self.history
        op = Op(len(history.ops), process, f, value, invoked, outcome,
                None if outcome is None else (invoked + 0.01 if done is None else done),
                reply, None if outcome in ("ok", None) else "error", node)
        history.ops.append(op)
        return op

    def final(self, at: float) -> None:
        self.history.final_at = at

    def acquire(self, process: str, key: str, generation: int, at: float,
                done: float | None = None) -> Op:
        return self.op(process, "acquire", {"key": key}, at,
                       reply={"token": f"{key}-{generation}", "generation": generation}, done=done)

    def release(self, process: str, key: str, generation: int, at: float) -> Op:
        return self.op(process, "release",
                       {"key": key, "token": f"{key}-{generation}", "generation": generation}, at)

    def fence(self, process: str, key: str, generation: int, at: float, current: bool) -> Op:
        return self.op(process, "fence",
                       {"key": key, "token": f"{key}-{generation}", "generation": generation}, at,
                       reply={"current": current, "generation": generation})


def _messages(violations: list[Violation]) -> str:
    return "\n".join(str(violation) for violation in violations)


# ---- acknowledged changes present ------------------------------------------------------


def _submits(w: Writer) -> None:
    w.op("planner", "submit", {"key": "k1", "input": {"n": 1}}, 1.0, reply={"task": "T1"})
    w.op("planner", "submit", {"key": "k2", "input": {"n": 2}}, 1.0, "info")  # fate unknown
    w.op("worker", "complete", {"task": "T1", "outcome": {"by": "w"}}, 2.0, reply={})


def test_the_history_checker_finds_an_acknowledged_submit_missing_on_the_final_primary() -> None:
    w = Writer()
    _submits(w)
    w.final(5.0)
    w.op("final", "submit", {"key": "k1", "input": {"n": 1}}, 5.0, reply={"task": "T9"})
    w.op("final", "status", {"task": "T1"}, 5.0, reply={"state": "SUCCEEDED",
                                                        "outcome": {"by": "w"}})
    found = check_acknowledged_changes_present(w.history)
    assert len(found) == 1 and "acknowledged as task T1" in found[0].message
    assert "T9" in str(found[0])


def test_the_history_checker_finds_an_acknowledged_completion_missing_on_the_final_primary(
) -> None:
    w = Writer()
    _submits(w)
    w.final(5.0)
    w.op("final", "submit", {"key": "k1", "input": {"n": 1}}, 5.0, reply={"task": "T1"})
    w.op("final", "status", {"task": "T1"}, 5.0, reply={"state": "RUNNING", "outcome": None})
    found = check_acknowledged_changes_present(w.history)
    assert len(found) == 1 and "acknowledged complete" in found[0].message


def test_the_history_checker_finds_acknowledged_changes_never_read_at_the_end() -> None:
    w = Writer()
    _submits(w)
    assert "no final reads" in _messages(check_acknowledged_changes_present(w.history))
    w.final(5.0)
    found = _messages(check_acknowledged_changes_present(w.history))
    assert "'k1' was acknowledged but never read" in found
    assert "T1's completion was acknowledged but its status was never read" in found


def test_the_history_checker_finds_a_grant_or_release_the_final_primary_forgot() -> None:
    w = Writer()
    w.acquire("a", "x", 5, 1.0)
    w.release("a", "x", 5, 2.0)
    w.final(5.0)
    w.op("final", "inspect", {"key": "x"}, 5.0, reply={"held": False, "generation": 3})
    assert "granted generation 5" in _messages(check_acknowledged_changes_present(w.history))
    w.history.ops[-1].reply = {"held": True, "generation": 5}
    assert "released (acknowledged) but the final primary holds it" in _messages(
        check_acknowledged_changes_present(w.history))


def test_the_history_checker_passes_a_history_whose_acknowledged_changes_are_all_there(
) -> None:
    w = Writer()
    _submits(w)
    w.acquire("a", "x", 5, 1.0)
    w.release("a", "x", 5, 2.0)
    w.final(5.0)
    w.op("final", "submit", {"key": "k1", "input": {"n": 1}}, 5.0, reply={"task": "T1"})
    w.op("final", "status", {"task": "T1"}, 5.0, reply={"state": "SUCCEEDED",
                                                        "outcome": {"by": "w"}})
    w.op("final", "inspect", {"key": "x"}, 5.0, reply={"held": False, "generation": 9})
    assert check(w.history) == []


# ---- one result per task ---------------------------------------------------------------


def test_the_history_checker_finds_a_task_with_two_results() -> None:
    w = Writer()
    w.op("p1", "result", {"task": "T1"}, 1.0, reply={"state": "SUCCEEDED", "outcome": "a"})
    w.op("p2", "result", {"task": "T1"}, 1.0, reply={"state": "SUCCEEDED", "outcome": "b"})
    found = check_one_result_per_task(w.history)
    assert len(found) == 1 and "task T1 has 2 results" in found[0].message


def test_the_history_checker_finds_an_acknowledged_completion_that_is_not_the_result() -> None:
    w = Writer()
    w.op("w1", "complete", {"task": "T1", "outcome": "mine"}, 1.0, reply={})
    w.op("w2", "complete", {"task": "T1", "outcome": "theirs"}, 1.5, reply={})
    w.op("p1", "result", {"task": "T1"}, 2.0, reply={"state": "SUCCEEDED", "outcome": "mine"})
    found = check_one_result_per_task(w.history)
    assert len(found) == 1 and '"theirs"' in found[0].message


def test_the_history_checker_finds_one_key_answered_as_two_tasks() -> None:
    w = Writer()
    w.op("p1", "submit", {"key": "k", "input": 1}, 1.0, reply={"task": "T1"})
    w.op("p2", "submit", {"key": "k", "input": 1}, 1.0, reply={"task": "T2"})
    assert "'k' was answered as 2 tasks" in _messages(check_one_result_per_task(w.history))


def test_the_history_checker_passes_one_result_read_by_many() -> None:
    w = Writer()
    w.op("p1", "submit", {"key": "k", "input": 1}, 1.0, reply={"task": "T1"})
    w.op("p2", "submit", {"key": "k", "input": 1}, 1.0, reply={"task": "T1"})
    w.op("w1", "complete", {"task": "T1", "outcome": "old"}, 1.0, "fail")  # STALE_CLAIM
    w.op("w2", "complete", {"task": "T1", "outcome": "new"}, 1.5, reply={})
    w.op("p1", "result", {"task": "T1"}, 2.0, reply={"state": "SUCCEEDED", "outcome": "new"})
    w.op("p2", "status", {"task": "T1"}, 2.0, reply={"state": "RUNNING", "outcome": None})
    w.op("p2", "status", {"task": "T1"}, 3.0, reply={"state": "SUCCEEDED", "outcome": "new"})
    assert check_one_result_per_task(w.history) == []


# ---- refused completions change nothing --------------------------------------------------


def test_the_history_checker_finds_a_refused_completion_that_is_the_result() -> None:
    """Seen in a real run: a worker's complete() was recorded, its reply lost with the
    killed primary, and the SDK's resend, past the lease's deadline, answered
    STALE_CLAIM: the worker was told its result was refused, yet it is the result."""
    w = Writer()
    mine = {"n": 50, "by": "worker-1", "attempt": 1}
    w.op("worker-1", "complete", {"task": "T1", "outcome": mine}, 3.0, "fail", done=8.6)
    w.op("planner", "result", {"task": "T1"}, 5.6, reply={"state": "SUCCEEDED",
                                                          "outcome": mine})
    found = check_refused_completions_change_nothing(w.history)
    assert len(found) == 1 and "a completion refused" in found[0].message
    assert "worker-1" in str(found[0]) and "planner" in str(found[0])


def test_the_history_checker_passes_a_refused_completion_of_a_lost_delivery() -> None:
    w = Writer()
    late = {"n": 1, "by": "worker-1", "attempt": 1}
    taken_over = {"n": 1, "by": "worker-2", "attempt": 2}
    w.op("worker-1", "complete", {"task": "T1", "outcome": late}, 9.0, "fail")
    w.op("worker-2", "complete", {"task": "T1", "outcome": taken_over}, 8.0, reply={})
    w.op("planner", "result", {"task": "T1"}, 9.5, reply={"state": "SUCCEEDED",
                                                          "outcome": taken_over})
    # A refusal of a repeat whose first send was acknowledged: that one explains it.
    w.op("worker-3", "complete", {"task": "T2", "outcome": "x"}, 1.0, reply={})
    w.op("worker-3", "complete", {"task": "T2", "outcome": "x"}, 2.0, "fail")
    w.op("planner", "result", {"task": "T2"}, 2.5, reply={"state": "SUCCEEDED",
                                                          "outcome": "x"})
    assert check_refused_completions_change_nothing(w.history) == []


# ---- one live holder per claim ---------------------------------------------------------


def test_the_history_checker_finds_two_live_holders_of_one_claim() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.acquire("b", "x", 2, 2.0)  # a still holds it: it neither released nor lost it
    w.release("a", "x", 1, 3.0)
    found = check_one_live_holder_per_claim(w.history)
    assert len(found) == 1 and "both held it" in found[0].message
    assert "a (generation 1) and b (generation 2)" in found[0].message


def test_the_history_checker_finds_one_generation_granted_twice() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.release("a", "x", 1, 2.0)
    w.op("b", "acquire", {"key": "x"}, 3.0, reply={"token": "other", "generation": 1})
    assert "generation 1 was granted twice" in _messages(
        check_one_live_holder_per_claim(w.history))


def test_the_history_checker_finds_a_generation_that_went_back() -> None:
    w = Writer()
    w.acquire("a", "x", 7, 1.0)
    w.release("a", "x", 7, 2.0)
    w.acquire("b", "x", 6, 3.0)
    assert "generation 6 was granted after generation 7" in _messages(
        check_one_live_holder_per_claim(w.history))


def test_the_history_checker_passes_holders_one_after_another() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.release("a", "x", 1, 2.0)  # ends a's interval at its invocation
    w.acquire("b", "x", 2, 1.99, done=2.05)  # invoked before the release: granted after it
    w.history.losses.append(LeaseLoss("b", "x", "x-2", 2, 6.0, "deadline"))
    w.acquire("c", "x", 3, 6.5)  # b's lease was lost first
    w.acquire("d", "y", 1, 6.6)  # another key
    w.op("e", "acquire", {"key": "x"}, 6.6, "fail")  # busy: nothing granted
    w.op("e", "acquire", {"key": "x"}, 6.7, "info")  # unknown: nobody holds it knowingly
    # A grant read after its own deadline: an empty interval, whoever holds the key.
    w.acquire("f", "x", 4, 7.0, done=12.0)
    w.history.losses.append(LeaseLoss("f", "x", "x-4", 4, 11.0, "deadline"))
    assert check_one_live_holder_per_claim(w.history) == []


# ---- stale tokens refused --------------------------------------------------------------


def test_the_history_checker_finds_a_stale_token_accepted() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.history.losses.append(LeaseLoss("a", "x", "x-1", 1, 4.0, "deadline"))
    w.acquire("b", "x", 2, 5.0)
    w.fence("a", "x", 1, 6.0, current=True)  # the older token, after generation 2 came
    found = check_stale_tokens_refused(w.history)
    assert len(found) == 1
    assert "generation 1 was current after generation 2 was granted" in found[0].message


def test_the_history_checker_finds_a_token_older_than_one_a_fenced_op_accepted() -> None:
    w = Writer()
    w.fence("b", "x", 2, 5.0, current=True)  # its grant is not in the history
    w.fence("a", "x", 1, 6.0, current=True)
    assert "after a fenced op accepted generation 2" in _messages(
        check_stale_tokens_refused(w.history))


def test_the_history_checker_finds_a_released_token_still_current() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.release("a", "x", 1, 2.0)
    w.fence("a", "x", 1, 3.0, current=True)
    assert "a released token was current" in _messages(check_stale_tokens_refused(w.history))


def test_the_history_checker_finds_a_stale_renewal_answered_ok() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.acquire("b", "x", 2, 5.0)
    w.op("a", "renew", {"key": "x", "token": "x-1", "generation": 1}, 6.0, reply={})
    assert "generation 1 was answered ok (renew)" in _messages(
        check_stale_tokens_refused(w.history))


def test_the_history_checker_passes_stale_tokens_refused() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.fence("a", "x", 1, 1.5, current=True)
    w.release("a", "x", 1, 2.0)
    w.acquire("b", "x", 2, 2.5, done=3.0)
    w.fence("a", "x", 1, 2.005, current=True)  # before the release and the grant were done
    w.fence("a", "x", 1, 3.5, current=False)
    w.fence("b", "x", 2, 3.5, current=True)
    assert check_stale_tokens_refused(w.history) == []


# ---- a live holder's token is current --------------------------------------------------


def test_the_history_checker_finds_a_live_holders_token_refused() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.fence("a", "x", 1, 2.0, current=False)
    w.release("a", "x", 1, 3.0)
    assert "was not current while a held it" in _messages(
        check_live_holders_tokens_current(w.history))


def test_the_history_checker_passes_a_token_refused_after_its_lease_was_lost() -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.history.losses.append(LeaseLoss("a", "x", "x-1", 1, 2.0, "deadline"))
    w.fence("a", "x", 1, 1.995, current=False)  # answered after the loss
    w.fence("a", "x", 1, 2.5, current=False)
    assert check_live_holders_tokens_current(w.history) == []


# ---- no reply from a replaced primary --------------------------------------------------


def _reign(w: Writer) -> None:
    w.history.nodes += [NodeEvent("primary", OLD, 0.5, 1)]


def test_the_history_checker_finds_a_reply_from_a_primary_after_its_successor() -> None:
    w = Writer()
    _reign(w)
    w.history.nodes.append(NodeEvent("primary", NEW, 5.0, 2))
    w.op("p", "submit", {"key": "k", "input": 1}, 4.0, reply={"task": "T1"}, done=5.5,
         node=OLD)  # sent before the successor was seen: may have been answered in time
    w.op("p", "submit", {"key": "k", "input": 1}, 6.0, reply={"task": "T1"}, node=OLD)
    found = check_no_reply_from_a_replaced_primary(w.history)
    assert len(found) == 1 and f"{OLD} (primary of epoch 1) answered" in found[0].message
    assert "epoch 2 led by" in found[0].message


def test_the_history_checker_finds_a_reply_from_a_primary_paused_past_its_lease() -> None:
    w = Writer()
    _reign(w)
    w.history.nodes += [NodeEvent("paused", OLD, 2.0), NodeEvent("resumed", OLD, 4.5)]
    w.op("p", "acquire", {"key": "x"}, 1.9, reply={"token": "t", "generation": 1}, done=1.95,
         node=OLD)
    w.op("p", "acquire", {"key": "y"}, 2.1, "fail", done=4.6, node=OLD)  # read after waking
    found = check_no_reply_from_a_replaced_primary(w.history)
    assert len(found) == 1 and "paused past its lease (2.5 s)" in found[0].message


def test_the_history_checker_finds_a_reply_from_a_killed_primary() -> None:
    w = Writer()
    _reign(w)
    w.history.nodes.append(NodeEvent("killed", OLD, 3.0))
    w.op("p", "status", {"task": "T1"}, 3.5, reply={"state": "READY"}, node=OLD)
    assert "it was killed" in _messages(check_no_reply_from_a_replaced_primary(w.history))


def test_the_history_checker_passes_replies_from_primaries_in_their_reigns() -> None:
    w = Writer()
    _reign(w)
    w.history.nodes += [NodeEvent("paused", OLD, 2.0), NodeEvent("resumed", OLD, 3.0)]  # short
    w.op("p", "status", {"task": "T1"}, 2.5, reply={"state": "READY"}, done=3.1, node=OLD)
    w.history.nodes += [NodeEvent("killed", OLD, 4.0), NodeEvent("primary", NEW, 6.0, 2),
                        NodeEvent("started", OLD, 7.0), NodeEvent("killed", NEW, 8.0),
                        NodeEvent("primary", OLD, 10.0, 3)]
    w.op("p", "status", {"task": "T1"}, 4.5, "info", node=None)  # lost with the kill
    w.op("p", "status", {"task": "T1"}, 6.5, reply={"state": "READY"}, node=NEW)
    # Sent while OLD was down, answered by its new process once it led again.
    w.op("p", "status", {"task": "T1"}, 5.0, reply={"state": "READY"}, done=10.5, node=OLD)
    assert check_no_reply_from_a_replaced_primary(w.history) == []


def test_the_history_checker_ends_a_reign_only_at_a_higher_epoch_of_its_own_shard() -> None:
    w = Writer()
    w.history.nodes += [NodeEvent("primary", OLD, 0.5, 1, "a"),
                        NodeEvent("primary", NEW, 1.0, 2, "b")]  # shard b counts its own
    w.op("p", "status", {"task": "T1"}, 2.0, reply={"state": "READY"}, node=OLD)
    assert check_no_reply_from_a_replaced_primary(w.history) == []
    w.history.nodes.append(NodeEvent("primary", "127.0.0.1:7003", 3.0, 2, "a"))
    w.op("p", "status", {"task": "T1"}, 4.0, reply={"state": "READY"}, node=OLD)
    assert "epoch 2 led by 127.0.0.1:7003" in _messages(
        check_no_reply_from_a_replaced_primary(w.history))


# ---- a shard that gave a slot away, and the map's versions -----------------------------

SOURCE, TARGET = (OLD, "127.0.0.1:7003"), NEW


def _switch(w: Writer, at: float = 3.0, epoch: int = 3) -> None:
    w.history.switches.append(SlotSwitch(256, 511, "a", "b", epoch, at, SOURCE))


def test_the_history_checker_finds_a_reply_for_a_slot_from_the_shard_that_gave_it_away(
) -> None:
    w = Writer()
    _switch(w)
    w.op("p", "submit", {"key": "k", "input": 1}, 2.0, reply={"task": "T1"}, done=3.5,
         node=OLD)  # sent before the switch was seen: may have been served in time
    w.op("p", "acquire", {"key": "x"}, 4.0, "fail", node=SOURCE[1])  # CLAIM_HELD: served
    w.op("p", "renew", {"key": "x"}, 4.0, reply={}, node=OLD)  # a renewal answered ok
    found = check_no_reply_for_a_slot_given_away(w.history)
    assert len(found) == 2, _messages(found)
    assert "(shard 'a') answered a request sent 1.000 s after map epoch 3 gave slots " \
        "256-511 to shard 'b'" in found[0].message


def test_the_history_checker_passes_moved_answers_and_handles_refused_after_a_switch(
) -> None:
    w = Writer()
    _switch(w)
    w.op("p", "submit", {"key": "k", "input": 1}, 4.0, reply={"task": "T1"}, node=TARGET)
    w.op("p", "complete", {"task": "T1", "outcome": {}}, 4.0, "fail", node=OLD)  # STALE_CLAIM
    w.op("p", "release", {"key": "x"}, 4.0, "fail", node=OLD)
    w.op("p", "status", {"task": "T1"}, 4.0, "info", node=None)  # MOVED too often: no node
    w.history.switches.append(SlotSwitch(256, 511, "b", "a", 4, 5.0, (NEW,)))  # and back
    w.op("p", "submit", {"key": "k", "input": 1}, 6.0, reply={"task": "T1"}, node=OLD)
    assert check_no_reply_for_a_slot_given_away(w.history) == []


def _map(revision: int, epoch: int, *ranges: list[object], slots: int = 1024) -> MapVersion:
    return MapVersion(revision, {"slots": slots, "epoch": epoch, "ranges": list(ranges)})


def test_the_history_checker_finds_a_map_version_with_two_owners_or_none_for_a_slot() -> None:
    w = Writer()
    w.history.maps = [_map(5, 1, [0, 1023, "a"]),
                      _map(9, 2, [0, 511, "a"], [500, 1023, "b"]),  # 500-511 twice
                      _map(12, 3, [0, 255, "a"], [512, 1023, "b"])]  # 256-511 nobody's
    found = _messages(check_one_owner_per_slot_at_every_map_epoch(w.history))
    assert "map epoch 2 (etcd revision 9): ranges must cover every slot once" in found
    assert "map epoch 3 (etcd revision 12): ranges must cover every slot once" in found


def test_the_history_checker_finds_a_map_epoch_skipped_and_a_switch_etcd_never_held() -> None:
    w = Writer()
    w.history.maps = [_map(5, 1, [0, 1023, "a"]), _map(9, 3, [0, 255, "a"], [256, 1023, "b"])]
    _switch(w, epoch=2)
    found = _messages(check_one_owner_per_slot_at_every_map_epoch(w.history))
    assert "map epoch 3 (etcd revision 9) follows map epoch 1" in found
    assert "no version of the map in etcd gives slots 256-511 to shard 'b' at epoch 2" in found


def test_the_history_checker_passes_maps_one_epoch_apart_each_covering_every_slot() -> None:
    w = Writer()
    w.history.maps = [_map(9, 2, [0, 511, "a"], [512, 1023, "b"]), _map(5, 1, [0, 1023, "a"]),
                      _map(12, 3, [0, 255, "a"], [256, 1023, "b"])]  # read in any order
    _switch(w)
    assert check_one_owner_per_slot_at_every_map_epoch(w.history) == []


# ---- the recorder ----------------------------------------------------------------------


def test_a_dumped_history_loads_back_and_checks_the_same(tmp_path: Path) -> None:
    w = Writer()
    w.acquire("a", "x", 1, 1.0)
    w.acquire("b", "x", 2, 2.0)
    w.history.losses.append(LeaseLoss("a", "x", "x-1", 1, 3.0, "deadline"))
    _reign(w)
    _switch(w)
    w.history.maps = [_map(5, 1, [0, 1023, "a"]), _map(9, 3, [0, 1023, "a"])]
    w.final(4.0)
    w.history.dump(tmp_path / "history.jsonl")
    again = load(tmp_path / "history.jsonl")
    assert again.lease_seconds == 2.0 and again.final_at == 4.0
    assert again.switches == w.history.switches and again.maps == w.history.maps
    assert [str(v) for v in check(again)] == [str(v) for v in check(w.history)] != []


class FakeConnection:
    """What ``Process`` watches of an SDK connection: ``_send`` (a request id per
    request) and ``_received`` (a batch of messages read), and the peer's address."""

    def __init__(self, port: int) -> None:
        self.host, self.port = "127.0.0.1", port
        self.next_id = 1

    def _send(self, op: int, args: dict[str, Any]) -> tuple[int, None]:
        rid, self.next_id = self.next_id, self.next_id + 1
        return rid, None

    def _received(self, proto: Any, messages: list[Any]) -> None:
        pass

    async def answer(self, message: list[Any], value: Any = None) -> Any:
        """A request sent, ``message`` read back for it (``RID`` stands for its id)."""
        rid = self._send(0, {})[0]
        self._received(None, [[rid if part == "RID" else part for part in message]])
        return value


def _client(home: FakeConnection, sibling: FakeConnection) -> Any:
    """A fake client: ``home`` its connection, ``sibling`` the one its router opens."""
    shards = SimpleNamespace(_open=lambda name: (sibling, None))
    return SimpleNamespace(_conn=home, _shards=shards)


async def test_the_history_recorder_tells_ok_fail_and_info_apart_and_names_the_node() -> None:
    history = History(lease_seconds=2.0)
    conn = FakeConnection(7001)
    process = history.process("p", _client(conn, FakeConnection(0)))

    async def refused() -> None:
        await conn.answer([3, "RID", "CLAIM_HELD", "held"])
        raise ConflictError("held", "CLAIM_HELD")

    async def lost() -> None:
        raise UnavailableError("connection lost")

    assert await process.call("acquire", {"key": "x"}, lambda: conn.answer([2, "RID", 3], 3),
                              reply=lambda n: {"generation": n}) == 3
    conn.port = 7002
    with pytest.raises(ConflictError):
        await process.call("acquire", {"key": "x"}, refused)
    with pytest.raises(UnavailableError):
        await process.call("acquire", {"key": "x"}, lost)
    with pytest.raises(asyncio.CancelledError):
        await process.call("acquire", {"key": "x"}, _cancelled)
    first, second, third, fourth = history.ops
    assert (first.outcome, first.reply, first.node) == ("ok", {"generation": 3},
                                                       "127.0.0.1:7001")
    assert (second.outcome, second.node) == ("fail", "127.0.0.1:7002")
    assert "CLAIM_HELD" in (second.error or "")
    assert (third.outcome, third.node) == ("info", None)  # nothing read: no node answered
    assert fourth.outcome == "info"
    assert all(op.invoked <= (op.completed or 0) for op in history.ops)
    assert "acquire ok: 1" in report(history, [], seed=7) and "(seed 7)" in report(
        history, [], seed=7)


async def test_the_history_recorder_names_the_shard_that_answered_not_the_one_that_redirected(
) -> None:
    history = History(lease_seconds=2.0)
    home, sibling = FakeConnection(7001), FakeConnection(7002)
    process = history.process("p", _client(home, sibling))
    process.rs._shards._open("b")  # the router opens shard b's connection

    async def moved_then_served() -> int:
        await home.answer([3, "RID", "MOVED", "slot 9 is shard b's"])  # not an answer
        await sibling.answer([2, "RID", 1])
        home._received(None, [[4, 1, {}]])  # a push read on home meanwhile
        return 1

    await process.call("submit", {"key": "k"}, moved_then_served)
    await process.call("submit", {"key": "k"}, lambda: home.answer([4, 1, {}]))  # a push
    served, unanswered = history.ops
    assert served.node == "127.0.0.1:7002"
    assert unanswered.node is None  # two connections: a batch read says nothing


async def _cancelled() -> None:
    raise asyncio.CancelledError
