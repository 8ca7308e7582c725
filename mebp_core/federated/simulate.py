"""A federated fleet simulated in one process, for the benchmark: the service's splits, round
draws and aggregation, each device's local steps a normal ``train`` with the configuration
the planner picks for that device's budget, and every device's time taken from its device
model (``mebp_core.plan.devices``), so rounds have a simulated on-device wall-clock.

Reported beside FedAvg and FFA: each device training alone on its own shard for as many
steps (local-only), one run on the union of the shards with the same total example count
(centralized), and MeZO fleets given the same simulated wall-clock as MeBP's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mebp_core.bench.corpus import collect_module_docstrings, split_corpus, take_prefix
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.federated.aggregate import Update, aggregate
from mebp_core.federated.rounds import participants, reference_steps
from mebp_core.federated.split import Row, SplitSpec, split_rows
from mebp_core.lora.peft_io import load_peft_adapter, save_peft_adapter

# 3 of 8 at 512 MB, the rest 768 MB to 1.5 GB
DEVICES = ("iphone-13", "iphone-se-3", "android-4gb", "iphone-15", "pixel-8",
           "iphone-15-pro-max", "pixel-8-pro", "galaxy-s24-ultra")
Log = Callable[[str], None]


@dataclass(frozen=True)
class FederatedSpec:
    model: str = "preset:tiny"
    devices: tuple[str, ...] = DEVICES
    rounds: int = 6
    local_steps: int = 8
    seq_len: int = 128
    optimizer: str = "adamw"
    lr: float = 1e-3
    mezo_lr: float = 1e-3
    mezo_eps: float = 1e-3
    seed: int = 0
    max_corpus_files: int | None = 400
    validation_fraction: float = 0.05
    validation_chars: int = 16384
    threads: int | None = None


@dataclass
class Device:
    profile: str
    shard: Path
    examples: int
    knobs: EngineKnobs
    configuration: str
    mebp_step_s: float  # estimated on the device
    mezo_step_s: float
    budget_mb: float


@dataclass
class FleetRun:
    label: str
    method: str
    aggregation: str
    rounds: list[dict] = field(default_factory=list)  # index, eval_loss, simulated_wall_s


def write_corpus(spec: FederatedSpec, out: Path) -> tuple[list[Row], Path, dict]:
    """Training rows labelled with their top-level stdlib package, and the held-out file."""
    texts = collect_module_docstrings(max_files=spec.max_corpus_files)
    train_texts, held_out = split_corpus([t for _, t in texts], spec.validation_fraction)
    held_out = take_prefix(held_out, spec.validation_chars)
    package = {text: module.split(".")[0] for module, text in texts}
    rows = [Row(i + 1, json.dumps({"text": t, "package": package[t]}).encode())
            for i, t in enumerate(train_texts)]
    out.mkdir(parents=True, exist_ok=True)
    validation = out / "held-out.jsonl"
    validation.write_text("".join(json.dumps({"text": t}) + "\n" for t in held_out))
    return rows, validation, {"docstrings": len(texts), "train": len(rows),
                              "held_out": len(held_out),
                              "packages": len(set(package.values()))}


def write_rows(rows: list[Row], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(row.text + b"\n" for row in rows))
    return path


def plan_devices(spec: FederatedSpec, shards: list[Path], counts: list[int]) -> list[Device]:
    """Each device's configuration: the fastest the planner predicts fits its budget."""
    from mebp_core.plan.arch import load_architecture
    from mebp_core.plan.devices import get_device
    from mebp_core.plan.on_host import chosen_entry, plan_on_host
    from mebp_core.units import MB

    arch = load_architecture(spec.model)
    config = TrainConfig(seq_len=spec.seq_len, knobs=EngineKnobs(threads=spec.threads))
    devices = []
    for profile, shard, examples in zip(spec.devices, shards, counts, strict=True):
        device = get_device(profile)
        plan = plan_on_host(arch, config, budget_bytes=int(device.budget_mb * MB),
                            device=device)
        chosen = chosen_entry(plan)
        devices.append(Device(profile, shard, examples, chosen.knobs.model_copy(
            update={"threads": spec.threads}), chosen.id, chosen.device_step_time_s,
            plan.device_mezo_step_time_s(), device.budget_mb))
    return devices


def local_config(spec: FederatedSpec, device: Device, method: str, steps: int,
                 freeze_a: bool) -> TrainConfig:
    mezo = method == "mezo"
    return TrainConfig(method=method, steps=steps, seq_len=spec.seq_len, seed=spec.seed,
                       optimizer="sgd" if mezo else spec.optimizer,
                       lr=spec.mezo_lr if mezo else spec.lr, mezo_eps=spec.mezo_eps,
                       lora_freeze_a=freeze_a, knobs=device.knobs)


def train_local(config: TrainConfig, model_dir: Path, data: Path, out: Path,
                init_adapter: Path | None) -> Path:
    from mebp_core.engine.memory import track_memory
    from mebp_core.engine.train import train

    with track_memory() as memory:
        train(config, model_dir=model_dir, data=data, out=out, memory=memory,
              init_adapter=init_adapter)
    return out


def held_out_loss(spec: FederatedSpec, model_dir: Path, validation: Path,
                  adapter: Path | None) -> float:
    from mebp_core.engine.evaluate import evaluate_dataset

    return evaluate_dataset(model_dir, validation, adapter=adapter,
                            seq_len=spec.seq_len)["loss"]


