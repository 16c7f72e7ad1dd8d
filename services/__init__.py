"""What every service process of ours needs: safe HTTP serving, fair use per client address,
children that die with their parent (imports nothing of ours)."""
