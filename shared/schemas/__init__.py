"""JSON Schema of every wire message, exported for producers in any language."""

from __future__ import annotations

from pathlib import Path

import orjson

from shared.messages import WIRE_MODELS

SCHEMA_DIR = Path(__file__).parent


def render() -> dict[str, bytes]:
    """File name → schema bytes, generated from the pydantic models."""
    out = {}
    for model in WIRE_MODELS:
        schema = model.model_json_schema(mode="validation")
        schema["$id"] = f"https://tokenwire.dev/schemas/{model.__name__}.json"
        out[f"{model.__name__}.json"] = (
            orjson.dumps(schema, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
        )
    return out


def export_schemas(folder: Path = SCHEMA_DIR) -> list[Path]:
    paths = []
    for name, data in render().items():
        path = folder / name
        path.write_bytes(data)
        paths.append(path)
    return paths


def stale_schemas(folder: Path = SCHEMA_DIR) -> list[str]:
    """Names of schema files that are missing or differ from the models."""
    return [
        name
        for name, data in render().items()
        if not (folder / name).is_file() or (folder / name).read_bytes() != data
    ]
