"""CLI commands, one module per family; each registers itself with flatcheck.cli.probe_command."""
