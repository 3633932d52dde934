"""The quickstart notebook executes headless, cell by cell."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_notebook_runs(monkeypatch):
    monkeypatch.setenv("KERAS_DATUM_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    path = os.path.join(ROOT, "examples", "notebooks", "quickstart.ipynb")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Validation accuracy:" in text
    assert "Dataset card:" in text
    # The preview displayed inline as a picture.
    assert any("image/png" in o.get("data", {}) for o in outputs)
