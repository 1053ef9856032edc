"""PNG figures for `flatcheck report`: one metric against another across models, coloured by
family (as in 002 Fig. 4, normalized MLS against adaptive sharpness over timm ViTs), and —
when results carry spectral densities (details "grid" + "density") — their overlay.

matplotlib is an optional dependency (`pip install flatcheck[plot]`); it is imported only
here, with the Agg backend, so plotting works on headless CI machines.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .io import write_or_rescue


@dataclass(frozen=True)
class Point:
    model: str
    family: str
    x: float
    y: float
    xerr: float | None = None
    yerr: float | None = None


@dataclass(frozen=True)
class Density:
    model: str
    family: str
    probe: str
    grid: list[float]
    density: list[float]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'flatcheck[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def write_scatter(path: str | Path, points: list[Point], *, xlabel: str, ylabel: str, logx: bool = False,
                  logy: bool = False, title: str | None = None, densities: list[Density] = (),
                  labels: bool = False) -> int:
    """Write the PNG atomically; returns how many points were drawn (log axes drop x ≤ 0).
    `labels`: each point named by its model."""
    plt = _pyplot()
    shown = [p for p in points if (not logx or p.x > 0) and (not logy or p.y > 0)]
    panels = 2 if densities else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.8), squeeze=False)
    try:
        ax = axes[0][0]
        families = sorted({p.family for p in shown} | {d.family for d in densities})
        cmap = plt.get_cmap("tab10" if len(families) <= 10 else "tab20")
        colour = {f: cmap(i % cmap.N) for i, f in enumerate(families)}
        for fam in families:
            pts = [p for p in shown if p.family == fam]
            if not pts:
                continue
            xerr = [p.xerr or 0.0 for p in pts] if any(p.xerr for p in pts) else None
            yerr = [p.yerr or 0.0 for p in pts] if any(p.yerr for p in pts) else None
            ax.errorbar([p.x for p in pts], [p.y for p in pts], xerr=xerr, yerr=yerr, fmt="o", ms=4, alpha=0.8,
                        color=colour[fam], ecolor=colour[fam], elinewidth=0.8, label=f"{fam} ({len(pts)})")
        if labels:
            for p in shown:
                ax.annotate(p.model, (p.x, p.y), xytext=(3, 3), textcoords="offset points", fontsize=6, alpha=0.8)
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        # wrapped: two long axis labels made a title wider than the figure, cut at both ends
        ax.set_title(textwrap.fill(f"{title or f'{ylabel} vs {xlabel}'} · {len(shown)} models", 60), fontsize=10)
        ax.grid(True, alpha=0.3, which="both")
        if families and len(families) <= 20:
            ax.legend(fontsize="small", title="family", loc="best")
        if densities:
            _densities(axes[0][1], densities, colour)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    write_or_rescue(path, buf.getvalue(), "--plot")  # a path that fails is written elsewhere, named
    return len(shown)


def _densities(ax, densities: list[Density], colour: dict) -> None:
    seen = set()
    for d in densities:
        pos = [(g, v) for g, v in zip(d.grid, d.density) if math.isfinite(g) and math.isfinite(v)]
        if not pos:
            continue
        label = d.family if d.family not in seen else None
        seen.add(d.family)
        ax.plot([g for g, _ in pos], [max(v, 1e-12) for _, v in pos], color=colour.get(d.family), alpha=0.6,
                lw=1, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density")
    probes = sorted({d.probe for d in densities})
    ax.set_title(f"spectral density ({', '.join(probes)}) · {len(densities)} models")
    ax.grid(True, alpha=0.3)
    if seen and len(seen) <= 20:
        ax.legend(fontsize="small", title="family")
