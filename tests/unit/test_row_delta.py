"""The sink's snapshot producer: which manifests a commit merges, by which table properties."""

from __future__ import annotations

from typing import Any

import pytest

from service.iceberg.row_delta import ManifestMerge


class _Manifest:
    def __init__(self, length: int) -> None:
        self.manifest_length = length


def _lengths(picked: list[Any]) -> list[int]:
    return [m.manifest_length for m in picked]


def test_manifest_merge_reads_the_tables_commit_manifest_properties() -> None:
    assert ManifestMerge.of({}) == ManifestMerge(enabled=True, min_count=2, target_bytes=64 * 1024)
    assert ManifestMerge.of(
        {"commit.manifest.min-count-to-merge": "100", "commit.manifest.target-size-bytes": "8388608"}
    ) == ManifestMerge(enabled=True, min_count=100, target_bytes=8388608)
    with pytest.raises(ValueError, match=r"commit\.manifest\.min-count-to-merge must be a whole number"):
        ManifestMerge.of({"commit.manifest.min-count-to-merge": "two"})


def test_a_commit_merges_the_smallest_manifests_within_the_target_size() -> None:
    merge = ManifestMerge(target_bytes=100)
    manifests: list[Any] = [_Manifest(60), _Manifest(10), _Manifest(30), _Manifest(200)]
    assert _lengths(merge.pick(manifests)) == [10, 30, 60]
    assert _lengths(ManifestMerge(target_bytes=50).pick(manifests)) == [10, 30]
    big: list[Any] = [_Manifest(200)]
    assert merge.pick(big) == []  # nothing small: the new manifest stays alone


def test_a_commit_merges_nothing_below_the_minimum_count_or_when_merging_is_off() -> None:
    manifests: list[Any] = [_Manifest(10), _Manifest(10)]
    assert ManifestMerge(min_count=4).pick(manifests) == []
    assert len(ManifestMerge(min_count=3).pick(manifests)) == 2
    assert ManifestMerge.of({"commit.manifest-merge.enabled": "false"}).pick(manifests) == []
