"""The one exception the dump readers raise (`mining/load.py` and the modules it reads with).

Why a module of its own: `load.py` (paths, meta, the facade) and `jsonl.py` (reading the launch
file) both refuse input with it, and `load.py` imports `jsonl.py`; named here, neither imports
the other for it. `mining.load.DumpError` is the same class (re-exported), the name callers use.
The class itself is `vocab.errors.DumpError`, a `MineError`: the capture side's binary reader
(`vocab/binfmt.py`) refuses a dump with the same class.
"""

from vocab.errors import DumpError  # noqa: F401  (re-exported)
