"""Erasure (admin): erasure.request, erasure.status, erasure.export. See the modules."""

from loom.ops.erasure.exporting import export
from loom.ops.erasure.requesting import request, run_removal, status

__all__ = ["export", "request", "run_removal", "status"]
