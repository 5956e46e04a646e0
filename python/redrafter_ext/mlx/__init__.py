"""MLX backend of redrafter_ext (placeholder init: replaced at merge)."""
