"""Hypothesis keeps its caches (example database, constants) outside the work tree: nothing of a run lands in git
status. Schemathesis uses Hypothesis too."""
import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "connector-v2-hypothesis")
