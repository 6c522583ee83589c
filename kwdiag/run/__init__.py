"""``kwdiag run``: run a job on an embedded cluster, watch it live, and end with the diagnosis.

This package is where the runtime and the analyzer meet (the only analysis-side code allowed to
import ``kwdiag.runtime``): ``options`` resolves settings, ``rundir`` owns the run directory and its
manifest, ``tail`` follows the events the cluster writes, ``view`` shows them, ``runner`` orchestrates.
"""
