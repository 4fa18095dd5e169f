"""The parts of ``tokenwire bench engine`` after its throughput rows, each skippable: apart
from the benchmark, so that the command line names them without importing torch."""

SECTIONS = (
    "prefix",
    "features",
    "speculation",
    "draft",
    "overhead",
    "overlap",
    "int8",
    "padding",
)
