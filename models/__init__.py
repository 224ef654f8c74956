"""stepcast models."""
