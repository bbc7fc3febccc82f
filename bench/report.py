"""The table of ``python -m bench``: printed, as JSON, and written into ``docs/performance.md`` between its
markers (the hand-written text around them stays)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from bench.common import Figure

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def table(figures: list[Figure]) -> str:
    head = ("figure", "value", "baseline", "ratio", "target", "verdict")
    rows = [(f.name, f"{fmt(f.value)} {f.unit}", f"{fmt(f.baseline)} {f.unit if f.baseline is not None else ''}".strip(),
             fmt(f.ratio), f.target, f.verdict()) for f in figures]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*head), line.format(*("-" * w for w in widths))]
    out += [line.format(*r) for r in rows]
    notes = [f"  {f.name}: {f.what}" + (f" [baseline: {f.baseline_what}]" if f.baseline_what else "")
             + (f"\n      limited by: {f.limit}" if f.limit else "") for f in figures]
    return "\n".join(out) + "\n\n" + "\n".join(notes)


def markdown(figures: list[Figure], meta: dict[str, Any]) -> str:
    m, v = meta["machine"], meta["versions"]
    lines = [f"Measured {meta['date']} by `python -m bench{meta['args']}` in {meta['seconds']:.0f} s.", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB memory, disk {m['disk']}; "
             f"load average at the start {m['loadavg'][0]}"
             f"{' (a busy machine: read the ratios)' if m['loadavg'][0] >= 1.0 else ''}.", "",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".", "",
             "| figure | what | value | baseline (same run) | ratio | target | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in figures:
        base = "-" if f.baseline is None else f"{fmt(f.baseline)} {f.unit} ({f.baseline_what})"
        lines.append(f"| `{f.name}` | {f.what} | {fmt(f.value)} {f.unit} | {base} | {fmt(f.ratio)} | {f.target} | "
                     f"**{f.verdict()}** |")
    limited = [f for f in figures if f.limit]
    if limited:
        lines += ["", "What limits each figure that falls short (or was not measured):", ""]
        lines += [f"- `{f.name}`: {f.limit}" for f in limited]
    return "\n".join(lines)


def write_doc(figures: list[Figure], meta: dict[str, Any], doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    doc.write_text(f"{before}{BEGIN}\n{markdown(figures, meta)}\n{END}{after}")


def today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
