"""kwdiag: why did my worker die?

This package root stays import-light on purpose: the CLI's start-up time and the
runtime's worker start-up both pass through it. Analysis code lives in submodules;
the runtime installs as ``kwdiag.runtime`` and the rule files as ``kwdiag.rules``.
"""

__version__ = "0.1.0"
