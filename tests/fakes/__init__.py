"""Real local stand-ins for external services, shared by test modules."""
