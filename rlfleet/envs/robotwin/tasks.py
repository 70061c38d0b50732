"""The ten RoboTwin tasks RLinf configures, rebuilt from primitives: objects, random layout, success check.

Every object's origin is the centre of its bottom face, so `place(obj, (x, y, 0))` stands it on the
table. Layouts are drawn from a per-episode `numpy.random.Generator`, so a seed fixes an episode.
Grippers cannot turn (top-down, fixed yaw per task), so the tasks are laid out to need no wrist
rotation; where RoboTwin asks for a final orientation (shoe, bottle) the check uses position and a
yaw tolerance instead.
"""

from __future__ import annotations

import numpy as np
import sapien

from rlfleet.envs.robotwin.scene import DualArmScene, Part

OPEN_WIDTH = 0.07  # gripper opening (m) above which a hand counts as released


def tilt_deg(entity: sapien.Entity) -> float:
    """Angle between the object's z axis and world up, in degrees."""
    z_axis = entity.pose.to_transformation_matrix()[:3, 2]
    return float(np.degrees(np.arccos(np.clip(z_axis[2], -1.0, 1.0))))


def yaw_of(entity: sapien.Entity) -> float:
    x_axis = entity.pose.to_transformation_matrix()[:3, 0]
    return float(np.arctan2(x_axis[1], x_axis[0]))


def side_arm(y: float) -> str:
    """The arm on the object's side of the table (left arm for y > 0)."""
    return "left" if y > 0 else "right"


class Task:
    """One task: builds its objects into a `DualArmScene`, lays them out per episode, checks success."""

    name = ""
    instruction = ""
    grip_yaw = 0.0  # both grippers' fixed yaw (0: fingers close along y, pi/2: along x)

    def __init__(self, scene: DualArmScene) -> None:
        self.s = scene
        self.footprints: list[tuple[np.ndarray, float]] = []  # (xy, radius) taken this episode
        self.build()

    # --- per task -------------------------------------------------------------------------------
    def build(self) -> None:
        raise NotImplementedError

    def layout(self, rng: np.random.Generator) -> None:
        raise NotImplementedError

    def key_objects(self) -> list[sapien.Entity]:
        """Up to three objects whose poses go into the state vector, most important first."""
        raise NotImplementedError

    def success(self) -> bool:
        raise NotImplementedError

    def progress(self) -> float | None:
        """How far through its stages the task is in the current state, in [0, 1] (1: the last stage
        before success); None for a task without stages. A potential for reward shaping
        (`EnvConfig.progress_reward`), so it must depend on the current state only."""
        return None

    # --- shared ---------------------------------------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        self.footprints = []
        self.layout(rng)

    def sample_xy(
        self, rng: np.random.Generator, lo: tuple[float, float], hi: tuple[float, float], radius: float
    ) -> np.ndarray:
        """A point in the box [lo, hi] at least `radius` + their radius away from everything placed."""
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)  # mirrored ranges may come in either order
        for _ in range(200):
            xy = rng.uniform(lo, hi)
            if all(np.linalg.norm(xy - p) > radius + r for p, r in self.footprints):
                break
        self.footprints.append((xy, radius))
        return xy

    def put(self, entity: sapien.Entity, xy: np.ndarray, z: float = 0.0, yaw: float = 0.0) -> None:
        self.s.place(entity, np.array([xy[0], xy[1], z]), yaw)

    def rel(self, entity: sapien.Entity) -> np.ndarray:
        """Object position relative to the table top."""
        return np.asarray(entity.pose.p, np.float64) - np.array([0.0, 0.0, self.s.table_z])

    def hands_open(self) -> bool:
        return all(arm.gripper_width() > OPEN_WIDTH for arm in self.s.arms.values())

    def holder(self, entity: sapien.Entity, reach: float = 0.06) -> str | None:
        """The nearest arm whose closed gripper is within `reach` of the object's origin (None if none)."""
        p = np.asarray(entity.pose.p)
        best, best_d = None, reach
        for name, arm in self.s.arms.items():
            d = float(np.linalg.norm(arm.ee_pos() - p))
            if arm.gripper_width() < OPEN_WIDTH and d < best_d:
                best, best_d = name, d
        return best


def _upright(radius: float, height: float) -> list[Part]:
    return [Part("cylinder", (radius, height / 2), (0.0, 0.0, height / 2))]


