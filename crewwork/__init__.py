"""crewwork: a durable runtime for AI agent work, built on Temporal."""

__version__ = "0.1.0"
