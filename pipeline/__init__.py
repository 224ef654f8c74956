"""stepcast pipeline."""
