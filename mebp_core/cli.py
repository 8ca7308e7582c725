"""The ``mebp`` command: pack, train, eval, export, export-base, plan and bench. The service
adds its own commands (``serve``, ``db``) from ``app.cli``: the engine knows nothing of HTTP
or SQL."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pydantic import ValidationError

from mebp_core.allocator import loaded_allocator, reexec_under_engine_allocator
from mebp_core.errors import MebpError

# what eval shares with train: the model's storage and the batches' shape
_MODEL_FIELDS = ("quant", "group_size", "compute_dtype", "seq_len", "batch_size")


def _add_model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="a packed dir, a Hugging Face dir, or preset:NAME")


@dataclass(frozen=True)
class Command:
    """A subcommand another package adds: its help, its arguments and what runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def build_parser(extra: Mapping[str, Command] = MappingProxyType({})) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mebp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in extra.items():
        command.add_arguments(sub.add_parser(name, help=command.help))

    pack = sub.add_parser("pack", help="pack a model into the memory-mapped quantized format")
    pack.add_argument("src", help="a Hugging Face model directory or preset:NAME")
    pack.add_argument("out", type=Path)
    from mebp_core.config import TrainConfig
    from mebp_core.config_args import add_model_arguments

    add_model_arguments(pack, TrainConfig, include=("quant", "group_size"))

    train = sub.add_parser("train", help="fine-tune LoRA adapters")
    _add_model_option(train)
    train.add_argument("--data", type=Path, required=True)
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--init-adapter", type=Path)
    train.add_argument("--metrics", type=Path, help="write one JSON line per step here")
    train.add_argument("--validation-data", type=Path, help="a JSONL file to validate on")
    # one option per TrainConfig field, described by the field
    add_model_arguments(train.add_argument_group("training"), TrainConfig,
                        exclude=("schema_version", "knobs"))
    loop = train.add_argument_group("checkpoints")
    loop.add_argument("--checkpoint-dir", type=Path,
                      help="where checkpoints go (default: OUT.checkpoint)")
    loop.add_argument("--resume", action="store_true",
                      help="continue the run saved in the checkpoint directory")
    _add_knob_arguments(train.add_argument_group("memory/time trade-off knobs"))

    evaluate = sub.add_parser("eval", help="loss and next-token accuracy on a dataset")
    _add_model_option(evaluate)
    add_model_arguments(evaluate, TrainConfig, include=_MODEL_FIELDS)
    evaluate.add_argument("--data", type=Path, required=True)
    evaluate.add_argument("--adapter", type=Path)
    evaluate.add_argument("--json", action="store_true")

    export = sub.add_parser("export", help="export a PEFT adapter for an on-device runtime")
    export.add_argument("adapter", type=Path, help="a PEFT adapter directory")
    export.add_argument("out", type=Path)
    export.add_argument("--format", choices=["peft", "mlx", "gguf"], required=True)
    export.add_argument("--model", required=True,
                        help="the base model (packed dir, Hugging Face dir or preset:NAME)")

    from mebp_core.store.export_base_common import BASE_DTYPES, BASE_FORMATS, GGUF_QUANTS

    base = sub.add_parser("export-base", help="export the base model an adapter applies to: "
                          "the packed weights it was trained against")
    base.add_argument("model", help="a packed dir, a Hugging Face dir, or preset:NAME")
    base.add_argument("--format", choices=BASE_FORMATS, required=True,
                      help="hf and gguf: dequantized; mlx: the packed int4/int8 weights as "
                           "MLX quantized ones")
    base.add_argument("--out", type=Path,
                      help="default: the name adapters give their base, in the current "
                           "directory (a .gguf file for gguf)")
    base.add_argument("--dtype", choices=BASE_DTYPES, default="float32",
                      help="the weights' dtype (gguf: float32 or float16; mlx: the scales' "
                           "and biases', float32 exact)")
    base.add_argument("--gguf-quant", choices=GGUF_QUANTS,
                      help="gguf only: llama.cpp's blocks (q4_1: the int4 store exactly)")
    add_model_arguments(base, TrainConfig, include=("quant", "group_size"))

    from mebp_core.bench import add_bench_arguments

    add_bench_arguments(sub.add_parser(
        "bench", help="mebp, mezo, backprop and transformers + PEFT side by side, or "
                      "convergence against mezo"))

    from mebp_core.plan.command import add_plan_arguments

    add_plan_arguments(sub.add_parser(
        "plan", help="predict memory and time of every trade-off configuration"))
    return parser


