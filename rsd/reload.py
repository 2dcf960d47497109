"""SIGHUP: read the config file again and apply what may change while rsd runs.

``Reloader.reload`` (the SIGHUP handler) re-reads ``--config``, keeps every flag given on
the command line (flags win, as at start), checks every value as at start, and then:
- options marked ``reload`` in options.py take their new values;
- an option that changed but cannot change live is named in a warning (it takes
  effect at the next start) and keeps its running value;
- every hook registered with ``register`` runs with the new settings (the log setup,
  and any other reloadable part: an auth tokens file, say) and returns what it changed.
One INFO line says what changed.

What always holds: a reload that fails (unreadable file, a bad value) changes nothing
and says why; rsd keeps running with the settings it had. A hook that raises is logged
and does not stop the other hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .options import OPTIONS, OptionError, Settings, read_config, resolve

__all__ = ["Hook", "Reloader", "reread"]

log = logging.getLogger("rsd")

# A reloadable part: given the new settings, apply them; returns what changed, as short
# phrases for the log ("3 tokens added"), empty if nothing did.
Hook = Callable[[Settings], list[str]]


def reread(settings: Settings) -> Settings:
    """The settings ``settings`` would have if rsd started now with the same command line."""
    path: str | None = getattr(settings, "config", None)
    config = read_config(path) if path else {}
    return resolve(settings.flags, config.items())


class Reloader:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._hooks: list[tuple[str, Hook]] = []

    def register(self, name: str, hook: Hook) -> None:
        """Run ``hook`` on every reload, after the options are updated."""
        self._hooks.append((name, hook))

    def reload(self) -> list[str]:
        """Apply the config file as it is now; returns what changed (also logged)."""
        current = self.settings
        try:
            fresh = reread(current)
        except OptionError as exc:
            log.error("reload refused, nothing changed: %s", exc)
            return []
        changes: list[str] = []
        for option in OPTIONS:
            old, new = current.configured.get(option.name), fresh.configured.get(option.name)
            if old == new:
                continue
            if option.reload:
                setattr(current, option.name, new)
                current.configured[option.name] = new
                changes.append(f"{option.name} {old} -> {new}")
            else:
                log.warning(
                    "%s changed from %s to %s, which takes effect only at the next start",
                    current.source(option.name), old, new,
                )
        for name, hook in self._hooks:
            try:
                changes.extend(hook(current))
            except Exception:
                log.exception("reloading %s failed; it keeps its previous state", name)
        where = getattr(current, "config", None) or "the command line (no --config)"
        log.info(
            "reloaded %s: %s", where, "; ".join(changes) if changes else "nothing changed"
        )
        return changes

