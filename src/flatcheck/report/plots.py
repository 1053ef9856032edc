"""PNG figures. matplotlib is an optional extra: importing this module does not need it."""

from __future__ import annotations

import os
import uuid
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
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(MISSING) from None
    floor = float(np.max(density)) * DYNAMIC_RANGE
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
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


def _save_atomically(fig, target: Path) -> None:
    # a reader never sees half a PNG and a failed write leaves an older file intact; the
    # temporary file is opened with mode 0o666 so the result gets the umask's permissions
    # (mkstemp would leave it 0o600)
    tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png")
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise ConfigError(f"--plot {target}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
