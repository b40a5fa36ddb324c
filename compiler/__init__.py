"""`mine compile` (issue 22): a kern manifest from a capture, with no model-specific wiring.

Modules, in pipeline order: `launches` (a launch's parameters, pointer words, host staging),
`programs` (decode and prefill from the analysis' forwards; cuBLASLt GEMMs joined), `externs`
(a GEMM's operands and m, n, k from cuBLASLt's launch struct), `buffers` (what each address
holds, directions, extents), `exprs` (fits over the program's forwards), `emit` (the manifest),
`compile` (the entry point and provenance), `weights` (binding weight bytes to checkpoint
tensors, for when a capture holds those bytes); inputs by provenance: `requests` (the requests a
capture served, as candidate steps), `inputs` (each forward's copies and host-mapped reads),
`fills` (naming bytes as kern fills), `input_fills` (fills onto input buffers, the report). The contract: docs/compile.md.
"""
