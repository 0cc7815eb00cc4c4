"""Sphinx extension: every figure that carries a phone layout is served as a ``<picture>``.

A chapter's figures are PNGs made by ``transformer_ref.plotting.figure_png``: the figure as
drawn for the page, with its panels stacked in one narrow column (``phone_layout``) in the
PNG text chunk ``PHONE_KEY``. Writing a page, this extension takes that chunk out into
``_images/<name>-phone.png`` and wraps the ``<img>`` in
``<picture><source media="(max-width: 600px)" srcset="...-phone.png">``, so a browser
600 px wide or less loads the stacked layout instead (``_static/phone-figures.css`` shows it
at most as wide as the column). When the build ends, the chunk is stripped from the copies
in ``_images/``, so no reader downloads both layouts.
"""

import base64
import struct
import zlib
from pathlib import Path

from docutils import nodes
from sphinx.writers.html5 import HTML5Translator

from transformer_ref.plotting import PHONE_KEY

PHONE_MEDIA = "(max-width: 600px)"   # as custom.css's phone rules
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunks(data):
    """``[(type, payload), ...]`` of a PNG's bytes (ValueError if it is not a PNG)."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not a PNG")
    chunks, at = [], len(_SIGNATURE)
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        chunks.append((kind, data[at + 8:at + 8 + length]))
        at += 12 + length
    return chunks


def split_phone_layout(data):
    """``(png without the phone chunk, phone PNG or None)`` of a figure PNG's bytes."""
    try:
        chunks = png_chunks(data)
    except ValueError:
        return data, None
    phone, kept = None, []
    for kind, payload in chunks:
        if kind == b"tEXt" and payload.startswith(PHONE_KEY.encode() + b"\0"):
            phone = base64.b64decode(payload[len(PHONE_KEY) + 1:])
        else:
            kept.append((kind, payload))
    if phone is None:
        return data, None
    out = [_SIGNATURE]
    for kind, payload in kept:
        out.append(struct.pack(">I", len(payload)) + kind + payload
                   + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))
    return b"".join(out), phone


def _source(translator, node):
    """The image file of ``node`` in the source tree, or None."""
    rel = node.get("candidates", {}).get("*") or node.get("uri", "")
    path = Path(translator.builder.srcdir) / rel
    return path if path.suffix == ".png" and path.is_file() else None


def visit_image(self, node):
    source = _source(self, node)
    name = self.builder.images.get(node.get("candidates", {}).get("*") or node["uri"]) if source else None
    phone = split_phone_layout(source.read_bytes())[1] if name else None
    if phone is not None:
        phone_name = f"{Path(name).stem}-phone.png"
        target = Path(self.builder.outdir) / self.builder.imagedir / phone_name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_bytes() != phone:
            target.write_bytes(phone)
        self.body.append(f'<picture><source media="{PHONE_MEDIA}" srcset="{self.builder.imgpath}/{phone_name}">')
        node["tr_phone"] = True
    HTML5Translator.visit_image(self, node)


def depart_image(self, node):
    HTML5Translator.depart_image(self, node)
    if node.get("tr_phone"):
        self.body.append("</picture>")


def strip_phone_chunks(app, exception):
    """Take the phone layout out of the figures the build copied to ``_images/``."""
    if exception is not None or app.builder.format != "html":
        return
    for path in (Path(app.builder.outdir) / app.builder.imagedir).glob("*.png"):
        data = path.read_bytes()
        stripped, phone = split_phone_layout(data)
        if phone is not None:
            path.write_bytes(stripped)


def setup(app):
    app.add_node(nodes.image, override=True, html=(visit_image, depart_image))
    app.connect("build-finished", strip_phone_chunks)
    app.add_css_file("phone-figures.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
