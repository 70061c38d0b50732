"""Scripted experts: one waypoint controller per subtask kind, in the env's own 7-dim action space.

Each expert is a function of the current physics `Snapshot`, the snapshot at subtask start and
the planned symbolic states (which block to stack on, where an unstacked block goes). It holds
no memory between steps: the phase (approach, grasp, pull, release, ...) is read off the scene
every step, so the expert also gives sensible labels in states a student policy drove into
(DAgger) and recovers from slips (a dropped block is grasped again).

Handles, the switch knob and blocks on the table are approached from above at `SAFE_Z`; the
drawer, sliding door and switch are moved by straddling their handle with the open fingers and
pushing with a finger (pure contact, no friction needed); blocks are pushed with the closed
fingers and grasped across their narrow side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlfleet.envs.calvin.layout import BLOCK_SIZE, DRAWER_TRAVEL, SLIDER_TRAVEL, SWITCH_TRAVEL, Variant
from rlfleet.envs.calvin.robot import ControlSettings
from rlfleet.envs.calvin.scene import Snapshot
from rlfleet.envs.calvin.subtasks import PUSH_DIST, ROTATE_ANGLE, Subtask, stack_target, stacked_top
from rlfleet.envs.calvin.symbolic import SymState, half_extent

_CTRL = ControlSettings()
SAFE_Z = 0.20  # tcp height for moving across the desk (hand clears towers, handles, the drawer unit)
FINGER_GAP = 0.04  # half the opening of the open gripper
OPEN, CLOSE = 1.0, -1.0
HALF_PI = math.pi / 2


@dataclass(frozen=True)
class ExpertContext:
    """What an expert may know beyond the current scene: the subtask and how it started / should end."""

    task: Subtask
    variant: Variant
    start: Snapshot
    before: SymState  # planned symbolic state at subtask start
    after: SymState  # planned symbolic state after it


def expert_action(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    """The expert's action (float32 [7] in [-1, 1]) for `ctx.task` in scene state `now`."""
    kind = ctx.task.kind
    if kind in ("drawer", "slider", "bulb"):
        action = _articulated(ctx, now)
    elif kind == "led":
        action = _button(ctx, now)
    elif kind in ("lift", "rotate"):
        action = _lift_or_rotate(ctx, now)
    elif kind == "push":
        action = _push(ctx, now)
    else:  # stack, unstack, place_drawer: carry a block somewhere and let go
        action = _carry(ctx, now)
    return np.clip(action, -1.0, 1.0).astype(np.float32)


# --- motion primitives ---------------------------------------------------------------------------


def _wrap(a: float) -> float:
    return math.remainder(a, 2 * math.pi)


def _act(now: Snapshot, goal: np.ndarray, yaw: float, grip: float, speed: float = 1.0) -> np.ndarray:
    """Step towards tcp position `goal` (at most `speed` x 2 cm) and hand yaw `yaw`, fingers down."""
    a = np.empty(7)
    a[:3] = np.clip((np.asarray(goal, float) - now.tcp_pos) / _CTRL.max_step_m, -speed, speed)
    a[3:5] = -now.tcp_euler[:2] / _CTRL.max_step_rad
    a[5] = (yaw - now.tcp_euler[2]) / _CTRL.max_step_rad  # not wrapped: never turn through +-pi
    a[6] = grip
    return np.clip(a, -1.0, 1.0)


