"""Scripted experts: per task a plan of end-effector waypoints (generators), followed with the env's action.

A plan is a generator of `Phase`s; it reads object poses when it is resumed, so later phases
(place, strike) adapt to where a grasped object actually ended up. The expert emits the same
8-dim delta action a policy does (`RoboTwinEnv` layout): it steers each arm's commanded target
toward the phase's waypoint at up to `MAX_DELTA` per step, and moves on once the real end
effectors are within `tol` (and have held for `hold` steps, which lets grippers close or open).

The expert is a state machine, not a function of the observation: it follows its own phase
counter, so DAgger labels are right as long as the student stays near the expert's path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import sapien

from rlfleet.envs.robotwin.scene import ARMS, MAX_DELTA
from rlfleet.envs.robotwin.tasks import (
    AdjustBottle,
    BeatBlockHammer,
    ClickBell,
    HandoverBlock,
    LiftPot,
    MoveCanPot,
    PickDualBottles,
    PlaceContainerPlate,
    PlaceEmptyCup,
    PlaceShoe,
    Task,
    side_arm,
)

OPEN, CLOSE = -1.0, 1.0
ABOVE = 0.1  # approach height over a grasp or place point


@dataclass
class Phase:
    """Waypoints (world xyz) and gripper commands for some arms; the others keep their last ones."""

    targets: dict[str, np.ndarray] = field(default_factory=dict)
    grip: dict[str, float] = field(default_factory=dict)
    hold: int = 0
    tol: float = 0.012
    timeout: int = 60


Plan = Iterator[Phase]


def _p(xyz: np.ndarray, dz: float = 0.0) -> np.ndarray:
    return np.asarray(xyz, np.float64) + np.array([0.0, 0.0, dz])


def pick(arm: str, grasp: np.ndarray, lift: float = 0.15) -> Plan:
    yield Phase({arm: _p(grasp, ABOVE)}, {arm: OPEN})
    yield Phase({arm: _p(grasp)}, {arm: OPEN}, tol=0.008)
    yield Phase({arm: _p(grasp)}, {arm: CLOSE}, hold=8)
    yield Phase({arm: _p(grasp, lift)}, {arm: CLOSE}, tol=0.02)


def place(arm: str, at: np.ndarray, release: bool = True) -> Plan:
    yield Phase({arm: _p(at, ABOVE)}, {arm: CLOSE}, tol=0.015)
    yield Phase({arm: _p(at)}, {arm: CLOSE}, tol=0.008)
    if release:
        yield Phase({arm: _p(at)}, {arm: OPEN}, hold=8)
        yield Phase({arm: _p(at, ABOVE)}, {arm: OPEN}, tol=0.02)


def _over(obj: sapien.Entity, z: float) -> np.ndarray:
    """The point `z` above an object's origin (the centre of its bottom face)."""
    return np.asarray(obj.pose.p) + np.array([0.0, 0.0, z])


def plan_place_empty_cup(t: PlaceEmptyCup) -> Plan:
    arm = side_arm(t.cup.pose.p[1])
    yield from pick(arm, _over(t.cup, 0.055))
    coaster = np.asarray(t.coaster.pose.p)
    yield from place(arm, coaster + np.array([0.0, 0.0, 0.008 + 0.055 + 0.004]))


def plan_place_container_plate(t: PlaceContainerPlate) -> Plan:
    arm = side_arm(t.container.pose.p[1])
    yield from pick(arm, _over(t.container, 0.035))
    plate = np.asarray(t.plate.pose.p)
    yield from place(arm, plate + np.array([0.0, 0.0, 0.01 + 0.035 + 0.004]))


def plan_move_can_pot(t: MoveCanPot) -> Plan:
    arm = side_arm(t.can.pose.p[1] - t.pot.pose.p[1])
    yield from pick(arm, _over(t.can, 0.07), lift=0.18)
    pot, can = np.asarray(t.pot.pose.p), np.asarray(t.can.pose.p)
    away = can[:2] - pot[:2]
    goal = pot[:2] + 0.115 * away / np.linalg.norm(away)
    yield from place(arm, np.array([goal[0], goal[1], pot[2] + 0.07 + 0.004]))


def plan_adjust_bottle(t: AdjustBottle) -> Plan:
    arm = "left" if t.cap_left else "right"
    grasp = np.asarray(t.bottle.pose.p) + np.array([0.0, 0.0, 0.035])
    yield from pick(arm, grasp, lift=0.18)
    yield Phase({arm: _p(grasp, 0.18)}, {arm: CLOSE}, hold=5)


def plan_click_bell(t: ClickBell) -> Plan:
    arm = side_arm(t.bell.pose.p[1])
    top = np.asarray(t.bell.pose.p) + np.array([0.0, 0.0, 0.06])
    yield Phase({arm: _p(top, ABOVE)}, {arm: CLOSE})
    yield Phase({arm: _p(top, -0.01)}, {arm: CLOSE}, tol=0.02, timeout=15)
    yield Phase({arm: _p(top, ABOVE)}, {arm: CLOSE})


def plan_pick_dual_bottles(t: PickDualBottles) -> Plan:
    grasps = {"left": _over(t.bottles[0], 0.1), "right": _over(t.bottles[1], 0.1)}
    yield Phase({a: _p(g, ABOVE) for a, g in grasps.items()}, dict.fromkeys(ARMS, OPEN))
    yield Phase({a: _p(g) for a, g in grasps.items()}, dict.fromkeys(ARMS, OPEN), tol=0.008)
    yield Phase({a: _p(g) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), hold=8)
    yield Phase({a: _p(g, 0.15) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), tol=0.02)
    yield Phase({a: _p(g, 0.15) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), hold=5)


