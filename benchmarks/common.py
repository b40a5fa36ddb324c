"""What the benchmarks share: the device-time readings of a torch.profiler run, and what every
record ends with (the GPU it ran on, the document written and printed)."""

from __future__ import annotations

import json
from pathlib import Path


def finish(doc: dict, out: Path) -> None:
    """Add the GPU's name to `doc` (or why it is missing), write it to `out` and print it."""
    try:
        import torch

        doc["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 -- the record says why the name is missing
        doc["gpu"] = f"unknown ({exc})"
    Path(out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


def kernel_us(prof) -> float | None:
    """Sum of the device-side event durations a torch.profiler run recorded (kernels, copies,
    memsets), microseconds; None when this torch's profiler exposes neither form."""
    from torch.autograd import DeviceType

    try:
        return float(sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA))
    except (AttributeError, TypeError):
        pass
    try:
        return float(sum(e.self_device_time_total for e in prof.key_averages()))
    except (AttributeError, TypeError):
        return None


def per_kernel(prof) -> dict[str, float] | None:
    """kernel name -> device microseconds a torch.profiler run recorded for it (all its launches),
    None when this torch's profiler exposes no device events."""
    from torch.autograd import DeviceType

    out: dict[str, float] = {}
    try:
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us()
    except (AttributeError, TypeError):
        return None
    return out


def kernel_table(total: dict | None, base: dict | None, steps: int, top: int = 25) -> list | None:
    """The per-step kernel table: (name, us a step, launches unknown) rows, largest first, of
    `total` less `base` (a run with fewer steps) over `steps`."""
    if total is None:
        return None
    base = base or {}
    rows = [(k, (v - base.get(k, 0.0)) / steps) for k, v in total.items()]
    rows = sorted((r for r in rows if r[1] > 0.05), key=lambda r: -r[1])
    return [{"kernel": k[:160], "us_per_step": round(v, 2)} for k, v in rows[:top]]
