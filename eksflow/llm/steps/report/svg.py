"""Inline SVG for the page: the DAG laid out by dependency depth, line charts, grouped bars. Pure text functions.

Every piece of text that reaches the markup goes through `esc` (task names, messages and labels come from the
workflow and from users). Sizes are in SVG user units; each drawing scales to its container (viewBox, no fixed
width), so the page reads on a laptop and in the Argo UI's artifact panel alike.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FONT = "font-family='system-ui, -apple-system, Segoe UI, sans-serif'"
# phase -> (stroke, fill): green done, red failed, blue running, grey not run
PHASE_COLOURS = {
    "Succeeded": ("#2e7d32", "#e8f5e9"),
    "Failed": ("#c62828", "#ffebee"),
    "Error": ("#c62828", "#ffebee"),
    "Running": ("#1565c0", "#e3f2fd"),
    "Skipped": ("#8d8d8d", "#f4f4f4"),
    "Omitted": ("#8d8d8d", "#f4f4f4"),
    "Pending": ("#b0b0b0", "#fbfbfb"),
}
SERIES_COLOURS = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#558b2f")
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 50, 40, 16, 16
NAME_CHARS = 20


def esc(text: object) -> str:
    """Text safe inside markup and attribute values."""
    return html.escape(str(text), quote=True)


def phase_colours(phase: str) -> tuple[str, str]:
    """(stroke, fill) of a phase; an unknown phase looks pending."""
    return PHASE_COLOURS.get(phase, PHASE_COLOURS["Pending"])


def clip(text: str, chars: int) -> str:
    """`text` cut to `chars` characters with an ellipsis."""
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


# -- the DAG --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """One task as drawn: name, phase, what the second line says, what hovering says, dependencies."""

    name: str
    phase: str
    detail: str  # e.g. "Succeeded · 3m12s"
    tooltip: str
    needs: tuple[str, ...] = ()


def depths(boxes: Sequence[Box]) -> dict[str, int]:
    """Each task's column: 0 without dependencies, else one more than its deepest dependency (cycles cut)."""
    by_name = {b.name: b for b in boxes}
    found: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str]) -> int:
        if name in found:
            return found[name]
        needs = [n for n in by_name[name].needs if n in by_name and n != name and n not in seen]
        found[name] = 1 + max((depth(n, seen | {name}) for n in needs), default=-1)
        return found[name]

    for box in boxes:
        depth(box.name, frozenset())
    return found


