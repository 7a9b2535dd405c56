"""flashtile inside the frameworks users call attention through (transformers)."""
