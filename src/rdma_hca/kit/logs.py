"""Log set-up: readable lines by default, one JSON object per line for collectors."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import MutableMapping

# gRPC's C core writes its own lines straight to stderr, in its own format, from the
# moment the library is loaded; its environment decides how many. The daemon reports
# every failure it cares about itself, so the core stays silent unless an operator
# asks for its lines by setting these variables.
GRPC_CORE_DEFAULTS = {"GRPC_VERBOSITY": "NONE", "GRPC_TRACE": ""}


def quiet_grpc_core(environ: MutableMapping[str, str] = os.environ) -> None:
    """Default gRPC's C-core logging to off; call before grpc is first imported."""
    for key, value in GRPC_CORE_DEFAULTS.items():
        environ.setdefault(key, value)


FIELDS = ("hca", "port", "resource", "claim")
"""What a record may carry (``log.info(..., extra={"hca": name})``) that JSON lines give as
fields of their own, to filter on; the text format has them in the message already."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                doc[key] = value if isinstance(value, int) else str(value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                              datefmt="%Y-%m-%dT%H:%M:%S")
        )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # asyncio's and grpc's Python loggers go through the same handler (and so the same
    # format, JSON included); below WARNING they repeat what we already report.
    logging.getLogger("asyncio").setLevel(logging.WARNING)
    quiet = logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    logging.getLogger("grpc").setLevel(quiet)
