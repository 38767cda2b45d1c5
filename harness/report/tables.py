"""Markdown for REPORT.md: the one writer of text that came from a folder, a table, and the columns a section shows.

A report folder is data someone else may have written: a folder's name, a ``model_id``, an error, an override.
Whatever REPORT.md takes from it is escaped here, at the output (SECURITY.md): as text (``md_text``: no HTML,
no link or image, no code span, no emphasis, no table cell boundary, one line), as inline code (``md_code``), or
as a fenced block (``md_fence``: a fence longer than any run of backticks inside). A table cell that holds markup
kvbench writes around such text is a ``Markdown``, which ``cell`` passes through as it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

# What Markdown reads as structure inside a line: links and images, code spans, emphasis and strikethrough, a
# table's cell boundary, and the escape character itself. ``_`` is left as it is: every impl and sweep name holds
# one, GitHub never reads one inside a word as emphasis, and at a word's edge it can only italicise.
_SPECIAL = re.compile(r"([\\`*\[\]|~])")
# HTML: a ``<`` that can open a tag, a comment, a declaration or an autolink (CommonMark: a letter, a digit for an
# e-mail autolink, ``/``, ``!`` or ``?`` follows), and an ``&`` that can start an entity. ``<=`` or ``a & b`` stay.
_HTML_START = re.compile(r"<(?=[A-Za-z0-9/!?])|&(?=#?[A-Za-z0-9]+;)")
_HTML = {"&": "&amp;", "<": "&lt;"}
_LINE_BREAK = re.compile(r"[\r\n\u2028\u2029\x0b\x0c\x85]+")


@dataclass(frozen=True)
class Markdown:
    """A table cell that is already Markdown, written by kvbench (its data parts escaped with the functions
    below). Not a ``str``: pandas would store a str subclass as a plain string and the mark would be lost."""

    text: str

    def __str__(self) -> str:
        return self.text


def md_text(value) -> str:
    """``value`` as one line of literal text: shown as it is (line breaks as spaces), no HTML, link or code."""
    text = _LINE_BREAK.sub(" ", str(value))
    text = _HTML_START.sub(lambda m: _HTML[m.group(0)], _SPECIAL.sub(r"\\\1", text))
    return text


def md_code(value) -> str:
    """``value`` as an inline code span on one line, fenced by more backticks than any run inside it; a ``|``
    is escaped, as GitHub splits a table's cells before it reads code spans."""
    text = _LINE_BREAK.sub(" ", str(value)).replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_fence(value) -> str:
    """``value`` as a fenced code block: its fence longer than any run of backticks in it, so no line closes it."""
    text = str(value)
    ticks = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{ticks}\n{text}\n{ticks}"


def cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return "–"
    if isinstance(v, float):
        # a whole number, or one of five digits or more, in plain digits (4 significant digits printed 32,370
        # tokens a second as 3.237e+04); a smaller one to 4 significant digits
        return f"{v:.0f}" if (v.is_integer() or abs(v) >= 1e4) and abs(v) < 1e15 else f"{v:.4g}"
    if isinstance(v, Markdown):
        return _LINE_BREAK.sub(" ", v.text)
    return md_text(v)


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    if df.empty:
        return "_(none)_\n"
    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def pick(df: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    """The columns present, renamed for display."""
    return df[[c for c in cols if c in df.columns]].rename(columns=cols)
