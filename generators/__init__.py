"""generators stage."""