def _approach(
    now: Snapshot,
    target: np.ndarray,
    yaw: float,
    grip: float,
    ready: bool = True,
    tol: float = 0.008,
    leave_open: bool = False,
    final_speed: float = 1.0,
) -> np.ndarray:
    """Go up to SAFE_Z, across, then down onto `target`; descend only once within 2 * `tol`, yawed and `ready`.

    `leave_open`: lift off with the fingers open, so a block the previous subtask left between
    them is not picked up by a gripper that closes for this one. `final_speed` caps the step
    within 3 cm of the target (a held block swings when the hand stops short).
    """
    pos = now.tcp_pos
    dxy = math.hypot(target[0] - pos[0], target[1] - pos[1])
    yaw_ok = abs(yaw - now.tcp_euler[2]) < 0.12
    speed = 1.0
    if dxy > 0.03:
        if pos[2] < SAFE_Z - 0.02:
            goal = np.array([pos[0], pos[1], SAFE_Z])  # lift off first, whatever is below
            yaw = now.tcp_euler[2]  # turning the wrist near the desk drags the tcp: turn once up
            if leave_open:
                grip = OPEN
        else:
            goal = np.array([target[0], target[1], SAFE_Z])
    elif dxy > 2 * tol or not yaw_ok or not ready:
        hold = target[2] + (0.05 if not ready or not yaw_ok else 0.0)
        goal = np.array([target[0], target[1], max(pos[2], hold)])
        if not yaw_ok and pos[2] < target[2] + 0.04:
            yaw = now.tcp_euler[2]  # turn the open fingers only once clear of what is below
        speed = final_speed
    else:  # descend while still correcting xy (going down drags the tcp a few mm near the base)
        goal = np.asarray(target, float)
        speed = final_speed
    return _act(now, goal, yaw, grip, speed)


def _yaw_range(x: float, y: float) -> tuple[float, float]:
    """Hand yaws the arm reaches with the fingers down at (x, y), measured on a grid: joint 7
    (~ pi/4 + heading - yaw) bounds yaw - heading to [-2.0, 3.4]; close to the base the folded
    arm allows only |yaw - heading| < ~1.6; |yaw| < 2.9 keeps the reported yaw off its +-pi wrap."""
    heading = math.atan2(y, x)
    folded = 1.6 + 17.0 * max(0.0, math.hypot(x, y) - 0.33)
    return max(heading - min(2.0, folded), -2.9), min(heading + min(3.4, folded), 2.9)


def _pick_yaw(base: float, period: float, x: float, y: float, near: float, turn: float = 0.0) -> float:
    """Among `base + k * period`, the yaw nearest `near` from which the hand can also turn by `turn`
    (if none can turn all the way, the one that gets furthest)."""
    lo, hi = _yaw_range(x, y)

    def cost(c: float) -> float:
        a, b = sorted((c, c + turn))
        return 10.0 * (max(0.0, lo - a) + max(0.0, b - hi)) + abs(c + turn / 2 - near)

    return min((base + k * period for k in range(-4, 5)), key=cost)


def _symmetric_yaw(yaw: float, now: Snapshot, x: float, y: float) -> float:
    """`yaw` or `yaw` +- pi (the gripper looks the same both ways): the reachable one nearest the hand's yaw."""
    return _pick_yaw(yaw, math.pi, x, y, now.tcp_euler[2])


def _rise(now: Snapshot, grip: float) -> np.ndarray:
    return _act(now, np.array([now.tcp_pos[0], now.tcp_pos[1], SAFE_Z]), now.tcp_euler[2], grip)


# --- articulated objects -------------------------------------------------------------------------


