"""The playtable in one pybullet DIRECT client: desk, drawer, sliding door, button + LED, switch +
lightbulb, three blocks and the Panda, built from box primitives and generated URDFs (CALVIN's
own assets are not on PyPI).

Each `Scene` owns its client (`p.connect(p.DIRECT)`) and passes `physicsClientId` to every call,
so many scenes live in one process. `Scene.snapshot()` returns the physical state the subtask
detectors compare (`Snapshot`); `robot_obs()` / `scene_obs()` are the proprioceptive state, laid
out like CALVIN's:

robot_obs (15): tcp xyz (3), tcp Euler roll/pitch/yaw (3, (0,0,0) = fingers down), gripper
    opening width in m (1), 7 arm joint angles (7), last gripper action -1 close / +1 open (1)
scene_obs (24): sliding door, drawer, button, switch joint positions (4), lightbulb on (1),
    LED on (1), then red, blue, pink block: xyz (3) + Euler (3) each (18)
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np
import pybullet as p
import pybullet_data

from rlfleet.envs.calvin.layout import (
    BLOCK_COLORS,
    BLOCK_MASS,
    BLOCK_RGBA,
    BLOCK_SIZE,
    BUTTON_BASE,
    BUTTON_CAP,
    BUTTON_TRAVEL,
    CABINET,
    CABINET_FRONT_X,
    DRAWER_HANDLE_Z,
    DRAWER_TRAVEL,
    DRAWER_UNIT,
    SLIDER_HANDLE,
    SLIDER_HANDLE_Z,
    SLIDER_TRAVEL,
    SWITCH_BASE,
    SWITCH_KNOB,
    SWITCH_TRAVEL,
    Variant,
)
from rlfleet.envs.calvin.robot import FINGER_LINKS, HAND_LINK, HOME, ControlSettings, Panda
from rlfleet.envs.calvin.symbolic import SymState

ROBOT_OBS_DIM = 15
SCENE_OBS_DIM = 24
STATE_DIM = ROBOT_OBS_DIM + SCENE_OBS_DIM
TIMESTEP = 1.0 / 240.0
BUTTON_PRESSED = -0.008  # the LED toggles when the cap goes below this ...
BUTTON_RELEASED = -0.004  # ... and can toggle again once it came back above this

LED_RGBA = {True: (0.1, 1.0, 0.15, 1.0), False: (0.08, 0.2, 0.08, 1.0)}
BULB_RGBA = {True: (1.0, 0.92, 0.35, 1.0), False: (0.45, 0.45, 0.45, 1.0)}
_GREY = (0.6, 0.6, 0.62, 1.0)
_DARK = (0.2, 0.2, 0.22, 1.0)


@dataclass
class Snapshot:
    """The physical state subtask detectors read (see `subtasks.py`)."""

    drawer: float
    slider: float
    button: float
    switch: float
    led: bool
    bulb: bool
    block_pos: dict[str, np.ndarray]
    block_yaw: dict[str, float]
    grasped: dict[str, bool]  # both fingers touch the block
    touching: dict[str, bool]  # any part of the robot touches the block
    on_table: dict[str, bool]  # resting on the desk (contact, low)
    on_block: dict[str, str | None]  # the block it rests on
    in_drawer: dict[str, bool]  # touching the drawer's tray
    button_latched: bool = False  # pressed far enough to have toggled the LED and not yet released
    tcp_pos: np.ndarray = field(default_factory=lambda: np.zeros(3))
    tcp_euler: np.ndarray = field(default_factory=lambda: np.zeros(3))
    gripper_width: float = 0.0


# --- URDF generation -----------------------------------------------------------------------------

Vec3 = tuple[float, float, float]
Box = tuple[Vec3, Vec3, tuple[float, ...]]  # centre, size, rgba


def _link_xml(name: str, boxes: list[Box], mass: float) -> str:
    parts = [
        f'<link name="{name}"><inertial><mass value="{mass}"/>'
        '<inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial>'
    ]
    for i, (c, s, rgba) in enumerate(boxes):
        xyz = " ".join(f"{v:.5f}" for v in c)
        size = " ".join(f"{v:.5f}" for v in s)
        color = " ".join(f"{v:.3f}" for v in rgba)
        parts.append(
            f'<visual><origin xyz="{xyz}"/><geometry><box size="{size}"/></geometry>'
            f'<material name="{name}_m{i}"><color rgba="{color}"/></material></visual>'
            f'<collision><origin xyz="{xyz}"/><geometry><box size="{size}"/></geometry></collision>'
        )
    parts.append("</link>")
    return "".join(parts)


def _articulated_urdf(
    name: str, base: list[Box], child: list[Box], axis: tuple[float, float, float], lower: float, upper: float
) -> str:
    """A fixed base link and one child link on a prismatic joint."""
    ax = " ".join(str(v) for v in axis)
    return (
        f'<?xml version="1.0"?><robot name="{name}">{_link_xml("base", base, 0.0)}'
        f"{_link_xml('moving', child, 0.2)}"
        f'<joint name="{name}_joint" type="prismatic"><parent link="base"/><child link="moving"/>'
        f'<origin xyz="0 0 0"/><axis xyz="{ax}"/>'
        f'<limit lower="{lower}" upper="{upper}" effort="100" velocity="1"/></joint></robot>'
    )


_URDF_DIR: str | None = None


def _urdf_file(text: str) -> str:
    """Write generated URDF text once per process (named by content) and return its path.

    The files live in a temporary directory that the process that made it removes at exit.
    """
    global _URDF_DIR
    if _URDF_DIR is None or not os.path.isdir(_URDF_DIR):
        _URDF_DIR = tempfile.mkdtemp(prefix="rlfleet_calvin_")
        atexit.register(_remove_dir, _URDF_DIR, os.getpid())
    path = os.path.join(_URDF_DIR, hashlib.sha1(text.encode()).hexdigest()[:16] + ".urdf")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(text)
    return path


def _remove_dir(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not from forked children, which share the directory
        shutil.rmtree(path, ignore_errors=True)


def _panda_urdf() -> str:
    """pybullet_data's Panda with its collision meshes (~3k triangles) as visuals instead of the ~100k
    triangle visual meshes: ER_TINY_RENDERER's cost is mostly triangles, and a small camera frame
    cannot show the difference."""
    root = os.path.join(pybullet_data.getDataPath(), "franka_panda")
    with open(os.path.join(root, "panda.urdf")) as f:
        text = f.read()
    text = text.replace("package://meshes/visual/", "package://meshes/collision/")
    return _urdf_file(text.replace("package://meshes/", os.path.join(root, "meshes") + "/"))


def _drawer_urdf(rgba: tuple[float, ...]) -> str:
    """Carcass (walls, top, back) and a tray sliding out along -x; local x=0 is the unit's front."""
    d, w, h = DRAWER_UNIT
    base = [
        ((d / 2, w / 2 - 0.005, h / 2), (d, 0.01, h), rgba),
        ((d / 2, -w / 2 + 0.005, h / 2), (d, 0.01, h), rgba),
        ((0.015 + (d - 0.015) / 2, 0, h - 0.005), (d - 0.015, w, 0.01), rgba),
        ((d - 0.005, 0, (h - 0.01) / 2), (0.01, w - 0.02, h - 0.01), rgba),
    ]
    tw = w - 0.04  # tray outer width
    tray = [
        ((0.0075, 0, (h + 0.005) / 2), (0.015, w - 0.03, h - 0.005), rgba),
        ((0.115, 0, 0.015), (0.2, tw, 0.01), _GREY),
        ((0.115, tw / 2 - 0.005, 0.045), (0.2, 0.01, 0.05), _GREY),
        ((0.115, -tw / 2 + 0.005, 0.045), (0.2, 0.01, 0.05), _GREY),
        ((0.21, 0, 0.045), (0.01, tw - 0.02, 0.05), _GREY),
        ((0.0075, 0, DRAWER_HANDLE_Z), (0.015, 0.08, 0.04), _DARK),
    ]
    return _articulated_urdf("drawer", base, tray, (-1, 0, 0), 0.0, DRAWER_TRAVEL)


