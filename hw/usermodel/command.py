"""`python -m hw profile MODEL`: time a user's model layer by layer on this GPU and write a profiled model file,
which `parsim predict/sweep/plan --model FILE` price and `hw measure/validate` run (parsim.workload.timed)."""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from hw.calibrate.fit import fit_affine, weight_grad_s
from hw.measure.steps import DTYPES
from hw.run.ranks import require_gpus
from hw.usermodel.sources import SPECS, Layers, loss_of, source_of, timed_batch, user_layers
from hw.usermodel.timing import LayerTimes, time_layers
from parsim import flags
from parsim.errors import ModelError, ParsimError
from parsim.files import check_output, json_text, write_atomic
from parsim.profile import OpCost
from parsim.workload.timed import Source

SIZES = (1, 2, 4, 8)  # micro-batch sizes timed by default (those up to the batch)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help=SPECS)
    p.add_argument("--seq-len", type=flags.whole(1, 1 << 20), default=0, metavar="N",
                   help="tokens per sequence (a Hugging Face model's; required there)")
    p.add_argument("--layers", type=flags.whole(1, 100_000), default=0, metavar="N",
                   help="a Hugging Face model's decoder layers, if fewer than its config's (a model scaled down)")
    p.add_argument("--image-size", type=flags.whole(1, 1 << 14), default=0, metavar="S",
                   help="a vision model's input side (default 224; a timm model's default input size)")
    p.add_argument("--batch", type=flags.whole(1, 1 << 24), default=32, metavar="N",
                   help="samples per training step (sequences, images): the model file's batch (default 32)")
    p.add_argument("--microbatch-sizes", type=flags.whole_list(1, 1 << 24), metavar="N,...",
                   help=f"samples per micro-batch to time (default {','.join(map(str, SIZES))}, those up to "
                        "--batch); parsim interpolates between them and extrapolates the fit beyond")
    p.add_argument("--repeat", type=flags.whole(1, 1000), default=5, help="timed passes per size (default 5)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--out", type=flags.path, default="model.json", metavar="FILE",
                   help="the profiled model file to write (default model.json)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--cpu", action="store_true", help="time on the CPU (for tests: the costs are the CPU's)")


@dataclass
class Group:
    """Consecutive layers alike (class, parameter shapes, input and output): timed together, written once."""

    name: str
    count: int
    module: nn.Module
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    out_bytes: int  # per sample
    rows: list[list[LayerTimes]]  # per micro-batch size, per layer of the group


def _signature(module: nn.Module, in_shape: tuple, out_shape: tuple) -> tuple:
    return (type(module).__name__, tuple((n, tuple(p.shape)) for n, p in module.named_parameters()), in_shape,
            out_shape)


def shapes(layers: Layers, device: torch.device, dtype: torch.dtype) -> list[tuple[tuple, tuple, int]]:
    """Each layer's input and output per sample, and its output's bytes per sample, from one sample run through
    them all: a layer that does not take what the one before gives is refused here, in one line."""
    h = layers.sample.to(device) if not layers.sample.is_floating_point() else layers.sample.to(device, dtype)
    out = []
    with torch.no_grad():
        for name, module in layers.named:
            before = tuple(h.shape[1:])
            try:
                h = module(h)
            except Exception as e:  # the user's code: any error it raises is theirs to read
                raise ModelError(f"{layers.source.model}: layer {name} ({type(module).__name__}) cannot take the "
                                 f"output of the one before ({e.__class__.__name__}: {str(e).splitlines()[0]})"
                                 ) from None
            if not isinstance(h, torch.Tensor):
                raise ModelError(f"{layers.source.model}: layer {name} returns {type(h).__name__}, not one tensor: "
                                 "a pipeline's layers pass one tensor on")
            out.append((before, tuple(h.shape[1:]), h[:1].numel() * h.element_size()))
    return out


def groups_of(layers: Layers, per_layer: list[tuple[tuple, tuple, int]]) -> list[Group]:
    """Runs of consecutive alike layers."""
    out: list[Group] = []
    for (name, module), (i, o, b) in zip(layers.named, per_layer):
        last = out[-1] if out else None
        if last is not None and _signature(last.module, last.in_shape, last.out_shape) == _signature(module, i, o):
            last.count += 1
        else:
            out.append(Group(name, 1, module, i, o, b, []))
    return out


def _fit(samples: list[int], seconds: list[float], host_s: float) -> OpCost:
    """GPU time against samples: the affine fit, and the measured over it at each size timed (its corrections)."""
    fit = fit_affine(samples, seconds)
    corrections = tuple((float(n), t / (fit.fixed_s + n / fit.rate)) for n, t in zip(samples, seconds))
    return OpCost(host_s, fit.fixed_s, fit.rate, corrections if len(samples) > 2 else ())


def _mean(rows: list[LayerTimes], key: str) -> float:
    return sum(getattr(r, key) for r in rows) / len(rows)


