"""The dual-arm tabletop scene: a table, two Franka Pandas with parallel grippers, primitive objects.

Why built this way: RoboTwin's own assets (meshes, robot models) come from a model hub that is not
reachable here, so robots are pybullet_data's `franka_panda/panda.urdf` and every object is a
compound of boxes and cylinders. Physics runs on `PhysxCpuSystem` alone unless images are asked
for: SAPIEN refuses to create *any* visual shape or render material without a Vulkan device, so in
state-only mode the URDF's `<visual>` tags are stripped and objects get collision shapes only.

Frame: x points away from the robots across the table, y to the left, z up; the table top is at
z = `table_z` (0 in the clean setting). The left arm's base is at (0, +0.3), the right one at
(0, -0.3). Each gripper keeps a fixed top-down orientation (with a per-task yaw); the end effector
is `panda_grasptarget`, the point between the fingertips.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass

import numpy as np
import sapien

ARMS = ("left", "right")
ARM_BASE_Y = {"left": 0.3, "right": -0.3}
ARM_DOF = 7
GRIPPER_MAX = 0.04  # metres per finger: the Panda opens to 8 cm
SIM_HZ = 125
CONTROL_HZ = 25  # one env step = SIM_HZ // CONTROL_HZ physics steps
MAX_DELTA = 0.025  # metres of end-effector motion per env step at |action| = 1
WORKSPACE_LOW = np.array([0.2, -0.55, 0.0])  # relative to the table top
WORKSPACE_HIGH = np.array([0.8, 0.55, 0.45])
HOME_EE = {"left": np.array([0.35, 0.25, 0.25]), "right": np.array([0.35, -0.25, 0.25])}  # above table top
_EE_LINK = "panda_grasptarget"
_SEED_QPOS = np.array([0.0, -0.3, 0.0, -2.2, 0.0, 2.0, 0.785])


@functools.cache
def render_available() -> bool:
    """Whether SAPIEN finds a Vulkan device (GPU or Mesa lavapipe); probed once per process."""
    try:
        sapien.render.RenderSystem()
    except RuntimeError:
        return False
    return True


def require_renderer() -> None:
    """Raise a clear error when images are asked for but no Vulkan device exists."""
    if not render_available():
        raise RuntimeError(
            "image_size > 0 needs a Vulkan device and SAPIEN found none ('failed to find a rendering "
            "device'). On a CPU-only Debian 12 machine run deploy/install_lavapipe.sh (Mesa 25 lavapipe "
            "from bookworm-backports), or use image_size=0 (state-only)."
        )


@functools.cache
def _panda_urdf(visual: bool) -> str:
    """pybullet_data's Panda with absolute mesh paths (and no visuals when headless), as a temp file.

    The file name is a hash of its text, written atomically, so processes share it and never litter.
    """
    import pybullet_data  # robot/asset files only when a scene is built (the [robotwin] extra)

    src = os.path.join(pybullet_data.getDataPath(), "franka_panda", "panda.urdf")
    with open(src) as f:
        text = f.read()
    if not visual:
        text = re.sub(r"<visual>.*?</visual>", "", text, flags=re.S)
    text = text.replace("package://", os.path.dirname(src) + "/")
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"rlfleet_panda_{digest}.urdf")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def down_quat(yaw: float) -> np.ndarray:
    """wxyz quaternion of a gripper pointing down (hand z = -world z) turned by `yaw` about world z.

    At yaw 0 the fingers close along world y; at yaw pi/2 along world x.
    """
    # Rz(yaw) * Rx(pi): (cos(y/2), 0, 0, sin(y/2)) * (0, 1, 0, 0)
    c, s = np.cos(yaw / 2), np.sin(yaw / 2)
    return np.array([0.0, c, s, 0.0])


@dataclass
class Part:
    """One collision (and, when rendering, visual) shape of an object, in the object's frame."""

    kind: str  # "box" (size = half extents xyz) or "cylinder" (size = (radius, half_length))
    size: tuple[float, ...]
    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    color: tuple[float, float, float] | None = None  # None: the object's colour
    axis: str = "z"  # cylinders: the axis they run along


# PhysX cylinders run along x; these turn x into the Part's axis
_CYLINDER_AXIS = {
    "x": sapien.Pose(),
    "y": sapien.Pose(q=[0.7071068, 0.0, 0.0, 0.7071068]),
    "z": sapien.Pose(q=[0.7071068, 0.0, -0.7071068, 0.0]),
}