class PlaceEmptyCup(Task):
    name = "place_empty_cup"
    instruction = "pick up the empty cup and place it on the coaster"

    def build(self) -> None:
        self.cup = self.s.add_object("cup", _upright(0.03, 0.09), color=(0.9, 0.9, 0.95), density=300)
        self.coaster = self.s.add_object("coaster", _upright(0.045, 0.008), color=(0.3, 0.2, 0.1), static=True)

    def layout(self, rng: np.random.Generator) -> None:
        sign = rng.choice([-1.0, 1.0])
        self.put(self.coaster, self.sample_xy(rng, (0.4, 0.05 * sign), (0.6, 0.2 * sign), 0.06))
        self.put(self.cup, self.sample_xy(rng, (0.35, 0.1 * sign), (0.6, 0.3 * sign), 0.1))

    def key_objects(self) -> list[sapien.Entity]:
        return [self.cup, self.coaster]

    def success(self) -> bool:
        cup, coaster = self.rel(self.cup), self.rel(self.coaster)
        return (
            np.linalg.norm(cup[:2] - coaster[:2]) < 0.03
            and cup[2] < 0.02
            and tilt_deg(self.cup) < 15
            and self.hands_open()
        )

    def progress(self) -> float:
        """Held (a closed hand at the cup), lifted (held, 3 cm up), over the coaster (held, within 3 cm
        of its centre), lowered onto it (within 3 cm, under 2 cm up): 0.25 each; success then needs
        the hand open."""
        cup, coaster = self.rel(self.cup), self.rel(self.coaster)
        over = bool(np.linalg.norm(cup[:2] - coaster[:2]) < 0.03)
        if over and cup[2] < 0.02 and tilt_deg(self.cup) < 15:
            return 1.0
        held = self.holder(self.cup, reach=0.08) is not None
        if not held:
            return 0.0
        if over:
            return 0.75
        return 0.5 if cup[2] > 0.03 else 0.25


class AdjustBottle(Task):
    name = "adjust_bottle"
    instruction = "pick up the lying bottle with the arm on the side its cap points to and lift it up"
    grip_yaw = np.pi / 2  # the bottle lies along y, so the fingers close along x

    def build(self) -> None:
        body = Part("cylinder", (0.03, 0.07), (0.0, 0.0, 0.03), axis="y")
        cap = Part("cylinder", (0.015, 0.02), (0.0, 0.09, 0.03), color=(0.9, 0.2, 0.2), axis="y")
        self.bottle = self.s.add_object("bottle", [body, cap], color=(0.3, 0.6, 0.9), density=300)

    def layout(self, rng: np.random.Generator) -> None:
        self.cap_left = bool(rng.integers(2))
        yaw = rng.uniform(-0.2, 0.2) + (0.0 if self.cap_left else np.pi)  # cap along the bottle's +y
        self.put(self.bottle, self.sample_xy(rng, (0.4, -0.1), (0.55, 0.1), 0.12), yaw=yaw)

    def key_objects(self) -> list[sapien.Entity]:
        return [self.bottle]

    def cap_pos(self) -> np.ndarray:
        return (self.bottle.pose * sapien.Pose([0.0, 0.09, 0.03])).p

    def success(self) -> bool:
        correct = "left" if self.cap_left else "right"
        return bool(self.rel(self.bottle)[2] > 0.08 and self.holder(self.bottle, 0.12) == correct)


class ClickBell(Task):
    name = "click_bell"
    instruction = "press the top of the bell"
    BUTTON_TOP = 0.05

    def build(self) -> None:
        base = Part("cylinder", (0.055, 0.02), (0.0, 0.0, 0.02))
        dome = Part("cylinder", (0.035, 0.01), (0.0, 0.0, 0.05), color=(0.8, 0.7, 0.2))
        button = Part("cylinder", (0.012, 0.005), (0.0, 0.0, 0.045), color=(0.2, 0.2, 0.2))
        self.bell = self.s.add_object("bell", [base, button, dome], color=(0.2, 0.2, 0.25), static=True)
        self.pressed = False

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.bell, self.sample_xy(rng, (0.4, -0.25), (0.6, 0.25), 0.08))
        self.pressed = False

    def key_objects(self) -> list[sapien.Entity]:
        return [self.bell]

    def success(self) -> bool:
        """A fingertip (the grasp point of a gripper) touches the top centre of the bell."""
        top = np.asarray(self.bell.pose.p) + np.array([0.0, 0.0, 0.06])
        for arm in self.s.arms.values():
            d = arm.ee_pos() - top
            if np.linalg.norm(d[:2]) < 0.025 and d[2] < 0.012:
                return True
        return False