def run_fleet(spec: FederatedSpec, devices: list[Device], model_dir: Path, validation: Path,
              work: Path, *, method: str, aggregation: str, log: Log) -> FleetRun:
    """``spec.rounds`` rounds of every device's local steps from the global adapter; MeZO
    devices run as many steps as fit MeBP's simulated time on that device."""
    run = FleetRun(f"{method} {aggregation}", method, aggregation)
    global_adapter = None
    for index in range(spec.rounds):
        updates, times = [], []
        for member in participants(len(devices), 1.0, spec.seed, index):
            device = devices[member]
            budget_s = spec.local_steps * device.mebp_step_s
            steps = spec.local_steps if method == "mebp" else \
                max(1, math.floor(budget_s / device.mezo_step_s))
            config = local_config(spec, device, method, steps, aggregation == "ffa")
            out = train_local(config, model_dir, device.shard,
                              work / run.label.replace(" ", "-") / f"round-{index}" / str(member),
                              global_adapter)
            updates.append(Update(device.profile, load_peft_adapter(out)[1], device.examples))
            times.append(steps * (device.mebp_step_s if method == "mebp"
                                  else device.mezo_step_s))
        lora_spec, _ = load_peft_adapter(out)
        global_adapter = save_peft_adapter(
            work / run.label.replace(" ", "-") / f"round-{index}" / "global",
            aggregate(updates, aggregation), lora_spec, base_model_name_or_path=None)
        loss = held_out_loss(spec, model_dir, validation, global_adapter)
        run.rounds.append({"index": index, "eval_loss": loss, "simulated_wall_s": max(times)})
        log(f"{run.label}: round {index}: held-out loss {loss:.4f}, "
            f"{max(times):.1f} s simulated")
    return run


def run_federated(spec: FederatedSpec, work: Path, log: Log = print) -> dict:
    """The whole comparison; the report as a dict."""
    import torch

    from mebp_core.store.resolve import resolve_model

    if spec.threads:
        torch.set_num_threads(spec.threads)
    rows, validation, corpus = write_corpus(spec, work / "corpus")
    shards = split_rows(rows, len(spec.devices), SplitSpec("by_field", "package"), spec.seed)
    paths = [write_rows(shard, work / "shards" / f"{i}.jsonl") for i, shard in enumerate(shards)]
    devices = plan_devices(spec, paths, [len(shard) for shard in shards])
    model_dir = resolve_model(spec.model)
    initial = held_out_loss(spec, model_dir, validation, None)
    log(f"corpus: {corpus}; initial held-out loss {initial:.4f}")
    fleets = [run_fleet(spec, devices, model_dir, validation, work, method=method,
                        aggregation=aggregation, log=log)
              for method, aggregation in (("mebp", "fedavg"), ("mebp", "ffa"),
                                          ("mezo", "fedavg"))]
    total_steps, central_steps = reference_steps(len(devices), 1.0, spec.rounds,
                                                 spec.local_steps)
    local = []
    for member, device in enumerate(devices):  # each device alone, as many steps
        config = local_config(spec, device, "mebp", total_steps, False)
        out = train_local(config, model_dir, device.shard, work / "local" / str(member), None)
        local.append(held_out_loss(spec, model_dir, validation, out))
        log(f"local-only {device.profile}: held-out loss {local[-1]:.4f}")
    union = write_rows(rows, work / "union.jsonl")
    central = train_local(TrainConfig(steps=central_steps, seq_len=spec.seq_len,
                                      seed=spec.seed, optimizer=spec.optimizer, lr=spec.lr,
                                      knobs=EngineKnobs(threads=spec.threads)),
                          model_dir, union, work / "central", None)
    centralized = held_out_loss(spec, model_dir, validation, central)
    log(f"centralized ({central_steps} steps on the union): held-out loss {centralized:.4f}")
    return {"spec": asdict(spec), "corpus": corpus, "initial_loss": initial,
            "devices": [{**asdict(d), "shard": str(d.shard), "knobs": d.knobs.model_dump()}
                        for d in devices],
            "fleets": [asdict(f) for f in fleets], "local_only": local,
            "local_only_mean": sum(local) / len(local), "centralized": centralized,
            "centralized_steps": central_steps}


def plot_federated(report: dict, png: Path) -> Path:
    """Held-out loss of each fleet's global adapter against simulated on-device time, with
    the local-only mean and centralized training as references."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (by_round, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for fleet in report["fleets"]:
        losses = [report["initial_loss"]] + [r["eval_loss"] for r in fleet["rounds"]]
        clock = [0.0]
        for r in fleet["rounds"]:
            clock.append(clock[-1] + r["simulated_wall_s"])
        by_round.plot(range(len(losses)), losses, marker=".", label=fleet["label"])
        by_time.plot(clock, losses, marker=".", label=fleet["label"])
    for axis in (by_round, by_time):
        axis.axhline(report["local_only_mean"], color="gray", linestyle=":",
                     label="local-only (mean of devices)")
        axis.axhline(report["centralized"], color="black", linestyle="--",
                     label="centralized, same examples")
        axis.set_ylabel("held-out loss (nats/token)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    by_round.set_xlabel("round")
    by_time.set_xlabel("simulated on-device wall-clock (s)")
    spec = report["spec"]
    figure.suptitle(f"{spec['model']}, stdlib docstrings by package across "
                    f"{len(spec['devices'])} phones, {spec['local_steps']} local steps a round")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png
