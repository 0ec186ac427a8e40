"""Files on the local disk or any pyarrow filesystem: folders with atomic writes, locks, their errors."""
