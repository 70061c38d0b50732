"""Symbolic scene state: what chain sampling simulates instead of physics.

A `SymState` holds the discrete state CALVIN's chain sampler tracks (drawer open, door left, LED,
lightbulb, where each block is, which block the robot holds) plus each block's planned xy and yaw,
so the sampler can also rule out chains that are impossible for geometric reasons (a push that
leaves the block region or runs into another block). Initial states are sampled from a seed
with numpy only, so pools of chains are built without a simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from rlfleet.envs.calvin.layout import BLOCK_COLORS, BLOCK_SIZE, MIN_BLOCK_GAP, REGION_X, REGION_Y

TABLE, GRASPED, DRAWER = "table", "grasped", "drawer"  # BlockState.where; or the colour it is stacked on


@dataclass(frozen=True)
class BlockState:
    x: float
    y: float
    yaw: float
    where: str = TABLE


@dataclass(frozen=True)
class SymState:
    drawer_open: bool
    slider_left: bool
    led_on: bool
    bulb_on: bool
    blocks: dict[str, BlockState] = field(default_factory=dict)

    @property
    def grasped(self) -> str | None:
        return next((c for c, b in self.blocks.items() if b.where == GRASPED), None)

    def with_block(self, color: str, **changes: object) -> SymState:
        blocks = dict(self.blocks)
        blocks[color] = replace(blocks[color], **changes)  # type: ignore[arg-type]
        return replace(self, blocks=blocks)

    def has_on_top(self, color: str) -> bool:
        return any(b.where == color for b in self.blocks.values())

    def free_on_table(self, color: str) -> bool:
        """On the table with nothing stacked on it: it can be pushed, rotated, lifted or stacked on."""
        return self.blocks[color].where == TABLE and not self.has_on_top(color)

    def key(self) -> tuple:
        """Discrete part of the state (what CALVIN's sampler tracks), for tests and statistics."""
        return (
            self.drawer_open,
            self.slider_left,
            self.led_on,
            self.bulb_on,
            tuple((c, b.where) for c, b in sorted(self.blocks.items())),
        )


def sample_initial_state(seed: int) -> SymState:
    """Random articulated states and blocks on the table, at least MIN_BLOCK_GAP apart (deterministic)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA1F]))
    flags = rng.integers(0, 2, size=4).astype(bool)
    while True:
        xy = np.column_stack([rng.uniform(*REGION_X, size=3), rng.uniform(*REGION_Y, size=3)])
        gaps = [np.linalg.norm(xy[i] - xy[j]) for i in range(3) for j in range(i + 1, 3)]
        if min(gaps) >= MIN_BLOCK_GAP:
            break
    yaws = rng.uniform(-math.pi / 2, math.pi / 2, size=3)
    blocks = {c: BlockState(float(xy[i, 0]), float(xy[i, 1]), float(yaws[i])) for i, c in enumerate(BLOCK_COLORS)}
    return SymState(bool(flags[0]), bool(flags[1]), bool(flags[2]), bool(flags[3]), blocks)


def half_extent(color: str, yaw: float, axis: int) -> float:
    """Half the block's footprint along world x (axis 0) or y (axis 1) at `yaw`."""
    sx, sy, _ = BLOCK_SIZE[color]
    c, s = abs(math.cos(yaw)), abs(math.sin(yaw))
    return (sx * c + sy * s) / 2 if axis == 0 else (sx * s + sy * c) / 2


def in_region(x: float, y: float) -> bool:
    return REGION_X[0] <= x <= REGION_X[1] and REGION_Y[0] <= y <= REGION_Y[1]


def push_clear(state: SymState, color: str, direction: int, distance: float) -> bool:
    """A push of `color` along y by `direction * distance` stays in the region and meets no block.

    The pusher starts ~6 cm behind the block and the hand is ~21 cm long along x, so another
    block in that corridor (wider for stacks, which reach the hand) blocks the push.
    """
    b = state.blocks[color]
    y_end = b.y + direction * distance
    if not in_region(b.x, y_end):
        return False
    y_lo, y_hi = sorted((b.y - direction * 0.07, y_end))
    for other, o in state.blocks.items():
        if other == color or o.where != TABLE:
            continue
        reach_x = 0.14 if state.has_on_top(other) else 0.08
        if abs(o.x - b.x) < reach_x and y_lo - 0.07 < o.y < y_hi + 0.07:
            return False
        if math.hypot(o.x - b.x, o.y - y_end) < MIN_BLOCK_GAP + 0.02:  # the push may stop short
            return False
    return True


def free_spot(state: SymState, color: str) -> tuple[float, float] | None:
    """Where an unstacked block goes: the grid point nearest to it that keeps MIN_BLOCK_GAP to the others."""
    b = state.blocks[color]
    others = [(o.x, o.y) for c, o in state.blocks.items() if c != color and o.where == TABLE]
    best, best_d = None, math.inf
    for x in np.linspace(REGION_X[0], REGION_X[1], 5):
        for y in np.linspace(REGION_Y[0], REGION_Y[1], 9):
            if all(math.hypot(x - ox, y - oy) >= MIN_BLOCK_GAP + 0.01 for ox, oy in others):
                d = math.hypot(x - b.x, y - b.y)
                if d < best_d:
                    best, best_d = (float(x), float(y)), d
    return best
