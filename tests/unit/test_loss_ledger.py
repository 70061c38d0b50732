"""Env steps lost by cause: the learner's ledger across resumes, and an actor life's ledger file."""

from __future__ import annotations

import json

import pytest

from rlfleet.actors.learner_client import LifeLedger, orphaned_lives
from rlfleet.learner import losses
from rlfleet.learner.losses import LEDGER_FILE, BadLifeReport, LossLedger, read_ledger
from rlfleet.wire.life_ledger import mark_reported


def test_every_taken_step_is_counted_or_lost_by_cause_across_resumes(tmp_path):
    led = LossLedger(tmp_path)
    led.start()
    base = 0xA << 32  # actor0's life 0xA: segment ids base+1, base+2, ...
    for i in range(1, 11):
        led.accepted_segment("actor0", base + i, 100)  # 1000 accepted
    led.refused_push("actor0", base + 11)  # one refused push: up to one segment's steps may be reported rejected
    for total in range(100, 701, 100):
        led.counted(total)  # 700 counted; the checkpoint saw 400; 300 still queued
    # its ledger file missed the last acknowledgement: the learners' count wins for a killed life
    assert led.life_ended("actor0", 0xA, taken=1250, accepted=900, rejected=50, crashed=True) == 200
    assert led.life_ended("actor0", 0xA, taken=1250, accepted=1000, rejected=50, crashed=True) == 0  # once only

    again = LossLedger(tmp_path)  # the learner crashed; --resume from the checkpoint at 400
    again.resume(checkpoint_env_steps=400)
    assert again.by_cause() == {
        "actor_crashed": 200,
        "learner_queue": 300,
        "rejected_segments": 50,
        "resume_rollback": 300,
    }
    assert again.seen_before("actor0", base + 10) and not again.seen_before("actor0", base + 11)
    assert not again.seen_before("actor1", (0xB << 32) + 1)  # a re-send after the crash is a duplicate
    again.accepted_segment("actor1", (0xB << 32) + 1, 100)
    again.counted(500)
    again.life_ended("actor1", 0xB, taken=100, accepted=100, rejected=0, crashed=False)
    third = LossLedger(tmp_path)  # a second resume, from a checkpoint at 500: nothing more lost
    third.resume(checkpoint_env_steps=500)
    lost = third.by_cause()
    taken = 1250 + 100
    assert 500 + sum(lost.values()) == taken, lost  # counted + lost == taken, no double count
    assert json.loads((tmp_path / LEDGER_FILE).read_text())["lives"] == ["actor0/a", "actor1/b"]


def test_an_actor_life_ledger_outlives_the_process_and_is_found_by_the_next(tmp_path):
    first = LifeLedger("actor0", 0x1234, str(tmp_path))
    first.set_taken(640)
    first.add(accepted=512)
    first.add(rejected=64)
    # killed here: no close(), no report; the next life of the same client id finds it
    second = LifeLedger("actor0", 0x9999, str(tmp_path))
    found = orphaned_lives(str(tmp_path), "actor0", second.path)
    assert len(found) == 1
    _, report = found[0]
    assert (report.life, report.env_steps, report.accepted_env_steps, report.rejected_env_steps, report.crashed) == (
        0x1234,
        640,
        512,
        64,
        True,
    )
    assert orphaned_lives(str(tmp_path), "actor1", None) == []  # other client ids are not ours
    second.close(reported=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor0.00001234.ledger", "actor0.00009999.reported"]
    assert LifeLedger("x", 1, None).path is None  # without a folder: counts only


def test_an_actor_closing_a_ledger_the_learner_already_counted_is_not_an_error(tmp_path):
    """The learner's end-of-run sweep may count and rename a life's ledger before the actor's own
    close(reported=True) renames it."""
    ledger = LifeLedger("actor0", 0x42, str(tmp_path))
    ledger.set_taken(8)
    assert mark_reported(ledger.path)  # the learner's sweep
    assert not mark_reported(ledger.path)  # gone: someone counted it
    ledger.close(reported=True)
    assert [p.name for p in tmp_path.iterdir()] == ["actor0.00000042.reported"]


@pytest.mark.parametrize(
    "report",
    [
        dict(life=0xBADBAD, taken=2**62, accepted=0, rejected=0, crashed=False),  # far above what it pushed
        dict(life=0xBADBAD, taken=100, accepted=-(2**62), rejected=-7, crashed=True),  # negative counts
        dict(life=0xBADBAD, taken=100, accepted=500, rejected=0, crashed=False),  # more accepted than learners saw
        dict(life=0xBADBAD, taken=100, accepted=0, rejected=100, crashed=False),  # rejected, never refused
        dict(life=2**40, taken=0, accepted=0, rejected=0, crashed=False),  # not a life (31 bits)
    ],
)
def test_a_poisoned_life_report_is_refused_and_adds_nothing(tmp_path, report):
    """Was: one heartbeat put 4.6e18 into actor_stopped / actor_crashed and the ledger file."""
    led = LossLedger(tmp_path, life_slack=320, segment_env_steps=64)
    led.start()
    led.accepted_segment("a", (0xBADBAD << 32) + 1, 64)
    with pytest.raises(BadLifeReport):
        led.life_ended("a", **report)
    assert led.by_cause() == {} and led.refused_reports == 1
    assert led.life_ended("a", 0xBADBAD, taken=64 + 320, accepted=64, rejected=0, crashed=False) == 320  # the bound
    assert read_ledger(tmp_path)["lost"] == {"actor_stopped": 320, "rejected_segments": 0}


def test_lives_are_bounded_and_the_ledger_is_appended_not_rewritten(tmp_path, monkeypatch):
    """Was: 6,000 life reports made 6,002 entries, and every change rewrote the whole file."""
    monkeypatch.setattr(losses, "COMPACT_EVERY", 500)
    led = LossLedger(tmp_path, life_slack=10, segment_env_steps=10)
    led.start()
    for life in range(1, 3001):
        led.life_ended("a", life, taken=1, accepted=0, rejected=0, crashed=False)
    for life in range(1, 51):
        led.life_ended(f"c{life}", life, taken=2, accepted=0, rejected=0, crashed=True)
    assert len(led.lives) == losses.MAX_LIVES_PER_CLIENT + 50 and led.folded_lives == 3000 - losses.MAX_LIVES_PER_CLIENT
    assert led.by_cause() == {"actor_stopped": 3000, "actor_crashed": 100}  # folded lives stay in the totals
    snapshot = (tmp_path / LEDGER_FILE).stat()
    for seg in range(1, 400):  # below COMPACT_EVERY: appended lines only, the snapshot is left alone
        led.accepted_segment("b", (7 << 32) + seg, 10)
    assert (tmp_path / LEDGER_FILE).stat().st_mtime_ns == snapshot.st_mtime_ns
    assert (tmp_path / losses.LOG_FILE).stat().st_size < 400 * 80
    led.close()
    # a learner killed here: the snapshot plus the log give the whole account, once
    state = read_ledger(tmp_path)
    assert state["accepted"] == 3990 and state["lost"]["actor_stopped"] == 3000
    again = LossLedger(tmp_path)
    again.resume(checkpoint_env_steps=0)
    assert again.seen_before("b", (7 << 32) + 399) and not again.seen_before("b", (7 << 32) + 400)
    assert again.by_cause()["learner_queue"] == 3990
