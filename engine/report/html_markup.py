"""report.html's HTML primitives: markup built here is escaped once, and every other value is escaped on its way
into the page (Html)."""

from __future__ import annotations

import html
import math
from typing import Any


class Html(str):
    """Markup built here: already escaped. Any other value is escaped on its way into the page."""


def h(x: Any) -> Html:
    """x as markup: itself where it is Html, else its text escaped."""
    return x if isinstance(x, Html) else Html(html.escape(str(x), quote=True))


def el(name: str, *children: Any, **attrs: Any) -> Html:
    """<name attrs>children</name>; `class_` gives class; an attribute that is None or False is left out."""
    text = "".join(f' {k.rstrip("_").replace("_", "-")}="{h(v)}"' for k, v in attrs.items()
                   if v is not None and v is not False)
    return Html(f"<{name}{text}>" + "".join(h(c) for c in children if c is not None) + f"</{name}>")


def join(*parts: Any) -> Html:
    """The parts one after another (None skipped)."""
    return Html("".join(h(p) for p in parts if p is not None))


def num(x: Any, spec: str = ".4f") -> Html:
    """A number formatted (an en dash where missing or NaN; a value that is not a number as text)."""
    if x is None or isinstance(x, bool):
        return Html("–") if x is None else h("yes" if x else "no")
    try:
        v = float(x)
    except (TypeError, ValueError):
        return h(x)
    if math.isnan(v) or math.isinf(v):
        return Html("–") if math.isnan(v) else h(format(v))
    if spec.endswith("d"):  # an integer spec: a whole float as an int, any other number as it is
        return h(format(int(v), spec)) if v.is_integer() else h(format(v, "g"))
    return h(format(v, spec))


def pm(mean: Any, sd: Any, spec: str = ".4f") -> Html:
    """mean ± sd (the mean alone without a spread)."""
    return num(mean, spec) if sd is None else join(num(mean, spec), " ± ", num(sd, spec.replace("+", "")))


def table(headers: list[Any], rows: list[list[Any] | Html], row_classes: list[str | None] | None = None,
          **attrs: Any) -> Html:
    """A table with a header row and a body row per list of cells (a row given as Html: its <td>s as they are)."""
    body = []
    for i, row in enumerate(rows):
        cells = row if isinstance(row, Html) else join(*(el("td", c) for c in row))
        body.append(el("tr", cells, class_=(row_classes or [None] * len(rows))[i]))
    return el("table", el("thead", el("tr", *(el("th", x) for x in headers))), el("tbody", *body), **attrs)


def keyvalue(pairs: list[tuple[str, Any]], **attrs: Any) -> Html:
    """A two-column table of named values (pairs whose value is None are left out)."""
    return el("table", el("tbody", *(el("tr", el("th", k), el("td", v)) for k, v in pairs if v is not None)),
              class_="kv", **attrs)


def section(ident: str, title: str, *body: Any) -> Html:
    """<section id=ident> with its heading."""
    return el("section", el("h2", title), *body, id=ident)


def para(*text: Any, class_: str | None = None) -> Html:
    return el("p", *text, class_=class_)


def mapping(x: Any) -> dict:
    """x where it is a dict, else {} (summary.json's sections are read without trusting their shape)."""
    return x if isinstance(x, dict) else {}


def as_float(x: Any) -> float:
    """x as a float (NaN where it is not a number)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan
