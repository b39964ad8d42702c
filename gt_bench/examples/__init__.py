"""Small, importable models that the tutorials and tests share."""
