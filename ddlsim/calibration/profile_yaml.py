"""Loading a calibration profile's YAML safely: bounded depth, no aliases, no duplicate keys.

A profile is a plain document that ddlsim writes; it never needs anchors or aliases, which
are how a small YAML file expands to gigabytes ("billion laughs"), nor deep nesting, which
exhausts the recursion of the loader. Both are refused from the parser's event stream, before
any object is built.
"""

from __future__ import annotations

import yaml
import yaml.constructor

from ..errors import ConfigError

__all__ = ["MAX_YAML_DEPTH", "parse_profile_yaml"]

#: Deepest nesting of mappings and lists a profile may have (a real one has 5 levels).
MAX_YAML_DEPTH = 20


def parse_profile_yaml(text: str, where: str) -> object:
    """The YAML document of a profile; :class:`ConfigError` for invalid YAML, anchors or
    aliases, nesting deeper than :data:`MAX_YAML_DEPTH`, or more than one document."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ConfigError(f"{where}: YAML anchors and aliases are not allowed in a "
                                  "calibration profile (line "
                                  f"{event.start_mark.line + 1})")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError(f"{where}: nested more than {MAX_YAML_DEPTH} levels deep "
                                      f"(line {event.start_mark.line + 1}); not a profile")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_ProfileLoader)  # noqa: S506 (a SafeLoader)
    except ConfigError:
        raise
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a 5,000-digit int, a bad date
        raise ConfigError(f"{where}: not valid YAML: "
                          f"{' '.join(str(exc).split())}") from None


class _ProfileLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (the last would win)."""

    def construct_mapping(self, node, deep=False):
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):
                if (key.tag, key.value) in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key.value!r}; give each key once",
                        key.start_mark)
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep=deep)
