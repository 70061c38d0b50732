"""Local mode (`rlfleet train`): one command spawns the learner, an inference server and the actors on this host.

Each role is the same `rlfleet` subcommand a user would start by hand in distributed mode;
the launcher only wires their addresses together (through small address files) and makes
sure that when the learner ends, or on Ctrl-C, every child stops and nothing is left behind.
While the learner runs, an actor process that crashes is restarted (`rlfleet.runs.supervisor`).
The starting policy's evaluation (eval.before) runs here, before the fleet, through the run's
`rlfleet.eval.service.EvaluationService` (the learner's service reads it back for summary.json);
the before/after tables are written once the learner's summary is in
(`rlfleet.eval.report.write_before_after`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlfleet.actors.learner_client import LEDGER_DIR_VAR
from rlfleet.config import as_dict, load_config, policy_settings, to_yaml
from rlfleet.envs.registry import build_env_config, task_groups
from rlfleet.envs.run_shapes import probe_env_dims
from rlfleet.eval.report import success_table, write_before_after, write_report
from rlfleet.eval.service import EvaluationService
from rlfleet.eval.summary import print_summary, read_summary, write_summary
from rlfleet.learner.main import RUN_OUTPUTS, START_OUTPUTS, archive_previous_run
from rlfleet.policies.checkpoint_io import policy_from_config
from rlfleet.policies.pinning import pinned_settings, starting_checkpoint
from rlfleet.runs.bootstrap import ensure_sft_checkpoint, needs_bootstrap
from rlfleet.runs.dagger import run_dagger
from rlfleet.runs.placement import PlacementPlan, resolve_placement
from rlfleet.runs.supervisor import ActorSupervisor, RestartPolicy, last_error_line
from rlfleet.wire.auth import current as current_auth
from rlfleet.wire.join import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, CommandError


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the launcher dies, even by SIGKILL (Linux
    prctl PR_SET_PDEATHSIG), so a killed `rlfleet train` leaves no actors or servers behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _spawn(
    args: list[str],
    log_file: Path | None = None,
    extra_env: dict[str, str] | None = None,
    launcher: tuple[str, ...] = ("-m", "rlfleet.cli"),
) -> subprocess.Popen:
    # token and TLS travel by environment: a command line is readable by every user of the host
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **current_auth().child_env(), **(extra_env or {}))
    out = open(log_file, "ab") if log_file else None
    return subprocess.Popen(
        [sys.executable, *launcher, *args],
        env=env,
        stdout=out,
        stderr=out,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )


def _learner_launcher(plan: PlacementPlan | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """`rlfleet learner`, or torchrun over the placement's learner devices (DDP, rank 0 serves)."""
    if plan is None or plan.num_learner_ranks == 1:
        env = plan.visible_devices(plan.learner[0]) if plan else {}
        return ("-m", "rlfleet.cli", "learner"), env
    env = plan.visible_devices(*plan.learner)
    return (
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={plan.num_learner_ranks}",
        "-m",
        "rlfleet.learner",
    ), env


def _child_config(cfg: DictConfig, plan: PlacementPlan | None) -> DictConfig:
    """The config the roles load: the placement is already applied here, and a child whose
    CUDA_VISIBLE_DEVICES is masked must not check it again against the devices it can see."""
    if plan is None:
        return cfg
    child = cfg.copy()
    child.cluster.component_placement = {}
    if plan.device_kind == "cuda" and plan.num_learner_ranks == 1:
        child.learner.device = "cuda:0"  # the one device left visible to it (torchrun ranks pick their own)
    return child


def _inference_addresses(addresses: list[str], actor_index: int) -> str:
    """Every server, starting with this actor's own: it fails over to the others (rlfleet.actors.inference_failover)."""
    k = actor_index % len(addresses)
    return ",".join(addresses[k:] + addresses[:k])


class FleetError(CommandError):
    """A role of the local fleet stopped the run (it exited before it was ready, or every actor
    crashed): the message says which and where its log is, so `rlfleet train` prints it as one line.
    `exit_code` is the command's: 2 when the role refused its input (exited 2), else 1."""