def plan_lift_pot(t: LiftPot) -> Plan:
    grasps = {"left": t.handle(1.0), "right": t.handle(-1.0)}
    yield Phase({a: _p(g, ABOVE) for a, g in grasps.items()}, dict.fromkeys(ARMS, OPEN))
    yield Phase({a: _p(g) for a, g in grasps.items()}, dict.fromkeys(ARMS, OPEN), tol=0.008)
    yield Phase({a: _p(g) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), hold=8)
    for dz in (0.05, 0.1, 0.15):  # lift in steps so both hands stay level
        yield Phase({a: _p(g, dz) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), tol=0.02)
    yield Phase({a: _p(g, 0.15) for a, g in grasps.items()}, dict.fromkeys(ARMS, CLOSE), hold=5)


def plan_handover_block(t: HandoverBlock) -> Plan:
    left_grasp = (t.block.pose * sapien.Pose([0.0, 0.06, 0.015])).p
    yield from pick("left", left_grasp, lift=0.15)
    meet = np.array([0.45, 0.06, t.s.table_z + 0.2])  # block centre over the table's middle
    yield Phase({"left": meet}, {"left": CLOSE}, tol=0.01)
    yield Phase({"left": meet}, {"left": CLOSE}, hold=5)
    right_grasp = (t.block.pose * sapien.Pose([0.0, -0.06, 0.015])).p
    yield Phase({"right": _p(right_grasp, ABOVE)}, {"right": OPEN})
    yield Phase({"right": _p(right_grasp)}, {"right": OPEN}, tol=0.008)
    yield Phase({"right": _p(right_grasp)}, {"right": CLOSE}, hold=8)
    yield Phase({}, {"left": OPEN}, hold=8)
    yield Phase({"left": _p(meet, 0.1)}, {"left": OPEN}, tol=0.02)
    pad = np.asarray(t.pad.pose.p)
    block = np.asarray(t.block.pose.p)
    offset = _p(right_grasp) - block  # grasp point relative to the block centre, as held now
    yield from place("right", np.array([pad[0], pad[1], pad[2] + 0.004]) + offset + np.array([0, 0, 0.004]))


def plan_beat_block_hammer(t: BeatBlockHammer) -> Plan:
    arm = side_arm(t.hammer.pose.p[1])
    yield from pick(arm, t.grasp_point(), lift=0.15)
    head = t.head_bottom()
    hand = t.s.arms[arm].ee_pos()
    top = np.asarray(t.block.pose.p) + np.array([0.0, 0.0, 0.05])
    over = hand + (top - head)  # move the hand so the head sits over the block
    yield Phase({arm: _p(over, 0.08)}, {arm: CLOSE}, tol=0.01)
    yield Phase({arm: _p(over, -0.01)}, {arm: CLOSE}, tol=0.02, timeout=20)
    yield Phase({arm: _p(over, 0.08)}, {arm: CLOSE})


def plan_place_shoe(t: PlaceShoe) -> Plan:
    arm = side_arm(t.shoe.pose.p[1])
    grasp = t.grasp_point() - np.array([0.0, 0.0, 0.02])
    yield from pick(arm, grasp)
    hand = t.s.arms[arm].ee_pos()
    shoe = np.asarray(t.shoe.pose.p)
    mat = np.asarray(t.mat.pose.p)
    at = hand + (mat - shoe)
    at[2] = hand[2] - (shoe[2] - mat[2]) + 0.006
    yield from place(arm, at)


PLANS: dict[str, Callable[[Task], Plan]] = {
    "place_empty_cup": plan_place_empty_cup,
    "place_container_plate": plan_place_container_plate,
    "move_can_pot": plan_move_can_pot,
    "adjust_bottle": plan_adjust_bottle,
    "click_bell": plan_click_bell,
    "pick_dual_bottles": plan_pick_dual_bottles,
    "lift_pot": plan_lift_pot,
    "handover_block": plan_handover_block,
    "beat_block_hammer": plan_beat_block_hammer,
    "place_shoe": plan_place_shoe,
}


class ScriptedExpert:
    """Follows a task's plan; `act()` gives the action for the scene's current step."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._phase: Phase | None = None

    def reset(self) -> None:
        """Start the plan over; call after the task has laid out its episode."""
        self._plan = PLANS[self.task.name](self.task)
        self._grip = dict.fromkeys(ARMS, OPEN)
        self._phase: Phase | None = None
        self._last: tuple[int, np.ndarray] | None = None
        self._advance()

    @property
    def done(self) -> bool:
        return self._phase is None

    def _advance(self) -> None:
        self._phase = next(self._plan, None)
        self._steps, self._held = 0, 0
        if self._phase is not None:
            self._grip.update(self._phase.grip)

    def act(self, step: int) -> np.ndarray:
        """The 8-dim action at env step `step` of the episode; asking twice at one step gives the same."""
        if self._last is not None and self._last[0] == step:
            return self._last[1].copy()
        arms = self.task.s.arms
        ph = self._phase
        if ph is not None:
            reached = all(np.linalg.norm(arms[a].ee_pos() - p) < ph.tol for a, p in ph.targets.items())
            self._held = self._held + 1 if reached else 0
            if (reached and self._held > ph.hold) or self._steps >= ph.timeout:
                self._advance()
                ph = self._phase
        action = np.zeros(8, np.float32)
        for i, name in enumerate(ARMS):
            if ph is not None and name in ph.targets:
                action[4 * i : 4 * i + 3] = np.clip((ph.targets[name] - arms[name].target) / MAX_DELTA, -1.0, 1.0)
            action[4 * i + 3] = self._grip[name]
        if ph is not None:
            self._steps += 1
        self._last = (step, action)
        return action.copy()
