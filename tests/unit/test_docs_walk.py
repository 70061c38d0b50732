"""docs/architecture.md's walk ("One observation, file by file") against the code: every file it
names exists, every class, method and function it names is defined in a file it names, and every
module an update runs through, from the segment a learner takes to the optimiser step, is named
(found by tracing an update, so a module added on that path fails here until the walk names it).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from rlfleet.config import RunConfig, config_keys

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # mlp_segments, shared with the trainer tests

# Modules an update calls that carry no part of the observation's way to the weights.
OFF_THE_PATH = {
    "rlfleet/learner/metrics.py": "the policy-lag histogram: a statistic of the update, not its data",
}
# Words the walk backticks that are not definitions: the estimators' registered names.
NOT_DEFINITIONS = {"gae", "vtrace", "grpo"}


def _walk() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    return text.split("## One observation, file by file", 1)[1].split("\n## ", 1)[0]


def _files(walk: str) -> list[str]:
    return sorted(set(re.findall(r"`(rlfleet/[\w/]+\.py)`", walk)))


def _definitions(path: Path) -> set[str]:
    """Names defined in a module: functions, classes, `Class.method`s and class attributes."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            out.add(node.name)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out.add(f"{node.name}.{item.target.id}")
    return out


def test_every_file_the_walk_names_exists():
    files = _files(_walk())
    assert len(files) >= 20
    missing = [f for f in files if not (REPO / f).is_file()]
    assert not missing, f"docs/architecture.md's walk names files that do not exist: {missing}"
    assert f"steps through {len(files)} files" in _walk(), "the walk's file count is stale"


def test_every_name_the_walk_gives_is_defined_in_a_file_it_names():
    walk = _walk()
    defined = set().union(*(_definitions(REPO / f) for f in _files(walk) if (REPO / f).is_file()))
    # `name` and `Class.name`; a prefix (`final_`) or a dotted path (rlfleet/...) is not a definition
    names = {t for t in re.findall(r"`(\w+|[A-Z]\w*\.\w+)`", walk) if not t.endswith("_")} - NOT_DEFINITIONS
    methods = {d.split(".", 1)[1] for d in defined if "." in d}  # a bare `finish`: some class's method
    settings = {k.rsplit(".", 1)[-1] for k in config_keys(OmegaConf.structured(RunConfig))}  # `max_batch`
    undefined = sorted(n for n in names if n not in defined | methods | settings)
    assert len(names) >= 15
    assert not undefined, f"docs/architecture.md's walk names what its files do not define: {undefined}"


def test_every_module_an_update_runs_through_is_named():
    from mlp_segments import make_segment

    from rlfleet.algorithms import PPOConfig
    from rlfleet.learner.trainer import Trainer
    from rlfleet.policies import GaussianMLPPolicy, PolicyConfig

    torch.manual_seed(0)
    policy = GaussianMLPPolicy(5, 2, 1, PolicyConfig(hidden_sizes=[8, 8]))
    trainer = Trainer(policy, PPOConfig(update_epochs=1, num_minibatches=1))
    terminated = np.zeros((8, 4), bool)
    terminated[3, 1] = True
    segments = [make_segment(policy, 8, 4, [3] * 8, seed=i, terminated=terminated) for i in range(2)]
    ran: set[str] = set()
    package = str(REPO / "rlfleet") + "/"

    def record(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename.startswith(package):
            ran.add("rlfleet/" + frame.f_code.co_filename[len(package) :])

    sys.setprofile(record)
    try:
        trainer.step(segments, version=3)
    finally:
        sys.setprofile(None)
    assert "rlfleet/learner/trainer.py" in ran and "rlfleet/algorithms/ppo.py" in ran
    unnamed = sorted(ran - set(_files(_walk())) - set(OFF_THE_PATH))
    assert not unnamed, f"an update runs through modules docs/architecture.md's walk does not name: {unnamed}"
    stale = sorted(set(OFF_THE_PATH) - ran)
    assert not stale, f"OFF_THE_PATH lists modules an update no longer runs: {stale}"
