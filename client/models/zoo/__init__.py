"""Real trained models that PyPI packages ship, ported to JAX."""
