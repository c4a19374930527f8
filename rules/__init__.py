"""Rule YAML files (package data: steptp._rules)."""
