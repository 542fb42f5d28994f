"""The reference's tests import it from the folder above."""

import pathlib
import sys

REFERENCE = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = REFERENCE.parent / "tests" / "golden"
sys.path.insert(0, str(REFERENCE))
