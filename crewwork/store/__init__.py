"""The store: the canonical record of work items, attempts, events, artifacts, fences and leases (SQLAlchemy 2 async,
Alembic migrations; PostgreSQL canonical, SQLite embedded). `store.py`'s docstring is the table of its modules; no
module outside this package writes SQL (tests/unit/test_store_boundary.py)."""
