"""mining stage."""
