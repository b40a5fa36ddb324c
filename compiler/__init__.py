"""`mine compile` (issue 22): a kern manifest from a capture, with no model-specific wiring.

Built so far: `weights`, the binder that names each weight range of a capture by the checkpoint
tensors its bytes are (exact, concatenated, sliced), so a compiled manifest can bind a checkpoint
without a generator knowing that vLLM fuses q, k and v or gate and up. Not built yet: the capture
knob that snapshots those bytes, and the rest of the compiler (buffers from liveness, programs,
expressions) -- see the issue.
"""
