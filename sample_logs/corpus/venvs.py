"""One virtual environment per Dask version, under ~/.cache/kwdiag-corpus/ (never in the repo).

Each version gets the Python it was released for and the pins it needs to import and run
(older tornado/msgpack/click/cloudpickle/zict where newer ones break it). The pins are written
into every case's labels.json, so a log can be traced to the exact environment that printed it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("KWDIAG_CORPUS_CACHE", Path.home() / ".cache" / "kwdiag-corpus"))
PYENV = Path("/root/.pyenv/versions")

# version -> (python, [requirements]). The requirements are the pins; pip resolves the rest.
VERSIONS: dict[str, tuple[str, list[str]]] = {
    "2.9.3": ("3.8.18", [
        "distributed==2.9.3", "dask==2.9.2", "tornado==6.0.3", "msgpack==0.6.2", "click==7.0",
        "cloudpickle==1.2.2", "toolz==0.10.0", "zict==1.0.0", "tblib==1.6.0", "psutil==5.6.7",
        "pyyaml==5.3", "sortedcontainers==2.1.0", "setuptools<60",
    ]),
    "2.30.1": ("3.8.18", [
        "distributed==2.30.1", "dask==2.30.0", "tornado==6.1", "msgpack==1.0.2", "click==7.1.2",
        "cloudpickle==1.6.0", "toolz==0.11.1", "zict==2.0.0", "tblib==1.7.0", "psutil==5.8.0",
        "pyyaml==5.4.1", "sortedcontainers==2.3.0", "setuptools<60",
    ]),
    "2021.11.2": ("3.9.18", [
        "distributed==2021.11.2", "dask==2021.11.2", "tornado==6.1", "msgpack==1.0.3", "click==8.0.3",
        "cloudpickle==2.0.0", "toolz==0.11.2", "zict==2.0.0", "tblib==1.7.0", "psutil==5.8.0",
        "pyyaml==6.0", "jinja2==3.0.3", "setuptools<60",
    ]),
    "2022.12.1": ("3.11.7", [
        "distributed==2022.12.1", "dask==2022.12.1", "tornado==6.2", "msgpack==1.0.4", "click==8.1.3",
        "cloudpickle==2.2.0", "toolz==0.12.0", "zict==2.2.0", "tblib==1.7.0", "psutil==5.9.4",
        "pyyaml==6.0", "jinja2==3.1.2", "urllib3<2",
    ]),
    "2022.6.1": ("3.10.13", [
        "distributed==2022.6.1", "dask==2022.6.1", "tornado==6.1", "msgpack==1.0.4", "click==8.1.3",
        "cloudpickle==2.1.0", "toolz==0.11.2", "zict==2.2.0", "tblib==1.7.0", "psutil==5.9.1",
        "pyyaml==6.0", "jinja2==3.1.2", "urllib3<2",
    ]),
    "2023.6.1": ("3.11.7", [
        "distributed==2023.6.1", "dask==2023.6.1", "tornado==6.3.2", "msgpack==1.0.5", "click==8.1.3",
        "cloudpickle==2.2.1", "toolz==0.12.0", "zict==3.0.0", "tblib==1.7.0", "psutil==5.9.5",
    ]),
    "2024.4.2": ("3.11.7", ["distributed==2024.4.2", "dask==2024.4.2"]),
    "2024.12.1": ("3.11.7", ["distributed==2024.12.1", "dask==2024.12.1"]),
    "2025.9.1": ("3.11.7", ["distributed==2025.9.1", "dask==2025.9.1"]),
    "2026.8.0": ("3.11.7", ["distributed==2026.8.0", "dask==2026.8.0"]),
}


def venv_dir(version: str) -> Path:
    return CACHE / f"dask-{version}"


def python_of(version: str) -> Path:
    return venv_dir(version) / "bin" / "python"


def ensure(version: str, log=print) -> Path:
    """Create the venv for `version` if it is not there yet; return its python."""
    py, reqs = VERSIONS[version]
    d = venv_dir(version)
    ok = d / ".kwdiag-ok"
    if ok.exists():
        return python_of(version)
    log(f"creating venv {d} (Python {py}) ...")
    base = PYENV / py / "bin" / "python"
    subprocess.run([str(base), "-m", "venv", "--clear", str(d)], check=True)
    pip = [str(python_of(version)), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["install", *reqs], check=True)
    # smoke test: import and print the versions Dask itself reports
    subprocess.run([str(python_of(version)), "-c", "import distributed, dask; print(distributed.__version__)"],
                   check=True)
    ok.write_text(json.dumps(pins(version)))
    return python_of(version)


def pins(version: str) -> dict:
    """Installed versions of the packages that matter for Dask's behaviour in this venv."""
    code = (
        "import json, sys, importlib.metadata as m\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for p in ['distributed','dask','tornado','msgpack','cloudpickle','click','toolz','zict','psutil','tblib','pyyaml']:\n"
        "    try: out[p] = m.version(p)\n"
        "    except Exception: pass\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([str(python_of(version)), "-c", code], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def requested_pins(version: str) -> list[str]:
    return list(VERSIONS[version][1])


if __name__ == "__main__":
    for v in sys.argv[1:] or list(VERSIONS):
        ensure(v)
        print(v, json.dumps(pins(v)))
