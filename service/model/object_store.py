"""The sink's FileIO: pyiceberg's PyArrow FileIO, with S3 files opened on their first write.

pyarrow's S3 output stream starts a multipart upload when it is opened and completes it when it is
closed: three requests for every file, however small. With ``allow_delayed_open`` a file smaller than
one part is a single PUT at close. A sink writes many small files (each commit's manifests and manifest
list, each batch's data and delete files, per table): measured against the dev stack's MinIO, 6 ms per
small file by default, 2.5 ms opened late; against a remote object store each request saved is a
round trip. The cost: a bucket that does not exist is reported when the file is closed rather than
opened, which fails the write all the same.

It also reads and writes ADLS locations in their canonical form,
``abfs[s]://<container>@<account>.dfs.core.windows.net/<path>`` (what Iceberg's Java ADLSFileIO and
every other engine write): pyiceberg 0.12 hands pyarrow ``<container>@<account>...`` as the container
(apache/iceberg-python#2698), while pyarrow's AzureFileSystem wants ``<container>/<path>`` and takes the
account from ``adls.account-name``. An ADLS SAS token is handed to pyarrow with its leading ``?``,
whichever form it was given in (below).

Tables the sink opens use it through the catalog's ``py-io-impl`` property (a ``py-io-impl`` of the
catalog's configuration wins), so the Spark tasks, which load the FileIO from the table's properties,
use it too.
"""

from __future__ import annotations

from urllib.parse import urlparse

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io import ADLS_ACCOUNT_NAME, ADLS_SAS_TOKEN, PY_IO_IMPL, S3_RETRY_STRATEGY_IMPL
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

PATH = f"{__name__}.ObjectStoreIO"
AZURE_SCHEMES = ("abfs", "abfss", "wasb", "wasbs")


class ObjectStoreIO(PyArrowFileIO):
    def __init__(self, properties: Properties = EMPTY_DICT):
        sas = properties.get(ADLS_SAS_TOKEN)
        if sas and not sas.startswith("?"):
            # pyarrow appends the token to its request URLs as it is: without the "?" the query becomes
            # part of the path, and Azure answers "The specified resource name length is not within the
            # permissible limits". `az storage account generate-sas` prints a token without it, the
            # portal with it; the maintainer's ADLSFileIO is given it without (maintenance/spark.py).
            properties = {**properties, ADLS_SAS_TOKEN: f"?{sas}"}
        super().__init__(properties)

    @staticmethod
    def parse_location(location: str, properties: Properties = EMPTY_DICT) -> tuple[str, str, str]:
        scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
        if scheme in AZURE_SCHEMES and "@" in netloc:
            container, host = netloc.split("@", 1)
            account = properties.get(ADLS_ACCOUNT_NAME)
            if account and host.split(".", 1)[0] != account:
                # pyarrow reaches one account (adls.account-name): another's location would be read
                # and written in that account's container of the same name.
                raise ValueError(f"{location}: not in the storage account {account} (adls.account-name)")
            return scheme, netloc, f"{container}{urlparse(location).path}"
        return scheme, netloc, path

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        fs = super()._initialize_s3_fs(netloc)
        if not isinstance(fs, S3FileSystem) or self.properties.get(S3_RETRY_STRATEGY_IMPL):
            return fs  # a retry strategy does not survive the copy below: keep pyarrow's default open
        rebuild, (options,) = fs.__reduce__()
        return rebuild({**options, "allow_delayed_open": True})


def with_object_store_io(properties: dict[str, str]) -> dict[str, str]:
    """Catalog ``properties`` whose tables use :class:`ObjectStoreIO`, unless they name a FileIO."""
    return {PY_IO_IMPL: PATH, **properties}
