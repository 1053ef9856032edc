"""CLI commands: one module per family registers its commands on flatcheck.cli.app; the
probes' own commands are generated from their Options (probes.py)."""