def _articulated(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    """Drawer, sliding door, switch: straddle the handle with the open fingers, push it with one finger."""
    v, d, kind = ctx.variant, ctx.task.direction, ctx.task.kind
    if kind == "drawer":
        handle = np.array(v.drawer_handle(now.drawer))
        end = np.array(v.drawer_handle(DRAWER_TRAVEL if d > 0 else 0.0))
        axis, yaw, half = 0, HALF_PI, 0.0075
        move = -d  # opening pulls towards the robot (-x)
        offset = np.zeros(3)
    elif kind == "slider":
        handle = np.array(v.slider_handle(now.slider))
        end = np.array(v.slider_handle(SLIDER_TRAVEL if d > 0 else 0.0))
        axis, yaw, half = 1, 0.0, 0.0075
        move = d
        offset = np.array([-0.012, 0.0, 0.0])  # keep the hand clear of the door
    else:  # bulb: the switch knob
        handle = np.array(v.switch_knob(now.switch))
        end = np.array(v.switch_knob(SWITCH_TRAVEL if d > 0 else 0.0))
        axis, yaw, half = 0, HALF_PI, 0.01
        move = d
        offset = np.array([0.0, 0.0, 0.005])
    grasp = handle + offset
    yaw = _symmetric_yaw(yaw, now, grasp[0], grasp[1])
    other = 1 - axis
    pos = now.tcp_pos
    contact = FINGER_GAP - half  # the pushing finger touches the handle when tcp = handle + move * contact
    engaged = (
        abs(pos[other] - grasp[other]) < 0.015
        and abs(pos[axis] - grasp[axis]) < contact + 0.004
        and pos[2] < grasp[2] + 0.015
    )
    if engaged:
        goal = grasp.copy()
        goal[axis] = end[axis] + move * (contact + 0.01)
        return _act(now, goal, yaw, OPEN)
    return _approach(now, grasp, yaw, OPEN, ready=now.gripper_width > 2 * FINGER_GAP - 0.01)


def _button(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    """Press the button with the closed fingers until the LED flips; back off first if it is still held down."""
    top = np.array(ctx.variant.button_top(0.0))
    yaw = _symmetric_yaw(HALF_PI, now, top[0], top[1])
    if now.led != ctx.start.led or now.button_latched:
        return _act(now, np.array([now.tcp_pos[0], now.tcp_pos[1], top[2] + 0.04]), yaw, CLOSE)
    return _approach(now, top - np.array([0, 0, 0.015]), yaw, CLOSE, ready=now.gripper_width < 0.02, leave_open=True)


# --- blocks --------------------------------------------------------------------------------------


def _grasp_yaw(color: str, block_yaw: float, x: float, y: float, near: float, turn: float = 0.0) -> float:
    """Hand yaw that closes the fingers across the block's narrow (y) side, nearest `near`, leaving room to `turn`."""
    period = HALF_PI if color == "red" else math.pi  # the cube can be grasped across either side
    return _pick_yaw(block_yaw, period, x, y, near, turn)


def _holding(now: Snapshot, color: str) -> bool:
    return now.grasped[color] and now.gripper_width < BLOCK_SIZE[color][1] + 0.008


def _grasp(now: Snapshot, color: str, turn: float = 0.0) -> np.ndarray:
    """Open above the block, go down around it, close (with room for the wrist to `turn` afterwards)."""
    b = now.block_pos[color]
    yaw = _grasp_yaw(color, now.block_yaw[color], b[0], b[1], 0.0, turn)
    # fingertips (7 mm below the tcp) stay well above the block's bottom: a block under it is not grabbed too
    target = np.array([b[0], b[1], b[2] + 0.006])
    pos = now.tcp_pos
    at_block = (
        math.hypot(*(pos[:2] - b[:2])) < 0.012
        and abs(pos[2] - target[2]) < 0.008
        and abs(yaw - now.tcp_euler[2]) < 0.15
    )
    if at_block:
        return _act(now, target, yaw, CLOSE)
    ready = now.gripper_width > BLOCK_SIZE[color][1] + 0.025
    return _approach(now, target, yaw, OPEN, ready=ready, final_speed=0.6)


def _release(now: Snapshot, color: str) -> np.ndarray:
    """Open where we are; once the fingers cleared the block, go up."""
    if now.gripper_width > BLOCK_SIZE[color][1] + 0.015:
        up = min(now.tcp_pos[2] + 0.03, max(now.tcp_pos[2], SAFE_Z))
        return _act(now, np.array([now.tcp_pos[0], now.tcp_pos[1], up]), now.tcp_euler[2], OPEN)
    return _act(now, now.tcp_pos, now.tcp_euler[2], OPEN)


def _lift_or_rotate(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    c, d = ctx.task.color, ctx.task.direction
    assert c is not None
    b = now.block_pos[c]
    rest_z = ctx.start.block_pos[c][2]
    if ctx.task.kind == "lift":
        if _holding(now, c):
            return _act(
                now,
                np.array([now.tcp_pos[0], now.tcp_pos[1], rest_z + 0.1 + (now.tcp_pos[2] - b[2])]),
                now.tcp_euler[2],
                CLOSE,
            )
        return _grasp(now, c)
    turned = d * _wrap(now.block_yaw[c] - ctx.start.block_yaw[c])
    # hold the block over where it started: turning the wrist fast drags the tcp sideways otherwise
    hold = ctx.start.block_pos[c] + (now.tcp_pos - b)
    lo, hi = _yaw_range(b[0], b[1])
    stalled = turned > math.radians(55) and not lo + 0.05 < now.tcp_euler[2] < hi - 0.05  # wrist at its limit
    if turned > ROTATE_ANGLE - math.radians(10) or stalled:  # turned far enough: put it down and let go
        if _holding(now, c) and b[2] > rest_z + 0.004:
            return _act(now, np.array([hold[0], hold[1], now.tcp_pos[2] - (b[2] - rest_z)]), now.tcp_euler[2], CLOSE)
        return _release(now, c)
    if _holding(now, c):
        lift = rest_z + 0.015 - b[2]
        yaw = now.tcp_euler[2] + (d * (ROTATE_ANGLE - turned) if lift < 0.008 else 0.0)
        return _act(now, np.array([hold[0], hold[1], now.tcp_pos[2] + lift]), yaw, CLOSE)
    return _grasp(now, c, d * (ROTATE_ANGLE - max(turned, 0.0)))


def _push(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    """Closed fingers (pad along x) behind the block, then sweep it along y."""
    c, d = ctx.task.color, ctx.task.direction
    assert c is not None
    b = now.block_pos[c]
    ext = half_extent(c, now.block_yaw[c], 1)
    pos = now.tcp_pos
    z = 0.018
    done = d * (b[1] - ctx.start.block_pos[c][1]) >= PUSH_DIST - 0.003
    behind = d * (b[1] - pos[1])
    engaged = pos[2] < 0.04 and abs(pos[0] - b[0]) < 0.02 and behind > ext + 0.004
    yaw = _symmetric_yaw(HALF_PI, now, b[0], b[1])
    if done:
        return _rise(now, CLOSE)
    if engaged:
        goal_y = ctx.start.block_pos[c][1] + d * (PUSH_DIST - ext - 0.0105 + 0.002)
        return _act(now, np.array([b[0], goal_y, z]), yaw, CLOSE)
    start = np.array([b[0], b[1] - d * (ext + 0.0105 + 0.015), z])
    return _approach(now, start, yaw, CLOSE, ready=now.gripper_width < 0.02, leave_open=True)


def _carry(ctx: ExpertContext, now: Snapshot) -> np.ndarray:
    """stack / unstack / place in drawer: bring a block over its goal, lower it, let go."""
    kind = ctx.task.kind
    if kind == "unstack":
        c = stacked_top(ctx.before)
        assert c is not None
        goal = ctx.after.blocks[c]
        goal_xy, goal_z = np.array([goal.x, goal.y]), BLOCK_SIZE[c][2] / 2 + 0.004
        yaw_pref: float | None = None
        done = now.on_table[c] and math.hypot(*(now.block_pos[c][:2] - goal_xy)) < 0.03
    else:
        c = ctx.before.grasped
        assert c is not None
        if kind == "stack":
            base = stack_target(ctx.before)
            assert base is not None
            bp = now.block_pos[base]
            goal_xy = bp[:2].copy()
            goal_z = bp[2] + BLOCK_SIZE[base][2] / 2 + BLOCK_SIZE[c][2] / 2 + 0.006
            yaw_pref = now.block_yaw[base]  # long sides parallel: a slab across the bar would tip over
            done = now.on_block[c] == base
        else:
            x0, x1, y0, y1 = ctx.variant.drawer_interior(now.drawer)
            goal_xy = np.array([(x0 + x1) / 2, (y0 + y1) / 2])
            goal_z = 0.02 + BLOCK_SIZE[c][2] / 2 + 0.01
            yaw_pref = 0.0  # fingers along y: they fit the tray
            done = now.in_drawer[c]
    b = now.block_pos[c]
    over_goal = math.hypot(*(b[:2] - goal_xy)) < 0.01 and b[2] < goal_z + 0.006
    if done or over_goal:
        return _release(now, c)
    if _holding(now, c):
        offset = now.tcp_pos - b  # tcp relative to the block it holds
        yaw = now.tcp_euler[2]
        if yaw_pref is not None:
            yaw = _pick_yaw(yaw_pref, math.pi, goal_xy[0], goal_xy[1], yaw)
        target = np.array([goal_xy[0], goal_xy[1], goal_z]) + offset
        return _approach(now, target, yaw, CLOSE, tol=0.006, final_speed=0.4)
    return _grasp(now, c)