def _cabinet_urdf(rgba: tuple[float, ...]) -> str:
    """Cabinet behind the block area with a door sliding along +y; local x=0 is the door's front face."""
    d, w, h = CABINET
    base = [((0.01 + d / 2, 0, h / 2), (d, w, h), rgba)]
    door_w = w / 2
    hx, hy, hz = SLIDER_HANDLE
    door = [
        ((0.005, -SLIDER_TRAVEL / 2, h / 2), (0.01, door_w, h - 0.02), (0.85, 0.85, 0.85, 1.0)),
        ((-hx / 2, -SLIDER_TRAVEL / 2, SLIDER_HANDLE_Z), (hx, hy, hz), _DARK),
    ]
    return _articulated_urdf("slider", base, door, (0, 1, 0), 0.0, SLIDER_TRAVEL)


def _button_urdf() -> str:
    base = [((0, 0, BUTTON_BASE[2] / 2), BUTTON_BASE, _DARK)]
    cap = [((0, 0, BUTTON_BASE[2] + BUTTON_CAP[2] / 2), BUTTON_CAP, (0.9, 0.9, 0.9, 1.0))]
    return _articulated_urdf("button", base, cap, (0, 0, 1), -BUTTON_TRAVEL, 0.0)


def _switch_urdf() -> str:
    base = [((0, 0, SWITCH_BASE[2] / 2), SWITCH_BASE, _DARK)]
    knob = [((-SWITCH_TRAVEL / 2, 0, SWITCH_BASE[2] + SWITCH_KNOB[2] / 2), SWITCH_KNOB, (0.95, 0.75, 0.1, 1.0))]
    return _articulated_urdf("switch", base, knob, (1, 0, 0), 0.0, SWITCH_TRAVEL)


