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


def gaps_before(prof, top: int = 12, steps: int = 1) -> dict | None:
    """Where a profiled run's device sat idle: the device events in start order, and for each kernel
    name the idle microseconds between the end of the event before it and its own start (summed
    over the run, with its launch count), largest first, and the idle total. Overlapping events
    count no gap. None when this torch's profiler exposes no device events. Why: a step longer
    than its device time is either launch gaps spread evenly (every node pays the same) or a few
    nodes that wait (a host node, a memset, a graph's join): the two call for different fixes."""
    from torch.autograd import DeviceType

    try:
        ev = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == DeviceType.CUDA), key=lambda t: t[0])
    except (AttributeError, TypeError):
        return None
    by: dict[str, list] = {}
    idle, last_end = 0.0, None
    for start, end, name in ev:
        gap = 0.0 if last_end is None else max(0.0, start - last_end)
        idle += gap
        row = by.setdefault(name, [0.0, 0])
        row[0] += gap
        row[1] += 1
        last_end = end if last_end is None else max(last_end, end)
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])[:top]
    # `steps` > 1: the run was that many steps; every figure is per step
    return {"idle_us": round(idle / steps, 1), "events": len(ev) // steps,
            "by_kernel": [{"kernel": k[:160], "idle_before_us": round(g / steps, 2), "launches": n // steps}
                          for k, (g, n) in rows]}
