"""Unit tests of the `capl` command and its subcommands (capl.cli, capl.commands)."""