# --- the scene -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CameraSettings:
    """Static third-person camera (high across the desk, looking at the robot) and gripper camera."""

    eye: tuple[float, float, float] = (1.15, 0.0, 1.25)
    target: tuple[float, float, float] = (0.45, 0.0, 0.0)
    fov_deg: float = 48.0
    gripper_fov_deg: float = 75.0


class Scene:
    """One playtable variant in its own pybullet client."""

    def __init__(
        self, variant: Variant, control: ControlSettings | None = None, camera: CameraSettings | None = None
    ) -> None:
        self.variant = variant
        self.camera = camera or CameraSettings()
        c = self.client = p.connect(p.DIRECT)
        p.setGravity(0, 0, -9.81, physicsClientId=c)
        p.setTimeStep(TIMESTEP, physicsClientId=c)
        p.setPhysicsEngineParameter(numSolverIterations=30, deterministicOverlappingPairs=1, physicsClientId=c)
        self.robot = Panda(c, _panda_urdf(), control or ControlSettings())
        for link in range(-1, 12):  # light grey arm, dark hand: visible against every desk colour
            rgba = _DARK if link >= 8 else (0.82, 0.82, 0.85, 1.0)
            p.changeVisualShape(self.robot.body, link, rgbaColor=rgba, physicsClientId=c)

        desk_col = p.createCollisionShape(p.GEOM_BOX, halfExtents=(0.55, 0.65, 0.02), physicsClientId=c)
        desk_vis = p.createVisualShape(
            p.GEOM_BOX, halfExtents=(0.55, 0.65, 0.02), rgbaColor=variant.desk_rgba, physicsClientId=c
        )
        self.desk = p.createMultiBody(0, desk_col, desk_vis, (0.45, 0.0, -0.02), physicsClientId=c)
        p.changeDynamics(self.desk, -1, lateralFriction=0.6, physicsClientId=c)

        dx, dy = variant.drawer_xy
        self.drawer = p.loadURDF(
            _urdf_file(_drawer_urdf(variant.cabinet_rgba)), (dx, dy, 0), useFixedBase=True, physicsClientId=c
        )
        self.slider = p.loadURDF(
            _urdf_file(_cabinet_urdf(variant.cabinet_rgba)),
            (CABINET_FRONT_X, variant.cabinet_y, 0),
            useFixedBase=True,
            physicsClientId=c,
        )
        self.button = p.loadURDF(
            _urdf_file(_button_urdf()), (*variant.button_xy, 0), useFixedBase=True, physicsClientId=c
        )
        self.switch = p.loadURDF(
            _urdf_file(_switch_urdf()), (*variant.switch_xy, 0), useFixedBase=True, physicsClientId=c
        )
        for body in (self.drawer, self.slider, self.switch):  # joint friction: they stay where left
            p.setJointMotorControl2(body, 0, p.VELOCITY_CONTROL, targetVelocity=0, force=2.0, physicsClientId=c)
        p.setJointMotorControl2(
            self.button, 0, p.POSITION_CONTROL, targetPosition=0.0, force=3.0, physicsClientId=c
        )  # the spring pushing the cap back up

        led_vis = p.createVisualShape(
            p.GEOM_BOX, halfExtents=(0.015, 0.015, 0.006), rgbaColor=LED_RGBA[False], physicsClientId=c
        )
        bx, by = variant.button_xy
        self.led_body = p.createMultiBody(0, -1, led_vis, (bx + 0.055, by, 0.006), physicsClientId=c)
        bulb_vis = p.createVisualShape(p.GEOM_SPHERE, radius=0.03, rgbaColor=BULB_RGBA[False], physicsClientId=c)
        self.bulb_body = p.createMultiBody(
            0, -1, bulb_vis, (CABINET_FRONT_X + 0.08, variant.cabinet_y + 0.2, CABINET[2] + 0.03), physicsClientId=c
        )

        self.blocks: dict[str, int] = {}
        for color in BLOCK_COLORS:
            half = [s / 2 for s in BLOCK_SIZE[color]]
            col = p.createCollisionShape(p.GEOM_BOX, halfExtents=half, physicsClientId=c)
            vis = p.createVisualShape(p.GEOM_BOX, halfExtents=half, rgbaColor=BLOCK_RGBA[color], physicsClientId=c)
            body = p.createMultiBody(BLOCK_MASS, col, vis, (0, 0, -1), physicsClientId=c)
            p.changeDynamics(
                body, -1, lateralFriction=1.0, spinningFriction=0.1, rollingFriction=0.0, physicsClientId=c
            )
            self.blocks[color] = body

        cam = self.camera
        self._view = p.computeViewMatrix(cam.eye, cam.target, (0, 0, 1))
        self._proj = p.computeProjectionMatrixFOV(cam.fov_deg, 1.0, 0.05, 3.0)
        self._gripper_proj = p.computeProjectionMatrixFOV(cam.gripper_fov_deg, 1.0, 0.01, 2.0)
        self.led = False
        self.bulb = False
        self._button_latched = False

    # --- episode start ---------------------------------------------------------------------------

    def reset(self, state: SymState, rng: np.random.Generator) -> None:
        """Put the scene in `state` (blocks on the table) with small continuous noise from `rng`.

        Blocks are first parked far away and contacts recomputed, which drops the cached contact
        manifolds: episodes start from the same state whatever ran before them in this client
        (Bullet keeps some solver warm-start state, so later steps can differ in the last digits).
        """
        c = self.client
        for i, body in enumerate(self.blocks.values()):
            p.resetBasePositionAndOrientation(body, (5.0 + i, 5.0, 1.0), (0, 0, 0, 1), physicsClientId=c)
        self.robot.reset(HOME)
        p.performCollisionDetection(physicsClientId=c)
        drawer = DRAWER_TRAVEL - rng.uniform(0, 0.01) if state.drawer_open else rng.uniform(0, 0.01)
        slider = SLIDER_TRAVEL - rng.uniform(0, 0.01) if state.slider_left else rng.uniform(0, 0.01)
        switch = SWITCH_TRAVEL - rng.uniform(0, 0.005) if state.bulb_on else rng.uniform(0, 0.005)
        for body, q in ((self.drawer, drawer), (self.slider, slider), (self.switch, switch), (self.button, 0.0)):
            p.resetJointState(body, 0, q, 0.0, physicsClientId=c)
        self._button_latched = False
        self._set_led(state.led_on)
        self._set_bulb(state.bulb_on)
        for color, body in self.blocks.items():
            b = state.blocks[color]
            if b.where != "table":
                raise ValueError(f"episodes start with every block on the table, {color} is {b.where!r}")
            z = BLOCK_SIZE[color][2] / 2 + 0.0005
            p.resetBasePositionAndOrientation(
                body, (b.x, b.y, z), p.getQuaternionFromEuler((0, 0, b.yaw)), physicsClientId=c
            )
            p.resetBaseVelocity(body, (0, 0, 0), (0, 0, 0), physicsClientId=c)
        self.robot.reset(HOME + rng.normal(0.0, 0.02, size=7) * np.array([1, 1, 1, 1, 1, 1, 2]))
        for _ in range(4):
            p.stepSimulation(physicsClientId=c)

    # --- stepping --------------------------------------------------------------------------------

    def step(self, action: np.ndarray) -> None:
        """One env step: motor targets from `action`, `substeps` physics steps, then the LED / bulb logic."""
        self.robot.apply(action)
        for _ in range(self.robot.settings.substeps):
            p.stepSimulation(physicsClientId=self.client)
        button = self.joint(self.button)
        if not self._button_latched and button < BUTTON_PRESSED:
            self._button_latched = True
            self._set_led(not self.led)
        elif self._button_latched and button > BUTTON_RELEASED:
            self._button_latched = False
        bulb = self.joint(self.switch) > SWITCH_TRAVEL / 2
        if bulb != self.bulb:
            self._set_bulb(bulb)

    def joint(self, body: int) -> float:
        return float(p.getJointState(body, 0, physicsClientId=self.client)[0])

    def _set_led(self, on: bool) -> None:
        self.led = bool(on)
        p.changeVisualShape(self.led_body, -1, rgbaColor=LED_RGBA[self.led], physicsClientId=self.client)

    def _set_bulb(self, on: bool) -> None:
        self.bulb = bool(on)
        p.changeVisualShape(self.bulb_body, -1, rgbaColor=BULB_RGBA[self.bulb], physicsClientId=self.client)

    # --- observations ----------------------------------------------------------------------------

    def block_pose(self, color: str) -> tuple[np.ndarray, np.ndarray]:
        pos, q = p.getBasePositionAndOrientation(self.blocks[color], physicsClientId=self.client)
        return np.array(pos), np.array(p.getEulerFromQuaternion(q))

    def robot_obs(self) -> np.ndarray:
        pos, euler = self.robot.tcp_pose()
        return np.concatenate(
            [pos, euler, [self.robot.gripper_width()], self.robot.arm_joints(), [self.robot.gripper_action]]
        ).astype(np.float32)

    def scene_obs(self) -> np.ndarray:
        parts = [
            [
                self.joint(self.slider),
                self.joint(self.drawer),
                self.joint(self.button),
                self.joint(self.switch),
                float(self.bulb),
                float(self.led),
            ]
        ]
        for color in BLOCK_COLORS:
            parts.extend(self.block_pose(color))
        return np.concatenate(parts).astype(np.float32)

    def state(self) -> np.ndarray:
        """`states` observation: robot_obs (15) then scene_obs (24)."""
        return np.concatenate([self.robot_obs(), self.scene_obs()])

    def snapshot(self) -> Snapshot:
        c = self.client
        robot = self.robot.body
        pos: dict[str, np.ndarray] = {}
        yaw: dict[str, float] = {}
        grasped, touching, on_table, in_drawer = {}, {}, {}, {}
        for color, body in self.blocks.items():
            xyz, euler = self.block_pose(color)
            pos[color], yaw[color] = xyz, float(euler[2])
            links = {pt[4] for pt in p.getContactPoints(body, robot, physicsClientId=c)}
            grasped[color] = all(link in links for link in FINGER_LINKS)
            touching[color] = bool(links)
            on_table[color] = bool(p.getContactPoints(body, self.desk, physicsClientId=c)) and xyz[2] < 0.06
            in_drawer[color] = bool(p.getContactPoints(body, self.drawer, -1, 0, physicsClientId=c))
        on_block: dict[str, str | None] = {}
        for color, body in self.blocks.items():
            on_block[color] = None
            if on_table[color]:
                continue
            for other, other_body in self.blocks.items():
                if (
                    other != color
                    and pos[color][2] > pos[other][2] + 0.02
                    and p.getContactPoints(body, other_body, physicsClientId=c)
                ):
                    on_block[color] = other
        tcp, euler = self.robot.tcp_pose()
        return Snapshot(
            drawer=self.joint(self.drawer),
            slider=self.joint(self.slider),
            button=self.joint(self.button),
            switch=self.joint(self.switch),
            led=self.led,
            bulb=self.bulb,
            block_pos=pos,
            block_yaw=yaw,
            grasped=grasped,
            touching=touching,
            on_table=on_table,
            on_block=on_block,
            in_drawer=in_drawer,
            button_latched=self._button_latched,
            tcp_pos=tcp,
            tcp_euler=euler,
            gripper_width=self.robot.gripper_width(),
        )

    def render(self, size: int) -> np.ndarray:
        """Static camera frame, uint8 [size, size, 3] (ER_TINY_RENDERER: CPU, no display)."""
        return self._image(size, self._view, self._proj)

    def render_gripper(self, size: int) -> np.ndarray:
        """Camera on the hand looking along the fingers, uint8 [size, size, 3]."""
        state = p.getLinkState(self.robot.body, HAND_LINK, computeForwardKinematics=True, physicsClientId=self.client)
        eye, q = np.array(state[4]), state[5]
        m = np.array(p.getMatrixFromQuaternion(q)).reshape(3, 3)
        forward, up = m[:, 2], m[:, 0]
        view = p.computeViewMatrix((eye + 0.05 * up).tolist(), (eye + 0.05 * up + forward).tolist(), up.tolist())
        return self._image(size, view, self._gripper_proj)

    def _image(self, size: int, view: list[float], proj: list[float]) -> np.ndarray:
        _, _, rgba, _, _ = p.getCameraImage(
            size,
            size,
            view,
            proj,
            renderer=p.ER_TINY_RENDERER,
            flags=p.ER_NO_SEGMENTATION_MASK,
            physicsClientId=self.client,
        )
        return np.asarray(rgba, np.uint8).reshape(size, size, 4)[:, :, :3].copy()

    def close(self) -> None:
        if self.client >= 0:
            p.disconnect(physicsClientId=self.client)
            self.client = -1
