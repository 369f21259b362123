"""The shape every section of the server's settings takes: a pydantic-settings model whose
field ``x`` is read from the environment variable ``RAYDOCK_X`` (or the alias the field
names) when it is not given, and which refuses a field it does not have."""

from __future__ import annotations

from pydantic import AliasChoices
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "RAYDOCK_"


class Section(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", populate_by_name=True)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The variable an operator sets for ``field`` (the bound an error message names)."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, AliasChoices):
            return str(alias.choices[0])
        return alias if isinstance(alias, str) else ENV_PREFIX + field.upper()
