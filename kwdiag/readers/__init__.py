"""Readers: turn whatever logs a user saved into ``kwdiag.events.Event`` objects with origins.

Covers: finding the input files (``inputs``), reading them safely and fast (``scan``: gzip,
binary, enormous lines, invalid UTF-8, a literal prefilter over raw bytes), and turning lines
into events (``text``: Dask/kwdiag text layout, kernel/k8s/SLURM/faulthandler text through the
rules; kwdiag JSONL lines anywhere; JSON logging records, ``jsonlog``). ``read_events`` is the one entry
point; ``Progress`` is how far it has got, for a display.

Does not cover: what the events mean (``kwdiag.timeline``, ``kwdiag.analysis``).
"""

from kwdiag.readers.inputs import Input, expand_inputs
from kwdiag.readers.text import FileResult, Progress, read_events, read_input

__all__ = ["Input", "expand_inputs", "FileResult", "Progress", "read_events", "read_input"]
