"""The tuning database: SQLAlchemy tables (models.py), one session context manager (store.py), the
queries (queries.py), JSON export / import (transfer.py), schema versions and migrations (schema.py,
migrations.py).

Importing this package costs nothing: schema.py is pure Python, and only models.py, store.py,
queries.py and transfer.py import SQLAlchemy (the runtime's read side, attngen.db.winners, reads
with the stdlib sqlite3).
"""
