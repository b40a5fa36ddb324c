"""kern-llm's verdict on a manifest file, on a machine without a GPU.

    python -m manifests.kern_oracle MANIFEST [KERNELS_DIR]
        prints `ACCEPTED <exception type> <message>` (exit 0) or `REJECTED <message>` (exit 3)

Why one place: `kern.Runtime(path, kernels_dir, weights, gpu)` verifies the manifest first. A
rejected manifest raises ValueError whose message lists every violation as `- ...` lines; an
accepted one goes on and fails further along -- loading libcuda on a GPU-less machine -- with
pyo3's PanicException, a BaseException. A manifest with a topology is checked as rank 0 of each of
its groups (without a rank kern stops at its caller contract before every check has run). The `cut`
fallback verifier, the differential and ABI tests and the verify benchmark all read that verdict;
tests of very large manifests read it through the command above, in a child process.
kern-llm is a test dependency (the `test` extra); importing this module does not import it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass


@dataclass
class Verdict:
    accepted: bool
    violations: list[str]        # rejected: kern's `- ...` lines (or its whole message)
    message: str                 # the exception's type and text, as kern raised it
    exc: BaseException | None    # what kern raised, for callers that want to re-raise it


def verdict(path, kernels_dir=".") -> Verdict:
    """kern's verdict on the manifest file at `path` (Ctrl-C and exit requests pass through)."""
    import kern

    os.environ.setdefault("RUST_BACKTRACE", "0")
    args = [str(path), str(kernels_dir), [], 0]
    ranks = _rank_zero(path)
    if ranks:   # kern checks a multi-rank manifest as one rank of its topology: rank 0 of each group
        args.append(ranks)
    try:
        kern.Runtime(*args)
    except ValueError as exc:
        lines = [ln.strip()[2:] for ln in str(exc).splitlines() if ln.strip().startswith("- ")]
        return Verdict(False, lines or [str(exc)], f"{type(exc).__name__} {exc}", exc)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - accepted, then no GPU (a pyo3 PanicException)
        return Verdict(True, [], f"{type(exc).__name__} {exc}", exc)
    return Verdict(True, [], "loaded", None)


def _rank_zero(path) -> dict:
    """{group: (0, size)} for the manifest's topology groups; {} when it has none or is not JSON
    (kern then says what is wrong with it)."""
    import json

    try:
        with open(path, "rb") as f:
            doc = json.load(f)
        groups = doc.get("topology", {}).get("groups", {})
        sizes = {str(g): n for g, n in groups.items()}
        if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2 ** 32
                                for n in sizes.values()):
            return {}   # no topology, or one kern must judge as written (a size no rank can take)
        return {g: (0, n) for g, n in sizes.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


@contextlib.contextmanager
def quiet_stderr():
    """kern's panic hook prints a backtrace to fd 2 for every accepted manifest; silence it."""
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m manifests.kern_oracle MANIFEST [KERNELS_DIR]", file=sys.stderr)
        return 2
    v = verdict(args[0], args[1] if len(args) > 1 else ".")
    print(("ACCEPTED " if v.accepted else "REJECTED ") + v.message[:200 if v.accepted else None])
    return 0 if v.accepted else 3


if __name__ == "__main__":
    sys.exit(main())
