"""The report layer's formatting half: Markdown, self-contained HTML and JSON of a `build_report` dict, and files.

Why a module of its own: formatting never computes. Every function here reads only the dict of
`metakernel.analysis.report.build_report`, so the three formats (and the PNG plots of `metakernel.analysis.plots`)
cannot disagree, and changing how a number is printed cannot change the number.

Rules every renderer follows, because a report is read by people who will not open the code:

- Any synthetic row makes the first line of every format say SYNTHETIC DATA.
- Every table prints its n (what it counts, too) and every row its own count columns.
- A number that cannot be computed is None in the JSON and "—" in Markdown/HTML, with a footnote pointing at the
  row's note; the text "nan" never appears.
- Missing input (no pairs, an absent arm, nothing passed) is stated in plain sentences in "What is missing".
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from metakernel.analysis import stats
from metakernel.analysis.records import FLOOR, TAU
from metakernel.analysis.report import Record, Table, build_report

__all__ = ["DASH", "DASH_FOOTNOTE", "FORMATS", "render_html", "render_json", "render_markdown", "write_report"]

FORMATS = ("md", "html", "json")
DASH = "—"
DASH_FOOTNOTE = f"{DASH} = not computable for that row; the row's note says why."


# --- formatting -----------------------------------------------------------------------------------------------------


def _strip_negative_zero(text: str) -> str:
    return text[1:] if text.startswith("-") and not re.search(r"[1-9]", text) else text


def _fmt(record: Record, column: Mapping[str, str]) -> str | None:
    """Format one cell; None means "not computable" (the renderer prints a dash and a footnote)."""
    fmt, key = column["format"], column["key"]
    if fmt == "ci":
        low, high = record.get("ci_low"), record.get("ci_high")
        if low is None or high is None:
            return None
        return f"[{_pct(low)}, {_pct(high)}]"
    value = record.get(key)
    if value is None:
        return "" if fmt == "str" else None
    if fmt == "str":
        return str(value)
    if fmt == "bool":
        return "yes" if value else "no"
    if fmt == "int":
        return str(int(value))
    v = float(value)
    if fmt == "pct":
        return _pct(v)
    if fmt == "rate":
        return f"{v:.3f}"
    if fmt == "score":
        return f"{v:.1f}"
    if fmt == "speed":
        return f"{v:.3f}x"
    if fmt == "signed":
        return _strip_negative_zero(f"{v:+.3f}")
    if fmt == "p":
        return "<0.0001" if v < 1e-4 else f"{v:.4f}"
    if fmt == "count":
        return f"{v:,.0f}"
    if fmt == "usd":
        return f"${v:,.2f}"
    return _strip_negative_zero(f"{v:.4g}")


def _pct(v: float) -> str:
    return _strip_negative_zero(f"{100 * v:+.1f} %")


def _rows(table: Table) -> tuple[list[str], list[list[str]], bool]:
    """Headers, formatted cells and whether any cell is a dash, shared by the Markdown and HTML renderers."""
    headers = [c["header"] for c in table["columns"]]
    rows, dashed = [], False
    for record in table["records"]:
        cells = []
        for column in table["columns"]:
            text = _fmt(record, column)
            if text is None:
                dashed = True
                text = DASH
            cells.append(text)
        rows.append(cells)
    return headers, rows, dashed


def _n_line(table: Table) -> str:
    return f"n = {table['n']} {table['n_label']} ({len(table['records'])} rows); label: {table['label']}"


# --- Markdown -------------------------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table, section_title: str = "") -> list[str]:
    lines = [] if table["title"] == section_title else [f"### {table['title']}", ""]
    lines += [f"*{_n_line(table)}*", ""]
    if table["description"]:
        lines += [table["description"], ""]
    headers, rows, dashed = _rows(table)
    if not rows:
        lines += ["No rows: the input has nothing for this table (see \"What is missing\").", ""]
    else:
        lines.append("| " + " | ".join(_md_cell(h) for h in headers) + " |")
        lines.append("|" + "|".join("---" for _ in headers) + "|")
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
        lines.append("")
    if dashed:
        lines += [DASH_FOOTNOTE, ""]
    lines += [f"Note: {n}" + ("" if n.endswith(".") else ".") for n in table["notes"]]
    if table["notes"]:
        lines.append("")
    return lines


def render_markdown(report: Mapping[str, Any], png_paths: Mapping[str, str | Path] | None = None) -> str:
    """Render the report as Markdown; with ``png_paths`` (name -> path relative to the file) it links the plots.

    The first line is the SYNTHETIC banner when any row was generated, so it is the first thing anyone sees.
    """
    lines: list[str] = []
    if report["banner"]:
        lines += [f"> **{report['banner']}**", ""]
    lines += [f"# {report['title']}", ""]
    for section in report["sections"]:
        lines += [f"## {section['title']}", ""]
        for paragraph in section["text"]:
            lines += [paragraph, ""]
        if section["key"] == "overview":
            lines += ["### What is missing", ""]
            lines += [f"- {m}" for m in report["missing"]] or ["- Nothing: every table has input."]
            lines.append("")
        for key in section["tables"]:
            lines += _md_table(report["tables"][key], section["title"])
    if png_paths:
        lines += ["## Plots", ""]
        for name, path in png_paths.items():
            lines += [f"![{name}]({Path(path).as_posix()})", ""]
    if report["banner"]:
        lines += [f"> **{report['banner']}**", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# --- HTML -----------------------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:110em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.85em}th,td{border:1px solid #ccc;padding:.2em .5em}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
.banner{background:#b00020;color:#fff;font-size:1.5em;font-weight:bold;padding:.6em 1em;margin-bottom:1em}
.n{color:#555;font-style:italic}
.warn{background:#fff3cd;padding:.4em .8em;border-left:4px solid #e0a800}img{max-width:100%}"""


