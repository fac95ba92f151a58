"""Number formats every report section shares: SI prefixes, durations, rates and shares."""

from __future__ import annotations


def si(value: float, unit: str, digits: int = 3) -> str:
    """`value` with an SI prefix: si(6.8e7, "B") -> "68 MB"."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"


def rate(value: float, unit: str) -> str:
    number = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{number} tok/s" if unit == "tokens" else f"{number} audio s/s"


def share(value: float) -> str:
    """A percentage that still tells 0.4% from 0%."""
    return f"{value:.0%}" if value >= 0.01 or value == 0 else f"{value:.1%}" if value >= 0.001 else "< 0.1%"


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table's lines; `|` inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
