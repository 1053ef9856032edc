"""Subprocesses in tests."""

# A subprocess that has not ended after this long is hung: the limit only stops the suite from
# waiting forever. It is far above what any check needs on a loaded machine (a CLI process that
# takes 4 s of CPU can take minutes of wall-clock time there), so no assertion depends on speed.
HANG_GUARD = 1800
