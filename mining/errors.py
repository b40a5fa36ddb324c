"""The one exception the dump readers raise (`mining/load.py` and the modules it reads with).

Why a module of its own: `load.py` (paths, meta, the facade) and `jsonl.py` (reading the launch
file) both refuse input with it, and `load.py` imports `jsonl.py`; defined here, neither imports
the other for it. `mining.load.DumpError` is the same class (re-exported), the name callers use.
"""


class DumpError(ValueError):
    """A dump that cannot be read; the message is one sentence naming the path."""
