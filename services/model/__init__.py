"""The embedded default model: a deterministic, offline builder for small Llama models.

Nothing here downloads anything: the tokenizer and the model are trained (or randomly
initialised) from the Python standard library's own docstrings, so a fresh machine with
no network can still serve tokens. The entry point is ``services.model.build.ensure_model``;
this package module stays import-light (no torch) on purpose.
"""
