"""stepcast assets."""
