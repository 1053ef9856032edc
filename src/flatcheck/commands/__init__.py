"""CLI commands: one module per family declares its commands with the framework in kit.py
(kit.command, kit.probe_command, kit.lazy_commands), and flatcheck.cli registers them on its
app; the probes' own commands are generated from their Options (probes.py)."""