class PlaceContainerPlate(Task):
    name = "place_container_plate"
    instruction = "place the container onto the plate"

    def build(self) -> None:
        self.container = self.s.add_object("container", _upright(0.034, 0.06), color=(0.2, 0.7, 0.3), density=300)
        self.plate = self.s.add_object("plate", _upright(0.08, 0.01), color=(0.95, 0.95, 0.9), static=True)

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.plate, self.sample_xy(rng, (0.42, -0.06), (0.55, 0.06), 0.09))
        sign = rng.choice([-1.0, 1.0])
        self.put(self.container, self.sample_xy(rng, (0.35, 0.15 * sign), (0.6, 0.3 * sign), 0.05))

    def key_objects(self) -> list[sapien.Entity]:
        return [self.container, self.plate]

    def success(self) -> bool:
        c, p = self.rel(self.container), self.rel(self.plate)
        return (
            np.linalg.norm(c[:2] - p[:2]) < 0.05
            and c[2] < 0.025
            and tilt_deg(self.container) < 15
            and self.hands_open()
        )


class PickDualBottles(Task):
    name = "pick_dual_bottles"
    instruction = "pick up both bottles with both arms at the same time and lift them"

    def build(self) -> None:
        self.bottles = [
            self.s.add_object(f"bottle_{i}", _upright(0.025, 0.14), color=c, density=300)
            for i, c in enumerate([(0.9, 0.4, 0.1), (0.1, 0.4, 0.9)])
        ]

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.bottles[0], self.sample_xy(rng, (0.38, 0.1), (0.58, 0.3), 0.05))
        self.put(self.bottles[1], self.sample_xy(rng, (0.38, -0.3), (0.58, -0.1), 0.05))

    def key_objects(self) -> list[sapien.Entity]:
        return list(self.bottles)

    def success(self) -> bool:
        return all(self.rel(b)[2] > 0.08 for b in self.bottles)


class MoveCanPot(Task):
    name = "move_can_pot"
    instruction = "pick up the can and put it down next to the pot"

    def build(self) -> None:
        self.pot = self.s.add_object("pot", _upright(0.07, 0.08), color=(0.3, 0.3, 0.3), density=1000)
        self.can = self.s.add_object("can", _upright(0.028, 0.1), color=(0.8, 0.1, 0.1), density=300)

    def layout(self, rng: np.random.Generator) -> None:
        pot = self.sample_xy(rng, (0.45, -0.05), (0.6, 0.05), 0.08)
        self.put(self.pot, pot)
        sign = rng.choice([-1.0, 1.0])
        self.put(self.can, self.sample_xy(rng, (0.35, pot[1] + 0.2 * sign), (0.6, pot[1] + 0.32 * sign), 0.12))

    def key_objects(self) -> list[sapien.Entity]:
        return [self.can, self.pot]

    def success(self) -> bool:
        can, pot = self.rel(self.can), self.rel(self.pot)
        return (
            np.linalg.norm(can[:2] - pot[:2]) < 0.14 and can[2] < 0.01 and tilt_deg(self.can) < 15 and self.hands_open()
        )


class LiftPot(Task):
    name = "lift_pot"
    instruction = "grasp both handles of the pot and lift it with both arms"
    HANDLE_Y = 0.13  # handle bar centre from the pot centre: an open gripper (8 cm) fits between bar and pot
    HANDLE_Z = 0.07

    def build(self) -> None:
        parts = [Part("box", (0.07, 0.07, 0.04), (0.0, 0.0, 0.04))]
        for s in (1.0, -1.0):
            parts.append(Part("box", (0.008, 0.027, 0.008), (0.0, s * 0.095, self.HANDLE_Z), color=(0.1, 0.1, 0.1)))
            parts.append(
                Part("box", (0.045, 0.01, 0.01), (0.0, s * self.HANDLE_Y, self.HANDLE_Z), color=(0.1, 0.1, 0.1))
            )
        self.pot = self.s.add_object("pot", parts, color=(0.6, 0.35, 0.2), density=150)

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.pot, self.sample_xy(rng, (0.45, -0.04), (0.55, 0.04), 0.17), yaw=rng.uniform(-0.12, 0.12))

    def key_objects(self) -> list[sapien.Entity]:
        return [self.pot]

    def handle(self, sign: float) -> np.ndarray:
        """World grasp point on a handle bar (off its centre, clear of the connector)."""
        return (self.pot.pose * sapien.Pose([0.028, sign * self.HANDLE_Y, self.HANDLE_Z])).p

    def success(self) -> bool:
        return bool(self.rel(self.pot)[2] > 0.08 and tilt_deg(self.pot) < 12)


