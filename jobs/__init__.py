"""Entry points: thin command-line jobs that parse a config, build, and run on Ray."""
