"""Read side of wdsloader."""
