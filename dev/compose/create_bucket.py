#!/usr/bin/env python3
"""Create the demo's S3 bucket (idempotent), waiting for the S3 server to come up.

Runs in the icesink image (pyarrow's S3 client), so the demo needs no extra MinIO client image.
Environment: ICESINK_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, BUCKET.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    from pyarrow import fs

    endpoint = os.environ.get("ICESINK_S3_ENDPOINT", "http://minio:9000")
    bucket = os.environ.get("BUCKET", "warehouse")
    s3 = fs.S3FileSystem(
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region=os.environ.get("AWS_REGION", "us-east-1"),
        endpoint_override=endpoint.split("://", 1)[-1],
        scheme="https" if endpoint.startswith("https://") else "http",
        allow_bucket_creation=True,
        connect_timeout=3,
        request_timeout=10,
    )
    deadline = time.monotonic() + float(os.environ.get("TIMEOUT_S", "120"))
    while True:
        try:
            if s3.get_file_info(bucket).type == fs.FileType.NotFound:
                s3.create_dir(bucket)
                print(f"created bucket {bucket} at {endpoint}")
            else:
                print(f"bucket {bucket} exists at {endpoint}")
            return 0
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"cannot create bucket {bucket} at {endpoint}: {exc}", file=sys.stderr)
                return 1
            time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
