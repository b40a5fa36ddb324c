"""Kimi-K3 manifest generator: prefill pipeline stages (P) and the TP8/EP8/DCP8 decode manifest (D).

Contract: the generator modules (`prefill`, `decode`, ...) take the architecture (`config.K3`) and
a kernel table (kernels.toml's modules, passed in by the caller) and return plain JSON dicts; they
read no kernels.toml, cut nothing and verify nothing. `generate.generate_k3` is the whole job of
`mine gen k3` as a library function: it reads the config and kernels.toml, generates, cuts the
prefill manifest into stages or verifies the decode manifest (with `manifests`), and writes them.
"""

GENERATOR = "mine.generators.k3"
VERSION = "0.1.0"
