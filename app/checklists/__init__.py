"""The built-in checklists (YAML), shipped as package data."""
