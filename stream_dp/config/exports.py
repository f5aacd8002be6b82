"""The ``exports`` section: pseudonymized, generalized event rows for partners (docs/exports.md).

An export is NOT differentially private: it sends one row per event to a partner. To enable
one, the configuration must state, per partner: the topic, the allow-list of fields, a
generalization rule for *every* listed field (free text never leaves as it came: a text field
must be cut to a ``prefix:N``, a date to ``year`` or ``month``, a number to ``bucket:N``), and
the purpose and legal basis of the transfer. ``k_anonymity`` (optional, k ≥ 2) suppresses
the rows whose combination of generalized fields fewer than k people of the window share.

Exports need ``input.keyed_by_user: true``: the worker exports the events of the input
partitions it owns, as their windows close (docs/exports.md#delivery).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stream_dp.config.numbers import OptionalInteger
from stream_dp.privacy.exports import RULE_SYNTAX, Rule, parse_rule


class ExportConfig(BaseModel):
    """One partner's export."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partner: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="the recipient; its pseudonym key is derived from the main key and this name",
    )
    topic: str = Field(min_length=1, max_length=249, description="the partner's topic")
    fields: list[str] = Field(
        min_length=1, description="the allow-list of input fields exported (each needs a rule)"
    )
    generalize: dict[str, str] = Field(
        description=f"field → its generalization rule: {RULE_SYNTAX}"
    )
    k_anonymity: OptionalInteger = Field(
        None,
        ge=2,
        description="suppress rows whose generalized fields fewer than k pseudonyms of the "
        "window share (unset: no suppression)",
    )
    purpose: str = Field(
        min_length=1, max_length=1000, description="why the partner receives the rows"
    )
    legal_basis: str = Field(
        min_length=1, max_length=1000, description="the legal basis of the transfer"
    )

    @field_validator("generalize")
    @classmethod
    def _rules_parse(cls, value: dict[str, str]) -> dict[str, str]:
        for field, rule in value.items():
            try:
                parse_rule(rule)
            except ValueError as exc:
                raise ValueError(f"generalize.{field}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _every_field_has_a_rule(self) -> ExportConfig:
        repeated = sorted({f for f in self.fields if self.fields.count(f) > 1})
        if repeated:
            raise ValueError(f"export {self.partner}: fields listed twice: {', '.join(repeated)}")
        reserved = sorted({"pseudonym", "timestamp"} & set(self.fields))
        if reserved:
            raise ValueError(
                f"export {self.partner}: every record carries pseudonym and timestamp of its "
                f"own; remove {', '.join(reserved)} from fields"
            )
        missing = [f for f in self.fields if f not in self.generalize]
        if missing:
            raise ValueError(
                f"export {self.partner}: fields {', '.join(missing)} have no generalization "
                f"rule; add generalize: {{FIELD: RULE}} for each ({RULE_SYNTAX}) — nothing "
                "leaves as it came, free text only as a prefix:N"
            )
        unused = sorted(set(self.generalize) - set(self.fields))
        if unused:
            raise ValueError(
                f"export {self.partner}: generalize names {', '.join(unused)}, which fields "
                "does not list; add them to fields or remove their rules"
            )
        return self

    @property
    def rules(self) -> list[tuple[str, Rule]]:
        """(field, rule) in the order of ``fields``."""
        return [(f, parse_rule(self.generalize[f])) for f in self.fields]


def export_problem(
    exports: Sequence[ExportConfig],
    *,
    keyed_by_user: bool,
    user_field: str,
    time_field: str,
    other_topics: Sequence[str],
) -> str | None:
    """What is wrong with the exports among the other settings, or None."""
    if not exports:
        return None
    if not keyed_by_user:
        return (
            "exports need input.keyed_by_user: true (the worker exports the events of the "
            "input partitions it owns); key the input by user id or remove exports"
        )
    partners = [e.partner for e in exports]
    topics = [e.topic for e in exports]
    for what, names in (("partner", partners), ("topic", topics)):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            return f"each export needs its own {what}; repeated: {', '.join(repeated)}"
    clash = sorted(set(topics) & set(other_topics))
    if clash:
        return f"export topics must be topics of their own; {', '.join(clash)} is already used"
    for e in exports:
        if user_field in e.fields:
            return (
                f"export {e.partner} lists the user field {user_field!r}: the raw id never "
                "leaves (each record carries the partner's pseudonym); remove it from fields"
            )
        if time_field in e.fields:
            return (
                f"export {e.partner} lists the time field {time_field!r}: every record "
                "carries its window under timestamp; remove it from fields"
            )
    return None
