"""Loading cluster specs: a built-in name (``8xA100-nvlink``) or a YAML/JSON file path."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import yaml

from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidClusterError


def builtin_names() -> list[str]:
    root = resources.files("service.cluster") / "specs"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_cluster_spec(name_or_path: str) -> ClusterSpec:
    """Return the validated spec; raise :class:`InvalidClusterError` with the culprit named."""
    if name_or_path in builtin_names():
        text = (resources.files("service.cluster") / "specs" / f"{name_or_path}.yaml").read_text()
        source = name_or_path
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise InvalidClusterError(
                f"no cluster spec {name_or_path!r}: not a file and not a built-in "
                f"({', '.join(builtin_names())})"
            )
        text, source = path.read_text(), str(path)
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidClusterError(f"{source}: not valid YAML/JSON: {exc}") from None
    return ClusterSpec.from_dict(data)
