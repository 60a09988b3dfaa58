"""`python -m engine.model.kernels`: build the kernels now (make run and make test do), say what runs."""
import sys

from . import describe, status
from .build import library_path

print(describe())
if status()["isa"]:
    print(library_path())
else:
    sys.exit(0)   # the engine runs without them (fp32), as the line above says
