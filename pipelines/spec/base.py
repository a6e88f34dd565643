"""What every spec model shares: the two errors and the strict base model.

Only pydantic and the standard library are imported (the Airflow side imports the spec while
parsing DAG files).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

__all__ = ["Problem", "SpecError", "FieldError", "field_error", "Strict", "schema_rule"]

Problem = tuple[str, str]  # (dotted field, message)


class SpecError(ValueError):
    """A job spec or pool file that cannot be used; the message names the file and field."""


class FieldError(ValueError):
    """A validator's error: one or more ``(field, message)`` problems, shown as ``<path>: <message>``
    without the input (which may hold a secret).  ``field`` is a dotted path below the validated
    model's own location; ``""`` is that location itself."""

    def __init__(self, *problems: Problem) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in problems))


def field_error(message: str) -> FieldError:
    """A :class:`FieldError` about the validated field itself."""
    return FieldError(("", message))


class Strict(BaseModel):
    """Unknown fields are refused and defaults validated too."""

    # hide_input_in_errors: str(ValidationError) never echoes a value (a URI may hold a secret);
    # format_validation_error shows inputs itself, redacted.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=False, hide_input_in_errors=True)


def schema_rule(pattern: str, max_length: int | None = None) -> Callable[[dict], None]:
    """A validator's rule written into the JSON schema too, so the trigger form refuses a bad value."""

    def extra(schema: dict) -> None:
        target = next((s for s in schema.get("anyOf", []) if s.get("type") == "string"), schema)
        target["pattern"] = pattern
        if max_length is not None:
            target["maxLength"] = max_length

    return extra
