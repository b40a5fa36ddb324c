"""notebooks/explore_dump.ipynb runs headless, top to bottom, without an error, on the bundled
real vLLM capture by default (its time is not asserted: a loaded machine is not a failure; a cell
that hangs is, after 100 s)."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from paths import ROOT


def test_explore_dump_notebook_runs():
    path = ROOT / "notebooks" / "explore_dump.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs not stripped"
    NotebookClient(nb, timeout=100, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for o in outputs), "no figure was drawn"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "7937 launches" in text and "28 layers" in text   # the offline fixture, analysed
