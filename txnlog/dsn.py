"""DSN handling: normalise to the psycopg 3 driver and keep the password out of every message."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

_DRIVERLESS = {"postgres", "postgresql"}
MASK = "***"


def parse_dsn(dsn: str | URL, password: str | None = None) -> URL:
    """Parse ``dsn`` and pin the driver to psycopg 3.

    ``postgresql://`` and ``postgres://`` (libpq style) are accepted and mapped to
    ``postgresql+psycopg://``; other drivers are refused because retry classification relies on
    psycopg's exception types. ``password``, when given, replaces the one in the DSN (so a secret
    can come from a different file or variable than the rest of the connection string).
    """
    try:
        url = make_url(dsn) if isinstance(dsn, str) else dsn
    except Exception:
        # The parser's message may echo the DSN, password included: do not chain it.
        raise ValueError("invalid Postgres DSN (not shown: it may contain a password)") from None
    if url.drivername in _DRIVERLESS:
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername != "postgresql+psycopg":
        raise ValueError(
            f"unsupported DSN driver {url.drivername!r}; use postgresql:// or postgresql+psycopg://"
        )
    if password is not None:
        url = url.set(password=password)
    return url


def masked(url: URL) -> str:
    """The URL as text with the password replaced by ``***``."""
    return url.render_as_string(hide_password=True)


def scrub(text: str, url: URL) -> str:
    """Remove the password from free text (a driver message, say) in case it was echoed."""
    password = url.password
    if password:
        text = text.replace(str(password), MASK)
    return text
