"""The operator's live dashboard: a small web server inside ``bursar serve`` (``server``),
the JSON views it sends (``views``, pure functions of the broker's state) and the page
(``static/``)."""
