"""Seeing what a job does: the Chrome-trace timeline, per-rank metrics, progress output."""
