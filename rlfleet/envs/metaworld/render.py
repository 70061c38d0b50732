"""`main_images` for MetaWorld envs: mujoco offscreen rendering tuned for CPU (llvmpipe)."""

from __future__ import annotations

from typing import Any

import numpy as np

GOAL_MARKER_RGBA = (0.0, 1.0, 0.0, 1.0)  # green: the arm, the tasks' own dots and most objects are red


def show_goal(model: Any, radius: float) -> None:
    """Draw the model's `goal` site as a sphere of `radius` in GOAL_MARKER_RGBA (nothing when it has none)."""
    import mujoco

    try:
        site = model.site("goal").id
    except KeyError:
        return
    model.site_type[site] = mujoco.mjtGeom.mjGEOM_SPHERE
    model.site_size[site] = radius
    model.site_rgba[site] = GOAL_MARKER_RGBA


class CameraRenderer:
    """`main_images` for one env: mujoco offscreen rendering with CPU-friendly settings.

    Multisampling, shadows and reflections cost most of a llvmpipe frame and add nothing a small
    policy can use (the unused 4096^2 shadow map alone is ~65 MB per renderer); MetaWorld's `corner`
    cameras come out rotated 180 degrees, so frames are flipped.
    """

    def __init__(self, env: Any, size: int, camera: str, goal_marker_size: float = 0.0) -> None:
        import mujoco  # after MUJOCO_GL is set (the metaworld package __init__)

        model = env.model
        if goal_marker_size > 0:
            show_goal(model, goal_marker_size)
        try:
            self._camera = model.camera(camera).id
        except KeyError as exc:
            names = [model.camera(i).name for i in range(model.ncam)]
            raise ValueError(f"unknown camera {camera!r}; this task has {names}") from exc
        model.vis.quality.offsamples = 0
        model.vis.quality.shadowsize = 0
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, size)
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        self._renderer = mujoco.Renderer(model, size, size)
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self._flip = camera.startswith("corner")
        self._env = env

    def render(self) -> np.ndarray:
        self._renderer.update_scene(self._env.data, camera=self._camera)
        img = self._renderer.render()
        return img[::-1, ::-1] if self._flip else img

    def close(self) -> None:
        self._renderer.close()
