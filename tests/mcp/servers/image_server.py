"""An MCP server whose tools return images, as a browser's screenshot tool does.

`python tests/mcp/servers/image_server.py`: tools
- `screenshot(width, height)`: a PNG of that size, with a line of text;
- `mislabelled`: a JPEG the server calls image/png (a server's label is not the bytes');
- `panorama`: a PNG 9,000 pixels wide, past what the model takes;
- `cut`: a PNG whose body is cut short (its header reads, the model cannot decode it);
- `report`: a PDF as an embedded resource, and a zip beside it (no kind the model takes).
"""

from __future__ import annotations

import base64
import io

from mcp.server.mcpserver import MCPServer
from mcp_types import BlobResourceContents, EmbeddedResource, ImageContent, TextContent
from PIL import Image

server = MCPServer("images")


def _image(width: int, height: int, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (40, 160, 90)).save(buf, fmt)
    return buf.getvalue()


def _content(data: bytes, mime: str) -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)


@server.tool(structured_output=False)
def screenshot(width: int = 640, height: int = 400) -> list[TextContent | ImageContent]:
    """A screenshot of the page."""
    return [TextContent(type="text", text=f"the page at {width}x{height}"),
            _content(_image(width, height), "image/png")]


@server.tool(structured_output=False)
def mislabelled() -> list[ImageContent]:
    """A JPEG labelled image/png."""
    return [_content(_image(120, 80, "JPEG"), "image/png")]


@server.tool(structured_output=False)
def panorama() -> list[TextContent | ImageContent]:
    """An image wider than the model takes."""
    return [TextContent(type="text", text="the whole street"),
            _content(_image(9_000, 10), "image/png")]


@server.tool(structured_output=False)
def cut() -> list[ImageContent]:
    """A PNG cut short."""
    whole = _image(200, 120)
    return [_content(whole[:len(whole) * 2 // 3], "image/png")]


def _resource(uri: str, data: bytes, mime: str) -> EmbeddedResource:
    return EmbeddedResource(type="resource", resource=BlobResourceContents(
        uri=uri, mime_type=mime, blob=base64.b64encode(data).decode()))


@server.tool(structured_output=False)
def report() -> list[TextContent | EmbeddedResource]:
    """The month's report as a PDF, and its data as a zip."""
    pdf = io.BytesIO()
    Image.new("RGB", (60, 80), (255, 255, 255)).save(pdf, "PDF")
    return [TextContent(type="text", text="the May report"),
            _resource("file:///reports/may.pdf", pdf.getvalue(), "application/pdf"),
            _resource("file:///reports/may.zip", b"PK\x03\x04\x00\xff", "application/zip")]


if __name__ == "__main__":
    server.run("stdio")
