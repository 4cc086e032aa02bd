"""One module per dashboard page: its routes read the query, call the ops through the
visitor's in-process client, and render a template."""
