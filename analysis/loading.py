"""Reading the attempt table a report is built from, whatever the user points at: store, bundle, .csv or .json.

Why a module of its own: where the rows come from is not the report's business. Every input kind ends as the same
validated `records.COLUMNS` table here, so `metakernel.analysis.report.build_report` computes the same numbers
from an experiment's store as from its export, and a bad input fails with one plain `UserError` sentence instead of
a traceback from deep inside a metric.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from metakernel.analysis.records import validate_attempts

__all__ = ["load_attempts"]

_FLOAT_COLUMNS = ("speedup", "speedup_gpu", "roofline_fraction", "cost_usd", "wall_s", "source_replicate")


def load_attempts(path: str | Path) -> pd.DataFrame:
    """Read the attempt table from an experiment, an export bundle, a ``.csv``, or a ``.json`` list of records.

    Accepted: an experiment directory (its store, through `metakernel.export.attempt_table`), an export bundle
    folder or its results.json (schema metakernel.export/1: its attempts), a directory holding ``attempts.csv``, a
    ``.csv`` file, or a ``.json`` list of records (or ``{"attempts": [...]}``). Store and bundle give the same table,
    so a report computes the same numbers from either. The table is validated here so the caller gets one clear
    sentence about a bad input rather than a traceback from deep inside a metric.

    Raises:
        metakernel.errors.UserError: When the path is missing, unreadable, of an unknown kind or invalid.
    """
    from metakernel.errors import UserError
    from metakernel.export import EXPORT_SCHEMA, RESULTS_NAME, bundle_attempts, read_bundle
    from metakernel.store import is_experiment

    p = Path(path)
    if p.is_dir():
        if is_experiment(p):
            from metakernel.export import attempt_table
            from metakernel.store import Store

            with Store(p) as store:
                return attempt_table(store)
        if (p / RESULTS_NAME).is_file():
            p = p / RESULTS_NAME
        elif (p / "attempts.csv").is_file():
            p = p / "attempts.csv"
        else:
            raise UserError(f"not an experiment (no metakernel.sqlite) or an export bundle (no {RESULTS_NAME}), and "
                            "no attempts.csv: pass one of those, or a .csv/.json attempt table", str(p))
    if not p.exists():
        raise UserError("no such file or directory", str(p))
    suffix = p.suffix.lower()
    try:
        if suffix == ".csv":
            df = pd.read_csv(p)
        elif suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            if isinstance(data, dict) and str(data.get("schema", "")).startswith("metakernel.export/"):
                if data["schema"] != EXPORT_SCHEMA:
                    read_bundle(p)  # raises the schema mismatch
                df = bundle_attempts(p)
            else:
                if isinstance(data, dict) and isinstance(data.get("attempts"), list):
                    data = data["attempts"]
                if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                    raise UserError("expected a JSON list of attempt records (or {\"attempts\": [...]})", str(p))
                df = pd.DataFrame.from_records(data)
                for column in _FLOAT_COLUMNS:
                    if column in df.columns:
                        df[column] = df[column].map(lambda v: math.nan if v is None else v)
        else:
            raise UserError(f"unknown attempt table type {suffix or '(none)'!r}: use .csv or .json", str(p))
    except UserError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:
        raise UserError(f"cannot read attempt table: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                        str(p)) from exc
    try:
        validate_attempts(df)
    except ValueError as exc:
        raise UserError(f"invalid attempt table: {exc}", str(p)) from exc
    return df
