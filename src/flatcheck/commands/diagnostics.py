"""`flatcheck gap`: train vs test loss and accuracy."""

from __future__ import annotations

from ..cli import Checkpoint, probe_command


@probe_command("gap", help="Loss and accuracy on the train and test splits, and their difference.")
def gap_cmd(checkpoint: Checkpoint):
    return ["gap"], {"gap": {"missing": "error"}}, False
