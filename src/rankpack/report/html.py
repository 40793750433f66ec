"""One self-contained HTML page from a report document: inline CSS, figures embedded as
base64 PNG ``data:`` URIs, no script and nothing fetched from the network.

Every text is escaped; figures and tables carry stable ids (``data-figure`` /
``data-table``) that the browser test looks for. Called by `rankpack.report.build`.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

from rankpack.report.figures import Figure


@dataclass(frozen=True)
class Tile:
    """A headline number."""

    label: str
    value: str
    note: str = ""
    tone: str = ""
    """'' | good | bad | warn: the tile's colour."""


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""
    text_columns: tuple[int, ...] = ()
    """Columns aligned left (the others hold numbers and are aligned right)."""


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    intro: str = ""
    tiles: tuple[Tile, ...] = ()
    figures: tuple[Figure, ...] = ()
    tables: tuple[Table, ...] = ()


@dataclass(frozen=True)
class ReportDoc:
    title: str
    subtitle: str
    sections: tuple[Section, ...]
    headline: str | None = None
    summary: tuple[str, ...] = field(default_factory=tuple)
    footer: str = ""


CSS = """
:root { --ink:#1d2433; --muted:#5b6475; --line:#e3e7ef; --bg:#f6f8fb; --card:#fff;
  --accent:#2459d6; --good:#1f8a4c; --bad:#c0392b; --warn:#b7791f; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; color:var(--ink); background:var(--bg); }
header.top { background:linear-gradient(120deg,#14213d,#2459d6); color:#fff;
  padding:28px 32px 24px; }
header.top h1 { margin:0 0 4px; font-size:26px; letter-spacing:-0.01em; }
header.top p { margin:0; color:#dbe4ff; }
main { max-width:1120px; margin:0 auto; padding:24px 24px 48px; }
.hero { background:var(--card); border:1px solid var(--line); border-left:6px solid var(--accent);
  border-radius:10px; padding:18px 22px; margin:0 0 22px; box-shadow:0 1px 3px #0000000d; }
.hero .headline { font-size:20px; font-weight:650; margin:0 0 8px; }
.hero ul { margin:6px 0 0; padding-left:20px; color:var(--ink); }
.hero li { margin:3px 0; }
nav.toc { display:flex; flex-wrap:wrap; gap:8px; margin:0 0 22px; }
nav.toc a { text-decoration:none; color:var(--accent); background:#e8efff; border-radius:999px;
  padding:4px 12px; font-size:13px; }
section.block { background:var(--card); border:1px solid var(--line); border-radius:10px;
  padding:20px 22px; margin:0 0 22px; box-shadow:0 1px 3px #0000000d; }
section.block h2 { margin:0 0 6px; font-size:19px; }
section.block p.intro { margin:0 0 14px; color:var(--muted); }
.tiles { display:grid; grid-template-columns:repeat(auto-fill,minmax(160px,1fr)); gap:10px;
  margin:0 0 16px; }
.tile { border:1px solid var(--line); border-radius:8px; padding:10px 12px; background:#fbfcfe; }
.tile .v { font-size:22px; font-weight:700; line-height:1.2; }
.tile .l { font-size:12px; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
.tile .n { font-size:12px; color:var(--muted); }
.tile.good .v { color:var(--good); } .tile.bad .v { color:var(--bad); }
.tile.warn .v { color:var(--warn); }
figure.fig { margin:18px 0; }
figure.fig img { display:block; max-width:100%; height:auto; border:1px solid var(--line);
  border-radius:6px; background:#fff; }
figure.fig figcaption { font-size:13px; color:var(--muted); margin-top:6px; }
figure.fig figcaption b { color:var(--ink); }
.tablewrap { overflow-x:auto; margin:14px 0; }
table.data { border-collapse:collapse; width:100%; font-size:13px; }
table.data caption { text-align:left; font-weight:650; padding:0 0 6px; color:var(--ink); }
table.data th, table.data td { padding:5px 8px; border-bottom:1px solid var(--line);
  text-align:right; vertical-align:top; }
table.data th { background:#f0f3f9; font-weight:600; position:sticky; top:0; }
table.data td.t, table.data th.t { text-align:left; }
table.data tr:nth-child(even) td { background:#fafbfd; }
p.tablenote { font-size:12px; color:var(--muted); margin:4px 0 0; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:12px; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _tile(t: Tile) -> str:
    tone = f" {_e(t.tone)}" if t.tone else ""
    note = f'<div class="n">{_e(t.note)}</div>' if t.note else ""
    return (
        f'<div class="tile{tone}"><div class="l">{_e(t.label)}</div>'
        f'<div class="v">{_e(t.value)}</div>{note}</div>'
    )


def _figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (
        f'<figure class="fig" id="{_e(f.key)}" data-figure="{_e(f.key)}">'
        f'<img alt="{_e(f.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption><b>{_e(f.title)}.</b> {_e(f.caption)}</figcaption></figure>"
    )


def _table(t: Table) -> str:
    def cls(i: int) -> str:
        return ' class="t"' if i in t.text_columns else ""

    head = "".join(f"<th{cls(i)}>{_e(c)}</th>" for i, c in enumerate(t.columns))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{_e(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in t.rows
    )
    if not t.rows:
        body = f'<tr><td class="t" colspan="{len(t.columns)}">none</td></tr>'
    note = f'<p class="tablenote">{_e(t.caption)}</p>' if t.caption else ""
    return (
        f'<div class="tablewrap"><table class="data" id="{_e(t.key)}" data-table="{_e(t.key)}">'
        f"<caption>{_e(t.title)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>{note}</div>"
    )


def _section(s: Section) -> str:
    parts = [f'<section class="block" id="{_e(s.key)}"><h2>{_e(s.title)}</h2>']
    if s.intro:
        parts.append(f'<p class="intro">{_e(s.intro)}</p>')
    if s.tiles:
        parts.append('<div class="tiles">' + "".join(_tile(t) for t in s.tiles) + "</div>")
    parts += [_figure(f) for f in s.figures]
    parts += [_table(t) for t in s.tables]
    parts.append("</section>")
    return "".join(parts)


def render(doc: ReportDoc) -> str:
    hero = ""
    if doc.headline or doc.summary:
        items = "".join(f"<li>{_e(line)}</li>" for line in doc.summary)
        headline = f'<p class="headline">{_e(doc.headline)}</p>' if doc.headline else ""
        hero = f'<div class="hero" id="summary">{headline}<ul>{items}</ul></div>'
    toc = "".join(f'<a href="#{_e(s.key)}">{_e(s.title)}</a>' for s in doc.sections)
    body = "".join(_section(s) for s in doc.sections)
    footer = f"<footer>{_e(doc.footer)}</footer>" if doc.footer else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No script, no fetch: a policy that forbids both makes any slip visible in a browser.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{_e(doc.title)}</title><style>{CSS}</style></head><body>"
        f'<header class="top"><h1>{_e(doc.title)}</h1><p>{_e(doc.subtitle)}</p></header>'
        f'<main>{hero}<nav class="toc">{toc}</nav>{body}</main>{footer}</body></html>\n'
    )
