"""Hugging Face Hub: export a checkpoint as a Hub-ready model folder, and push it.

`rlfleet export CHECKPOINT OUT` writes model.safetensors, config.json, norm_stats.json,
training.json and a model card (README.md: the training command, source commit, metrics and eval
table); `rlfleet push CHECKPOINT ORG/NAME` uploads that folder. Loading is the other way round:
`policy.model_path=hf://ORG/NAME[@REVISION]` and `rlfleet eval hf://ORG/NAME` resolve through
huggingface_hub's cache (rlfleet.policies.checkpoint_io.resolve_model_path).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from rlfleet.policies.checkpoint_io import (
    checkpoint_folder,
    load_checkpoint,
    run_folder,
)
from rlfleet.policies.vla.normalization import get_norm_stats

TRAINING_INFO = "training.json"  # written by rlfleet.learner.checkpointer beside each checkpoint
NORM_STATS = "norm_stats.json"
_SUMMARY_METRICS = (
    "env_steps",
    "updates",
    "train_seconds",
    "throughput_env_steps_per_s",
    "train_success_once",
    "eval_success_mean",
    "eval_before_mean",
)


def _norm_stats(checkpoint: Path) -> dict[str, Any] | None:
    """norm_stats.json of the checkpoint, or the statistics read out of its weights: VLA q01/q99,
    or the MLP's running observation mean and standard deviation."""
    if (checkpoint / NORM_STATS).exists():
        return json.loads((checkpoint / NORM_STATS).read_text())
    policy, cfg = load_checkpoint(checkpoint)
    try:
        return {cfg["policy"].get("unnorm_key", "default"): get_norm_stats(policy)}
    except (TypeError, ValueError, LookupError):
        pass  # no VLA normaliser in this policy
    state = policy.state_dict()
    stats = {
        name[: -len(".mean")]: {
            "mean": state[name].tolist(),
            "std": state[name[: -len("mean")] + "var"].sqrt().tolist(),
        }
        for name in state
        if name.endswith(".mean") and name[: -len("mean")] + "var" in state
    }
    return {"observation": stats} if stats else None


def model_card(
    config: Mapping[str, Any],
    info: Mapping[str, Any],
    summary: Mapping[str, Any],
    eval_md: str | None,
    repo_id: str | None = None,
) -> str:
    """README.md of an exported checkpoint (Hub model-card metadata first)."""
    policy = config.get("policy", {}).get("name", "policy")
    env = config.get("env", {}) or {}
    tags = ["rlfleet", "reinforcement-learning", "robotics", *(t for t in (env.get("name"), policy) if t)]
    name = repo_id or "ORG/NAME"
    lines = [
        "---",
        "library_name: rlfleet",
        "tags:",
        *(f"- {t}" for t in dict.fromkeys(tags)),
        "---",
        "",
        f"# {name}",
        "",
        f"A `{policy}` policy fine-tuned with [rlfleet](https://pypi.org/project/rlfleet/) on "
        f"`{env.get('name', '?')}` (task `{env.get('task', '?')}`).",
        "",
        "## Use",
        "",
        "```bash",
        f"rlfleet eval hf://{name} --episodes 10",
        f"rlfleet train RECIPE policy.model_path=hf://{name}",
        "```",
        "",
        "## Training",
        "",
    ]
    if info.get("command"):
        lines += ["```bash", str(info["command"]), "```", ""]
    facts = {
        "source commit": info.get("commit"),
        "rlfleet version": info.get("rlfleet_version"),
        **{k: v for k, v in (info.get("counters") or {}).items()},
    }
    lines += [f"- {k}: `{v}`" for k, v in facts.items() if v is not None]
    if config.get("averaged_from"):  # rlfleet average: the counters above are its newest checkpoint's
        sources = ", ".join(f"`{s}`" for s in config["averaged_from"])
        lines += [f"- weights: the mean of the checkpoints {sources} (`rlfleet average`)"]
    metrics = {k: summary[k] for k in _SUMMARY_METRICS if summary.get(k) is not None}
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    if eval_md:
        lines += [
            "",
            "## Evaluation",
            "",
            "\n".join("###" + ln[1:] if ln.startswith("# ") else ln for ln in eval_md.strip().splitlines()),
        ]
    lines += [
        "",
        "## Files",
        "",
        "- `model.safetensors`: weights (with the observation/action normalisation buffers)",
        "- `config.json`: policy settings and env dimensions (what rebuilds the policy), and the"
        " evaluation `rlfleet eval` plays (the recipe's eval task, seed and episodes per task)",
        "- `norm_stats.json`: the normalisation statistics, readable",
        "- `training.json`: command, commit and counters of the training run",
        "",
    ]
    return "\n".join(lines)


EvalMarkdown = Callable[[Mapping[str, Any], Path, str], "str | None"]
"""(run summary, checkpoint folder, env name) -> the model card's evaluation section, or None."""


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    repo_id: str | None = None,
    eval_markdown: EvalMarkdown | None = None,
    merge_adapters: bool = False,
) -> Path:
    """Write a Hub-ready folder for `checkpoint` (a checkpoint folder, run folder or hf:// path) into
    `out`. `eval_markdown` writes the card's evaluation section (the CLI passes
    `rlfleet.eval.report.checkpoint_eval_markdown`; policies sit below the eval layer).

    A policy on a pretrained backbone exports its adapters and heads, with the backbone's id and
    revision in config.json; `merge_adapters` instead folds the adapters into the backbone and
    writes it whole under `backbone/` (the policy's `export_merged`)."""
    src = checkpoint_folder(checkpoint)
    out = Path(out)
    if out.resolve() == src.resolve():
        raise ValueError(f"export to {out}: choose another folder than the checkpoint itself")
    config = json.loads((src / "config.json").read_text())
    policy, _ = load_checkpoint(src)  # the weights must fit their config before anyone downloads them
    out.mkdir(parents=True, exist_ok=True)
    if merge_adapters:
        export_merged = getattr(policy, "export_merged", None)
        if export_merged is None:
            raise ValueError(f"{config['policy'].get('name')} policy has no adapters to merge (drop --merge-adapters)")
        settings, tensors = export_merged(out)
        config["policy"] = {**config["policy"], **settings}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, out / "model.safetensors")
        (out / "config.json").write_text(json.dumps(config, indent=2))
    else:
        shutil.copyfile(src / "model.safetensors", out / "model.safetensors")
        shutil.copyfile(src / "config.json", out / "config.json")
    norm = _norm_stats(src)
    if norm:
        (out / NORM_STATS).write_text(json.dumps(norm, indent=1, sort_keys=True))
    info = json.loads((src / TRAINING_INFO).read_text()) if (src / TRAINING_INFO).exists() else {}
    if info:
        (out / TRAINING_INFO).write_text(json.dumps(info, indent=2))
    summary = _run_summary(src)
    env_name = (config.get("env") or {}).get("name", "")
    eval_md = eval_markdown(summary, src, env_name) if eval_markdown else None
    (out / "README.md").write_text(model_card(config, info, summary, eval_md, repo_id))
    return out


def _run_summary(checkpoint: Path) -> dict[str, Any]:
    """The run's summary.json when `checkpoint` is the run's latest checkpoint, whose training and
    evaluation it describes; {} for an earlier checkpoint, an average of several or no run's."""
    run = run_folder(checkpoint)
    if run is None or not (run / "summary.json").exists():
        return {}
    latest = run / "checkpoints" / "latest"
    if not latest.exists() or latest.read_text().strip() != Path(checkpoint).resolve().name:
        return {}
    return json.loads((run / "summary.json").read_text())


def push_checkpoint(
    checkpoint: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    message: str | None = None,
    eval_markdown: EvalMarkdown | None = None,
    merge_adapters: bool = False,
) -> str:
    """Export `checkpoint` and upload it to the Hub model repo `repo_id` (created if missing); the
    token comes from HF_TOKEN or `hf auth login`. Returns the commit URL."""
    from huggingface_hub import HfApi  # only pushing needs the network client
    from huggingface_hub.errors import HfHubHTTPError  # the same

    api = HfApi()
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_checkpoint(
            checkpoint,
            Path(tmp) / "export",
            repo_id=repo_id,
            eval_markdown=eval_markdown,
            merge_adapters=merge_adapters,
        )
        try:
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            info = api.upload_folder(
                repo_id=repo_id,
                folder_path=str(folder),
                repo_type="model",
                revision=revision,
                commit_message=message or f"rlfleet export of {checkpoint}",
            )
        except (HfHubHTTPError, OSError, ConnectionError) as exc:  # no token, offline, no write access: one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"push to {repo_id} failed: {first}") from exc
    return str(getattr(info, "commit_url", info))
