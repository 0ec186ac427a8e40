"""The driver's own error (no Ray imported: the command line names it among what it refuses before any Ray)."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The Ray cluster named by --address, RAY_ADDRESS or ray.address cannot be reached."""