def dag(lanes: Sequence[tuple[str, Sequence[Box]]]) -> str:
    """The DAG as one SVG: each lane (main DAG, exit handler) laid out left to right by depth, edges as curves."""
    parts: list[str] = []
    positions: dict[tuple[int, str], tuple[float, float]] = {}
    y0 = float(PAD)
    width = 0.0
    for lane_no, (label, boxes) in enumerate(lanes):
        if not boxes:
            continue
        column = depths(boxes)
        rows: dict[int, int] = {}
        parts.append(f"<text x='{PAD}' y='{y0 + 12:.0f}' class='lane'>{esc(label)}</text>")
        y0 += 22
        for box in boxes:
            col = column[box.name]
            row = rows.get(col, 0)
            rows[col] = row + 1
            positions[(lane_no, box.name)] = (PAD + col * (BOX_W + GAP_X), y0 + row * (BOX_H + GAP_Y))
        for box in boxes:
            x2, y2 = positions[(lane_no, box.name)]
            for need in box.needs:
                if need == box.name or (lane_no, need) not in positions:
                    continue
                x1, y1 = positions[(lane_no, need)]
                sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H / 2, x2, y2 + BOX_H / 2
                mid = (sx + ex) / 2
                parts.append(
                    f"<path d='M{sx:.0f},{sy:.0f} C{mid:.0f},{sy:.0f} {mid:.0f},{ey:.0f} {ex - 6:.0f},{ey:.0f}' "
                    "class='edge' marker-end='url(#arrow)'/>"
                )
        for box in boxes:
            x, y = positions[(lane_no, box.name)]
            stroke, fill = phase_colours(box.phase)
            dash = " stroke-dasharray='5 3'" if box.phase in ("Skipped", "Omitted", "Pending") else ""
            parts.append(
                f"<g class='task' data-phase='{esc(box.phase)}'><title>{esc(box.tooltip)}</title>"
                f"<rect x='{x:.0f}' y='{y:.0f}' width='{BOX_W}' height='{BOX_H}' rx='8' fill='{fill}' "
                f"stroke='{stroke}' stroke-width='2'{dash}/>"
                f"<text x='{x + 12:.0f}' y='{y + 21:.0f}' class='name'>{esc(clip(box.name, NAME_CHARS))}</text>"
                f"<text x='{x + 12:.0f}' y='{y + 40:.0f}' class='detail' fill='{stroke}'>{esc(box.detail)}</text></g>"
            )
        width = max(width, PAD + (max(column.values()) + 1) * (BOX_W + GAP_X))
        y0 += max(rows.values()) * (BOX_H + GAP_Y) + 14
    height = y0 + PAD - 14
    return (
        # Drawn at its own size, one unit a CSS pixel, in a box that scrolls: scaled to the page's width, a
        # flagship's 14 columns put its 13-unit labels at ~6 px.
        f"<svg class='dag' width='{width:.0f}' height='{height:.0f}' viewBox='0 0 {width:.0f} {height:.0f}' "
        "role='img' aria-label='workflow DAG' "
        f"xmlns='http://www.w3.org/2000/svg' {FONT}>"
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
        "orient='auto'><path d='M0,0 L10,5 L0,10 z' fill='#777'/></marker></defs>"
        "<style>.lane{font-size:12px;fill:#555;font-weight:600}.name{font-size:13px;font-weight:600;fill:#222}"
        ".detail{font-size:11.5px}.edge{fill:none;stroke:#999;stroke-width:1.5}</style>" + "".join(parts) + "</svg>"
    )


# -- charts ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line of a chart: (x, y) points in x order."""

    label: str
    points: tuple[tuple[float, float], ...]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def tick_label(value: float) -> str:
    """Short tick text: 0.001 -> `0.001`, 12000 -> `12k`, 1.5e-5 -> `1.5e-05`."""
    if value == 0:
        return "0"
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:.3g}"


