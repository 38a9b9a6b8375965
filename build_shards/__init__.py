"""Write side."""
