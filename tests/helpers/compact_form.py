"""The compact form's launch records turned back into the default form (docs/dump-format.md,
"Compact form"), for tests that compare the two or check compact and binary captures with the
default form's assertions."""

from __future__ import annotations


def expand(launch: dict, fns: dict[int, dict]) -> dict:
    """A compact launch record as the default form writes it (key order included)."""
    f = fns[launch["fn"]]
    out = {}
    for k, v in launch.items():
        if k == "fn":
            out.update({k2: f[k2] for k2 in ("handle", "func", "module", "sha256", "symbol", "name", "attrs")})
        elif k == "params":
            lay = {i: (off, size) for i, off, size in f["params_layout"]}
            out["layout"] = f["layout"]
            out["params"] = [{"i": p["i"], "off": lay[p["i"]][0], "size": lay[p["i"]][1],
                              **{k2: v2 for k2, v2 in p.items() if k2 != "i"}} for p in v]
        else:
            out[k] = v
    return out
