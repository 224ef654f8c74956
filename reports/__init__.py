"""stepcast reports."""