def group_entry(group: Group, sizes: list[int], dtype_bytes: int) -> dict:
    """A group's entry in the model file: its costs (fitted over the sizes timed), bytes per sample, raw times."""
    at = [[group.rows[k][j] for j in range(group.count)] for k in range(len(sizes))]  # per size, the group's layers

    def per(key: str) -> list[float]:
        return [_mean(rows, key) for rows in at]

    fwd, inp, full = per("forward_s"), per("backward_input_s"), per("backward_s")
    host_f, host_b = per("host_forward_s"), per("host_backward_s")
    floor = 1e-9  # a layer nothing flows back through (the first) has no input-gradient work: its fit is moot
    costs = {"forward": _fit(sizes, fwd, min(host_f)),
             "backward_input": _fit(sizes, [max(t, floor) for t in inp], min(host_b)),
             "backward_weight": _fit(sizes, [weight_grad_s(b, i) for b, i in zip(full, inp)], 0.0)}
    largest = at[-1]
    n = sizes[-1]
    return {
        "name": group.name, "count": group.count, "in_shape": list(group.in_shape), "out_shape": list(group.out_shape),
        "params": sum(p.numel() for p in group.module.parameters()), "dtype_bytes": dtype_bytes,
        "out_bytes_per_token": group.out_bytes,
        "stash_bytes_per_token": round(_mean(largest, "stash_bytes") / n),
        "forward_workspace_bytes_per_token": round(_mean(largest, "forward_workspace_bytes") / n),
        "backward_workspace_bytes_per_token": round(_mean(largest, "backward_workspace_bytes") / n),
        "flops_per_token": _mean(largest, "flops") / n,
        "saved_tensors": round(_mean(largest, "saved_tensors")),
        "costs": {op: asdict(c) for op, c in costs.items()},
        "measured": {"samples": sizes, "forward_s": fwd, "backward_input_s": inp, "backward_s": full,
                     "host_forward_s": host_f, "host_backward_s": host_b},
    }


def _sizes(args: argparse.Namespace) -> list[int]:
    sizes = sorted(set(args.microbatch_sizes or [n for n in SIZES if n <= args.batch]))
    if len(sizes) < 2:
        raise ParsimError("time at least two micro-batch sizes (--microbatch-sizes, or a --batch of 2 or more): "
                          "a layer's cost is fitted against its samples")
    return sizes


def main(args: argparse.Namespace) -> int:
    out = check_output(args.out, "--out")
    if out.exists() and not args.force:
        raise ParsimError(f"{out} exists; pass --force to overwrite it")
    sizes = _sizes(args)
    if max(sizes) > args.batch or any(args.batch % n for n in sizes):
        raise ParsimError(f"micro-batch sizes {','.join(map(str, sizes))} must divide --batch {args.batch}")
    require_gpus(1, cpu=args.cpu)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = DTYPES[args.dtype or ("fp32" if args.cpu else "bf16")]
    start = time.perf_counter()
    layers = user_layers(source_of(args.model, args.seq_len, args.layers, args.image_size), device=device)
    for _, module in layers.named:
        module.to(device, dtype).train()
    per_layer = shapes(layers, device, dtype)
    print(f"hw profile: {layers.source.model} built, {len(layers.named)} layers ({time.perf_counter() - start:.1f} s)",
          file=sys.stderr)
    groups = groups_of(layers, per_layer)
    modules = [m for _, m in layers.named]
    for k, n in enumerate(sizes):
        x, y = timed_batch(layers.source, per_layer[0][0], per_layer[-1][1], n, torch.Generator().manual_seed(k + 1),
                           device, dtype)
        try:
            times = time_layers(modules, x, y, loss_of(layers.source), device, args.repeat)
        except torch.cuda.OutOfMemoryError:
            raise ParsimError(f"{n} samples per micro-batch do not fit on this GPU with the whole model; time smaller "
                              "--microbatch-sizes (parsim extrapolates the fit beyond them)") from None
        i = 0
        for group in groups:
            group.rows.append(times[i:i + group.count])
            i += group.count
        print(f"hw profile: {n} samples per micro-batch timed ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    source = {f.name: getattr(layers.source, f.name) for f in fields(Source) if f.name not in ("file", "timed_on")}
    source["dtype"] = str(dtype).removeprefix("torch.")
    elapsed = time.perf_counter() - start
    doc = {"profiled": _provenance(args, sizes, device, elapsed), "source": source, "samples": args.batch,
           "layers": [group_entry(g, sizes, torch.finfo(dtype).bits // 8) for g in groups]}
    write_atomic(out, json_text(doc, indent=1) + "\n", "--out")
    print(f"wrote {out}: {len(modules)} layers in {len(groups)} kinds, timed at {len(sizes)} micro-batch sizes in "
          f"{elapsed:.1f} s on {doc['profiled']['gpu']}")
    return 0


def _provenance(args: argparse.Namespace, sizes: list[int], device: torch.device, elapsed: float) -> dict:
    """Where and how the file was made."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'})"
    hf, timm = (getattr(sys.modules.get(name), "__version__", None) for name in ("transformers", "timm"))
    return {"command": "python -m hw profile " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["profile"]
                                                            else sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu, "torch": torch.__version__, "transformers": hf, "timm": timm,
            "python": platform.python_version(),
            "microbatch_sizes": sizes, "repeat": args.repeat, "seconds": round(elapsed, 1)}
