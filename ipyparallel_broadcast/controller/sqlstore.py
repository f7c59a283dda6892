"""IPython Parallel's SQLite record store, found again by a restored controller.

``SQLiteDB`` keeps the hub's task records in a table of ``tasks.db``, and
checks at start that a table already there has its columns and types. SQLite
describes the primary key's type in capitals (``TEXT``), the check compares
exactly, and so every controller after the first took the table for an old
format and started another, empty one: a controller restarted with
``--restore`` lost every record. Ours compares types as SQLite does, without
case, and keeps the table. A broadcast's record also carries its engine's
outputs (``outputs``), which the in-memory stores keep and SQLite has no column
for: updates file the columns it has, where the whole update failed before.
"""

from __future__ import annotations

from ..compat.ipp import SQLiteSeam


class BroadcastSQLiteDB(SQLiteSeam):
    """``SQLiteDB``, whose table outlives the controller (``BroadcastController.db_class``)."""

    def _table_fits(self) -> bool:
        """Whether the table is absent, or has this store's columns and types (any case)."""
        lines = self._connection.execute(f"PRAGMA table_info('{self.table}')").fetchall()
        if not lines:
            return True
        found = {line[1]: str(line[2]).lower() for line in lines}
        if [line[1] for line in lines] != list(self._columns):
            self.log.warning("task records: table %s has other columns; a new one is made", self.table)
            return False
        return all(found[key] == kind.lower() for key, kind in self._column_types.items())

    def update_record(self, msg_id, rec):
        """ipyparallel's, for the keys this table has columns for."""
        columns = self._columns
        return super().update_record(msg_id, {k: v for k, v in rec.items() if k in columns})
