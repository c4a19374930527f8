"""Jinja templates (package data: steptp._templates)."""
