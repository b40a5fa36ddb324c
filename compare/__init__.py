"""`mine compare`: is a manifest on kern the same model as the engine it came from?

With random-weight checkpoints (the only kind we may use) logits are nearly flat and top-2 gaps of
one bf16 step are common, so equal greedy tokens over a short run prove little and unequal ones
over a long run do not prove a bug. This stage judges a manifest teacher-forced against an
engine's recorded log-probabilities instead: at every generated position kern is fed the
reference's tokens, its logit differences over the reference's top-k ids are compared with the
reference's own, and a top-1 flip is allowed only where the reference's margin between the two
tokens is within bf16 noise (docs/compare.md).

Modules: `checkpoint` (safetensors headers, fingerprints), `reference` (the recorded reference,
its file format), `verdict` (pure judgement of one step and of a run), `host` (the manifest on
kern with a host that writes its inputs by their declared fills; GPU), `run` (the teacher-forced
and free-running loops), `show` (the report at a terminal), `record` (a recording's checks and its child process),
`record_vllm` (the vLLM recorder, run in that child), `record_sglang` (a reference from SGLang's HTTP answers), `batch` (several sequences a call through a batched manifest; GPU).
"""
