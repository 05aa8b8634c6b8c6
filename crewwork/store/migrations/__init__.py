"""Alembic migrations of the store (env.py and versions/); `crewwork db upgrade` runs them."""
