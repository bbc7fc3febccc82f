"""The Jupyter server extension: ``GoalsApp`` and its traits, thin REST handlers, the service behind
them (start-up and storage states, the admission and outbox loops, health, answers), the models
catalog and the OpenAPI document. The top layer: may import everything but ``clients`` and ``testing``.
"""
