"""The subcommands of scripts/gpu/probe.py, one file a framework or a job."""
