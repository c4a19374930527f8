"""Rule files: YAML schema, loader and self-tests (one YAML file per strategy).

See ``rules/README.md`` (repo root) for the rule language.
"""

from .checks import check_rule
from .loader import Rule, RuleTest, default_rules_dir, difficulty_level, difficulty_score, load_rule, load_rule_text, load_rules
from .schema import PRECONDITIONS, RULE_SCHEMA, RuleError, validate_rule_data

__all__ = ["Rule", "RuleTest", "RuleError", "check_rule", "RULE_SCHEMA", "PRECONDITIONS", "load_rule", "load_rule_text",
           "load_rules", "default_rules_dir", "difficulty_score", "difficulty_level", "validate_rule_data"]
