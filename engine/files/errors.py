"""The store's error: a run folder or vector store that is inconsistent with the run asking for it."""


class StoreError(RuntimeError):
    """The vector store or run folder is inconsistent with the run asking for it (the message names the file)."""