def _html_table(table: Table, section_title: str = "") -> list[str]:
    e = html.escape
    out = [] if table["title"] == section_title else [f"<h3>{e(table['title'])}</h3>"]
    out.append(f"<p class=\"n\">{e(_n_line(table))}</p>")
    if table["description"]:
        out.append(f"<p>{e(table['description'])}</p>")
    headers, rows, dashed = _rows(table)
    if not rows:
        out.append("<p>No rows: the input has nothing for this table (see \"What is missing\").</p>")
    else:
        out.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead><tbody>")
        numeric = [c["format"] not in ("str", "bool") for c in table["columns"]]
        for row in rows:
            out.append("<tr>" + "".join(f"<td class=\"num\">{e(c)}</td>" if num else f"<td>{e(c)}</td>"
                                        for c, num in zip(row, numeric, strict=True)) + "</tr>")
        out.append("</tbody></table>")
    if dashed:
        out.append(f"<p><small>{e(DASH_FOOTNOTE)}</small></p>")
    out += [f"<p><small>Note: {e(n)}</small></p>" for n in table["notes"]]
    return out


def _png_items(png_paths: Mapping[str, str | Path] | Sequence[str | Path]) -> list[tuple[str, Path]]:
    if isinstance(png_paths, Mapping):
        return [(str(k), Path(v)) for k, v in png_paths.items()]
    return [(Path(p).stem, Path(p)) for p in png_paths]


def render_html(report: Mapping[str, Any], png_paths: Mapping[str, str | Path] | Sequence[str | Path] = ()) -> str:
    """Render a self-contained HTML page: inline CSS, every PNG embedded as base64, no external fetches.

    The first line carries the SYNTHETIC banner in the page title when any row was generated; the body opens with
    the same banner in red.
    """
    e = html.escape
    title = f"{report['banner']} | {report['title']}" if report["banner"] else report["title"]
    out = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>",
           f"<style>{_CSS}</style></head><body>"]
    if report["banner"]:
        out.append(f"<div class=\"banner\">{e(report['banner'])}</div>")
    out.append(f"<h1>{e(report['title'])}</h1>")
    for section in report["sections"]:
        out.append(f"<h2>{e(section['title'])}</h2>")
        for paragraph in section["text"]:
            cls = " class=\"warn\"" if paragraph.startswith("Warning:") else ""
            out.append(f"<p{cls}>{e(paragraph)}</p>")
        if section["key"] == "overview":
            out.append("<h3>What is missing</h3><ul>")
            out += [f"<li>{e(m)}</li>" for m in report["missing"]] or ["<li>Nothing: every table has input.</li>"]
            out.append("</ul>")
        for key in section["tables"]:
            out += _html_table(report["tables"][key], section["title"])
    items = _png_items(png_paths)
    if items:
        out.append("<h2>Plots</h2>")
        for name, path in items:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            out.append(f"<figure><img alt=\"{e(name)}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption>{e(name)}</figcaption></figure>")
    if report["banner"]:
        out.append(f"<div class=\"banner\">{e(report['banner'])}</div>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --- JSON and files -------------------------------------------------------------------------------------------------


def render_json(report: Mapping[str, Any]) -> str:
    """Serialise the report with the banner on the first line (``{"banner": ...,``) and no NaN anywhere."""
    text = json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False)
    return "{" + text[len("{\n "):] + "\n" if text.startswith("{\n ") else text + "\n"


def write_report(df: pd.DataFrame, out_dir: str | Path, formats: Iterable[str] = FORMATS, *, tau: float = TAU,
                 floor: float = FLOOR, seed: int = stats.DEFAULT_SEED,
                 n_resamples: int = stats.DEFAULT_RESAMPLES, speed: str = "e2e") -> dict[str, Path | list[Path]]:
    """Build the report and write the requested formats plus the PNG plots into ``out_dir``.

    Returns:
        Format name ("md", "html", "json") -> file, and "png" -> the plot files.

    Raises:
        ValueError: On an unknown format or a table `records.validate_attempts` rejects.
    """
    from metakernel.analysis.plots import write_plots

    wanted = list(dict.fromkeys(formats))
    unknown = [f for f in wanted if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown report format(s) {', '.join(unknown)}; use {', '.join(FORMATS)}")
    report = build_report(df, tau=tau, floor=floor, seed=seed, n_resamples=n_resamples, speed=speed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = write_plots(report, out)
    written: dict[str, Path | list[Path]] = {}
    texts = {
        "json": lambda: render_json(report),
        "md": lambda: render_markdown(report, {k: p.name for k, p in pngs.items()}),
        "html": lambda: render_html(report, pngs),
    }
    for fmt in FORMATS:
        if fmt in wanted:
            path = out / f"report.{fmt}"
            path.write_text(texts[fmt](), encoding="utf-8")
            written[fmt] = path
    written["png"] = list(pngs.values())
    return written