def main(argv: list[str] | None = None,
         extra: Mapping[str, Command] = MappingProxyType({})) -> int:
    if argv is None and sys.argv[1:2] and sys.argv[1] in _ENGINE_COMMANDS:
        try:  # before the parser's imports (half a second), which the new process repeats
            reexec_under_engine_allocator()
        except MebpError as exc:
            return _fail(str(exc))
    args = build_parser(extra).parse_args(argv)
    run = extra[args.command].run if args.command in extra else _COMMANDS[args.command]
    try:
        return run(args)
    except ValidationError as exc:
        return _fail(_describe_validation(exc.errors()))
    except (MebpError, OSError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", code=130)


def _fail(message: str, code: int = 2) -> int:
    print(f"mebp: error: {message}", file=sys.stderr)
    return code


def _describe_validation(errors: list[dict]) -> str:
    """One clause per option: every config field has the option of the same name
    (lora_rank -> --lora-rank); a union's failed alternatives are joined with "or"."""
    from mebp_core.config import EngineKnobs, TrainConfig

    fields = set(TrainConfig.model_fields) | set(EngineKnobs.model_fields)
    by_option: dict[str, list[str]] = {}
    for err in errors:
        names = [str(part) for part in err["loc"] if str(part) in fields]
        option = f"--{names[-1].replace('_', '-')}: " if names else ""
        by_option.setdefault(option, []).append(err["msg"].removeprefix("Value error, "))
    return "; ".join(option + ", or ".join(messages) for option, messages in by_option.items())


def _run_pack(args: argparse.Namespace) -> int:
    from mebp_core.store.pack import pack_model

    out = pack_model(args.src, args.out, quant=args.quant, group_size=args.group_size,
                     progress=_show_progress)
    print(out)
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from mebp_core.engine.memory import track_memory
    from mebp_core.engine.stop import StopOnSignals
    from mebp_core.engine.train import train
    from mebp_core.store.resolve import resolve_model

    config = _train_config(args)
    if args.plan_budget_mb is not None:
        config = _planned(config, args)
    checkpoint_dir = args.checkpoint_dir or args.out.with_name(args.out.name + ".checkpoint")
    # A first use packs the model in a child process: not part of the training footprint.
    model_dir = resolve_model(args.model, quant=config.quant, group_size=config.group_size,
                              isolated=True)
    with track_memory() as memory, StopOnSignals() as stop:
        result = train(config, model_dir=model_dir, data=args.data, out=args.out,
                       memory=memory, init_adapter=args.init_adapter,
                       validation_data=args.validation_data, metrics_path=args.metrics,
                       checkpoint_dir=checkpoint_dir, resume=args.resume,
                       on_step=_print_step,
                       stop_requested=stop.is_set)
    print(json.dumps({"steps": result.steps, "final_loss": result.final_loss,
                      "adapter": str(result.adapter_dir), "peak_mb": result.peak_mb,
                      "peak_anon_mb": result.peak_anon_mb,
                      "footprint_mb": result.footprint_mb,
                      "memory_method": result.memory_method, "allocator": loaded_allocator(),
                      "interrupted": result.interrupted,
                      "skipped_rows": result.skipped_rows}))
    if result.interrupted:
        print(f"mebp: interrupted after step {result.steps}; checkpoint in "
              f"{result.checkpoint_dir}; continue with --resume", file=sys.stderr)
        return 128 + stop.signal_number
    return 0


def _planned(config, args: argparse.Namespace):
    """The config with the knobs the planner picks for ``--plan-budget-mb``."""
    from mebp_core.kernel_memory import memory_cgroup_of
    from mebp_core.plan.arch import PlanInputError, load_architecture
    from mebp_core.plan.on_host import (
        CalibrationUnavailableError,
        fastest_fitting,
        plan_on_host,
    )
    from mebp_core.plan.planner import knobs_id
    from mebp_core.units import MB

    # the calibration runs torch in a child: inside a memory cap it would count against it
    group = memory_cgroup_of()
    cap = None if group is None else group.limit_bytes()
    try:
        plan = plan_on_host(load_architecture(args.model), config,
                            budget_bytes=int(args.plan_budget_mb * MB),
                            measure=cap is None)
    except CalibrationUnavailableError:
        raise PlanInputError(
            f"--plan-budget-mb needs this host's calibration, which is not measured yet, and "
            f"measuring it here would run inside this process's memory cap of "
            f"{cap / MB:.0f} MB: run `mebp plan --model {args.model}` once outside the "
            f"cap first") from None
    config = fastest_fitting(plan, config)
    print(f"planner: {knobs_id(config.knobs, config.method)} (the fastest predicted to fit "
          f"{args.plan_budget_mb:.0f} MB)", file=sys.stderr)
    return config


def _train_config(args: argparse.Namespace):
    from mebp_core.config import EngineKnobs, TrainConfig
    from mebp_core.config_args import model_values

    return TrainConfig(**model_values(args, TrainConfig, exclude=("schema_version", "knobs")),
                       knobs=EngineKnobs(**model_values(args, EngineKnobs)))


def _add_knob_arguments(knobs) -> None:
    from mebp_core.config import EngineKnobs
    from mebp_core.config_args import add_model_arguments
    from mebp_core.plan.command import positive_float

    add_model_arguments(knobs, EngineKnobs)  # one option per field, described by the field
    knobs.add_argument("--plan-budget-mb", type=positive_float, metavar="MB",
                       help="let the planner pick the knobs: the fastest configuration "
                       "predicted to fit MB (overrides the knob options above)")


def _print_step(metrics) -> None:
    validation = "" if metrics.val_loss is None else f"  val_loss {metrics.val_loss:.4f}"
    print(f"step {metrics.step}: loss {metrics.loss:.4f}{validation}  lr {metrics.lr:.2e}  "
          f"{metrics.step_time_s:.2f}s  footprint {metrics.footprint_mb:.0f} MB",
          file=sys.stderr, flush=True)


def _run_eval(args: argparse.Namespace) -> int:
    from mebp_core.engine.evaluate import evaluate_dataset
    from mebp_core.store.resolve import resolve_model

    model_dir = resolve_model(args.model, quant=args.quant, group_size=args.group_size)
    report = evaluate_dataset(model_dir, args.data, adapter=args.adapter,
                              compute_dtype=args.compute_dtype, seq_len=args.seq_len,
                              batch_size=args.batch_size)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"loss {report['loss']:.4f}  token accuracy {report['token_accuracy']:.4f}  "
              f"tokens {report['tokens']}")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from mebp_core.lora.export import export_adapter
    from mebp_core.lora.peft_files import AdapterError
    from mebp_core.store.model_source import source_config

    config = source_config(args.model)
    try:
        print(export_adapter(args.adapter, args.format, args.out, base_config=config))
    except AdapterError as exc:
        message = str(exc)
        return _fail(message if str(args.adapter) in message else f"{args.adapter}: {message}")
    return 0


