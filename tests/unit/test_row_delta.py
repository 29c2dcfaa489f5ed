"""The sink's snapshot producer: which table properties make it merge manifests."""

from __future__ import annotations

import pytest

from service.iceberg.row_delta import ManifestMerge


def test_manifest_merge_reads_the_tables_commit_manifest_properties() -> None:
    assert ManifestMerge.of({}) == ManifestMerge(enabled=True, min_count=2, target_bytes=512 * 1024)
    assert ManifestMerge.of(
        {"commit.manifest.min-count-to-merge": "100", "commit.manifest.target-size-bytes": "8388608"}
    ) == ManifestMerge(enabled=True, min_count=100, target_bytes=8388608)
    assert not ManifestMerge.of({"commit.manifest-merge.enabled": "false"}).merges([])
    with pytest.raises(ValueError, match=r"commit\.manifest\.min-count-to-merge must be a whole number"):
        ManifestMerge.of({"commit.manifest.min-count-to-merge": "two"})
