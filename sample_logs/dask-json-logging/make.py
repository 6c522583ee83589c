"""Scenario: Dask's own logging configured to write JSON lines (python-json-logger, as ELK/Datadog/Loki setups do).

Every process reads ``logging.yaml`` (DASK_CONFIG points at this folder's ``config/``): Dask's ``logging`` config
with a ``version: 1`` dictConfig whose formatter is python-json-logger's JsonFormatter. Then w1's task kills
its own worker process with SIGKILL once (the nanny restarts it, the retry succeeds), w2's task raises (a task
error, not a death), and the cluster is closed. Needs ``pip install python-json-logger`` in the Dask venv."""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dask-harness"))
import harness

LOGGING = """\
logging:
  version: 1
  disable_existing_loggers: false
  formatters:
    json:
      (): pythonjsonlogger.json.JsonFormatter
      format: "%(asctime)s %(name)s %(levelname)s %(message)s"
  handlers:
    console:
      class: logging.StreamHandler
      formatter: json
  loggers:
    distributed:
      level: INFO
      handlers: [console]
      propagate: false
"""


def die_once(marker):
    import os, signal
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return "ok"


def fails():
    raise ValueError("a task error, not a death")


if harness.is_client():
    from distributed import Client
    import tempfile
    info = harness.client_info()
    tmp = tempfile.mkdtemp()
    with Client(info["address"]) as c:
        a = c.submit(die_once, os.path.join(tmp, "a"), key="die-once", workers=["w1"], allow_other_workers=True)
        print(a.result(timeout=60), file=sys.stderr)
        b = c.submit(fails, key="fails", workers=["w2"])
        try:
            b.result(timeout=60)
        except ValueError as exc:
            print("task error:", exc, file=sys.stderr)
else:
    here = Path(__file__).resolve().parent
    config = here / "config"
    config.mkdir(exist_ok=True)
    (config / "logging.yaml").write_text(LOGGING)
    cl = harness.Cluster(here, env={"DASK_CONFIG": str(config)})
    cl.worker("w1")
    cl.worker("w2")
    cl.wait_workers(2)
    cl.client(__file__)
    cl.shutdown()
