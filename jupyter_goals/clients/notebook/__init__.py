"""The notebook side: ``%goal`` / ``%chat`` magics, id-only MIME cards and ipywidgets, over ``clients.rest``."""
