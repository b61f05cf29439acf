"""The API's JSON parser: DRF's JSONParser with the bounded parser of untrusted JSON (decision D-167), so a body
nested 100,000 levels deep or a 5,000-digit number answers 400 REQUEST_INVALID instead of a RecursionError 500."""
from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from connector.canonical import bounded_json


class BoundedJSONParser(JSONParser):
    """`application/json` within `bounded_json`'s depth and number bounds; every failure is a ParseError. The
    charset is DRF's (`get_encoding` refuses non-text codecs such as `bz2_codec`)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            text = (stream.read() if stream is not None else b"").decode(encoding)
            return bounded_json.loads(text)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not {encoding}: {exc.reason}") from exc
        except bounded_json.JsonRefused as exc:
            raise ParseError(f"JSON parse error - {exc.detail}") from exc
