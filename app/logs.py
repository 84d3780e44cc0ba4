"""One format for every log line on stderr (CHARON_LOG_FORMAT): uvicorn's, the service's (`charon.*`:
errors, the sweeper, the notifier, the redrive runner, the stores), whatever the process logs. `json` writes
one object a line, as the access lines are (api/access.py writes those itself, in batches, and in `text` as
text too); `text` writes `time level logger: message` for a terminal.

`config()` is the logging.config dictionary of a process: `charon serve` gives it to uvicorn (`log_config`),
which applies it in each worker too; `charon notify` and the CLI's own messages apply it with `configure()`.
Hand-written rather than python-json-logger: the lines are a dozen lines of orjson, and share the access
lines' time format to the millisecond."""

from __future__ import annotations

import logging
import logging.config
from typing import Any, Literal

import orjson

from api.access import utc_millis

LogFormat = Literal["json", "text"]


class JsonLines(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and `exception` (its traceback) when the
    record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "time": utc_millis(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exception"] = record.exc_text
        if record.stack_info:
            fields["stack"] = record.stack_info
        return orjson.dumps(fields, default=str).decode()


class TextLines(logging.Formatter):
    """A record as `time level logger: message`, its traceback on the lines after."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_millis(record.created)


FORMATTERS: dict[str, type[logging.Formatter]] = {"json": JsonLines, "text": TextLines}


def config(log_format: LogFormat, level: str = "info") -> dict[str, Any]:
    """The logging configuration of a process: one stderr handler with `log_format`'s formatter, on the root
    logger and on uvicorn's (which otherwise bring their own). The access logger (`charon.access`) is left
    to api/access.py, which writes its lines itself."""
    handler = {"class": "logging.StreamHandler", "formatter": "charon", "stream": "ext://sys.stderr"}
    ours = {"handlers": ["charon"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"charon": {"()": FORMATTERS[log_format]}},
        "handlers": {"charon": handler},
        "root": {"handlers": ["charon"], "level": level.upper()},
        "loggers": {"uvicorn": ours, "uvicorn.error": {"level": level.upper()}, "uvicorn.access": ours},
    }


def configure(log_format: LogFormat, level: str = "info") -> None:
    """Apply `config` to this process."""
    logging.config.dictConfig(config(log_format, level))
