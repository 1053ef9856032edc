"""PNG figures. matplotlib is an optional extra: importing this module does not need it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError

MISSING = "--plot needs matplotlib: pip install 'flatcheck[plot]'"
# a log axis must stop somewhere: densities this far below the peak are numerically zero
# (the Gaussian tails between separated nodes), and showing them would flatten the plot
DYNAMIC_RANGE = 1e-10


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_plot_target(path: str, flag: str = "--plot") -> None:
    """Refuse an unusable target before minutes of Lanczos, not after."""
    if not matplotlib_available():
        raise ConfigError(MISSING)
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ConfigError(f"{flag} {path}: the figure is a PNG; give a path ending in .png")
    if target.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file path")
    if not target.parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {target.parent} does not exist")


def plot_density(path: str, grid: np.ndarray, density: np.ndarray, *, title: str,
                 nodes: np.ndarray | None = None) -> None:
    """Spectral density on a log y-axis (as Granziol 2020, Fig. 1), written atomically.

    Uses the object-oriented Figure/Agg API rather than pyplot, so a user's interactive
    backend and global figure state are left alone.
    """
    floor = float(np.max(density)) * DYNAMIC_RANGE
    fig, ax = _axes()
    ax.plot(grid, np.maximum(density, floor), color="tab:blue", lw=1.2)
    if nodes is not None and len(nodes):
        ax.plot(nodes, np.full(len(nodes), floor), "|", color="tab:red", ms=8, label="Ritz values (nodes)")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    _save_atomically(fig, Path(path))


def _axes():
    """One 7×4.5 in figure on the Agg canvas and its axes (no pyplot state)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(MISSING) from None
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def plot_nodes(path: str, nodes: np.ndarray, weights: np.ndarray, *, title: str, note: str | None = None) -> None:
    """A quadrature rule too short to smooth (a budget cut it): each node as a stem of its
    weight, nothing between or beyond the nodes, and `note` on the figure saying why."""
    fig, ax = _axes()
    # a log axis, as the density's: a node of weight 1e-6 is as much a node as one of 0.5
    floor = float(np.max(weights)) * DYNAMIC_RANGE
    shown = np.maximum(weights, floor)
    ax.vlines(nodes, floor, shown, color="tab:red", lw=1.5)
    ax.plot(nodes, shown, "o", color="tab:red", ms=4, label="Ritz values (nodes), weight / starts")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("quadrature weight")
    ax.set_title(title + (f"\nunresolved: {note}" if note else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    _save_atomically(fig, Path(path))


@dataclass(frozen=True)
class Series:
    """One field of one run along its steps (or epochs)."""

    field: str
    run: str
    x: list[float]
    y: list[float]
    yerr: list[float | None]


def plot_trajectories(path: str, series: list[Series], *, xlabel: str, ylabels: dict[str, str], logy: bool = False,
                      lrs: list[float] = ()) -> int:
    """Fields against the training step, a panel per field sharing the x axis, a line per run,
    as in MacDonald et al. 2023 Fig. 1. Each η in `lrs` adds a dashed line at 2/η — the edge
    of stability, where gradient descent's λmax settles (Cohen et al. 2021) — to the panels of
    lmax fields, or to the first panel when none is. Returns the points drawn."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(MISSING) from None
    fields = list(ylabels)
    fig = Figure(figsize=(7, 2.6 * len(fields) + 0.8), dpi=120)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(fields), 1, sharex=True, squeeze=False)[:, 0]
    runs = list(dict.fromkeys(s.run for s in series))
    colours = {r: f"C{i % 10}" for i, r in enumerate(runs)}
    edge_panels = [f for f in fields if f.split(".", 1)[0] == "lmax"] or fields[:1]
    drawn = 0
    for ax, f in zip(axes, fields):
        for s in (s for s in series if s.field == f):
            keep = [i for i, v in enumerate(s.y) if not logy or v > 0]
            xs, ys = [s.x[i] for i in keep], [s.y[i] for i in keep]
            err = [s.yerr[i] or 0.0 for i in keep]
            ax.errorbar(xs, ys, yerr=err if any(err) else None, marker="o", ms=3, lw=1.2, capsize=2,
                        color=colours[s.run], label=s.run if len(runs) > 1 else None)
            drawn += len(xs)
        if f in edge_panels:
            for i, eta in enumerate(lrs):
                ax.axhline(2 / eta, ls="--", lw=1, color="0.3" if len(lrs) == 1 else f"C{(len(runs) + i) % 10}",
                           label=f"2/η = {2 / eta:.4g} (η = {eta:g})")
        ax.set_yscale("log" if logy else "linear")
        ax.set_ylabel(ylabels[f], fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    _save_atomically(fig, Path(path))
    return drawn


def _save_atomically(fig, target: Path) -> None:
    # drawn in memory, then written atomically (a reader never sees half a PNG, a failed write
    # leaves an older file intact); a path that fails after a run is written elsewhere and named
    import io

    from .io import write_or_rescue

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_or_rescue(target, buf.getvalue(), "--plot")
