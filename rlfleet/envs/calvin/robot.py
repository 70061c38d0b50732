"""The Franka Panda of the playtable: relative end-effector control through pybullet IK.

Action (7 floats in [-1, 1], as CALVIN's relative actions):
    [0:3] tcp displacement, times `ControlSettings.max_step_m` (2 cm) per env step
    [3:6] change of tcp roll / pitch / yaw, times `max_step_rad` (0.1 rad)
    [6]   gripper: > 0 open, <= 0 close

The tcp (tool centre point) is the Panda's `panda_grasptarget` link, between the fingertips. Its
orientation is reported with the fingers pointing down as (0, 0, 0): Euler angles of
`R_grasptarget * Rx(pi)`, so the usual top-down pose sits far from the +-pi wrap of the raw frame,
and yaw is the hand's heading (yaw 0: fingers close along world y).

Each step the target pose is the measured tcp pose plus the scaled action (as CALVIN's relative
actions), clipped to a workspace box, then solved with pybullet's null-space IK and tracked with
joint position control for `substeps` physics steps. The action is therefore a function of what
the policy observes (no hidden setpoint); a zero action holds the arm (drift ~3 mm over 360 steps).
The IK is steered to the elbow-up posture (`POSTURE_GAIN`), and the two fingers are geared
together, as the URDF's mimic joint intends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pybullet as p

ARM_JOINTS = (0, 1, 2, 3, 4, 5, 6)
FINGER_JOINTS = (9, 10)
TCP_LINK = 11
HAND_LINK = 8
FINGER_LINKS = (9, 10)
ARM_FORCES = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)
LOWER = np.array([-2.9671, -1.8326, -2.9671, -3.1416, -2.9671, -0.0873, -2.9671])
UPPER = np.array([2.9671, 1.8326, 2.9671, 0.0, 2.9671, 3.8223, 2.9671])
# The arm is redundant: left alone, pybullet's IK lets joints 1 and 3 drift (base turned away, upper
# arm rolled) into folded postures that can no longer reach down to the desk. Each step the IK
# starts from the measured joints with joint 1 pulled towards the target's heading and joint 3
# towards 0 by this fraction, so it settles on the nearby elbow-up solution.
POSTURE_GAIN = 0.1
HOME = np.array([0.0, -0.25, 0.0, -2.2, 0.0, 1.95, math.pi / 4])  # tcp about (0.48, 0, 0.40), fingers down
_FLIP = p.getQuaternionFromEuler((math.pi, 0.0, 0.0))  # Rx(pi): grasptarget frame <-> reported tcp frame

GRIPPER_OPEN = 0.04  # per finger: 8 cm between the finger pads
FINGER_FORCE = 40.0


@dataclass(frozen=True)
class ControlSettings:
    """How an action maps to motion; CALVIN runs its arm at 30 Hz with 8 physics substeps of 1/240 s."""

    max_step_m: float = 0.02
    max_step_rad: float = 0.1
    substeps: int = 8
    workspace_low: tuple[float, float, float] = (0.22, -0.55, 0.005)
    workspace_high: tuple[float, float, float] = (0.80, 0.55, 0.45)
    max_tilt_rad: float = 0.6  # |roll|, |pitch| limit of the commanded tcp
    max_yaw_rad: float = 2.9


def tcp_quat_from_euler(euler: np.ndarray) -> tuple[float, ...]:
    """Grasptarget-link quaternion for a reported tcp orientation (Euler)."""
    _, q = p.multiplyTransforms((0, 0, 0), p.getQuaternionFromEuler(euler.tolist()), (0, 0, 0), _FLIP)
    return q


class Panda:
    """One Panda in one pybullet client; `target_pos` / `target_euler` keep the last commanded tcp pose."""

    def __init__(self, client: int, urdf_path: str, settings: ControlSettings) -> None:
        self.client = client
        self.settings = settings
        self.body = p.loadURDF(urdf_path, (0, 0, 0), useFixedBase=True, physicsClientId=client)
        for link in FINGER_LINKS:
            p.changeDynamics(self.body, link, lateralFriction=1.5, spinningFriction=0.1, physicsClientId=client)
        # couple the fingers (the URDF's mimic joint is ignored by pybullet): without it a held block
        # sloshes a centimetre or more between two independently driven fingers
        gear = p.createConstraint(
            self.body,
            FINGER_JOINTS[0],
            self.body,
            FINGER_JOINTS[1],
            p.JOINT_GEAR,
            (1, 0, 0),
            (0, 0, 0),
            (0, 0, 0),
            physicsClientId=client,
        )
        p.changeConstraint(gear, gearRatio=-1, erp=0.1, maxForce=50, physicsClientId=client)
        self._ranges = (UPPER - LOWER).tolist()
        self.target_pos = np.zeros(3)
        self.target_euler = np.zeros(3)
        self.gripper_action = 1.0

    def reset(self, joints: np.ndarray) -> None:
        """Teleport to `joints` (7 arm angles), gripper open, and hold there."""
        for j, q in zip(ARM_JOINTS, joints):
            p.resetJointState(self.body, j, float(q), physicsClientId=self.client)
        for j in FINGER_JOINTS:
            p.resetJointState(self.body, j, GRIPPER_OPEN, physicsClientId=self.client)
        self.target_pos, self.target_euler = self.tcp_pose()
        self.gripper_action = 1.0
        self._command(np.asarray(joints, float))
        self._command_gripper(True)

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Measured tcp position and reported Euler orientation."""
        state = p.getLinkState(self.body, TCP_LINK, computeForwardKinematics=True, physicsClientId=self.client)
        _, q = p.multiplyTransforms((0, 0, 0), state[5], (0, 0, 0), _FLIP)
        return np.array(state[4]), np.array(p.getEulerFromQuaternion(q))

    def gripper_width(self) -> float:
        return float(sum(p.getJointState(self.body, j, physicsClientId=self.client)[0] for j in FINGER_JOINTS))

    def arm_joints(self) -> np.ndarray:
        return np.array([s[0] for s in p.getJointStates(self.body, ARM_JOINTS, physicsClientId=self.client)])

    def apply(self, action: np.ndarray) -> None:
        """Set motor targets for one env step (the caller steps the physics)."""
        s = self.settings
        pos, euler = self.tcp_pose()
        self.target_pos = np.clip(pos + action[:3] * s.max_step_m, s.workspace_low, s.workspace_high)
        rot = euler + action[3:6] * s.max_step_rad
        rot[:2] = np.clip(rot[:2], -s.max_tilt_rad, s.max_tilt_rad)
        rot[2] = np.clip(rot[2], -s.max_yaw_rad, s.max_yaw_rad)  # no wrap: the wrist never turns through +-pi
        self.target_euler = rot
        # pybullet's IK starts from the body's joint state (its `currentPositions` argument misbehaves):
        # set the posture-biased seed, solve, then put the measured state back
        states = p.getJointStates(self.body, ARM_JOINTS, physicsClientId=self.client)
        seed = [st[0] for st in states]
        seed[0] += POSTURE_GAIN * (math.atan2(self.target_pos[1], self.target_pos[0]) - seed[0])
        seed[2] -= POSTURE_GAIN * seed[2]
        for j, q in zip(ARM_JOINTS, seed):
            p.resetJointState(self.body, j, q, physicsClientId=self.client)
        joints = p.calculateInverseKinematics(
            self.body,
            TCP_LINK,
            self.target_pos.tolist(),
            tcp_quat_from_euler(self.target_euler),
            lowerLimits=LOWER.tolist(),
            upperLimits=UPPER.tolist(),
            jointRanges=self._ranges,
            restPoses=HOME.tolist(),
            maxNumIterations=20,
            residualThreshold=1e-5,
            physicsClientId=self.client,
        )
        for j, st in zip(ARM_JOINTS, states):
            p.resetJointState(self.body, j, st[0], st[1], physicsClientId=self.client)
        self._command(np.clip(np.asarray(joints[:7]), LOWER, UPPER))
        self.gripper_action = 1.0 if action[6] > 0 else -1.0
        self._command_gripper(action[6] > 0)

    def _command(self, joints: np.ndarray) -> None:
        p.setJointMotorControlArray(
            self.body,
            ARM_JOINTS,
            p.POSITION_CONTROL,
            targetPositions=joints.tolist(),
            forces=ARM_FORCES,
            positionGains=[0.3] * 7,
            physicsClientId=self.client,
        )

    def _command_gripper(self, open_: bool) -> None:
        target = GRIPPER_OPEN if open_ else 0.0
        p.setJointMotorControlArray(
            self.body,
            FINGER_JOINTS,
            p.POSITION_CONTROL,
            targetPositions=[target] * 2,
            forces=[FINGER_FORCE] * 2,
            positionGains=[0.1] * 2,
            physicsClientId=self.client,
        )
