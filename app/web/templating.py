"""The dashboard's Jinja2 environment, its static files, and plotly.js from the installed
``plotly`` package (the machines have no internet: never a CDN)."""

from __future__ import annotations

import json
from pathlib import Path

import plotly
from fastapi.templating import Jinja2Templates

from app.sessions import CSRF_FIELD

WEB_DIR = Path(__file__).resolve().parent
STATIC_DIR = WEB_DIR / "static"
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"

templates = Jinja2Templates(directory=WEB_DIR / "templates")
templates.env.globals["csrf_field"] = CSRF_FIELD  # its value: request.state


_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(value) -> str:
    """JSON safe inside a <script> element: no <, > or & to end it or open a comment."""
    return json.dumps(value).translate(_SCRIPT_UNSAFE)
