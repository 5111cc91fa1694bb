"""The run log: every run's settings, statistics and full token trace in one SQLite file.

``store`` (:class:`RunLog`: writing, reading, repairs), ``schema`` (tables and migrations) and
``rows`` (events to rows and back). Import from here.
"""

from engine.runlog.schema import SCHEMA_VERSION
from engine.runlog.store import RunLog, RunLogError, RunMeta, library_versions, prompt_hash

__all__ = ["SCHEMA_VERSION", "RunLog", "RunLogError", "RunMeta", "library_versions", "prompt_hash"]
