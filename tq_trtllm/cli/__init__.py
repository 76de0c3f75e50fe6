"""Command-line front ends (click). Each module is one console script."""
