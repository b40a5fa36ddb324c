"""manifests stage."""
