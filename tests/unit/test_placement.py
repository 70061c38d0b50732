"""cluster.component_placement: RLinf's grammar resolved to devices per role."""

import pytest

from rlfleet.config import load_config
from rlfleet.runs.placement import PlacementError, parse_devices, plan_placement, resolve_placement


@pytest.mark.parametrize(
    "spec,want",
    [
        ("all", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("0-3", [0, 1, 2, 3]),
        ("4-7", [4, 5, 6, 7]),
        ("0,2,4-5", [0, 2, 4, 5]),
        (3, [3]),
        ("5", [5]),
        ("1-1", [1]),
        ("2,0,1-2", [0, 1, 2]),
    ],
)
def test_parse_devices(spec, want):
    assert parse_devices(spec, 8) == want


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("8", "does not exist"),
        ("0-9", "does not exist"),
        ("3-1", "bad device range"),
        ("a-b", "not an index"),
        ("", "not an index"),
        ("-1", "bad device"),
        (True, "bad device list"),
    ],
)
def test_parse_devices_errors(spec, msg):
    with pytest.raises(PlacementError, match=msg):
        parse_devices(spec, 8)


def test_collocated():
    plan = plan_placement({"env,rollout,actor": "all"}, 8, "cuda")
    assert plan.mode == "collocated"
    assert (plan.num_actors, plan.num_inference_servers, plan.num_learner_ranks) == (8, 8, 8)
    assert all(plan.shares_device(d) for d in plan.inference)
    assert plan.visible_devices(3) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert plan.device_name(3) == "cuda:3"


def test_disaggregated():
    plan = plan_placement({"env": "0-1", "rollout": "2-5", "actor": "6-7"}, 8, "cuda")
    assert plan.mode == "disaggregated"
    assert plan.inference == [2, 3, 4, 5] and plan.learner == [6, 7]
    assert not any(plan.shares_device(d) for d in plan.inference)


def test_hybrid_is_the_issue_example():
    plan = plan_placement({"env": "0-3", "rollout": "4-7", "actor": "0-7"}, 8, "cuda")
    assert plan.mode == "hybrid"
    assert plan.num_learner_ranks == 8 and plan.num_inference_servers == 4 and plan.num_actors == 4
    assert "hybrid" in plan.describe() and "4-7" in plan.describe()


def test_cpu_maps_to_process_slots_and_says_so():
    plan = plan_placement({"env": "0-1", "rollout": 0, "actor": 1}, 2, "cpu")
    assert plan.device_name(1) == "cpu" and plan.visible_devices(1) == {}
    assert "no CUDA device" in plan.describe()
    assert plan.mode == "disaggregated"


@pytest.mark.parametrize(
    "spec,msg",
    [
        ({"env,rollout": "all"}, "does not place actor"),
        ({"env": "all", "rollout": "all", "actor": "all", "learner": 0}, "unknown component 'learner'"),
        ({"env,rollout,actor": "all", "env": 0}, "placed twice"),
        ({"env": None, "rollout": None, "actor": "all"}, "quote a comma-joined key"),
    ],
)
def test_plan_errors(spec, msg):
    with pytest.raises(PlacementError, match=msg):
        plan_placement(spec, 4, "cuda")


def test_a_run_resolves_its_placement_and_rejects_a_bad_one():
    cfg = load_config(
        "metaworld_reach_ppo", ["cluster.cpu_slots=4", "cluster.component_placement={env: 0-1, rollout: 2, actor: 3}"]
    )
    plan = resolve_placement(cfg)
    assert plan.num_actors == 2 and plan.num_inference_servers == 1 and plan.mode == "disaggregated"
    assert resolve_placement(load_config("metaworld_reach_ppo")) is None
    bad = load_config(
        "metaworld_reach_ppo", ["cluster.cpu_slots=2", "cluster.component_placement={env: 0-5, rollout: 0, actor: 0}"]
    )
    with pytest.raises(PlacementError, match="does not exist"):
        resolve_placement(bad)


def test_inference_addresses_start_with_the_actors_own_server():
    from rlfleet.runs.launcher import _inference_addresses

    addrs = ["a:1", "b:2", "c:3"]
    assert _inference_addresses(addrs, 0) == "a:1,b:2,c:3"
    assert _inference_addresses(addrs, 4) == "b:2,c:3,a:1"
    assert _inference_addresses(["a:1"], 7) == "a:1"


def test_runner_offload_is_a_no_op_on_cpu():
    import torch

    from rlfleet.inference_server.policy_runner import PolicyRunner
    from rlfleet.policies.registry import make_policy

    runner = PolicyRunner(make_policy({"name": "gaussian_mlp"}, 4, 2, 1), 0, "cpu")
    runner.offload()
    assert not runner.offloaded and next(runner.policy.parameters()).device == torch.device("cpu")


def test_visible_devices_honour_the_parents_mask(monkeypatch):
    plan = plan_placement({"env": 0, "rollout": 1, "actor": "2-3"}, 4, "cuda")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert plan.visible_devices(2, 3) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert plan.visible_devices(1) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert plan.visible_devices(2, 3) == {"CUDA_VISIBLE_DEVICES": "6,7"}


def test_roles_get_the_config_without_the_placement_to_recheck():
    """A child sees only its own devices: it must not validate the whole plan again."""
    from rlfleet.runs.launcher import _child_config

    cfg = load_config(
        "metaworld_reach_ppo", ["cluster.cpu_slots=4", "cluster.component_placement={env: 0-3, rollout: 0, actor: 1}"]
    )
    child = _child_config(cfg, resolve_placement(cfg))
    assert not child.cluster.component_placement and cfg.cluster.component_placement
    assert child.learner.device == "cpu"  # CPU slots: nothing to move
    gpu = _child_config(cfg, plan_placement({"env": "0-3", "rollout": 0, "actor": 1}, 4, "cuda"))
    assert gpu.learner.device == "cuda:0"  # the one device its CUDA_VISIBLE_DEVICES leaves
