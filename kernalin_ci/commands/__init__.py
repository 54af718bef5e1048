"""One module per subcommand (see kernalin_ci/cli.py)."""
