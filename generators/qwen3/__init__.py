"""Qwen3 manifest generator: a vLLM capture (TRITON_ATTN, eager) to a kern schema_version 7 manifest.

Contract: `mined.mine(dump, cfg, analysis)` takes the forwards of the analysis contract
(`vocab.analysis.AnalysisDoc`) and reads the per-layer launches of a `mining.load` dump, pins every
vLLM kernel instance (symbol, cubin sha256, parameter sizes, registers, block, shared memory) and
checks the generator's wiring against the mined addresses (`mined.WiringMismatch` names the call
site); `build.generate(cfg, mined, own)` writes the manifest (plain JSON dict) from Jinja per-layer
templates; `bindings.write(...)` writes the safetensors tensors no checkpoint holds (rope cos/sin,
kv scale). Those read no kernels.toml and verify nothing: `generate.generate_qwen3`, the whole job
of `mine gen qwen3` as a library function, passes the own kernels' launches in, verifies the
result with `manifests`, and writes the manifest, the bindings and the kernels folder.
`tp.generate_tp` (`mine gen qwen3 --tp`) makes one manifest for every rank of a tensor-parallel
capture (topology, per-rank weight binds, NCCL all-reduces; docs/ranks.md).
Not handled: batches of more than one sequence (the captured reduce kernel is built for one),
pipeline parallelism, quantized KV caches.
"""

GENERATOR = "mine.generators.qwen3"
VERSION = "0.1.0"