# A role's start-up (imports, policy and reference build, a probe env for the model's dimensions)
# can take minutes on a small, busy host: wait long while it is alive.
ROLE_START_TIMEOUT_S = 900.0


def _wait_address(
    path: Path, proc: subprocess.Popen, key: str, timeout: float = ROLE_START_TIMEOUT_S, log_file: Path | None = None
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())[key]
        if proc.poll() is not None:
            cause = last_error_line(log_file)
            raise FleetError(
                f"{key} exited with code {proc.returncode} before it was ready" + (f": {cause}" if cause else ""),
                EXIT_BAD_INPUT if proc.returncode == EXIT_BAD_INPUT else EXIT_FAILED,
            )
        time.sleep(0.1)
    raise TimeoutError(f"{key} did not report its address within {timeout:.0f}s")


def _stop_all(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def starting_policy(cfg: DictConfig) -> torch.nn.Module:
    """The policy the run starts from (fresh, seeded by runner.seed, or `policy.model_path`)."""
    torch.manual_seed(cfg.runner.seed)
    state_dim, action_dim = probe_env_dims(build_env_config(as_dict(cfg.env)))
    return policy_from_config(as_dict(cfg.policy), state_dim, action_dim, cfg.env.chunk_size, cfg.env.image_size)


def evaluate_start(
    cfg: DictConfig,
    deterministic: bool = True,
    episode_records: list[dict] | None = None,
) -> tuple[dict[str, float], dict | None]:
    """Success of the policy the run starts from on the run's eval episodes, and for chained envs
    (CALVIN) its chain metrics from the same episodes (else None); nothing written.
    `deterministic=False` samples the actions (diagnostics; runs evaluate deterministically);
    `episode_records`, when given, receives every episode (`evaluate_policy`)."""
    service = EvaluationService(cfg, Path(cfg.runner.logger.log_path))
    ev = service.play(starting_policy(cfg), cfg.eval.episodes_per_task, None, video=False, deterministic=deterministic)
    if episode_records is not None:
        episode_records.extend(ev.records)
    return ev.success, service.chains(ev)


def evaluate_only(cfg: DictConfig, run_dir: Path) -> dict:
    """`runner.only_eval`: the starting policy's final evaluation (summary.json, episodes.jsonl,
    eval_chain.md for chained envs) and its success table as JSON and Markdown (eval.json, eval.md)."""
    if not cfg.policy.get("model_path"):
        raise ValueError("runner.only_eval needs policy.model_path (or demos.bootstrap: true)")
    summary = EvaluationService(cfg, run_dir).final(starting_policy(cfg))
    write_report(
        success_table(summary["eval_success"], groups=task_groups(cfg.env.name)),
        run_dir,
        name="eval",
        title=f"Evaluation of {cfg.policy.model_path}",
    )
    write_summary(run_dir, summary)
    return summary


def metrics_ports(base: int, num_actors: int, num_inference: int = 1) -> dict[str, int]:
    """Local mode's metrics ports: learner `base`, inference `base+1`, actor i `base+2+i`, then any
    further inference servers (inference1, ...); all 0 when base is 0."""
    names = [
        "learner",
        "inference",
        *(f"actor{i}" for i in range(num_actors)),
        *(f"inference{j}" for j in range(1, num_inference)),
    ]
    if base and base + len(names) - 1 > 65535:
        raise ValueError(f"metrics ports {base}..{base + len(names) - 1} do not fit below 65536")
    return {name: base + i if base else 0 for i, name in enumerate(names)}


def _render_device(plan: PlacementPlan | None, index: int) -> dict[str, str] | None:
    """MuJoCo's EGL renderer of actor `index` on its placed GPU (nothing to choose on CPU)."""
    if plan is None or plan.device_kind != "cuda":
        return None
    return {"MUJOCO_EGL_DEVICE_ID": str(plan.actors[index % len(plan.actors)])}


def _metrics_flags(ports: dict[str, int], name: str, host: str) -> list[str]:
    return ["--metrics-port", str(ports[name]), "--metrics-host", host]


def main(args: Namespace) -> int:
    """`rlfleet train RECIPE [overrides]`: the whole run on this host, then its tables."""
    cfg = load_config(args.recipe, args.overrides + (["runner.resume=true"] if args.resume else []))
    os.environ["RLFLEET_LOG_FORMAT"] = args.log_format  # the roles it spawns log the same way
    os.environ["RLFLEET_COMMAND"] = args.command_line  # the learner records it in each checkpoint
    try:
        summary = train_local(cfg, metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    except KeyboardInterrupt:  # the roles are stopped (the learner checkpointed): say where things are
        print(interrupted_line(Path(cfg.runner.logger.log_path)), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    print_summary(summary)
    print(f"run folder: {cfg.runner.logger.log_path}")
    return 0


def interrupted_line(run_dir: Path) -> str:
    """What an interrupted run leaves: its last checkpoint (what `--resume` continues from)."""
    latest = run_dir / "checkpoints" / "latest"
    if latest.is_file():
        return f"interrupted; last checkpoint: {run_dir / 'checkpoints' / latest.read_text().strip()}"
    return f"interrupted; no checkpoint was written (run folder: {run_dir})"


def train_local(cfg: DictConfig, metrics_port: int = 0, metrics_host: str = "127.0.0.1") -> dict:
    """Bootstrap an SFT checkpoint if the recipe asks for one, then run the fleet on this host
    (or DAgger in this process); writes the before/after tables when the starting policy was evaluated."""
    run_dir = Path(cfg.runner.logger.log_path)
    plan = resolve_placement(cfg)  # a bad placement fails now, before the bootstrap or any process
    for key, value in pinned_settings(policy_settings(cfg)).items():  # every process reads the same revision
        cfg.policy[key] = value
    if needs_bootstrap(cfg):
        cfg.policy.model_path = str(ensure_sft_checkpoint(cfg))
    if cfg.policy.get("model_path"):  # every process of the run reads the same Hub revision
        cfg.policy.model_path = starting_checkpoint(cfg.policy.model_path, run_dir, cfg.runner.resume)
    if cfg.runner.only_eval:
        return evaluate_only(cfg, run_dir)
    if cfg.dagger.enabled:  # imitation with the scripted experts, in this process (no fleet)
        summary = run_dagger(cfg)
    else:
        summary = _train_fleet(cfg, run_dir, plan, metrics_port, metrics_host)
    write_before_after(run_dir, summary, cfg.runner.experiment_name, cfg.env.name, cfg.eval.episodes_per_task)
    return summary


def _train_fleet(
    cfg: DictConfig, run_dir: Path, plan: PlacementPlan | None, metrics_port: int, metrics_host: str
) -> dict:
    if plan is not None:
        print(plan.describe(), file=sys.stderr, flush=True)
        cfg.actor.num_actors = plan.num_actors
    if not cfg.runner.resume:  # an earlier run's start and outputs, before this run writes its own start
        archive_previous_run(run_dir, (*RUN_OUTPUTS, *START_OUTPUTS))
    if cfg.eval.before:  # kept in the run folder, where the learner's evaluation service reads it
        EvaluationService(cfg, run_dir).before(lambda: starting_policy(cfg))
    ports = metrics_ports(metrics_port, cfg.actor.num_actors, plan.num_inference_servers if plan else 1)
    return _run_fleet(cfg, run_dir, ports, metrics_host, plan)


def _supervise(learner: subprocess.Popen, supervisor: ActorSupervisor, every_s: float = 0.5) -> None:
    """Until the learner exits: restart crashed actors (see rlfleet.runs.supervisor)."""
    while True:
        try:
            learner.wait(timeout=every_s)
            return
        except subprocess.TimeoutExpired:
            supervisor.poll()
            if supervisor.procs and len(supervisor.given_up) == len(supervisor.procs):
                learner.send_signal(signal.SIGINT)  # no data will come: checkpoint and stop
                learner.wait()
                last = "; ".join(f"actor {i}: {c}" for i, c in sorted(supervisor.causes.items()) if c)
                raise FleetError(
                    "every actor crashed more often than actor.max_restarts allows"
                    + (f" ({last})" if last else "")
                    + "; see the run folder's logs/actor*.log"
                ) from None


def _run_fleet(
    cfg: DictConfig, run_dir: Path, ports: dict[str, int], metrics_host: str, plan: PlacementPlan | None = None
) -> dict:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    cfg_file = run_dir / "launch_config.yaml"
    cfg_file.write_text(to_yaml(_child_config(cfg, plan)))
    addr_dir = run_dir / "addresses"
    addr_dir.mkdir(exist_ok=True)
    for old in addr_dir.glob("*.json"):
        old.unlink()
    logs = run_dir / "logs"
    if any(ports.values()):  # where to point Prometheus (a static scrape config)
        (addr_dir / "metrics.json").write_text(json.dumps({k: f"{metrics_host}:{p}" for k, p in ports.items()}))

    learner_launcher, learner_env = _learner_launcher(plan)
    learner = _spawn(
        [
            str(cfg_file),
            "--address-file",
            str(addr_dir / "learner.json"),
            *_metrics_flags(ports, "learner", metrics_host),
        ],
        extra_env=learner_env,
        launcher=learner_launcher,
    )  # console: progress
    children = [learner]
    supervisor: ActorSupervisor | None = None
    try:
        learner_addr = _wait_address(addr_dir / "learner.json", learner, "learner")
        inference_addrs = []
        for j, device in enumerate(plan.inference if plan else [None]):
            name = "inference" if j == 0 else f"inference{j}"
            placed = (
                [] if device is None else ["--device", plan.device_name(0 if plan.device_kind == "cuda" else device)]
            )
            if device is not None and plan.device_kind == "cuda" and plan.shares_device(device):
                placed += ["--offload-idle-s", "1.0"]  # the learner on this device needs the memory
            inference = _spawn(
                [
                    "inference",
                    "--learner",
                    learner_addr,
                    "--address-file",
                    str(addr_dir / f"{name}.json"),
                    *placed,
                    *_metrics_flags({name: ports.get(name, 0)}, name, metrics_host),
                ],
                logs / f"{name}.log",
                extra_env=plan.visible_devices(device) if plan else None,
            )
            children.append(inference)
            inference_addrs.append(
                _wait_address(addr_dir / f"{name}.json", inference, "inference", log_file=logs / f"{name}.log")
            )
        supervisor = ActorSupervisor(  # a stable id per index: the run's per-actor counts survive restarts
            lambda i: _spawn(
                [
                    "actor",
                    "--learner",
                    learner_addr,
                    "--inference",
                    _inference_addresses(inference_addrs, i),
                    "--index",
                    str(i),
                    "--id",
                    f"actor{i}",
                    *_metrics_flags(ports, f"actor{i}", metrics_host),
                ],
                logs / f"actor{i}.log",  # ledgers: a killed actor's losses are still counted
                extra_env={**(_render_device(plan, i) or {}), LEDGER_DIR_VAR: str(run_dir / "ledgers")},
            ),
            cfg.actor.num_actors,
            RestartPolicy(
                cfg.actor.max_restarts, cfg.actor.restart_backoff_s, refill_s=cfg.actor.get("restart_refill_s", 600.0)
            ),
            run_dir / "pids",
            log_file=lambda i: logs / f"actor{i}.log",
        )
        _supervise(learner, supervisor)
    except KeyboardInterrupt:
        print("\nstopping: the learner writes a checkpoint before it exits", file=sys.stderr)
        learner.send_signal(signal.SIGINT)
        try:
            learner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            learner.kill()
        raise  # after the roles are stopped (finally): `rlfleet train` says where the checkpoint is
    finally:
        _stop_all(children + (supervisor.current() if supervisor else []), grace=15.0)
    summary = read_summary(run_dir)  # the learner wrote it, with the start's evaluation
    if learner.returncode != 0 and summary is None:
        raise FleetError(f"learner exited with code {learner.returncode}; see the output above")
    return summary or {}
