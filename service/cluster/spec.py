"""Loading cluster specs: a built-in name (``8xA100-nvlink``) or a YAML/JSON file path."""

from __future__ import annotations

from service.document import builtin_documents, load_document
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidClusterError


def builtin_names() -> list[str]:
    return builtin_documents("service.cluster", "specs")


def load_cluster_spec(name_or_path: str) -> ClusterSpec:
    """Return the validated spec; raise :class:`InvalidClusterError` with the culprit named."""
    data, _ = load_document(name_or_path, package="service.cluster", folder="specs", what="cluster spec",
                            error=InvalidClusterError)
    return ClusterSpec.from_dict(data)
