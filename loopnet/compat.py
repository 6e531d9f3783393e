"""The dependencies' private APIs that loopnet uses, in one place: each has no public equivalent, and a
new release of the dependency that moves it breaks here, at import, rather than deep in a command."""

from __future__ import annotations

# jsonargparse
# The parsing settings as a dict (the import-path policy's entries have no public getter or reset), and
# the signature reader its parsers use (follows **kwargs into the classes they are passed to).
from jsonargparse._common import parsing_settings  # noqa: F401
from jsonargparse._parameter_resolvers import get_signature_parameters  # noqa: F401
