"""Command-line overrides: `apply_overrides(cfg, ["section.field=value", ...])`, with the
parsing of each value against its field's type."""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any, Optional, Sequence

from scalerl_jax.config.checks import ConfigError

if TYPE_CHECKING:
    from scalerl_jax.config.run import RunConfig


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the field type `hint` (int, float, bool, str, Optional[...]), else an error."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and not isinstance(value, str):
        return str(value)  # e.g. a numeric-looking string such as a run name "42"
    if (
        isinstance(hint, type)
        and isinstance(value, hint)
        and not (hint is int and isinstance(value, bool))
    ):
        return value
    raise ConfigError(
        f"override {key}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}"
    )


def _apply(obj: Any, tree: dict, prefix: str) -> Any:
    """`obj` with the overrides in `tree` ({field: text or subtree}), every field of one section
    replaced at once, so that fields validated together (think_min <= think_max) can move
    together."""
    cls = type(obj)
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    changes: dict[str, Any] = {}
    for name, sub in tree.items():
        key = prefix + name
        if name not in fields:
            raise ConfigError(
                f"override {key}: {cls.__name__} has no field {name!r}; fields: {sorted(fields)}"
            )
        current = getattr(obj, name)
        item = _named_sections(hints[name])
        if item is not None:  # data.domains.NAME.field=value: sections addressed by name
            changes[name] = _apply_named(current, item, sub, key)
            continue
        if not isinstance(sub, dict):
            if _parse_value(sub) is None and type(None) in typing.get_args(hints[name]):
                changes[name] = None  # e.g. sft=none turns an optional stage off
                continue
            if dataclasses.is_dataclass(current):
                raise ConfigError(
                    f"override {key}: {name!r} is a section; set one of its "
                    f"fields ({key}.<field>=...)"
                )
            changes[name] = _coerce(_parse_value(sub), hints[name], f"{key}={sub}")
            continue
        if current is None:  # an optional section that is off: start from its defaults
            section = next(
                (a for a in typing.get_args(hints[name]) if dataclasses.is_dataclass(a)), None
            )
            if section is None:
                raise ConfigError(f"override {key}: {name!r} is not a section")
            try:
                current = section()  # type: ignore[operator]  # a dataclass class
            except TypeError:
                raise ConfigError(
                    f"override {key}: {name!r} is unset and has no defaults; set it in a recipe"
                ) from None
        elif not dataclasses.is_dataclass(current):
            raise ConfigError(f"override {key}: {name!r} is a value, not a section")
        changes[name] = _apply(current, sub, key + ".")
    return dataclasses.replace(obj, **changes)


def _named_sections(hint: Any) -> Optional[type]:
    """X when `hint` is tuple[X, ...] of a dataclass X with a `name` field, else None."""
    args = typing.get_args(hint)
    if (
        typing.get_origin(hint) is tuple
        and len(args) == 2
        and args[1] is Ellipsis
        and dataclasses.is_dataclass(args[0])
        and "name" in {f.name for f in dataclasses.fields(args[0])}
    ):
        return args[0]  # type: ignore[return-value]  # a class: tuple[X, ...] holds types
    return None


def _apply_named(items: tuple, cls: type, tree: Any, key: str) -> tuple:
    """`items` (a tuple of `cls` sections) with `tree` = {name: {field: text}} applied: a
    known name is updated, a new one is added (built from its fields), `name=none` removes it
    and `key=none` clears them all."""
    if not isinstance(tree, dict):
        if _parse_value(tree) is None:
            return ()
        raise ConfigError(
            f"override {key}={tree}: {key} holds named sections; set "
            f"{key}.NAME.<field>=... (or {key}.NAME=none to drop one)"
        )
    out = list(items)
    for name, sub in tree.items():
        where = next((i for i, it in enumerate(out) if it.name == name), None)
        if not isinstance(sub, dict):
            if _parse_value(sub) is not None:
                raise ConfigError(
                    f"override {key}.{name}={sub}: set {key}.{name}.<field>=... "
                    f"or {key}.{name}=none"
                )
            if where is None:
                raise ConfigError(
                    f"override {key}.{name}=none: no such entry; have {[it.name for it in out]}"
                )
            out.pop(where)
            continue
        if "name" in sub:
            raise ConfigError(
                f"override {key}.{name}.name: the name is the key; rename by "
                f"dropping {key}.{name}=none and adding the new one"
            )
        if where is not None:
            out[where] = _apply(out[where], sub, f"{key}.{name}.")
            continue
        hints, fields = typing.get_type_hints(cls), {f.name for f in dataclasses.fields(cls)}
        values = {}
        for field, text in sub.items():
            if field not in fields or isinstance(text, dict):
                raise ConfigError(
                    f"override {key}.{name}.{field}: {cls.__name__} has no value "
                    f"field {field!r}; fields: {sorted(fields)}"
                )
            parsed = _parse_value(text)
            values[field] = (
                None
                if parsed is None and type(None) in typing.get_args(hints[field])
                else _coerce(parsed, hints[field], f"{key}.{name}.{field}={text}")
            )
        out.append(cls(name=name, **values))
    return tuple(out)


def apply_overrides(cfg: "RunConfig", overrides: Sequence[str]) -> "RunConfig":
    """`cfg` with `key.path=value` overrides, e.g. `pipeline.mode=sync`,
    `optim.learning_rate=3e-4`, `sft.steps=100`, `sampler.top_k=none`. Values are parsed as
    bool / none / int / float / text and checked against the field's type; each changed section
    is rebuilt once with all its new values and validated by its own dataclass, so a bad value
    fails with the usual ConfigError. A later override of the same key wins. Sections kept in
    a tuple by name (DataConfig.domains) are addressed by that name: `data.domains.code.weight=2`
    changes one, a new name adds one, `data.domains.code=none` drops it."""
    tree: dict = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise ConfigError(f"override {item!r}: expected key.path=value")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} was set as a value")
        node[path[-1]] = value
    return _apply(cfg, tree, "") if tree else cfg
