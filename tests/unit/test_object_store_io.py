"""icesink's FileIO hands pyarrow an ADLS SAS token in the one form pyarrow takes."""

from __future__ import annotations

import pytest

from service.model.object_store import ObjectStoreIO

TOKEN = "sv=2021-08-06&ss=b&srt=sco&sp=racwdl&se=2030-01-01T00%3A00%3A00Z&spr=https&sig=abc%3D"


@pytest.mark.parametrize("given", [TOKEN, f"?{TOKEN}"], ids=["as-az-cli-prints-it", "as-the-portal-shows-it"])
def test_a_sas_token_reaches_pyarrow_with_one_leading_question_mark(given: str) -> None:
    """pyarrow appends the token to its URLs as it is: without the "?" the query would become part of
    the path (the Azurite test, tests/sink/test_catalogs.py, shows what Azure answers then)."""
    io = ObjectStoreIO({"adls.account-name": "acct", "adls.sas-token": given})
    assert io.properties["adls.sas-token"] == f"?{TOKEN}"


def test_properties_without_a_sas_token_are_left_as_given() -> None:
    properties = {"adls.account-name": "acct", "adls.account-key": "a2V5"}
    assert ObjectStoreIO(properties).properties == properties