class HandoverBlock(Task):
    name = "handover_block"
    instruction = "pick up the block with the left arm, hand it over to the right arm and place it on the blue pad"
    grip_yaw = np.pi / 2  # the block lies along y, so the fingers close along x
    HALF_LEN = 0.1

    def build(self) -> None:
        self.block = self.s.add_object(
            "block", [Part("box", (0.015, self.HALF_LEN, 0.015), (0.0, 0.0, 0.015))], color=(0.9, 0.1, 0.1), density=300
        )
        self.pad = self.s.add_object(
            "pad", [Part("box", (0.06, 0.12, 0.002), (0.0, 0.0, 0.002))], color=(0.1, 0.2, 0.9), static=True
        )

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.block, self.sample_xy(rng, (0.4, 0.2), (0.55, 0.28), 0.1), yaw=rng.uniform(-0.1, 0.1))
        self.put(self.pad, self.sample_xy(rng, (0.4, -0.3), (0.55, -0.22), 0.1))

    def key_objects(self) -> list[sapien.Entity]:
        return [self.block, self.pad]

    def success(self) -> bool:
        b, p = self.rel(self.block), self.rel(self.pad)
        return abs(b[0] - p[0]) < 0.05 and abs(b[1] - p[1]) < 0.08 and b[2] < 0.02 and self.hands_open()


class BeatBlockHammer(Task):
    name = "beat_block_hammer"
    instruction = "pick up the hammer and beat the block with it"
    HEAD_X = 0.1  # head centre along the hammer's x axis

    def build(self) -> None:
        handle = Part("box", (0.09, 0.012, 0.012), (-0.02, 0.0, 0.012), color=(0.5, 0.3, 0.1))
        head = Part("box", (0.02, 0.04, 0.025), (self.HEAD_X, 0.0, 0.025), color=(0.4, 0.4, 0.45))
        self.hammer = self.s.add_object("hammer", [handle, head], density=300)
        self.block = self.s.add_object(
            "block", [Part("box", (0.025, 0.025, 0.025), (0.0, 0.0, 0.025))], color=(0.1, 0.7, 0.2), static=True
        )

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.block, self.sample_xy(rng, (0.45, -0.06), (0.6, 0.06), 0.06))
        sign = rng.choice([-1.0, 1.0])
        self.put(
            self.hammer,
            self.sample_xy(rng, (0.32, 0.16 * sign), (0.45, 0.3 * sign), 0.11),
            yaw=rng.uniform(-0.15, 0.15),
        )

    def key_objects(self) -> list[sapien.Entity]:
        return [self.hammer, self.block]

    def head_bottom(self) -> np.ndarray:
        return (self.hammer.pose * sapien.Pose([self.HEAD_X, 0.0, 0.0])).p

    def grasp_point(self) -> np.ndarray:
        return (self.hammer.pose * sapien.Pose([-0.03, 0.0, 0.024])).p

    def success(self) -> bool:
        head = self.head_bottom()
        top = np.asarray(self.block.pose.p) + np.array([0.0, 0.0, 0.05])
        return bool(np.linalg.norm(head[:2] - top[:2]) < 0.035 and abs(head[2] - top[2]) < 0.012)


class PlaceShoe(Task):
    name = "place_shoe"
    instruction = "pick up the shoe and place it on the mat"

    def build(self) -> None:
        sole = Part("box", (0.1, 0.04, 0.01), (0.0, 0.0, 0.01))
        upper = Part("box", (0.06, 0.027, 0.025), (-0.03, 0.0, 0.045))
        self.shoe = self.s.add_object("shoe", [sole, upper], color=(0.9, 0.5, 0.6), density=300)
        self.mat = self.s.add_object(
            "mat", [Part("box", (0.13, 0.07, 0.002), (0.0, 0.0, 0.002))], color=(0.2, 0.2, 0.2), static=True
        )

    def layout(self, rng: np.random.Generator) -> None:
        self.put(self.mat, self.sample_xy(rng, (0.45, -0.05), (0.58, 0.05), 0.13))
        sign = rng.choice([-1.0, 1.0])
        self.put(
            self.shoe, self.sample_xy(rng, (0.35, 0.2 * sign), (0.55, 0.3 * sign), 0.1), yaw=rng.uniform(-0.15, 0.15)
        )

    def key_objects(self) -> list[sapien.Entity]:
        return [self.shoe, self.mat]

    def grasp_point(self) -> np.ndarray:
        return (self.shoe.pose * sapien.Pose([-0.03, 0.0, 0.05])).p

    def success(self) -> bool:
        s, m = self.rel(self.shoe), self.rel(self.mat)
        return (
            abs(s[0] - m[0]) < 0.06
            and abs(s[1] - m[1]) < 0.04
            and s[2] < 0.02
            and abs(yaw_of(self.shoe)) < np.radians(20)
            and self.hands_open()
        )


TASKS: dict[str, type[Task]] = {
    t.name: t
    for t in (
        AdjustBottle,
        PlaceEmptyCup,
        PlaceContainerPlate,
        PickDualBottles,
        MoveCanPot,
        LiftPot,
        HandoverBlock,
        BeatBlockHammer,
        ClickBell,
        PlaceShoe,
    )
}
