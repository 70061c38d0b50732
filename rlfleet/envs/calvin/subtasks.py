"""The CALVIN subtask vocabulary built here: preconditions, symbolic effects, success detectors.

As in CALVIN's `Tasks`, a subtask succeeds when the scene at subtask start and the scene now
differ in the right way (the drawer joint moved > 10 cm, the LED flag flipped, ...), not when some
absolute goal state holds; so "open the drawer" on an already open drawer can never succeed,
which is why chains only chain subtasks whose preconditions hold (see `chains.py`).

Preconditions and effects act on the symbolic `SymState` (what CALVIN's sampler tracks, plus
block positions for geometric feasibility); detectors read physics `Snapshot`s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rlfleet.envs.calvin.layout import BLOCK_COLORS
from rlfleet.envs.calvin.symbolic import DRAWER, GRASPED, TABLE, SymState, free_spot, push_clear

if TYPE_CHECKING:
    from rlfleet.envs.calvin.scene import Snapshot

DOOR_MIN = {"drawer": 0.10, "slider": 0.15}  # joint travel that counts as opened / moved
PUSH_DIST = 0.10  # how far the expert pushes (the sampler plans with it)
PUSH_MIN = 0.08  # block displacement along y that counts as a push
ROTATE_ANGLE = math.radians(80)  # how far the expert turns a block
ROTATE_MIN = math.radians(45)  # yaw change that counts as a rotation
LIFT_MIN = 0.05  # height gain of a lifted block


@dataclass(frozen=True)
class Subtask:
    """One subtask: `kind` says what it manipulates, `color` / `direction` which block / which way.

    direction: +1 open / left (+y) / on / counter-clockwise; -1 close / right / off / clockwise.
    """

    name: str
    instruction: str
    kind: str  # drawer, slider, led, bulb, lift, push, rotate, stack, unstack, place_drawer
    color: str | None = None
    direction: int = 0

    def precondition(self, s: SymState) -> bool:
        held = s.grasped
        if self.kind in ("stack", "place_drawer"):
            if held is None:
                return False
            if self.kind == "place_drawer":  # one block at a time: the open part of the tray is small
                return s.drawer_open and not any(b.where == DRAWER for b in s.blocks.values())
            return stack_target(s) is not None
        if held is not None:  # everything else needs a free hand
            return False
        up = self.direction > 0
        if self.kind == "drawer":
            return s.drawer_open != up
        if self.kind == "slider":
            return s.slider_left != up
        if self.kind == "led":
            return s.led_on != up
        if self.kind == "bulb":
            return s.bulb_on != up
        if self.kind == "unstack":
            top = stacked_top(s)
            return top is not None and free_spot(s, top) is not None
        assert self.color is not None
        if not s.free_on_table(self.color):
            return False
        if self.kind == "push":
            return push_clear(s, self.color, self.direction, PUSH_DIST)
        return True  # lift, rotate

    def effect(self, s: SymState) -> SymState:
        """The symbolic state after the subtask (assumes the precondition holds)."""
        up = self.direction > 0
        if self.kind == "drawer":
            return _replace(s, drawer_open=up)
        if self.kind == "slider":
            return _replace(s, slider_left=up)
        if self.kind == "led":
            return _replace(s, led_on=up)
        if self.kind == "bulb":
            return _replace(s, bulb_on=up)
        if self.kind == "stack":
            held, base = s.grasped, stack_target(s)
            assert held is not None and base is not None
            b = s.blocks[base]
            return s.with_block(held, x=b.x, y=b.y, where=base)
        if self.kind == "place_drawer":
            held = s.grasped
            assert held is not None
            return s.with_block(held, where=DRAWER)
        if self.kind == "unstack":
            top = stacked_top(s)
            assert top is not None
            spot = free_spot(s, top)
            assert spot is not None
            return s.with_block(top, x=spot[0], y=spot[1], where=TABLE)
        assert self.color is not None
        b = s.blocks[self.color]
        if self.kind == "lift":
            return s.with_block(self.color, where=GRASPED)
        if self.kind == "push":
            return s.with_block(self.color, y=b.y + self.direction * PUSH_DIST)
        if self.kind == "rotate":
            yaw = math.remainder(b.yaw + self.direction * ROTATE_ANGLE, 2 * math.pi)
            return s.with_block(self.color, yaw=yaw)
        raise ValueError(f"unknown subtask kind {self.kind!r}")

    def success(self, start: Snapshot, now: Snapshot) -> bool:
        """Did the scene change from `start` (subtask start) to `now` the way this subtask asks?"""
        d = self.direction
        if self.kind == "drawer":
            return d * (now.drawer - start.drawer) > DOOR_MIN["drawer"]
        if self.kind == "slider":
            return d * (now.slider - start.slider) > DOOR_MIN["slider"]
        if self.kind == "led":
            return start.led != (d > 0) and now.led == (d > 0)
        if self.kind == "bulb":
            return start.bulb != (d > 0) and now.bulb == (d > 0)
        if self.kind == "stack":
            return any(
                now.on_block[c] is not None and start.on_block[c] is None and not now.touching[c] for c in BLOCK_COLORS
            )
        if self.kind == "unstack":
            return any(start.on_block[c] is not None and now.on_table[c] and not now.touching[c] for c in BLOCK_COLORS)
        if self.kind == "place_drawer":
            return any(now.in_drawer[c] and not start.in_drawer[c] and not now.touching[c] for c in BLOCK_COLORS)
        c = self.color
        assert c is not None
        moved = now.block_pos[c] - start.block_pos[c]
        if self.kind == "lift":
            return start.on_table[c] and now.grasped[c] and moved[2] > LIFT_MIN
        if self.kind == "push":
            return start.on_table[c] and now.on_table[c] and d * moved[1] > PUSH_MIN
        if self.kind == "rotate":
            turned = math.remainder(now.block_yaw[c] - start.block_yaw[c], 2 * math.pi)
            return (
                start.on_table[c]
                and now.on_table[c]
                and not now.touching[c]
                and math.hypot(moved[0], moved[1]) < 0.06
                and d * turned > ROTATE_MIN
            )
        raise ValueError(f"unknown subtask kind {self.kind!r}")


def _replace(s: SymState, **changes: object) -> SymState:
    return replace(s, **changes)  # type: ignore[arg-type]


def stacked_top(s: SymState) -> str | None:
    """The block standing on another block (at most one: only table blocks can be stacked on)."""
    return next((c for c, b in s.blocks.items() if b.where in BLOCK_COLORS), None)


def stack_target(s: SymState) -> str | None:
    """Where `stack_block` puts the held block: the free table block nearest to where it was picked."""
    held = s.grasped
    if held is None:
        return None
    h = s.blocks[held]
    bases = [c for c in BLOCK_COLORS if c != held and s.free_on_table(c)]
    return min(bases, key=lambda c: math.hypot(s.blocks[c].x - h.x, s.blocks[c].y - h.y), default=None)


def _build() -> dict[str, Subtask]:
    tasks = [
        Subtask("open_drawer", "open the drawer", "drawer", direction=1),
        Subtask("close_drawer", "close the drawer", "drawer", direction=-1),
        Subtask("move_slider_left", "push the sliding door to the left", "slider", direction=1),
        Subtask("move_slider_right", "push the sliding door to the right", "slider", direction=-1),
        Subtask("turn_on_led", "turn on the led light", "led", direction=1),
        Subtask("turn_off_led", "turn off the led light", "led", direction=-1),
        Subtask("turn_on_lightbulb", "turn on the light bulb", "bulb", direction=1),
        Subtask("turn_off_lightbulb", "turn off the light bulb", "bulb", direction=-1),
    ]
    for c in BLOCK_COLORS:
        tasks += [
            Subtask(f"lift_{c}_block_table", f"lift the {c} block from the table", "lift", c),
            Subtask(f"push_{c}_block_left", f"push the {c} block to the left", "push", c, 1),
            Subtask(f"push_{c}_block_right", f"push the {c} block to the right", "push", c, -1),
            Subtask(f"rotate_{c}_block_left", f"rotate the {c} block to the left", "rotate", c, 1),
            Subtask(f"rotate_{c}_block_right", f"rotate the {c} block to the right", "rotate", c, -1),
        ]
    tasks += [
        Subtask("stack_block", "stack the blocks on top of each other", "stack"),
        Subtask("unstack_block", "take the top block off the stack", "unstack"),
        Subtask("place_in_drawer", "place the grasped block in the drawer", "place_drawer"),
    ]
    return {t.name: t for t in tasks}


SUBTASKS: dict[str, Subtask] = _build()
SUBTASK_NAMES: tuple[str, ...] = tuple(SUBTASKS)
