"""Where the daemon's config comes from: a TOML file, and ``TPUMARKET_PROVIDER_*`` variables.

Two pydantic-settings sources (:func:`provider.config.load_config` puts the environment's
first, so it wins key by key): each hands over its values with the private key already a
``SecretStr`` (no repr of a source, of its values or of a validation error shows the key) and
says where a value came from (:meth:`ProviderEnvSource.origin`, :meth:`ProviderTomlSource.origin`)
so that an error names the variable or the file. A file that cannot be read or parsed, and a
plan variable that is not a JSON object, are a ConfigError at once.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, TomlConfigSettingsSource

from provider.config_sections import ENV_PREFIX
from provider.errors import ConfigError

CONFIG_VARIABLE = ENV_PREFIX + "CONFIG"
"""Names the config file for the operator's commands: not a config key."""
SECTIONS = ("settlement", "ask", "http", "storage")
"""Tables whose keys have variables of their own (``TPUMARKET_PROVIDER_<TABLE>_<KEY>``)."""


def hide_key(values: dict[str, Any]) -> dict[str, Any]:
    """Return ``values`` with a private key given as text wrapped as a ``SecretStr``."""
    key = values.get("private_key")
    return {**values, "private_key": SecretStr(key)} if isinstance(key, str) else values


def plan_json(variable: str, text: str) -> dict[str, Any]:
    """Return the plan fields of ``text`` (a JSON object); a ConfigError naming ``variable``."""
    try:
        plan = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError's kin
        raise ConfigError(f"{variable} is not valid JSON: {exc}") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"{variable} must be a JSON object of plan fields, got {text[:60]!r}")
    return plan


class ProviderEnvSource(PydanticBaseSettingsSource):
    """The ``TPUMARKET_PROVIDER_*`` variables of an environment, as nested config values.

    ``TPUMARKET_PROVIDER_<KEY>`` sets a top-level key, ``TPUMARKET_PROVIDER_SETTLEMENT_<KEY>``
    and ``TPUMARKET_PROVIDER_ASK_<KEY>`` a key of those tables (the key part in any case),
    ``TPUMARKET_PROVIDER_PLAN`` the whole plan (JSON). Unknown keys are left to the model to
    refuse; ``TPUMARKET_PROVIDER_CONFIG`` names the file and is no key.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        """Read the provider's variables of ``environ``."""
        super().__init__(settings_cls)
        values: dict[str, Any] = {}
        self.variables: dict[tuple[str, ...], str] = {}
        for variable, text in environ.items():
            if not variable.startswith(ENV_PREFIX) or variable == CONFIG_VARIABLE:
                continue
            name = variable[len(ENV_PREFIX) :].lower()
            table, _, key = name.partition("_")
            if name == "plan":
                values["plan"] = plan_json(variable, text)
                self.variables[("plan",)] = variable
            elif table in SECTIONS and key:
                section = values.setdefault(table, {})
                if isinstance(section, dict):
                    section[key] = text
                self.variables[(table, key)] = variable
            else:
                values[name] = text
                self.variables[(name,)] = variable
        self.values = hide_key(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Not used: :meth:`__call__` hands over every value at once."""
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        """Return the values the variables set."""
        return self.values

    def origin(self, loc: tuple[str, ...]) -> str | None:
        """Return the variable that set the value at ``loc`` (or a table holding it), if any."""
        for length in range(len(loc), 0, -1):
            variable = self.variables.get(loc[:length])
            if variable is not None:
                return variable
        return None

    def __repr__(self) -> str:
        """Name the variables, not their values."""
        return f"{type(self).__name__}(variables={sorted(self.variables.values())})"


class ProviderTomlSource(TomlConfigSettingsSource):
    """The daemon's TOML file; one that is missing or does not parse is a ConfigError.

    A plan set by a source above this one (the environment's) replaces the file's whole.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        """Read ``path`` now."""
        self.path = path
        if not path.is_file():
            raise ConfigError(f"cannot read config {path}: no such file")
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            with Path(file_path).open("rb") as file:
                return hide_key(tomllib.load(file))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {self.path}: {exc}") from None

    def __call__(self) -> dict[str, Any]:
        """Return the file's values, less a plan that a source above sets."""
        values = super().__call__()
        if "plan" in self.current_state:
            return {k: v for k, v in values.items() if k != "plan"}
        return values

    def origin(self, loc: tuple[str, ...]) -> str | None:
        """Return the file when it holds the value at ``loc``."""
        node: Any = self.toml_data
        for part in loc:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return str(self.path)

    def __repr__(self) -> str:
        """Name the file, not its values."""
        return f"{type(self).__name__}(path={str(self.path)!r})"
