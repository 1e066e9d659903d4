"""The page at `GET /`: `page.html` beside this module, plain HTML with
its script and styles inline (no build step, nothing fetched from
elsewhere, so it works offline). It fills its language pickers from
`GET /languages` and translates through `POST /translate`; its elements
have ids for scripts and tests (`#source`, `#target`, `#source-text`,
`#translate`, `#translation`, `#time`, `#error`)."""

import functools
import importlib.resources


@functools.cache
def page_html():
    """The page's HTML."""
    return importlib.resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
