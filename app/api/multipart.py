"""Reading one file field of a ``multipart/form-data`` body as it arrives: python-multipart's
streaming parser hands the field's bytes on as they are parsed, so nothing is spooled and no
more than a chunk is held (FastAPI's own form parsing reads the whole body first, before the
route's dependencies have run)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from python_multipart.multipart import MultipartParser, parse_options_header

from app.api.errors import invalid

Sink = Callable[[bytes], None]
MAX_HEADER_BYTES = 8 << 10
MAX_TEXT_FIELD_BYTES = 1024


class MultipartField:
    """Feed ``write`` the body's pieces: the bytes of the first part named ``name`` go to
    ``open_sink(filename)``'s writer; the parts named in ``text_fields`` are kept in
    ``values`` (each up to ``MAX_TEXT_FIELD_BYTES``); other parts are skipped. ``finish``
    says whether the field was there, whole."""

    def __init__(self, content_type: str, name: str, open_sink: Callable[[str | None], Sink],
                 text_fields: tuple[str, ...] = ()):
        media_type, params = parse_options_header(content_type)
        if media_type != b"multipart/form-data" or not params.get(b"boundary"):
            raise invalid(name, "Field required (send multipart/form-data)")
        self.name, self.open_sink, self.text_fields = name, open_sink, text_fields
        self.values: dict[str, str] = {}
        self._text: tuple[str, bytearray] | None = None  # the text part being read
        self._header_name, self._header_value = bytearray(), bytearray()
        self._disposition = b""
        self._sink: Sink | None = None  # set while inside the wanted part
        self.found = self.whole = False
        self._parser = MultipartParser(params[b"boundary"], {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._header_name.extend(
                data[start:end]),
            "on_header_value": lambda data, start, end: self._header_value.extend(
                data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }, max_header_size=MAX_HEADER_BYTES)

    def write(self, data: bytes) -> None:
        self._parser.write(data)

    def finish(self) -> None:
        self._parser.finalize()
        if not self.found:
            raise invalid(self.name, "Field required")
        if not self.whole:
            raise invalid(self.name, "the upload ended before the end of its part")

    def _part_begin(self) -> None:
        self._disposition = b""

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._disposition)
        name = params.get(b"name", b"").decode("latin-1")
        if name in self.text_fields and name not in self.values:
            self._text = (name, bytearray())
            return
        if self.found or name != self.name:
            return
        self.found = True
        filename = params.get(b"filename")
        self._sink = self.open_sink(None if filename is None
                                    else filename.decode("utf-8", "replace"))

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            self._sink(data[start:end])
        elif self._text is not None:
            name, value = self._text
            value.extend(data[start:end])
            if len(value) > MAX_TEXT_FIELD_BYTES:
                raise invalid(name, f"longer than {MAX_TEXT_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._text is not None:
            name, value = self._text
            self.values[name], self._text = value.decode("utf-8", "replace"), None
        if self._sink is not None:
            self._sink, self.whole = None, True


async def batched(stream: AsyncIterator[bytes], size_bytes: int) -> AsyncIterator[bytes]:
    """The stream's pieces joined into batches of about ``size_bytes`` (one thread hop each,
    not one per network read)."""
    pending: list[bytes] = []
    pending_bytes = 0
    async for piece in stream:
        pending.append(piece)
        pending_bytes += len(piece)
        if pending_bytes >= size_bytes:
            yield b"".join(pending)
            pending, pending_bytes = [], 0
    if pending:
        yield b"".join(pending)
