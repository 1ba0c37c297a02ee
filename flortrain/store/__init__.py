"""The store: SQLite for runs, source snapshots, blocks, checkpoints and captured output, plus
checkpoint blob files. Writes are crash-safe: a blob is written and renamed into place before the
row that commits it; a run killed mid-record stays readable and reads as incomplete."""

from flortrain.store.db import Store, open_store, store_path

__all__ = ["Store", "open_store", "store_path"]