def line_chart(title: str, series: Sequence[Series], *, x_label: str = "step", width: int = 460) -> str:
    """A line chart with axes, round ticks and a legend when there are several series; a note when empty."""
    height, left, right, top, bottom = 250, 58, 14, 30, 40
    clean = [Series(s.label, tuple(p for p in s.points if all(map(math.isfinite, p)))) for s in series]
    clean = [s for s in clean if s.points]
    head = (
        f"<svg class='chart' viewBox='0 0 {width} {height}' role='img' aria-label='{esc(title)}' "
        f"xmlns='http://www.w3.org/2000/svg' {FONT}>"
        f"<text x='{left}' y='18' font-size='13' font-weight='600' fill='#222'>{esc(title)}</text>"
    )
    if not clean:
        return head + f"<text x='{left}' y='{height / 2:.0f}' font-size='12' fill='#777'>no data logged</text></svg>"
    xs = [x for s in clean for x, _ in s.points]
    ys = [y for s in clean for _, y in s.points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    x_lo, x_hi, y_lo, y_hi = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / ((x_hi - x_lo) or 1.0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_lo) / ((y_hi - y_lo) or 1.0) * plot_h

    parts = [head]
    for y in y_ticks:
        parts.append(
            f"<line x1='{left}' x2='{left + plot_w}' y1='{sy(y):.1f}' y2='{sy(y):.1f}' stroke='#eee'/>"
            f"<text x='{left - 6}' y='{sy(y) + 4:.1f}' font-size='10.5' fill='#666' text-anchor='end'>"
            f"{esc(tick_label(y))}</text>"
        )
    for x in x_ticks:
        parts.append(
            f"<text x='{sx(x):.1f}' y='{top + plot_h + 15}' font-size='10.5' fill='#666' text-anchor='middle'>"
            f"{esc(tick_label(x))}</text>"
        )
    parts.append(
        f"<path d='M{left},{top} V{top + plot_h} H{left + plot_w}' fill='none' stroke='#888'/>"
        f"<text x='{left + plot_w / 2:.0f}' y='{height - 6}' font-size='11' fill='#555' text-anchor='middle'>"
        f"{esc(x_label)}</text>"
    )
    for n, s in enumerate(clean):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        parts.append(
            f"<polyline class='series' points='{points}' fill='none' stroke='{colour}' stroke-width='2'>"
            f"<title>{esc(s.label)}</title></polyline>"
        )
        if len(s.points) <= 40:
            parts += [
                f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.6' fill='{colour}'><title>{esc(s.label)}: "
                f"{esc(tick_label(x))}, {y:.6g}</title></circle>"
                for x, y in s.points
            ]
        if len(clean) > 1:
            ly = top + 4 + n * 14
            parts.append(
                f"<rect x='{left + plot_w - 120}' y='{ly}' width='10' height='3' fill='{colour}'/>"
                f"<text x='{left + plot_w - 106}' y='{ly + 5}' font-size='10.5' fill='#444'>"
                f"{esc(clip(s.label, 18))}</text>"
            )
    return "".join(parts) + "</svg>"


def bar_chart(
    title: str,
    values: Mapping[str, Mapping[str, float]],
    groups: Sequence[str],
    marks: Mapping[str, float] | None = None,
) -> str:
    """Horizontal grouped bars on [0, 1]: one row per metric, one bar per group (base, tuned, champion).

    `marks` draws each metric's gate threshold as a dashed line across its row.
    """
    marks = marks or {}
    width, left, right, row_gap, bar_h = 520, 130, 60, 14, 12
    rows = [m for m in values if any(g in values[m] for g in groups)]
    row_h = bar_h * len(groups) + row_gap
    legend_h = 24
    height = 30 + legend_h + row_h * len(rows) + 10
    plot_w = width - left - right
    parts = [
        f"<svg class='chart bars' viewBox='0 0 {width} {height}' role='img' aria-label='{esc(title)}' "
        f"xmlns='http://www.w3.org/2000/svg' {FONT}>"
        f"<text x='10' y='18' font-size='13' font-weight='600' fill='#222'>{esc(title)}</text>"
    ]
    for n, group in enumerate(groups):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)] if n else "#9e9e9e"
        parts.append(
            f"<rect x='{left + n * 110}' y='30' width='12' height='12' fill='{colour}'/>"
            f"<text x='{left + n * 110 + 17}' y='40' font-size='11' fill='#444'>{esc(group)}</text>"
        )
    for r, metric in enumerate(rows):
        y = 30 + legend_h + r * row_h
        parts.append(
            f"<text x='{left - 8}' y='{y + row_h / 2:.0f}' font-size='12' fill='#222' text-anchor='end'>"
            f"{esc(clip(metric, 18))}</text>"
        )
        for n, group in enumerate(groups):
            value = values[metric].get(group)
            if value is None or not math.isfinite(value):
                continue
            colour = SERIES_COLOURS[n % len(SERIES_COLOURS)] if n else "#9e9e9e"
            w = max(0.0, min(value, 1.0)) * plot_w
            by = y + n * bar_h
            parts.append(
                f"<rect class='bar' x='{left}' y='{by}' width='{w:.1f}' height='{bar_h - 2}' fill='{colour}'>"
                f"<title>{esc(metric)} {esc(group)}: {value:.4f}</title></rect>"
                f"<text x='{left + w + 4:.1f}' y='{by + bar_h - 3}' font-size='10.5' fill='#444'>{value:.3f}</text>"
            )
        if metric in marks and math.isfinite(marks[metric]):
            mx = left + max(0.0, min(marks[metric], 1.0)) * plot_w
            parts.append(
                f"<line x1='{mx:.1f}' x2='{mx:.1f}' y1='{y - 3}' y2='{y + row_h - row_gap + 3}' stroke='#c62828' "
                f"stroke-width='2' stroke-dasharray='4 3'><title>gate: {esc(metric)} threshold "
                f"{marks[metric]:g}</title></line>"
            )
    parts.append(f"<line x1='{left}' x2='{left}' y1='{30 + legend_h - 4}' y2='{height - 8}' stroke='#888'/>")
    return "".join(parts) + "</svg>"
