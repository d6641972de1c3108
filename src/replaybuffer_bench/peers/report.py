"""The peer table's rows as text and markdown tables, with each time against ours."""

from __future__ import annotations

from typing import Any


def row_cells(r: dict[str, Any], ours: dict[tuple[str, str], float]) -> tuple[str, ...]:
    """One row's table cells; ``ours`` gives the time the ``x ours`` column divides by."""
    if r["op"] == "bytes/transition":
        rss = r["bytes_per_transition"]
        obs = r["obs_bytes_per_transition"]
        value = "" if rss is None else f"{rss:,.0f} B"
        if obs is not None:
            value += f" (obs {obs:,.0f} B)"
        return (r["workload"], r["op"], r["peer"], value, "", "", "", r["status"])
    s = r["seconds_per_call"]
    if s is None:
        return (r["workload"], r["op"], r["peer"], "", "", "", "", r["status"])
    others = r.get("others_cores")
    base = ours.get((r["workload"], r["op"]))
    return (r["workload"], r["op"], r["peer"], f"{s * 1e6:,.1f}",
            f"{r['items_per_call'] / s:,.0f}", "" if base is None else f"{s / base:.2f}",
            "" if others is None else f"{others:.2f}", r["status"])


def _ours_seconds(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """This project's time per (workload, op): what the ``x ours`` column divides by."""
    return {(r["workload"], r["op"]): r["seconds_per_call"] for r in rows
            if r["peer"] == "replaybuffer" and r.get("seconds_per_call")}


HEADER = ("workload", "op", "peer", "us/call (or bytes)", "items/s", "x ours", "others",
          "status")


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of ``run_peers`` rows."""
    ours = _ours_seconds(rows)
    table = [HEADER] + [row_cells(r, ours) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if i in (3, 4, 5, 6) else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``run_peers`` rows."""
    ours = _ours_seconds(rows)
    lines = ["| " + " | ".join(HEADER) + " |",
             "|" + "|".join(["---"] * 3 + ["---:"] * 4 + ["---"]) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row_cells(r, ours))
                     + " |")
    return "\n".join(lines)

