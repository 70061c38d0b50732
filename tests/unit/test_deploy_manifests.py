"""deploy/: Kubernetes manifests and compose files against their schemas, plus the wiring between them.

Schemas come from installed packages (the dev extra), never from the network:
Kubernetes' from `kubernetes-validate`, compose-spec's from `check-jsonschema`'s vendored copy.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30"  # gRPC probes are GA from 1.27; validate against a version clusters run today
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
COMPOSE_FILES = sorted(DEPLOY.glob("compose*.yaml"))


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _k8s_objects() -> list[dict]:
    return [doc for path in MANIFESTS for doc in _docs(path)]


def _by_kind(kind: str) -> list[dict]:
    return [o for o in _k8s_objects() if o["kind"] == kind]


def _workloads() -> list[dict]:
    return [o for o in _k8s_objects() if o["kind"] in ("Deployment", "StatefulSet")]


def _containers(workload: dict) -> list[dict]:
    return workload["spec"]["template"]["spec"]["containers"]


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    text = (resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text()
    schema = json.loads(text)
    jsonschema.validators.validator_for(schema).check_schema(schema)
    return schema


def _compose_errors(schema: dict, doc: dict) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


# ---- Kubernetes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_k8s_manifest_matches_the_kubernetes_schema(path):
    for doc in _docs(path):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on any unknown or mistyped field


def test_the_kubernetes_schema_check_catches_a_typo():
    learner = copy.deepcopy(next(o for o in _workloads() if o["kind"] == "StatefulSet"))
    _containers(learner)[0]["readinessProbe"]["grpc"]["prot"] = 50051
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(learner, K8S_VERSION, strict=True)


def test_kustomization_lists_exactly_the_manifests():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    # secret.yaml is a template: applying it with the rest would reset the real token to the placeholder
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS if p.name != "secret.yaml")
    images = {i["name"] for i in kustomization["images"]}
    used = {c["image"].split(":")[0] for w in _workloads() for c in _containers(w)}
    assert used <= images  # `images:` can retarget every container to a registry


def test_the_roles_and_their_controllers():
    kinds = {(o["kind"], o["metadata"]["name"]) for o in _k8s_objects()}
    assert {
        ("StatefulSet", "rlfleet-learner"),
        ("Deployment", "rlfleet-inference"),
        ("Deployment", "rlfleet-actor"),
        ("Service", "rlfleet-learner"),
        ("Service", "rlfleet-inference"),
        ("Secret", "rlfleet-token"),
    } <= kinds
    learner = next(o for o in _workloads() if o["kind"] == "StatefulSet")
    assert learner["spec"]["serviceName"] == "rlfleet-learner"
    claim = learner["spec"]["volumeClaimTemplates"][0]
    mounts = {m["name"]: m["mountPath"] for m in _containers(learner)[0]["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"  # the run folder (checkpoints) lives on the claim
    assert "--resume" in _containers(learner)[0]["args"]
    headless = next(s for s in _by_kind("Service") if s["metadata"]["name"] == "rlfleet-learner")
    assert headless["spec"]["clusterIP"] == "None"


def test_services_select_pods_and_name_their_ports():
    for svc in _by_kind("Service"):
        selector = svc["spec"]["selector"]
        targets = [w for w in _workloads() if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert targets, f"service {svc['metadata']['name']} selects no pods"
        names = {p["name"] for w in targets for c in _containers(w) for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)


def test_probes_metrics_annotations_secrets_and_config_fit_together():
    config_maps = {c["metadata"]["name"]: c["data"] for c in _by_kind("ConfigMap")}
    secrets = {s["metadata"]["name"]: s["stringData"] for s in _by_kind("Secret")}
    metrics_port = int(config_maps["rlfleet-env"]["RLFLEET_METRICS_PORT"])
    for w in _workloads():
        pod = w["spec"]["template"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics_port
        for c in _containers(w):
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports["metrics"] == metrics_port
            assert set(c["resources"]) == {"requests", "limits"}
            for probe in ("readinessProbe", "livenessProbe"):
                spec = c[probe]
                port = spec["grpc"]["port"] if "grpc" in spec else spec["httpGet"]["port"]
                assert port in ports or port in ports.values(), (w["metadata"]["name"], probe, port)
            for ref in c["envFrom"]:
                assert ref["configMapRef"]["name"] in config_maps
            for var in c["env"]:
                if "valueFrom" in var:
                    ref = var["valueFrom"]["secretKeyRef"]
                    assert ref["key"] in secrets[ref["name"]]
            assert any(v["name"] == "RLFLEET_TOKEN" for v in c["env"])  # non-loopback binds need it


def test_the_recipe_in_the_config_map_loads(tmp_path):
    from rlfleet.config import load_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        next(c for c in _by_kind("ConfigMap") if c["metadata"]["name"] == "rlfleet-recipe")["data"]["recipe.yaml"]
    )
    cfg = load_config(str(recipe), ["runner.logger.log_path=/data/runs/rlfleet"])  # unknown keys would raise
    assert cfg.actor.transport == "zmq"  # actors in other pods cannot share memory with the server


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds():
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert all(d["metadata"].get("namespace", "rlfleet") == "rlfleet" for d in built)
    assert len(built) == len(_k8s_objects()) - len(_by_kind("Secret"))


# ---- compose ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_files_match_the_compose_spec(compose_schema, path):
    assert _compose_errors(compose_schema, yaml.safe_load(path.read_text())) == []


def test_the_compose_schema_check_catches_a_typo(compose_schema):
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    doc["services"]["actor"]["shm_sise"] = "1gb"
    assert _compose_errors(compose_schema, doc)


def test_compose_wires_the_roles_by_name_and_scales_actors():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert {"learner", "inference", "actor"} <= set(services)
    actor = services["actor"]
    assert "container_name" not in actor and "ports" not in actor  # both would break --scale actor=N
    assert actor["environment"]["RLFLEET_LEARNER"] == "learner:50051"
    assert actor["environment"]["RLFLEET_INFERENCE"] == "inference:50052"
    assert services["inference"]["environment"]["RLFLEET_GRPC_PORT"] == "50052"
    for name in ("learner", "inference", "actor"):
        env = services[name]["environment"]
        assert env["RLFLEET_HOST"] == "0.0.0.0" and env["RLFLEET_TOKEN"].startswith("${RLFLEET_TOKEN")
        assert "healthcheck" in services[name]
    assert any(v.endswith(":/data") for v in services["learner"]["volumes"])


def _deploy_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in [*MANIFESTS, *COMPOSE_FILES, DEPLOY / "README.md"]}


def test_every_environment_variable_the_deploy_files_set_is_read_by_rlfleet():
    source = "\n".join(p.read_text() for p in (ROOT / "rlfleet").rglob("*.py"))
    used = {v for text in _deploy_texts().values() for v in re.findall(r"\bRLFLEET_[A-Z_]+\b", text)}
    unknown = {v for v in used if v not in source and v not in ("RLFLEET_RECIPE", "RLFLEET_IMAGE_TAG")}
    assert not unknown, f"set in deploy/ but read nowhere in rlfleet/: {sorted(unknown)}"  # compose-only: recipe, tag


# ---- image and batch scripts --------------------------------------------------------------------


def test_the_dockerfile_parses_and_builds_a_non_root_rlfleet_image():
    parser = DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    instructions = [i["instruction"] for i in parser.structure if i["instruction"] != "COMMENT"]
    assert instructions[0] == "ARG" and "FROM" in instructions  # BASE_IMAGE picks CPU or CUDA
    assert parser.baseimage == "python:3.11-slim"  # the default: the CPU image
    args = {}
    for i in parser.structure:
        if i["instruction"] == "ARG" and "=" in i["value"]:
            key, _, value = i["value"].partition("=")
            args[key] = value
    assert {"BASE_IMAGE", "TORCH_VERSION", "TORCH_INDEX_URL"} <= set(args)
    makefile = (ROOT / "Makefile").read_text()
    assert f'"torch=={args["TORCH_VERSION"]}"' in makefile  # the image runs the torch the project is tested with
    users = [i["value"].split(":")[0] for i in parser.structure if i["instruction"] == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert json.loads(next(i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT")) == ["rlfleet"]


SBATCH = sorted((DEPLOY / "slurm").glob("*.sbatch"))


@pytest.mark.skipif(not SBATCH, reason="no deploy/slurm/*.sbatch")
@pytest.mark.parametrize("path", SBATCH, ids=lambda p: p.name)
def test_slurm_scripts_are_valid_bash(path):
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
