"""SQL storage (SQLAlchemy 2.0): contexts and their privacy ledger."""