class Arm:
    """One Panda: joint drives, a pinocchio model for IK, and the commanded end-effector target."""

    def __init__(self, scene: sapien.Scene, name: str, visual: bool, material: sapien.physx.PhysxMaterial) -> None:
        loader = scene.create_urdf_loader()
        loader.fix_root_link = True
        loader.set_material(material.static_friction, material.dynamic_friction, material.restitution)
        self.robot = loader.load(_panda_urdf(visual))
        self.robot.name = name
        self.name = name
        self.base = np.array([0.0, ARM_BASE_Y[name], 0.0])
        self.robot.set_root_pose(sapien.Pose(self.base))
        for link in self.robot.links:
            link.disable_gravity = True  # gravity compensation, as a real Panda's controller does
        self.joints = self.robot.active_joints
        for j in self.joints[:ARM_DOF]:
            j.set_drive_property(stiffness=4000.0, damping=400.0, force_limit=200.0)
        for j in self.joints[ARM_DOF:]:
            j.set_drive_property(stiffness=2000.0, damping=100.0, force_limit=60.0)
        self.model = self.robot.create_pinocchio_model()
        self.ee_index = [link.name for link in self.robot.links].index(_EE_LINK)
        self.ee_link = self.robot.links[self.ee_index]
        self.fingers = [link for link in self.robot.links if link.name.endswith("finger")]
        self.yaw = 0.0
        self.target = np.zeros(3)  # commanded end-effector position (world)
        self.q_target = np.concatenate([_SEED_QPOS, [GRIPPER_MAX, GRIPPER_MAX]])
        self.grip_cmd = GRIPPER_MAX

    def ik(self, pos_world: np.ndarray, q_init: np.ndarray) -> tuple[np.ndarray, bool]:
        """Joint targets putting the end effector at `pos_world`, pointing down at this arm's yaw."""
        pose = sapien.Pose(pos_world - self.base, down_quat(self.yaw))
        q, ok, _ = self.model.compute_inverse_kinematics(
            self.ee_index,
            pose,
            initial_qpos=q_init,
            active_qmask=[1] * ARM_DOF + [0, 0],
            eps=1e-5,
            max_iterations=40,
            dt=1.0,
            damp=1e-6,
        )
        return np.asarray(q), bool(ok)

    def home(self, pos_world: np.ndarray, yaw: float) -> None:
        """Teleport to a top-down pose at `pos_world` with an open gripper (episode start)."""
        self.yaw = yaw
        q, _ = self.ik(pos_world, np.concatenate([_SEED_QPOS, [GRIPPER_MAX, GRIPPER_MAX]]))
        q[ARM_DOF:] = GRIPPER_MAX
        self.robot.set_qpos(q)
        self.robot.set_qvel(np.zeros_like(q))
        self.q_target = q
        self.grip_cmd = GRIPPER_MAX
        self.target = np.asarray(pos_world, np.float64).copy()
        self._drive()

    def command(self, target: np.ndarray, grip: float) -> None:
        """New end-effector target (world) and gripper command (+1 close, -1 open)."""
        q, _ = self.ik(target, self.q_target)  # unconverged: the closest pose found, still a valid command
        if np.all(np.isfinite(q)):
            self.q_target[:ARM_DOF] = q[:ARM_DOF]
            self.target = target
        self.grip_cmd = GRIPPER_MAX * (1.0 - float(np.clip(grip, -1.0, 1.0))) / 2.0
        self._drive()

    def _drive(self) -> None:
        for j, t in zip(self.joints[:ARM_DOF], self.q_target[:ARM_DOF]):
            j.set_drive_target(float(t))
        for j in self.joints[ARM_DOF:]:
            j.set_drive_target(self.grip_cmd)

    def ee_pos(self) -> np.ndarray:
        return np.asarray(self.ee_link.entity_pose.p, np.float64)

    def gripper_width(self) -> float:
        """Opening between the fingers in metres (0 closed, 0.08 open)."""
        q = self.robot.get_qpos()
        return float(q[ARM_DOF] + q[ARM_DOF + 1])


