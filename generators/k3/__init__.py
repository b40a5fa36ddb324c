"""Kimi-K3 manifest generator: prefill pipeline stages (P) and the TP8/EP8/DCP8 decode manifest (D).

Contract: the functions here take the architecture (`config.K3`) and a kernel table (a dict of
kernels.toml modules, passed in by the caller) and return plain JSON dicts. Nothing in this
package reads kernels.toml, cuts or verifies: the CLI layer does that with `manifests`.
"""

GENERATOR = "mine.generators.k3"
VERSION = "0.1.0"
