"""A compare report for a terminal: one row per request, the steps that are not a plain match,
and the verdict in one line naming the first failing position. Reads at 80 columns."""

from __future__ import annotations


def report(doc: dict, console=None) -> None:
    """The report as a table per request, the steps that are not a plain match, and a verdict line."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{doc['manifest']} on kern vs {doc['engine']} ({doc['mode']}), teacher-forced",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
              caption="error: largest logit-difference error; margin: largest reference margin at an allowed "
                      "flip; greedy: free-running agreement")
    for col in ("req", "prompt", "new", "match", "flip", "wrong", "off", "error", "bound", "margin", "greedy"):
        t.add_column(col, justify="right", min_width=len(col))
    for r in doc["requests"]:
        c = r["counts"]
        agree = "" if r["agreement"] is None else f"{r['agreement']}/{r['new_tokens']}"
        fm = r["max_flip_margin"]
        t.add_row(str(r["request"]), str(r["prompt_tokens"]), str(r["new_tokens"]), str(c["match"]),
                  str(c["flip"]), str(c["wrong"]), str(c["off"]), f"{r['max_error']:.3f}", f"{r['max_bound']:.3f}",
                  "" if fm is None else f"{fm:.3f}", agree)
    con = console or Console()
    con.print(t)
    odd = [st for st in doc["steps"] if st["verdict"] != "match"]
    if odd:
        u = Table(title=f"steps that are not a plain match ({len(odd)}; the first {min(len(odd), 20)})",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for col in ("req", "step", "pos", "reference", "kern", "verdict", "margin", "error", "bound"):
            u.add_column(col, justify="right", min_width=len(col))
        for st in odd[:20]:
            u.add_row(str(st["request"]), str(st["step"]), str(st["position"]), str(st["want"]), str(st["got"]),
                      st["verdict"], "" if st["margin"] is None else f"{st['margin']:.4f}", f"{st['error']:.4f}",
                      f"{st['bound']:.4f}")
        con.print(u)
    s = doc["summary"]
    if doc["passed"]:
        con.print(f"passed: {s['steps']} steps, {s['counts']['flip']} allowed flip(s), largest error "
                  f"{s['max_error']:.4f} (bound up to {s['max_bound']:.4f})")
    else:
        f = s["first_failure"]
        why = (f"kern's logit differences are off by {f['error']:.4f} (bound {f['bound']:.4f})" if f["verdict"] == "off"
               else f"kern chose {f['got']} where the reference chose {f['want']}" +
               (f" by a margin of {f['margin']:.4f} (bound {f['bound']:.4f})" if f["margin"] is not None
                else " (outside the reference's top-k)"))
        con.print(f"FAILED at request {f['request']}, step {f['step']} (position {f['position']}): {why}; "
                  f"{s['counts']['wrong']} wrong and {s['counts']['off']} off of {s['steps']} steps")