class DualArmScene:
    """A SAPIEN scene with the table and both arms; tasks add their objects through `add_object`."""

    def __init__(self, render_size: int = 0) -> None:
        self.visual = render_size > 0
        if self.visual:
            require_renderer()
            self.scene = sapien.Scene()
            self.scene.set_ambient_light([0.4, 0.4, 0.4])
            self.scene.add_directional_light([0.3, 0.2, -1.0], [0.7, 0.7, 0.7])
        else:
            self.scene = sapien.Scene([sapien.physx.PhysxCpuSystem()])
        self.scene.set_timestep(1.0 / SIM_HZ)
        self.material = sapien.physx.PhysxMaterial(1.5, 1.2, 0.0)
        self.table_z = 0.0
        self.table = self.add_object("table", [Part("box", (0.4, 0.8, 0.02))], color=(0.55, 0.42, 0.3), static=True)
        self.arms = {name: Arm(self.scene, name, self.visual, self.material) for name in ARMS}
        self.camera = None
        if self.visual:
            self.camera = self.scene.add_camera("head", render_size, render_size, np.deg2rad(60), 0.01, 5.0)
        self.set_table_height(0.0)

    def set_table_height(self, z: float) -> None:
        """Move the table top to height `z` (the arms stay put: the randomised setting varies this)."""
        self.table_z = float(z)
        self.table.set_pose(sapien.Pose([0.6, 0.0, z - 0.02]))
        if self.camera is not None:
            # head camera behind and above the arms, looking at the table centre
            eye, look = np.array([0.0, 0.0, z + 0.8]), np.array([0.55, 0.0, z])
            fwd = (look - eye) / np.linalg.norm(look - eye)
            left = np.cross([0.0, 0.0, 1.0], fwd)
            left /= np.linalg.norm(left)
            up = np.cross(fwd, left)
            mat = np.eye(4)
            mat[:3, :3] = np.stack([fwd, left, up], axis=1)
            mat[:3, 3] = eye
            self.camera.entity.set_pose(sapien.Pose(mat))

    def add_object(
        self,
        name: str,
        parts: list[Part],
        color: tuple[float, float, float] = (0.8, 0.8, 0.8),
        density: float = 400.0,
        static: bool = False,
    ) -> sapien.Entity:
        """Build a rigid object from boxes and z-axis cylinders (collision always, visuals when rendering)."""
        builder = self.scene.create_actor_builder()
        for part in parts:
            pose = sapien.Pose(list(part.offset))
            rgb = list(part.color or color) + [1.0]
            if part.kind == "box":
                builder.add_box_collision(pose, list(part.size), material=self.material, density=density)
                if self.visual:
                    builder.add_box_visual(pose, list(part.size), material=rgb)
            elif part.kind == "cylinder":
                radius, half = part.size
                pose = pose * _CYLINDER_AXIS[part.axis]
                builder.add_cylinder_collision(pose, radius, half, material=self.material, density=density)
                if self.visual:
                    builder.add_cylinder_visual(pose, radius, half, material=rgb)
            else:
                raise ValueError(f"unknown part kind {part.kind!r}")
        entity = builder.build_static(name) if static else builder.build(name)
        return entity

    def set_color(self, entity: sapien.Entity, rgb: tuple[float, float, float]) -> None:
        """Recolour an object (only visible when rendering; a no-op state-only)."""
        if not self.visual:
            return
        for comp in entity.components:
            if isinstance(comp, sapien.render.RenderBodyComponent):
                for shape in comp.render_shapes:
                    for part in shape.parts:
                        part.material.base_color = list(rgb) + [1.0]

    def place(self, entity: sapien.Entity, xyz: np.ndarray, yaw: float = 0.0) -> None:
        """Put an object at `xyz` (z relative to the table top) with yaw, at rest."""
        pose = sapien.Pose([xyz[0], xyz[1], xyz[2] + self.table_z], [np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])
        entity.set_pose(pose)
        body = entity.find_component_by_type(sapien.physx.PhysxRigidDynamicComponent)
        if body is not None:
            body.set_linear_velocity([0.0, 0.0, 0.0])
            body.set_angular_velocity([0.0, 0.0, 0.0])

    def home_arms(self, yaw: dict[str, float]) -> None:
        for name, arm in self.arms.items():
            arm.home(HOME_EE[name] + np.array([0.0, 0.0, self.table_z]), yaw[name])

    def apply_action(self, action: np.ndarray) -> None:
        """One env step of the 8-dim action: per arm (left, right) dx, dy, dz in [-1, 1] and gripper."""
        low = WORKSPACE_LOW + np.array([0.0, 0.0, self.table_z])
        high = WORKSPACE_HIGH + np.array([0.0, 0.0, self.table_z])
        for i, arm in enumerate(self.arms.values()):
            a = action[4 * i : 4 * i + 4]
            arm.command(np.clip(arm.target + MAX_DELTA * a[:3], low, high), float(a[3]))
        for _ in range(SIM_HZ // CONTROL_HZ):
            self.scene.step()

    def proprio(self) -> np.ndarray:
        """Per arm: 7 joint positions, gripper opening (m), end-effector xyz (table-top relative): 22 floats."""
        out = []
        for arm in self.arms.values():
            q = arm.robot.get_qpos()
            out.extend(q[:ARM_DOF])
            out.append(q[ARM_DOF] + q[ARM_DOF + 1])
            out.extend(arm.ee_pos() - np.array([0.0, 0.0, self.table_z]))
        return np.asarray(out, np.float32)

    def render(self) -> np.ndarray:
        """The head camera's RGB frame, uint8 [H, W, 3]."""
        assert self.camera is not None
        self.scene.update_render()
        self.camera.take_picture()
        rgba = self.camera.get_picture("Color")
        return (np.clip(rgba[..., :3], 0.0, 1.0) * 255).astype(np.uint8)
