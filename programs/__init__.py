"""Task programs: the envelope a client writes and a provider reads (imports nothing of ours)."""