def _run_export_base(args: argparse.Namespace) -> int:
    from mebp_core.store.export_base import export_base
    from mebp_core.store.export_base_checks import check_base_format
    from mebp_core.store.export_base_common import base_model_name
    from mebp_core.store.model_source import source_config
    from mebp_core.store.resolve import resolve_model

    check_base_format(source_config(args.model), args.format, args.dtype, quant=args.quant,
                      group_size=args.group_size, gguf_quant=args.gguf_quant)  # before packing
    model_dir = resolve_model(args.model, quant=args.quant, group_size=args.group_size,
                              isolated=True)
    out = args.out
    if out is None:
        out = Path(base_model_name(model_dir) + (".gguf" if args.format == "gguf" else ""))
    print(export_base(model_dir, args.format, out, dtype=args.dtype,
                      gguf_quant=args.gguf_quant, progress=_show_progress))
    return 0


def _show_progress(done: int, total: int, name: str) -> None:
    print(f"\r[{done}/{total}] {name[:60]:<60}", end="\n" if done == total else "",
          file=sys.stderr, flush=True)


def _run_plan(args: argparse.Namespace) -> int:
    from mebp_core.plan.command import run_plan

    return run_plan(args)


def _run_bench(args: argparse.Namespace) -> int:
    from mebp_core.bench import run_bench

    return run_bench(args)


_COMMANDS = {"pack": _run_pack, "train": _run_train, "eval": _run_eval,
             "export": _run_export, "export-base": _run_export_base, "bench": _run_bench,
             "plan": _run_plan}
# the commands that run the engine in this process, and so start again under its allocator
_ENGINE_COMMANDS = ("train", "eval")

if __name__ == "__main__":
    sys.exit(main())
