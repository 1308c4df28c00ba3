"""What a document must be to be reviewed: plain text, UTF-8. One rule for every way in (intake's S3 read and inline
text, the CLI's file read, the Job API): bytes that are not UTF-8 are refused with advice taken from what the bytes
are (a byte-order mark names its encoding; a PDF, a Word file or a ZIP is named as such), and markup (RTF, HTML) is
refused rather than reviewed as markup and all: its analysts would quote tags and control words, not clauses.
Both are `input.undecodable`. A UTF-8 byte-order mark is dropped (it is UTF-8)."""

from __future__ import annotations

import codecs
import re

from contract_review.domain.errors import ReviewError

_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32LE"), (codecs.BOM_UTF32_BE, "UTF-32BE"),  # before UTF-16: the same first bytes
         (codecs.BOM_UTF16_LE, "UTF-16LE"), (codecs.BOM_UTF16_BE, "UTF-16BE"))
_BINARY = ((b"%PDF-", "a PDF: extract its text first (`pdftotext FILE out.txt`)"),
           (b"PK\x03\x04", "a ZIP archive (a .docx or .odt is one): save it from its editor as plain text (.txt)"),
           (b"\xd0\xcf\x11\xe0", "a Microsoft Office file (.doc): save it from its editor as plain text (.txt)"))
_RTF = re.compile(r"\A\s*\{\\rtf", re.IGNORECASE)
_HTML = re.compile(r"\A\s*(?:<!doctype\s+html|<html[\s>]|<\?xml[^>]*>\s*<html)", re.IGNORECASE)


def decoded(where: str, data: bytes) -> str:
    """`data` as text (UTF-8; a UTF-8 byte-order mark dropped), checked to be plain text (`plain`). Anything else:
    ReviewError `input.undecodable`, with advice from what the bytes are."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReviewError.of("input.undecodable", f"{where}: not UTF-8 text (at byte {exc.start}): {_advice(data)}",
                             step="intake.load") from exc
    return plain(where, text)


def plain(where: str, text: str) -> str:
    """`text`, unless it is markup a reviewer would read as markup (RTF, an HTML page): `input.undecodable`."""
    kind = "RTF" if _RTF.match(text) else "HTML" if _HTML.match(text) else None
    if kind is not None:
        raise ReviewError.of("input.undecodable", f"{where}: {kind} markup, not plain text: it would be reviewed "
                             "tags and all. Save it from its editor as plain text (.txt), or convert it (`pandoc "
                             f"-t plain FILE -o out.txt`), and send that", step="intake.validate")
    return text


def _advice(data: bytes) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return (f"it is {encoding} (it starts with that byte-order mark): convert it to UTF-8 "
                    f"(`iconv -f {encoding} -t UTF-8 FILE > out.txt`)")
    for magic, what in _BINARY:
        if data.startswith(magic):
            return f"it is {what}"
    if data[:4096].count(b"\x00") > len(data[:4096]) // 8:  # UTF-16 without a mark: every other byte is zero
        return "it looks like UTF-16 without a byte-order mark: convert it (`iconv -f UTF-16LE -t UTF-8 FILE`)"
    return ("it is probably a single-byte encoding such as Windows-1252 or Latin-1: convert it "
            "(`iconv -f CP1252 -t UTF-8 FILE > out.txt`)")
