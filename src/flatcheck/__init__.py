"""flatcheck: loss-landscape geometry of trained checkpoints.

Public API: build a RunConfig, call run(), read the Report.
"""

__version__ = "0.1.0"

from .api import Session, open_session, run  # noqa: E402
from .config import ProbeRequest, RunConfig, probe_requests  # noqa: E402
from .errors import FlatcheckError, InputError  # noqa: E402
from .probes.registry import create_probe, list_probes, register_probe  # noqa: E402
from .report.result import ProbeResult, Report  # noqa: E402

__all__ = [
    "__version__",
    "run",
    "open_session",
    "Session",
    "RunConfig",
    "ProbeRequest",
    "probe_requests",
    "list_probes",
    "create_probe",
    "register_probe",
    "Report",
    "ProbeResult",
    "FlatcheckError",
    "InputError",
]
