"""Provider daemon: capacity, sandboxed runtime, diagnosis, receipts, task API, settlement."""
