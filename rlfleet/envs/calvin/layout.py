"""Geometry of the playtable: the four scene variants, block shapes and the block region.

Pure data (no pybullet), shared by the scene builder, the symbolic chain sampler and the experts,
so all three agree on where things are. World frame: the Panda's base at the origin facing +x,
the desk top at z = 0, "left" is +y (the robot's left). Lengths in metres.

Every fixture sits outside the block region (x in [0.33, 0.52], |y| <= 0.22) and the gripper's
paths to each fixture stay outside it too, so blocks never get in the way of the articulated
objects and pushes never move a block into a fixture.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- blocks ------------------------------------------------------------------------------------

BLOCK_COLORS: tuple[str, ...] = ("red", "blue", "pink")
# full extents (x, y, z) in the block's own frame; every block is graspable across its y side
BLOCK_SIZE: dict[str, tuple[float, float, float]] = {
    "red": (0.045, 0.045, 0.045),  # cube
    "blue": (0.09, 0.04, 0.04),  # long bar
    "pink": (0.07, 0.045, 0.035),  # flat slab
}
BLOCK_RGBA: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.1, 0.1, 1.0),
    "blue": (0.1, 0.25, 0.85, 1.0),
    "pink": (0.95, 0.45, 0.75, 1.0),
}
BLOCK_MASS = 0.08

# Blocks start, are pushed and are unstacked only inside this region (block centres).
REGION_X = (0.33, 0.52)
REGION_Y = (-0.22, 0.22)
MIN_BLOCK_GAP = 0.12  # centre-to-centre distance kept between blocks on the table

# --- articulated fixtures ----------------------------------------------------------------------

DRAWER_TRAVEL = 0.16  # joint range of the drawer (0 closed, pulled out towards the robot)
SLIDER_TRAVEL = 0.26  # joint range of the sliding door (0 right, SLIDER_TRAVEL left)
SWITCH_TRAVEL = 0.08  # joint range of the switch knob (0 off, pushed away from the robot = on)
BUTTON_TRAVEL = 0.012  # how far the button cap can be pressed down

DRAWER_UNIT = (0.24, 0.22, 0.10)  # carcass depth (x), width (y), height (z)
DRAWER_HANDLE_Z = 0.12  # centre of the handle standing on top of the drawer front
CABINET = (0.14, 0.56, 0.18)  # sliding-door cabinet depth, width, height
CABINET_FRONT_X = 0.70  # front face of the sliding door
SLIDER_HANDLE = (0.06, 0.015, 0.04)  # handle sticking out of the door towards the robot
SLIDER_HANDLE_Z = 0.09
BUTTON_BASE = (0.06, 0.06, 0.03)
BUTTON_CAP = (0.04, 0.04, 0.015)
SWITCH_BASE = (0.14, 0.05, 0.03)
SWITCH_KNOB = (0.02, 0.04, 0.04)


@dataclass(frozen=True)
class Variant:
    """One scene variant: desk look and where the drawer, sliding-door cabinet, button and switch stand."""

    name: str
    desk_rgba: tuple[float, float, float, float]
    cabinet_rgba: tuple[float, float, float, float]
    drawer_xy: tuple[float, float]  # front-centre of the drawer unit (the drawer opens towards -x)
    cabinet_y: float  # centre of the cabinet along y (its front is at CABINET_FRONT_X)
    button_xy: tuple[float, float]
    switch_xy: tuple[float, float]  # centre of the switch rail (knob at x - travel/2 when off)

    def drawer_handle(self, drawer: float) -> tuple[float, float, float]:
        """Handle centre when the drawer joint is at `drawer`."""
        return (self.drawer_xy[0] + 0.0075 - drawer, self.drawer_xy[1], DRAWER_HANDLE_Z)

    def slider_handle(self, slider: float) -> tuple[float, float, float]:
        """Handle centre when the sliding-door joint is at `slider`."""
        x = CABINET_FRONT_X - SLIDER_HANDLE[0] / 2
        return (x, self.cabinet_y - SLIDER_TRAVEL / 2 + slider, SLIDER_HANDLE_Z)

    def switch_knob(self, switch: float) -> tuple[float, float, float]:
        """Knob centre when the switch joint is at `switch`."""
        x = self.switch_xy[0] - SWITCH_TRAVEL / 2 + switch
        return (x, self.switch_xy[1], SWITCH_BASE[2] + SWITCH_KNOB[2] / 2)

    def button_top(self, button: float = 0.0) -> tuple[float, float, float]:
        """Centre of the button cap's top face."""
        return (self.button_xy[0], self.button_xy[1], BUTTON_BASE[2] + BUTTON_CAP[2] + button)

    def drawer_interior(self, drawer: float) -> tuple[float, float, float, float]:
        """(x_min, x_max, y_min, y_max) of the tray floor that is outside the carcass at `drawer`."""
        front = self.drawer_xy[0] - drawer + 0.015
        half_w = (DRAWER_UNIT[1] - 0.06) / 2
        return (front, self.drawer_xy[0], self.drawer_xy[1] - half_w, self.drawer_xy[1] + half_w)


# A and B mirror each other, C swaps button and switch, D (held out in the ABC->D split) puts the
# drawer left like B with C's button/switch order and a new cabinet position.
VARIANTS: dict[str, Variant] = {
    "A": Variant(
        "A",
        (0.72, 0.55, 0.36, 1.0),
        (0.55, 0.38, 0.25, 1.0),
        drawer_xy=(0.45, -0.46),
        cabinet_y=0.0,
        button_xy=(0.40, 0.38),
        switch_xy=(0.57, 0.38),
    ),
    "B": Variant(
        "B",
        (0.45, 0.30, 0.20, 1.0),
        (0.80, 0.78, 0.72, 1.0),
        drawer_xy=(0.45, 0.46),
        cabinet_y=0.05,
        button_xy=(0.40, -0.38),
        switch_xy=(0.57, -0.38),
    ),
    "C": Variant(
        "C",
        (0.55, 0.57, 0.60, 1.0),
        (0.30, 0.40, 0.30, 1.0),
        drawer_xy=(0.45, -0.46),
        cabinet_y=-0.05,
        button_xy=(0.57, 0.38),
        switch_xy=(0.40, 0.38),
    ),
    "D": Variant(
        "D",
        (0.88, 0.86, 0.80, 1.0),
        (0.35, 0.30, 0.45, 1.0),
        drawer_xy=(0.45, 0.46),
        cabinet_y=0.03,
        button_xy=(0.57, -0.38),
        switch_xy=(0.40, -0.38),
    ),
}


def resolve_variants(task: str) -> list[str]:
    """`EnvConfig.task` -> variant names: "D", "ABC" (each letter a variant) or "A,B,C"."""
    spec = task.strip()
    if spec.lower().startswith("calvin-"):
        spec = spec[len("calvin-") :]
    names = [s.strip() for s in spec.split(",")] if "," in spec else list(spec)
    names = [n.upper() for n in names if n]
    unknown = [n for n in names if n not in VARIANTS]
    if not names or unknown:
        raise ValueError(
            f"CALVIN task must name scene variants from {sorted(VARIANTS)} (e.g. 'D', 'ABC', 'A,B,C'), got {task!r}"
        )
    return list(dict.fromkeys(names))
